"""The prefetch's time line (objcache/observe/prefetch_timeline.py): recorded by the real
read engine over a file:// store whose GETs (and listing) the test holds, waiting on
conditions; rendered by ``objcache explain --time`` in tests/cli/test_timing.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from objcache.backends import create_backend
from objcache.backends.base import Backend, ObjectInfo, PutMode
from objcache.backends.disk.store import DiskBackend
from objcache.config.urls import parse_tier_list, parse_tier_url
from objcache.core import manifest
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.reads import note_local_hit, read_local_sync
from objcache.core.tier import Tier
from objcache.core.tiered import TieredCache
from objcache.observe import prefetch_timeline as tl
from objcache.observe import run_summary as summary
from tests.support.tiers import CODEC, NS
from tests.support.waiting import until


class Held:
    """A real backend whose GETs of chosen keys, and listings, wait for the test's word."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.gets: dict[str, asyncio.Event] = {}
        self.listing: asyncio.Event | None = None
        self.waiting: set[str] = set()
        get, capped, listing = inner.get, inner.get_capped, inner.list

        async def hold(key: str) -> None:
            event = self.gets.get(key)
            if event is not None:
                self.waiting.add(key)
                await event.wait()

        async def held_get(key: str) -> bytes | None:
            await hold(key)
            return await get(key)

        async def held_capped(key: str, max_bytes: int) -> bytes | None:
            await hold(key)
            return await capped(key, max_bytes)

        async def held_list(prefix: str = "") -> AsyncIterator[ObjectInfo]:
            if self.listing is not None:
                await self.listing.wait()
            async for info in listing(prefix):
                yield info

        inner.get = held_get  # type: ignore[method-assign]
        inner.get_capped = held_capped  # type: ignore[method-assign]
        inner.list = held_list  # type: ignore[method-assign]


async def store_with_job(tmp_path: Path, keys: list[str], extra: list[str]) -> tuple[Tier, Held]:
    """A file:// store holding entries ``keys`` + ``extra`` (payload ``v-<key>``) and one
    run manifest of job ``job`` listing ``keys``."""
    backend = create_backend(parse_tier_list(f"file://{tmp_path / 'store'}", "t")[0])
    for key in keys + extra:
        okey = NS.object_key("fx-graph", key)
        await backend.put(okey, CODEC.encode(f"v-{key}".encode(), okey), PutMode.CREATE)
    okeys = frozenset(NS.object_key("fx-graph", k) for k in keys)
    mokey = NS.object_key(manifest.KIND, "job/run-1")
    body = manifest.Manifest("job", okeys, 1.0).to_bytes()
    await backend.put(mokey, CODEC.encode(body, mokey), PutMode.CREATE)
    held = Held(backend)
    return Tier(backend, RetryPolicy(timeout_s=30.0, retries=0), CircuitBreaker(5, 60)), held


def reader(tmp_path: Path, remote: Tier) -> TieredCache:
    """A new machine: an empty disk local tier (with the fast path) over ``remote``."""
    disk = DiskBackend(parse_tier_url(f"disk://{tmp_path / 'local'}"))
    local = Tier(disk, RetryPolicy(timeout_s=30.0), CircuitBreaker(3, 60))
    return TieredCache(local, [remote], CODEC, NS)


async def test_the_time_line_tells_served_waited_missed_local_and_absent_lookups(
    tmp_path: Path,
) -> None:
    keys = ["k0", "k1", "k2", "k3", "k4"]
    remote, held = await store_with_job(tmp_path, keys, extra=["other"])
    cache = reader(tmp_path, remote)
    assert cache.local is not None
    k4 = NS.object_key("fx-graph", "k4")  # already on this machine
    await cache.local.backend.put(k4, CODEC.encode(b"v-k4", k4), PutMode.CREATE)
    k1 = NS.object_key("fx-graph", "k1")
    held.gets[k1] = asyncio.Event()  # the far store is slow for this one

    task = asyncio.ensure_future(manifest.prefetch(cache, "job"))
    await until(lambda: cache.prefetch_timeline is not None, what="the prefetch's start")
    timeline = cache.prefetch_timeline
    assert timeline is not None
    await until(lambda: timeline.fetched == 3 and k1 in held.waiting, what="3 fetched, k1 held")
    await cache.flush(5)  # their write-through landed: the fast path reads them

    # served: the fast path of a prefetched entry
    hit = read_local_sync(cache, "fx-graph", "k0")
    assert hit is not None and hit[0] == b"v-k0"
    note_local_hit(cache, "fx-graph", hit[1], hit[2], 0.1)
    # served: the async path too
    assert await cache.get("fx-graph", "k2") == b"v-k2"
    # waited: k1 is still in flight; the lookup joins the prefetch's fetch
    waiting = asyncio.ensure_future(cache.get("fx-graph", "k1"))
    await until(lambda: cache.stats.gets["fx-graph"] == 3, what="the lookup of k1 started")
    assert not waiting.done()
    held.gets[k1].set()
    assert await waiting == b"v-k1"
    # missed: the store has it, the manifest did not list it
    assert await cache.get("fx-graph", "other") == b"v-other"
    # local: on this machine before the prefetch; absent: in no tier
    assert await cache.get("fx-graph", "k4") == b"v-k4"
    assert await cache.get("fx-graph", "nowhere") is None
    result = await task
    assert result["fetched"] == 4 and result["already_local"] == 1

    p = timeline.as_dict()
    assert p["lookups"] == {"served": 2, "waited": 1, "missed": 1, "local": 1, "absent": 1}
    assert p["missed_reasons"] == {tl.NOT_LISTED: 1}
    assert p["keys"] == 5 and p["already_local"] == 1 and p["manifests"] == 1
    assert p["requested"] == p["fetched"] == 4 and p["not_found"] == 0 and p["errors"] == 0
    sizes = {k: len(f"v-{k}") for k in keys}
    assert p["bytes"] == sum(sizes[k] for k in keys if k != "k4")
    assert p["by_tier"] == {remote.name: {"n": 4, "bytes": p["bytes"]}}
    # the wait is the lookup's, of its kind, answered by the far store
    [wait] = p["waits"]
    assert wait["kind"] == "fx-graph" and wait["key"] == "k1" and wait["tier"] == remote.name
    assert wait["s"] > 0 and p["wait_s"] == pytest.approx(wait["s"], abs=1e-3)
    # the order of events: start, manifest, requests, arrivals, end; k1 arrived last
    assert p["started_s"] <= p["manifest_s"] <= p["ended_s"]
    assert p["first_lookup_s"] is not None and p["first_lookup_s"] <= p["ended_s"]
    entries = {e["key"]: e for e in p["entries"]}
    assert set(entries) == {"k0", "k1", "k2", "k3"}
    for key, e in entries.items():
        assert e["tier"] == remote.name and e["bytes"] == sizes[key]
        assert p["manifest_s"] <= e["requested_s"] <= e["arrived_s"] <= p["ended_s"]
    assert entries["k1"]["arrived_s"] == max(e["arrived_s"] for e in entries.values())
    assert p["last_arrival_s"] == pytest.approx(entries["k1"]["arrived_s"], abs=1e-3)
    # what the run summary carries, read back as `objcache explain --time` reads it
    built = summary.build(
        cache.stats_dict(), job="job", run="run-1-1-aa", started=1.0, ended=2.0, prefetch=p
    )
    assert summary.parse(summary.encode(built))["prefetch"] == p
    await cache.close(5)


async def test_lookups_before_the_manifest_and_before_their_request_missed_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manifest, "PREFETCH_CONCURRENCY", 1)
    keys = [f"k{i}" for i in range(4)]
    remote, held = await store_with_job(tmp_path, keys, extra=[])
    cache = reader(tmp_path, remote)
    held.listing = asyncio.Event()  # listing the job's manifests is slow
    task = asyncio.ensure_future(manifest.prefetch(cache, "job"))
    await until(lambda: cache.prefetch_timeline is not None, what="the prefetch's start")
    timeline = cache.prefetch_timeline
    assert timeline is not None
    assert await cache.get("fx-graph", "k0") == b"v-k0"  # before the manifest arrived
    # one entry at a time, the first one held: the others are queued, not requested
    for okey in (NS.object_key("fx-graph", k) for k in keys):
        held.gets[okey] = asyncio.Event()
    held.listing.set()
    await until(lambda: len(held.waiting) == 1, what="the prefetch's first request")
    [first] = held.waiting
    queued = next(k for k in keys[1:] if NS.object_key("fx-graph", k) != first)
    held.gets[NS.object_key("fx-graph", queued)].set()
    assert await cache.get("fx-graph", queued) == f"v-{queued}".encode()
    for event in held.gets.values():
        event.set()
    await task
    p = timeline.as_dict()
    assert p["lookups"]["missed"] == 2 and p["lookups"]["served"] == 0
    assert p["missed_reasons"] == {tl.BEFORE_MANIFEST: 1, tl.NOT_YET: 1}
    assert p["first_lookup_s"] is not None and p["manifest_s"] is not None
    assert p["first_lookup_s"] < p["manifest_s"]
    await cache.close(5)


async def test_what_a_run_records_is_bounded_and_recording_never_fails_a_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tl, "MAX_ENTRIES", 3)
    keys = [f"k{i}" for i in range(8)]
    remote, _held = await store_with_job(tmp_path, keys, extra=[])
    cache = reader(tmp_path, remote)
    await manifest.prefetch(cache, "job")
    timeline = cache.prefetch_timeline
    assert timeline is not None
    p = timeline.as_dict()
    assert len(p["entries"]) == 3 and p["entries_left_out"] == 5 and p["fetched"] == 8
    assert p["bytes"] == sum(len(f"v-{k}") for k in keys)

    # a recording step that raises is counted; the lookup still answers
    def broken(*_: Any) -> tuple[str, str]:
        raise RuntimeError("recording failed")

    monkeypatch.setattr(tl, "_kind_key", broken)
    timeline._state[NS.object_key("fx-graph", "k0")] = tl._IN_FLIGHT  # recorded as a wait
    assert await cache.get("fx-graph", "k0") == b"v-k0"
    assert timeline.errors == 1 and cache.stats.hits["fx-graph"] == 1
    await cache.close(5)


def test_a_summary_without_a_prefetch_or_of_an_older_objcache_has_none() -> None:
    built = summary.build({}, job="job", run="run-1-1-aa", started=1.0, ended=2.0)
    assert built["prefetch"] is None
    assert summary.parse(summary.encode(built))["prefetch"] is None
    del built["prefetch"]
    assert summary.parse(summary.encode(built))["prefetch"] is None


def recorded() -> dict[str, Any]:
    timeline = tl.PrefetchTimeline()
    return timeline.as_dict()


@pytest.mark.parametrize(
    "change",
    [
        {"since": "boot"},
        {"started_s": None},
        {"ended_s": -1.0},
        {"fetched": -1},
        {"bytes": True},
        {"entries": [{"kind": "fx-graph", "key": "k", "requested_s": 1.0}] * 201},
        {"entries": ["x"]},
        {"waits": [{"kind": "k", "key": "", "s": float("inf"), "at_s": 0.0, "tier": "t"}]},
        {"lookups": {"served": "1"}},
        {"by_tier": {"s3://b": {"n": 1}}},
        [],
    ],
)
def test_a_summary_with_a_hostile_prefetch_is_invalid(change: Any) -> None:
    built = summary.build({}, job="job", run="run-1-1-aa", started=1.0, ended=2.0)
    built["prefetch"] = {**recorded(), **change} if isinstance(change, dict) else change
    with pytest.raises(summary.SummaryError):
        summary.parse(summary.encode(built))
