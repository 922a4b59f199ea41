"""A lookup's local look and node lease (objcache/core/fetch_once/leased_lookup.py) through the
cache, with another rank of the node in the same process: what a waiting lookup is served, and how
claims and takeovers are counted (docs/architecture.md, "One remote fetch per node")."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from objcache.backends.base import PutMode
from objcache.backends.disk.store import DiskBackend
from objcache.core.fetch_once.nodelease import Claim, NodeLeases, lease_path
from tests.support.flock import blocked_on
from tests.support.tiers import NS, leased_cache, mem, seed, tier


async def test_a_lookup_that_waited_is_served_what_the_holder_found(tmp_path: Path) -> None:
    remote = tier("mem://r")
    hit, miss = seed(remote, "hit", b"payload"), NS.object_key("fx-graph", "miss")
    cache = leased_cache(tmp_path, remote)
    store = cache.local_store
    assert isinstance(store, DiskBackend) and cache.local is not None
    other = NodeLeases(str(tmp_path), hold_s=30)
    for okey, outcome in ((hit, "hit"), (miss, "miss")):
        claim, lease = await other.claim(okey)
        assert claim is Claim.HELD and lease is not None
        lookup = asyncio.ensure_future(cache.get_object(okey))
        await blocked_on(lease_path(str(tmp_path), okey))
        if outcome == "hit":  # the other rank fetched it and wrote it through
            assert await store.put(okey, mem(remote).data[okey], PutMode.OVERWRITE)
        await lease.release(outcome)
        assert await asyncio.wait_for(lookup, 60) == (
            (b"payload", cache.local.name) if outcome == "hit" else (None, "")
        )
    assert mem(remote).calls["get"] == 0, "neither lookup asked the remote"
    assert dict(cache.stats.node_leases) == {"landed": 1, "missed": 1}
    # both waits are the run's "node lease" phase (docs/architecture.md, "Phase times");
    # a lease this process takes to fetch for itself is not a wait
    assert cache.stats.phase_ms["node lease"][1] == 2
    await cache.get_object(NS.object_key("fx-graph", "third"))
    assert cache.stats.phase_ms["node lease"][1] == 2 and cache.stats.node_leases["held"] == 1
    assert cache.local.stats.hits == 1 and cache.local.stats.misses["absent"] == 3
    assert dict(cache.local.stats.kinds["fx-graph"]) == {"hit": 1, "absent": 3}
    assert store._index.sizes == {hit: len(mem(remote).data[hit])}, "the hit is in the LRU"
    await cache.close()


async def test_leased_lookups_and_takeovers_add_up(tmp_path: Path) -> None:
    remote = tier("mem://r")
    keys = [seed(remote, f"k{i}", b"v%d" % i) for i in range(2)]
    crashed = NodeLeases(str(tmp_path), hold_s=30)
    for okey in keys:  # a rank that died mid-fetch: its lock is gone, its record is not
        claim, lease = await crashed.claim(okey)
        assert claim is Claim.HELD and lease is not None and lease._fd is not None
        os.close(lease._fd)  # the kernel drops a dead process's locks
        lease._fd = None
    cache = leased_cache(tmp_path, remote)
    for i, okey in enumerate(keys):
        assert await cache.get_object(okey) == (b"v%d" % i, "mem://r")
    assert dict(cache.stats.node_leases) == {"held": 2, "took_over": 2}
    await cache.flush()
    assert cache.stats.write_through == 2
    await cache.close()
