"""The client's process exit (:mod:`objcache.client`): what a process wrote is uploaded even
when it exits right after writing."""

from __future__ import annotations

from pathlib import Path

from tests.support import torch_runs


def test_a_process_that_exits_right_after_writing_still_uploads(tmp_path: Path) -> None:
    """Exit-time flushes must run before thread pools stop (they need asyncio.to_thread)."""
    env = torch_runs.file_store_env(tmp_path, OBJCACHE_JOB="exit-test")
    code = (
        "from objcache.client import get_client\n"
        "get_client().put('kernel', 'k1-exit.so', b'x' * 5000)\n"  # no flush: exit at once
    )
    torch_runs.python_c(code, env)
    stored = {p.parent.parent.name for p in (tmp_path / "store").rglob("*") if p.is_file()}
    assert {"kernel", "manifest"} <= stored


def test_an_entry_that_changes_under_its_key_replaces_the_stored_one(tmp_path: Path) -> None:
    """``replace``: a precompile entry saved before its function's later frames compiled is
    saved again whole; the store and the local tier hold the later version (a write-behind
    put keeps the first one), and a new machine reads that one."""
    from objcache.client import Client
    from objcache.config.settings import Config

    def machine(name: str) -> Client:
        return Client(
            Config(
                tiers=f"file://{tmp_path / 'store'}",
                local_dir=tmp_path / name,
                prefetch=False,
                job="replace-test",
            )
        )

    writer = machine("writer")
    try:
        [first] = writer.replace("precompile", {"fn": b"one frame"})
        [second] = writer.replace("precompile", {"fn": b"three frames"})
        assert (first.stored, first.asked, second.stored, second.asked) == (1, 1, 1, 1)
        assert writer.get_local("precompile", "fn") == b"three frames"
    finally:
        writer.close()
    reader = machine("reader")
    try:
        assert reader.get("precompile", "fn") == b"three frames"
    finally:
        reader.close()
