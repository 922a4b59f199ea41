"""torch.compile end to end against the real remote stores: S3 (SeaweedFS) and Redis.

The cold compile of tests/integrations/torch/test_compile.py fills a file:// store; its
entries are copied (verified) into each real store, and a fresh machine whose only tier is
that store must get every kind remotely and run no g++.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest

from objcache.backends import create_backend
from objcache.backends.base import TierSpec
from objcache.cli import ops
from objcache.config.urls import parse_tier_url
from objcache.entry.codec import Codec
from tests.integrations.torch.test_compile import World, hits
from tests.support import torch_runs as ts
from tests.support.cloud import s3_url

pytest.importorskip("torch")
pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
]

#: The precompiled header (~150 MB) is not worth a network copy in a test.
MAX_SEED_BYTES = 8 << 20


def seed_store(store: Path, url: str) -> int:
    async def run() -> int:
        source = create_backend(TierSpec(f"file://{store}", "file", "", str(store), {}))
        target = create_backend(parse_tier_url(url))
        try:
            keys = [i.key async for i in source.list("") if i.size <= MAX_SEED_BYTES]
            report = await ops.copy(source, [target], keys, Codec())
            assert report.failed == report.refused == 0, report.errors
            return report.copied
        finally:
            await source.close()
            await target.close()

    return asyncio.run(run())


@pytest.mark.parametrize("scheme", ["s3", "redis"])
def test_new_machine_from_a_real_store(
    world: World,
    scheme: str,
    request: pytest.FixtureRequest,
) -> None:
    _ = world.cold
    prefix = f"torch-{secrets.token_hex(4)}"
    if scheme == "s3":
        url = s3_url(request.getfixturevalue("seaweed_s3"), prefix)
    else:
        url = f"{request.getfixturevalue('redis_server').url}?prefix={prefix}/"
    assert seed_store(world.store, url) > 0
    env, log = world.env(f"remote-{scheme}", url)
    env["OBJCACHE_TIMEOUT_MS"] = "5000"
    result: dict[str, Any] = ts.run_compile(env)
    result["gxx"] = ts.gxx_builds(log)
    assert result["match"], result["max_abs_err"]
    got = hits(result)
    for kind in ("fx-graph", "aot-autograd", "pgo"):
        assert got[kind][0] == got[kind][1] > 0, (kind, got)
    # a kernel is placed where torch looks while the prefetch runs (never asked for), or
    # asked for and served on load
    placed = result["integration"]["kernels"].get("placed", 0)
    hit, asked = got.get("kernel", (0, 0))
    assert hit == asked and placed + hit > 0, (got, result["integration"]["kernels"])
    assert result["torch"].get("fxgraph_cache_hit") == 2
    assert result["gxx"] == [], "\n".join(result["gxx"])
    assert ts.store_hits(result, f"{scheme}://") > 0
