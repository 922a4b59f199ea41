"""Write-behind (objcache/core/writebehind.py): remote writes that never block the caller,
coalesced and bounded in bytes, to the tiers ``write_to`` names; a write skipped for an open
breaker is counted (docs/architecture.md, "Write path")."""

from __future__ import annotations

import os

from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.tier import TierFlags
from objcache.core.tiered import TieredCache
from objcache.core.writes import put
from tests.support.tiers import CODEC, NS, make, mem, tier


async def test_write_behind_coalesces_and_drops_over_the_bound() -> None:
    remote = tier("mem://r", timeout=1.0)
    mem(remote).fault = "hang"
    cache, _ = make(remote, write_behind_max_bytes=4000)
    big = b"\x00" * 1500
    for i in range(20):
        await put(cache, "fx-graph", f"k{i}", os.urandom(1500) if i else big)
    assert cache.stats.write_behind_dropped > 0
    left = await cache.close(flush_timeout=0.2)
    assert left > 0


async def test_remote_put_failure_never_raises_and_is_counted() -> None:
    remote = tier("mem://r")
    mem(remote).fault = "permanent"
    cache, _ = make(remote)
    await put(cache, "fx-graph", "k", b"v")
    assert await cache.flush(5) == 0
    assert remote.stats.put_errors["error"] >= 1


async def test_nearest_write_policy_writes_region_and_home() -> None:
    regional, eu, home = tier("mem://regional"), tier("mem://eu"), tier("mem://home")
    home.flags = TierFlags(home=True)
    local = tier("mem://local")
    cache = TieredCache(local, [regional, eu, home], CODEC, NS, write_to="nearest")
    await put(cache, "fx-graph", "k", b"v")
    await cache.flush(5)
    okey = NS.object_key("fx-graph", "k")
    assert okey in mem(regional).data and okey in mem(home).data
    assert okey not in mem(eu).data
    mem(regional).fault = "hang"  # nearest tier down: its breaker opens, the next one takes writes
    regional.breaker = CircuitBreaker(1, 60)
    regional.policy = RetryPolicy(timeout_s=0.05, retries=0)
    await regional.put("probe", b"x")
    assert [t.name for t in cache.write_targets()] == ["mem://eu", "mem://home"]


async def test_puts_skipped_by_an_open_breaker_are_counted() -> None:
    broken, healthy = tier("mem://broken"), tier("mem://healthy")
    cache, _ = make(broken, healthy)
    for _ in range(broken.breaker.threshold):
        broken.breaker.failure()
    assert broken.breaker_open()
    for i in range(4):
        await put(cache, "fx-graph", f"k{i}", b"v")
    await cache.flush(5)
    assert broken.stats.put_errors["breaker"] == 4 + 1  # and the ENV.json
    assert healthy.stats.puts == 4 + 1  # and the ENV.json


async def test_only_writable_tiers_count_puts_skipped_by_their_breaker() -> None:
    writable, read_only = tier("mem://w"), tier("mem://ro", flags=TierFlags(read_only=True))
    cache, _ = make(writable, read_only)
    for t in (writable, read_only):
        for _ in range(3):
            t.breaker.failure()
        assert t.breaker_open()
    await put(cache, "fx-graph", "k", b"v")
    await cache.flush(5)
    assert writable.stats.put_errors["breaker"] >= 1
    assert read_only.stats.put_errors["breaker"] == 0
