"""Records across the tiers (objcache/core/tiered_records.py) through one cache: counted per
lookup; an unreadable or forged record is a counted miss, replaced by the next update
(docs/architecture.md, "Records"). Several hosts sharing one record: tests/core/test_records.py."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from objcache.backends.base import PutMode
from objcache.backends.disk.store import DiskBackend
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.tier import Tier
from objcache.core.tiered import TieredCache
from objcache.core.tiered_records import get_record, update_record
from objcache.entry.codec import Codec
from tests.support.tiers import CODEC, NS, Versions, appending, disk_tier, mem, tier


async def test_a_forged_unsigned_remote_record_is_replaced_not_joined() -> None:
    key = b"k" * 32
    remote = Tier(
        Versions("mem://records"), RetryPolicy(timeout_s=2.0, retries=0), CircuitBreaker(5, 60)
    )
    cache = TieredCache(None, [remote], Codec(signing_keys=(key,)), NS)
    okey = NS.object_key("pgo", "r")
    mem(remote).data[okey] = Codec().encode(b"forged", okey)  # unsigned
    await update_record(cache, "pgo", "r", appending(b"mine"))
    await cache.flush(5)
    assert await get_record(cache, "pgo", "r") == b"mine"
    assert cache.stats.records_unreadable == Counter({"pgo": 1})


async def test_records_are_counted_per_lookup_and_a_corrupt_local_one_is_a_miss(
    tmp_path: Path,
) -> None:
    local = disk_tier(tmp_path)
    cache = TieredCache(local, [tier("mem://r")], CODEC, NS)
    assert await get_record(cache, "pgo", "r") is None
    assert cache.stats.hits["pgo"] == 0
    unchanged: list[bytes | None] = []
    await update_record(cache, "pgo", "r", lambda cur: unchanged.append(cur))  # returns None
    assert unchanged == [None] and await get_record(cache, "pgo", "r") is None
    for item in (b"a", b"b"):
        await update_record(cache, "pgo", "r", appending(item))
    await cache.flush(5)
    for _ in range(2):
        assert await get_record(cache, "pgo", "r") == b"a,b"
    assert cache.stats.gets["pgo"] == 4 and cache.stats.hits["pgo"] == 2
    okey = NS.object_key("pgo", "r")  # in the local tier only (the remote has no records)
    store = local.backend
    assert isinstance(store, DiskBackend)
    good = store.store.read(okey)
    assert good is not None
    store.store.write(okey, good[:-1] + bytes([good[-1] ^ 1]), PutMode.OVERWRITE)
    assert await get_record(cache, "pgo", "r") is None
    assert local.stats.misses["corrupt"] == 1
    # an unreadable local record is counted, then replaced by the next update
    store.store.write(okey, good[:-1] + bytes([good[-1] ^ 1]), PutMode.OVERWRITE)
    await update_record(cache, "pgo", "r", appending(b"c"))
    assert cache.stats.records_unreadable == Counter({"pgo": 1})
    store.store.write(okey, b"garbage", PutMode.OVERWRITE)
    await update_record(cache, "pgo", "r", appending(b"d"))
    assert cache.stats.records_unreadable == Counter({"pgo": 2})


async def test_a_start_s_first_read_of_a_prefetched_record_is_the_local_copy() -> None:
    """The record a run read is listed for the next start's prefetch; that start's first
    read is the prefetched copy (no far round trip), its later reads ask the remotes."""
    local, remote = tier("mem://local"), tier("mem://far")
    cache = TieredCache(local, [remote], CODEC, NS)
    okey = NS.object_key("pgo", "r")
    mem(local).data[okey] = CODEC.encode(b"as prefetched", okey)
    mem(remote).data[okey] = CODEC.encode(b"updated since", okey)
    cache.prefetched = {okey}
    assert await get_record(cache, "pgo", "r") == b"as prefetched"
    assert remote.stats.hits == 0
    assert await get_record(cache, "pgo", "r") == b"updated since"
    assert okey in cache.recorded  # listed in this run's manifest
    unlisted = TieredCache(tier("mem://l2"), [remote], CODEC, NS)
    assert await get_record(unlisted, "pgo", "r") == b"updated since"


async def test_a_record_the_run_wrote_is_named_by_its_manifest() -> None:
    """The next start's prefetch brings the profile this run wrote (a writer's first read
    of it was a miss), so a new machine's compile does not read it from a far tier."""
    from objcache.core import manifest

    cache = TieredCache(tier("mem://local"), [tier("mem://r")], CODEC, NS)
    assert await get_record(cache, "pgo", "r") is None
    await update_record(cache, "pgo", "r", appending(b"a"))
    await cache.flush(5)
    assert await manifest.record_run(cache, "job", "run-1") is not None
    await cache.flush(5)
    new_machine = TieredCache(tier("mem://local2"), [cache.remotes[0]], CODEC, NS)
    listed, _ = await manifest.read_job(new_machine, "job")
    assert NS.object_key("pgo", "r") in listed
