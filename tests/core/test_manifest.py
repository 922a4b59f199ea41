"""Prefetch manifests: concurrent writers, union, compaction, prefetch single-flight."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from objcache.core import manifest
from objcache.core.manifest import Manifest, ManifestError, default_job_name
from objcache.core.tier import Tier, TierFlags
from objcache.core.tiered import TieredCache
from tests.core.fetch_once.test_nodelease import rank
from tests.support.memory_backend import MemoryBackend
from tests.support.tiers import CODEC, NS, make, mem, seed, tier
from tests.support.waiting import until


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


@pytest.mark.parametrize("budget", [0, 1])
async def test_prefetch_starts_no_fetch_while_unwritten_entries_pass_its_byte_budget(
    budget: int,
) -> None:
    writer, okeys, _ = await job_in_a_store(10)
    reader, local = make(writer.remotes[0])
    mem(local).delay_s = 0.02  # the local tier takes longer to write than the remote to read
    held_at_start: list[int] = []
    fetch = reader.get_object

    async def watched(okey: str, **kw: bool) -> tuple[bytes | None, str]:
        held_at_start.append(reader.landing_bytes)
        return await fetch(okey, **kw)

    reader.get_object = watched  # type: ignore[method-assign]
    result = await manifest.prefetch(reader, "job", concurrency=2, byte_budget=budget)
    await reader.flush(5)
    assert result["fetched"] == 10 and all(k in mem(local).data for k in okeys)
    assert reader.landing_bytes == 0 and reader.on_landed is None
    if budget:
        assert max(held_at_start) <= budget, "a fetch started over the budget"
    else:
        assert max(held_at_start) > 0, "without a budget, fetches outrun the local writes"


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


# --- names, wire format and parsing ---------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "job"),
    [
        (["/work/train.py", "--lr", "1"], "train"),
        (["-c"], "interactive"),
        (["-m"], "interactive"),
        (["python"], "interactive"),
        ([], "interactive"),
        ([""], "interactive"),
        (["/"], "python"),
    ],
)
def test_default_job_name_of_each_command_line(argv: list[str], job: str) -> None:
    assert default_job_name(argv) == job


def test_default_job_name_reads_this_process_s_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "argv", ["/srv/eval.py", "--fast"])
    assert default_job_name() == "eval"


def test_the_manifest_wire_format_is_compact_json_with_sorted_keys() -> None:
    """Other objcache versions on the fleet read these bytes: pinned."""
    a, b = NS.object_key("fx-graph", "a"), NS.object_key("fx-graph", "b")
    first, last = sorted([a, b])
    m = Manifest("j", frozenset({b, a}), 1.5)
    assert m.to_bytes() == (
        b'{"format":1,"job":"j","created":1.5,"keys":["'
        + first.encode()
        + b'","'
        + last.encode()
        + b'"]}'
    )


@pytest.mark.parametrize(
    "body",
    [
        {"format": 2, "job": "j", "created": 1, "keys": []},
        {"format": 1, "job": 7, "created": 1, "keys": []},
        {"format": 1, "job": "j", "created": 1, "keys": "abc"},
        {"format": 1, "job": "j", "created": True, "keys": []},
        {"format": 1, "job": "j", "created": "1", "keys": []},
        {"format": 1, "job": "j", "keys": []},
        {"format": 1, "job": "j", "created": 1, "keys": [3]},
    ],
)
def test_a_manifest_with_a_bad_field_is_refused(body: dict[str, object]) -> None:
    with pytest.raises(ManifestError):
        Manifest.from_bytes(json.dumps(body).encode())


def test_a_manifest_may_list_up_to_max_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest, "MAX_KEYS", 2)
    keys = [NS.object_key("fx-graph", k) for k in "abc"]
    body = {"format": 1, "job": "j", "created": 1, "keys": keys[:2]}
    assert len(Manifest.from_bytes(json.dumps(body).encode()).keys) == 2
    with pytest.raises(ManifestError):
        Manifest.from_bytes(json.dumps({**body, "keys": keys}).encode())


def test_run_and_merged_manifest_names() -> None:
    """Runs are unique per process and call; a merged manifest is named by its key set
    alone, the same in every process and version (two compactors write one object)."""
    run = manifest._run_name("job")
    assert re.fullmatch(rf"job/run-\d+-{os.getpid()}-[0-9a-f]{{8}}", run), run
    assert manifest._run_name("job") != run
    keys = ["v1/e/fx-graph/ab/b", "v1/e/fx-graph/ab/a"]
    digest = hashlib.blake2b(b"v1/e/fx-graph/ab/a\nv1/e/fx-graph/ab/b", digest_size=8)
    assert manifest._merged_name("job", keys) == f"job/merged-{digest.hexdigest()}"
    assert manifest._merged_name("job", reversed(keys)) == manifest._merged_name("job", keys)
    assert manifest._merged_name("job", keys[:1]) != manifest._merged_name("job", keys)


# --- listing, reading, writing and compacting a job's manifests -----------------------------


def failing_list_tier(name: str, fault: str, timeout: float = 1.0) -> Tier:
    t = tier(name, timeout=timeout)
    mem(t).fault = fault
    return t


async def test_manifests_are_listed_from_the_first_tier_that_can_list_them() -> None:
    """Skipped: a write-only tier, an open breaker, a tier whose listing fails or hangs."""
    good = tier("mem://good")
    for job in ("train", "training"):
        seed(good, f"{job}/run-1", b"x", kind=manifest.KIND)
    write_only = tier("mem://write-only", flags=TierFlags(write_only=True))
    tripped = tier("mem://tripped")
    for _ in range(3):
        tripped.breaker.failure()
    cache, _ = make(
        write_only,
        tripped,
        failing_list_tier("mem://failing", "permanent"),
        failing_list_tier("mem://hung", "hang", timeout=0.1),
        good,
    )
    assert tripped.breaker_open()
    assert await manifest.list_manifests(cache, "train") == ["train/run-1"]
    assert mem(write_only).calls["list"] == mem(tripped).calls["list"] == 0


async def test_read_job_skips_unreadable_manifests_and_reads_the_rest() -> None:
    store = tier("mem://store")
    good = Manifest("job", frozenset({NS.object_key("fx-graph", "k")}), 1.0).to_bytes()
    seed(store, "job/a-not-json", b"{", kind=manifest.KIND)
    seed(store, "job/b-good", good, kind=manifest.KIND)
    okey = NS.object_key(manifest.KIND, "job/c-corrupt")
    mem(store).data[okey] = CODEC.encode(good, okey)[:-1] + b"!"
    seed(store, "job/d-good", good, kind=manifest.KIND)
    cache, _ = make(store)
    keys, read = await manifest.read_job(cache, "job")
    assert keys == {NS.object_key("fx-graph", "k")}
    assert sorted(read) == ["job/b-good", "job/d-good"]


async def test_write_run_is_named_by_the_run_id_when_given() -> None:
    caches, store = shared_store_caches(1)
    cache = caches[0]
    key = NS.object_key("fx-graph", "k")
    assert await manifest.write_run(cache, "job", [key], run_id="r-42") == "job/r-42"
    cache.recorded = {key, NS.object_key(manifest.KIND, "job/older")}
    assert await manifest.record_run(cache, "job", "r-43") == "job/r-43"
    await cache.flush(5)
    okey = NS.object_key(manifest.KIND, "job/r-43")
    payload = CODEC.decode(store.data[okey], okey)
    assert Manifest.from_bytes(payload).keys == {key}  # manifests never list manifests


async def test_compaction_starts_past_compact_after_runs_and_never_when_read_only() -> None:
    caches, _ = shared_store_caches(1)
    cache = caches[0]
    for i in range(manifest.COMPACT_AFTER):
        await manifest.write_run(cache, "job", {NS.object_key("fx-graph", f"k{i}")})
    await cache.flush(5)
    keys, names = await manifest.read_job(cache, "job")
    assert not await manifest.compact(cache, "job", keys, names)  # exactly the threshold
    await manifest.write_run(cache, "job", {NS.object_key("fx-graph", "one-more")})
    await cache.flush(5)
    keys, names = await manifest.read_job(cache, "job")
    reader, _ = make(caches[0].remotes[0], read_only=True)
    assert not await manifest.compact(reader, "job", keys, names)
    assert len(await manifest.list_manifests(cache, "job")) == manifest.COMPACT_AFTER + 1
    assert await manifest.compact(cache, "job", keys, names)
    left = await manifest.list_manifests(cache, "job")
    assert len(left) == 1 and "/merged-" in left[0]
    merged = NS.object_key(manifest.KIND, left[0])
    assert cache.local is not None and merged in mem(cache.local).data  # kept locally too


async def test_prefetch_reports_what_it_did() -> None:
    writer, okeys, _ = await job_in_a_store(6)
    for _ in range(manifest.COMPACT_AFTER):  # enough runs to compact
        await manifest.write_run(writer, "job", okeys[:1])
    await writer.flush(5)
    reader, local = make(writer.remotes[0])
    for okey in okeys[:2]:  # already local
        mem(local).data[okey] = mem(writer.remotes[0]).data[okey]
    planned: list[int] = []
    done: list[int] = []
    result = await manifest.prefetch(
        reader, "job", concurrency=2, progress=done.append, planned=planned.append
    )
    seconds = result.pop("seconds")
    fetched = [reader.codec.decode(mem(local).data[k], k) for k in okeys[2:]]
    assert planned == [4], "told the entries to fetch before fetching them"
    assert sorted(done) == sorted(len(p) for p in fetched), "each fetched entry's bytes, once"
    assert result == {
        "job": "job",
        "manifests": manifest.COMPACT_AFTER + 1,
        "keys": 6,
        "fetched": 4,
        "bytes": sum(done),
        "already_local": 2,
        "fetched_by_another_process": 0,
        "ordered": 0,
        "order_dropped": 0,
        "compacted": True,
    }
    assert isinstance(seconds, float) and 0 <= seconds < 2.9 and round(seconds, 3) == seconds
    assert reader.prefetched == set(okeys)
    left = await manifest.list_manifests(reader, "job")  # compacted into the job's own
    assert len(left) == 1 and left[0].startswith("job/merged-")


async def test_prefetch_leaves_a_key_another_process_is_fetching_to_it(tmp_path: Path) -> None:
    """Two ranks on one local dir: a key leased by the first is not fetched by the second's
    prefetch, and is reported as fetched by another process."""
    slow, remote = MemoryBackend("mem://slow"), MemoryBackend("mem://store")
    okeys = [NS.object_key("fx-graph", f"k{i}") for i in range(4)]
    for i, okey in enumerate(okeys):
        slow.data[okey] = remote.data[okey] = CODEC.encode(f"v{i}".encode(), okey)
    job = Manifest("job", frozenset(okeys), 1.0).to_bytes()
    mokey = NS.object_key(manifest.KIND, "job/run-1")
    remote.data[mokey] = CODEC.encode(job, mokey)
    first, second = rank(tmp_path, slow), rank(tmp_path, remote)
    slow.hold_until = asyncio.Event()  # the first rank's fetch lasts until the prefetch ends
    holder = asyncio.ensure_future(first.get("fx-graph", "k0"))
    await until(lambda: first.stats.node_leases["held"] >= 1, what="the first rank's lease")
    result = await manifest.prefetch(second, "job")
    slow.hold_until.set()
    assert result["fetched_by_another_process"] == 1 and result["fetched"] == 3
    assert await holder == b"v0" and remote.calls["get"] == 1 + 3  # the manifest, 3 entries
    await first.flush(5)
    await second.flush(5)


async def test_a_new_machine_fetches_in_the_order_a_start_asked_and_tells_its_listeners() -> None:
    """The manifest records the order of a run's first lookups; the next machine's prefetch
    fetches in that order (shuffled only within a window fetched at once) and tells each
    listener every key as it is local (docs/architecture.md, "Prefetch ordered by need")."""
    writer, okeys, _ = await job_in_a_store(12)
    need = list(reversed(okeys))  # asked last-written first
    await manifest.write_run(writer, "ordered", okeys, order=need)
    await writer.flush(5)
    reader, local = make(writer.remotes[0])
    mem(local).data[okeys[0]] = mem(writer.remotes[0]).data[okeys[0]]  # already local
    told: list[tuple[str, bool]] = []
    reader.prefetch_listeners.append(lambda okey, payload: told.append((okey, payload is None)))
    result = await manifest.prefetch(reader, "ordered", concurrency=1)
    assert result["ordered"] == 11 and result["order_dropped"] == 0
    fetched = [k for k, was_local in told if not was_local]
    assert fetched == need[:-1], "one at a time: exactly the order of need"
    assert [k for k, was_local in told if was_local] == [okeys[0]]


async def test_lookups_are_remembered_in_first_asked_order_and_written_with_the_run() -> None:
    writer, okeys, _ = await job_in_a_store(3)
    reader, _local = make(writer.remotes[0])
    for key in ("k2", "k0", "k2", "k1"):
        await reader.get("fx-graph", key)
    assert list(reader.asked) == [okeys[2], okeys[0], okeys[1]]
    await manifest.record_run(reader, "asked")
    await reader.flush(5)
    _, _, need = await manifest.read_job_ordered(reader, "asked")
    assert sorted(need.rank, key=need.rank.__getitem__) == [okeys[2], okeys[0], okeys[1]]


async def test_a_candidate_ranks_where_its_folder_was_listed_and_an_unasked_write_where_made() -> (
    None
):
    """A guarded candidate's object key is only known once listed: it ranks where the run
    first listed its key's folder; an entry no lookup asked for (a kernel's place record)
    ranks where the run wrote it, next to what it goes with."""
    from objcache.core import candidates, writes

    writer, _okeys, _ = await job_in_a_store(1)
    reader, _local = make(writer.remotes[0])
    await reader.get("kernel", "first")  # a miss, asked first
    assert await candidates.get_candidates(reader, "fx-graph", "graph") == []
    await writes.put(reader, "kernel-place", "record", b"ab/cab.so")
    folder = await candidates.put_candidate(reader, "fx-graph", "graph", b"g")
    await writes.put(reader, "kernel", "first", b"k")
    listed = {
        folder,
        *(
            reader.namespace.object_key(k, n)
            for k, n in (
                ("kernel-place", "record"),
                ("kernel", "first"),
                ("kernel", "never-asked-listed"),
            )
        ),
    }
    order = manifest.need_order(reader.asked, listed)
    assert order == [
        reader.namespace.object_key("kernel", "first"),
        folder,
        reader.namespace.object_key("kernel-place", "record"),
    ]
    await reader.flush(5)


def test_a_hostile_order_costs_a_bounded_parse_and_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = NS.object_key("fx-graph", "k")
    body = {"format": 1, "job": "j", "created": 1.0, "keys": [key]}
    hostile = [key, key, "v1/x/../y", 7, NS.object_key("fx-graph", "other")]
    parsed = Manifest.from_bytes(json.dumps({**body, "order": hostile}).encode())
    assert parsed.order == (key,) and parsed.order_dropped == 4
    monkeypatch.setattr(manifest, "MAX_KEYS", 3)
    for bad in ([key] * 4, {"a": 1}, "k"):
        with pytest.raises(ManifestError):
            Manifest.from_bytes(json.dumps({**body, "order": bad}).encode())
    ordered = Manifest("j", frozenset({key}), 1.0, (key, key, "v1/e/fx-graph/00/gone"))
    assert json.loads(ordered.to_bytes())["order"] == [key]
