"""The client's process exit (:mod:`objcache.client`): what a process wrote is uploaded even
when it exits right after writing."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support import torch_runs


def test_a_process_that_exits_right_after_writing_still_uploads(tmp_path: Path) -> None:
    """Exit-time flushes must run before thread pools stop (they need asyncio.to_thread)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJCACHE_")}
    env.update(
        PYTHONPATH=str(torch_runs.ROOT),
        OBJCACHE_TIERS=f"file://{tmp_path / 'store'}",
        OBJCACHE_LOCAL_DIR=str(tmp_path / "local"),
        OBJCACHE_JOB="exit-test",
    )
    code = (
        "from objcache.client import get_client\n"
        "get_client().put('kernel', 'k1-exit.so', b'x' * 5000)\n"  # no flush: exit at once
    )
    torch_runs.python_c(code, env)
    stored = {p.parent.parent.name for p in (tmp_path / "store").rglob("*") if p.is_file()}
    assert {"kernel", "manifest"} <= stored
