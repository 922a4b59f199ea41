"""Reads built on the engine (objcache/core/reads.py): the local-hit fast path in the caller's
thread serves only verified entries and counts each hit once (docs/architecture.md, "Read
path")."""

from __future__ import annotations

from pathlib import Path

from objcache.backends.base import LocalStore
from objcache.backends.disk.store import DiskBackend
from objcache.backends.fs_store import QUARANTINE_DIR
from objcache.config.urls import parse_tier_url
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.reads import note_local_hit, read_local_sync
from objcache.core.tier import Tier
from objcache.core.tiered import TieredCache
from objcache.core.writes import put
from tests.support.tiers import CODEC, NS, disk_tier, make, seed, tier


async def test_local_fast_path_serves_only_verified_hits_and_counts_them(tmp_path: Path) -> None:
    disk = DiskBackend(parse_tier_url(f"disk://{tmp_path}"))
    local = Tier(disk, RetryPolicy(timeout_s=1.0), CircuitBreaker(3, 60))
    cache = TieredCache(local, [], CODEC, NS)
    okey = NS.object_key("fx-graph", "k")
    entry = CODEC.encode(b"payload", okey)
    assert await disk.put(okey, entry)
    assert read_local_sync(cache, "fx-graph", "k") == (b"payload", okey, len(entry))
    assert read_local_sync(cache, "fx-graph", "absent") is None
    assert await disk.put(NS.object_key("fx-graph", "bad"), entry[:-1] + b"!")
    assert read_local_sync(cache, "fx-graph", "bad") is None, "the async path quarantines it"
    note_local_hit(cache, "fx-graph", okey, len(entry), 0.5)
    assert (cache.stats.gets["fx-graph"], cache.stats.hits["fx-graph"]) == (1, 1)
    assert cache.stats.served_by[local.name] == 1 and local.stats.hits == 1
    assert local.stats.bytes_read == len(entry) and okey in cache.recorded
    assert [t["local"] for t in cache.stats_dict()["tiers"]] == [True]
    assert read_local_sync(TieredCache(tier("mem://local"), [], CODEC, NS), "fx-graph", "k") is None
    await disk.close()


async def test_local_fast_path_hits_add_up(tmp_path: Path) -> None:
    disk = DiskBackend(parse_tier_url(f"disk://{tmp_path}?max_bytes=1M"))
    local = Tier(disk, RetryPolicy(timeout_s=1.0), CircuitBreaker(3, 60))
    cache = TieredCache(local, [], CODEC, NS)
    okey = NS.object_key("fx-graph", "k")
    for ms in (0.5, 3.0):
        note_local_hit(cache, "fx-graph", okey, 10, ms)
    assert (cache.stats.gets["fx-graph"], cache.stats.hits["fx-graph"]) == (2, 2)
    assert (cache.stats.served_by[local.name], local.stats.hits) == (2, 2)
    assert local.stats.bytes_read == 20 and local.stats.kinds["fx-graph"]["hit"] == 2
    assert local.stats.get_latency.total == 2 and local.stats.get_latency.sum_ms == 3.5
    assert cache.stats.lookup.total == 2 and cache.stats.lookup.sum_ms == 3.5
    assert disk.total_bytes == 10, "the hit reached the disk tier's LRU index"
    assert disk._index.sizes == {okey: 10}
    await disk.close()


async def test_disk_local_tier_serves_the_fast_path_and_quarantines(tmp_path: Path) -> None:
    """The local tier's extras (``LocalStore``) are used when its backend has them."""
    disk = DiskBackend(parse_tier_url(f"disk://{tmp_path}?max_bytes=1M"))
    assert isinstance(disk, LocalStore)
    local = Tier(disk, RetryPolicy(timeout_s=1.0), CircuitBreaker(3, 60))
    cache = TieredCache(local, [], CODEC, NS)
    await put(cache, "fx-graph", "good", b"payload")
    hit = read_local_sync(cache, "fx-graph", "good")
    assert hit is not None and hit[0] == b"payload"
    bad = NS.object_key("fx-graph", "bad")
    await disk.put(bad, b"not an entry")
    assert read_local_sync(cache, "fx-graph", "bad") is None
    assert await cache.get("fx-graph", "bad") is None
    assert await disk.exists(bad) is False
    assert len(list((tmp_path / QUARANTINE_DIR).iterdir())) == 1
    await cache.close(5)


def test_a_plain_local_tier_has_no_fast_path() -> None:
    cache, local = make()
    assert not isinstance(local.backend, LocalStore)
    seed(local, "k", b"v")
    assert read_local_sync(cache, "fx-graph", "k") is None


async def test_fast_path_hits_are_counted_once_each(tmp_path: Path) -> None:
    local = disk_tier(tmp_path, "?max_bytes=1M")
    cache = TieredCache(local, [], CODEC, NS)
    await put(cache, "fx-graph", "k", b"v")
    okey = NS.object_key("fx-graph", "k")
    for _ in range(2):
        note_local_hit(cache, "fx-graph", okey, 10, 1.0)
    assert cache.stats.lookups_served_by == {local.name: 2}
    assert cache.stats.hits["fx-graph"] == 2 and local.stats.bytes_read == 20
    assert isinstance(local.backend, DiskBackend)
    assert okey in local.backend._index.used
