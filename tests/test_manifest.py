"""Prefetch manifests: concurrent writers, union, compaction, prefetch single-flight."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from objcache import manifest
from objcache.manifest import Manifest, ManifestError, default_job_name
from objcache.tier import Tier, TierFlags
from objcache.tiered import TieredCache
from tests.memory_backend import MemoryBackend
from tests.test_tiered import CODEC, NS, make, mem, seed, tier


def shared_store_caches(n: int) -> tuple[list[TieredCache], MemoryBackend]:
    """n processes' caches (own local tier each) over one remote store."""
    store = tier("mem://store")
    caches = []
    for _ in range(n):
        cache, _local = make(store)
        caches.append(cache)
    return caches, mem(store)


async def test_eight_concurrent_writers_lose_no_update() -> None:
    caches, _ = shared_store_caches(8)
    for i, cache in enumerate(caches):
        cache.recorded = {NS.object_key("fx-graph", f"key-{i}-{j}") for j in range(5)}
    names = await asyncio.gather(*(manifest.record_run(c, "train") for c in caches))
    await asyncio.gather(*(c.flush(5) for c in caches))
    assert len(set(names)) == 8
    reader, _ = make(caches[0].remotes[0])
    keys, read = await manifest.read_job(reader, "train")
    assert len(read) == 8 and len(keys) == 40
    other, _ = await manifest.read_job(reader, "eval")
    assert other == set()


async def test_compaction_merges_runs_and_keeps_concurrent_ones() -> None:
    caches, _store = shared_store_caches(1)
    cache = caches[0]
    for i in range(manifest.COMPACT_AFTER + 2):
        await manifest.write_run(cache, "job", {NS.object_key("fx-graph", f"k{i}")})
    await cache.flush(5)
    keys, names = await manifest.read_job(cache, "job")
    late = await manifest.write_run(cache, "job", {NS.object_key("fx-graph", "late")})
    await cache.flush(5)
    assert await manifest.compact(cache, "job", keys, names)
    remaining = await manifest.list_manifests(cache, "job")
    assert late in remaining and sum("/merged-" in n for n in remaining) == 1
    assert len(remaining) == 2
    union, _ = await manifest.read_job(cache, "job")
    assert len(union) == manifest.COMPACT_AFTER + 3


async def test_compaction_keeps_the_runs_when_one_tier_refuses_the_merged_manifest() -> None:
    near, far = tier("mem://near"), tier("mem://far")
    cache, _ = make(near, far)
    for i in range(manifest.COMPACT_AFTER + 2):
        await manifest.write_run(cache, "job", {NS.object_key("fx-graph", f"k{i}")})
    await cache.flush(5)
    runs = {k for k in mem(far).data if "run-" in k}
    assert len(runs) == manifest.COMPACT_AFTER + 2 and runs <= set(mem(near).data)
    # The far tier stores entries as large as a run manifest, not the merged one.
    far.flags = TierFlags(max_size=max(len(mem(far).data[k]) for k in runs))
    keys, names = await manifest.read_job(cache, "job")
    assert not await manifest.compact(cache, "job", keys, names)
    assert far.stats.put_errors["too_large"] == 1
    for t in (near, far):
        assert runs <= set(mem(t).data), f"{t.name} lost run manifests"
    union, _ = await manifest.read_job(cache, "job")
    assert union == keys and len(keys) == manifest.COMPACT_AFTER + 2


async def job_in_a_store(n: int) -> tuple[TieredCache, list[str], MemoryBackend]:
    """A store holding ``n`` entries k0..k{n-1} and one run manifest of job "job" listing
    them; returns the writer, the object keys and the store."""
    caches, store = shared_store_caches(1)
    writer = caches[0]
    okeys = [seed(tier_of(writer), f"k{i}", f"v{i}".encode()) for i in range(n)]
    await manifest.write_run(writer, "job", okeys)
    await writer.flush(5)
    return writer, okeys, store


async def test_prefetch_fills_local_and_lookups_join_in_flight_fetches() -> None:
    writer, okeys, store = await job_in_a_store(20)
    reader_cache, local = make(writer.remotes[0])
    store.delay_s = 0.05
    task = asyncio.ensure_future(manifest.prefetch(reader_cache, "job"))
    while not reader_cache.fetching(okeys[3]):
        await asyncio.sleep(0.005)
    assert await reader_cache.get("fx-graph", "k3") == b"v3"
    result = await task
    assert result["fetched"] == 20
    assert reader_cache.stats.single_flight_shared >= 1
    gets_before = store.calls["get"]
    assert await reader_cache.get("fx-graph", "k7") == b"v7"
    assert store.calls["get"] == gets_before, "prefetched entries are local"
    assert CODEC.decode(mem(local).data[okeys[7]], okeys[7]) == b"v7"


def tier_of(cache: TieredCache) -> Tier:
    return cache.remotes[0]


async def test_run_manifest_is_skipped_when_nothing_new() -> None:
    caches, _store = shared_store_caches(1)
    cache = caches[0]
    assert await manifest.record_run(cache, "job") is None
    cache.recorded = {NS.object_key("pgo", "a")}
    cache.prefetched = set(cache.recorded)
    assert await manifest.record_run(cache, "job") is None


def test_default_job_name() -> None:
    assert default_job_name(["/work/train.py", "--lr", "1"]) == "train"
    assert default_job_name(["-c"]) == "interactive"


@given(st.binary(max_size=300))
def test_manifest_parser_only_raises_manifest_error(blob: bytes) -> None:
    with contextlib.suppress(ManifestError):
        Manifest.from_bytes(blob)


def test_manifest_round_trip_and_rejects_foreign_keys() -> None:
    m = Manifest("j", frozenset({NS.object_key("fx-graph", "a")}), 1.0)
    assert Manifest.from_bytes(m.to_bytes()) == m
    with pytest.raises(ManifestError):
        Manifest.from_bytes(b'{"format":1,"job":"j","created":1,"keys":["../../etc"]}')


async def test_prefetch_is_counted_apart_from_lookups() -> None:
    """Prefetch fetches are not lookups, and do not show as misses of the local tier."""
    writer, _, _ = await job_in_a_store(6)
    reader, local = make(writer.remotes[0])
    result = await manifest.prefetch(reader, "job")
    assert result["fetched"] == 6
    await reader.flush(5)
    assert reader.stats.prefetch_fetched == {writer.remotes[0].name: 6}
    assert sum(reader.stats.gets.values()) == 0 and not reader.stats.lookups_served_by
    # the one run manifest was looked for locally; the 6 prefetched entries were not
    assert local.stats.misses == {"absent": 1}, local.stats.misses
    assert await reader.get("fx-graph", "k1") == b"v1"
    assert reader.stats.lookups_served_by == {local.name: 1}
