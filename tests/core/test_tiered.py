"""The read engine (objcache/core/tiered.py): local first, remote tiers raced in priority order
within the grace, single-flight, write-through (the landing entry, node leases let go of),
back-fill, breakers, read-only, refusal of bad entries, flush. Uses the in-process
MemoryBackend; the real backends are covered by the contract suite. The decisions the engine
drives are tested without I/O in tests/core/test_read_decision.py; the modules built on it
have their own test files (tests/core/test_reads.py, test_writes.py, test_writebehind.py,
test_tiered_records.py, test_candidates.py, test_leased_lookup.py)."""

from __future__ import annotations

import asyncio
import functools
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from objcache.backends.base import PutMode
from objcache.backends.disk.store import DiskBackend
from objcache.backends.fs_store import QUARANTINE_DIR
from objcache.config.urls import parse_tier_url
from objcache.core.fetch_once.nodelease import Claim, NodeLeases, lease_path
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.reads import read_local_sync
from objcache.core.tier import Tier, TierFlags
from objcache.core.tiered import OFFLOAD_BYTES, PRIORITY_GRACE_S, TieredCache
from objcache.core.tiered_records import get_record, update_record
from objcache.core.writes import put
from objcache.entry.caps import SizeCaps
from objcache.entry.codec import Codec
from objcache.entry.layout import Namespace
from tests.support.flock import blocked_on
from tests.support.memory_backend import MemoryBackend
from tests.support.tiers import CODEC, NS, appending, disk_tier, leased_cache, make, mem, seed, tier
from tests.support.waiting import until


async def test_local_hit_asks_no_remote() -> None:
    remote = tier("mem://r")
    cache, local = make(remote)
    seed(local, "k", b"v")
    assert await cache.get("fx-graph", "k") == b"v"
    assert mem(remote).calls["get"] == 0


async def test_remote_hit_is_written_through_to_local() -> None:
    remote = tier("mem://r")
    cache, local = make(remote)
    okey = seed(remote, "k", b"v")
    assert await cache.get("fx-graph", "k") == b"v"
    await cache.flush(5)
    assert CODEC.decode(mem(local).data[okey], okey) == b"v"
    assert cache.stats.write_through == 1
    assert await cache.get("fx-graph", "k") == b"v"
    assert mem(remote).calls["get"] == 1, "second lookup is local"


async def test_remote_tiers_are_asked_concurrently() -> None:
    a, b, c = tier("mem://a"), tier("mem://b"), tier("mem://c")
    gate = asyncio.Event()
    for t in (a, b, c):
        mem(t).hold_until = gate
    seed(c, "k", b"from-c")
    cache, _ = make(a, b, c)
    lookup = asyncio.ensure_future(cache.get("fx-graph", "k"))
    # Asked one after another, b and c would not be asked while a's answer is held back.
    await until(lambda: all(mem(t).calls["get"] == 1 for t in (a, b, c)), what="three asks")
    gate.set()
    assert await lookup == b"from-c"


async def test_priority_order_wins_within_the_grace_and_losers_are_cancelled() -> None:
    near, far = tier("mem://near", timeout=60), tier("mem://far", timeout=60)
    mem(near).hold_until = asyncio.Event()
    seed(near, "k", b"near")
    seed(far, "k", b"far")
    cache, _ = make(near, far)
    cache.priority_grace_s = 60  # a grace no busy machine outlasts: near answers within it
    lookup = asyncio.ensure_future(cache.get("fx-graph", "k"))
    await until(lambda: mem(far).calls["get"] == 1, what="the far tier answering")
    mem(near).hold_until.set()
    assert await lookup == b"near"
    # A near tier slower than the grace does not hold the far hit: this one never answers
    # (its deadline, 60 s, is what a lookup without the grace would wait).
    mem(near).hold_until = asyncio.Event()
    cache.priority_grace_s = PRIORITY_GRACE_S
    seed(near, "k3", b"near")
    seed(far, "k3", b"far")
    started = time.perf_counter()
    assert await cache.get("fx-graph", "k3") == b"far"
    assert time.perf_counter() - started < 30
    slow = tier("mem://slow", timeout=60)
    mem(slow).hold_until = asyncio.Event()  # never answers
    fast = tier("mem://fast")
    seed(fast, "k2", b"fast")
    cache2, _ = make(fast, slow)
    started = time.perf_counter()
    assert await cache2.get("fx-graph", "k2") == b"fast"
    assert time.perf_counter() - started < 30, "the slow loser is cancelled, not awaited"
    for gated in (near, slow):
        gated_gate = mem(gated).hold_until
        assert gated_gate is not None
        gated_gate.set()
    await cache.flush(30)
    await cache2.flush(30)


async def test_faster_tiers_are_backfilled_but_not_when_read_only() -> None:
    near, far = tier("mem://near"), tier("mem://far")
    okey = seed(far, "k", b"v")
    cache, _ = make(near, far)
    assert await cache.get("fx-graph", "k") == b"v"
    await cache.flush(5)
    assert okey in mem(near).data and cache.stats.backfills == 1
    near2, far2 = tier("mem://near"), tier("mem://far")
    seed(far2, "k", b"v")
    ro, _ = make(near2, far2, read_only=True)
    assert await ro.get("fx-graph", "k") == b"v"
    await put(ro, "fx-graph", "other", b"x")
    await ro.flush(5)
    assert mem(near2).calls["put"] == 0 and mem(far2).calls["put"] == 0


async def test_corrupt_remote_entry_is_a_counted_miss_and_never_written_through() -> None:
    bad, good = tier("mem://bad"), tier("mem://good")
    okey = seed(bad, "k", b"v")
    mem(bad).data[okey] = mem(bad).data[okey][:-1] + b"!"
    cache, local = make(bad, good)
    assert await cache.get("fx-graph", "k") is None
    assert bad.stats.misses["corrupt"] == 1
    seed(good, "k", b"v")
    assert await cache.get("fx-graph", "k") == b"v"
    await cache.flush(5)
    assert CODEC.decode(mem(local).data[okey], okey) == b"v"


async def test_corrupt_local_entry_is_quarantined_and_the_lookup_goes_on(tmp_path: Path) -> None:
    disk = DiskBackend(parse_tier_url(f"disk://{tmp_path}"))
    local = Tier(disk, RetryPolicy(timeout_s=1.0), CircuitBreaker(3, 60))
    remote = tier("mem://r")
    okey = seed(remote, "k", b"good")
    corrupt = CODEC.encode(b"good", okey)[:-1] + b"!"
    assert await disk.put(okey, corrupt)
    cache = TieredCache(local, [remote], CODEC, NS)
    assert await cache.get("fx-graph", "k") == b"good", "a corrupt local entry is a miss"
    assert local.stats.misses["corrupt"] == 1
    assert mem(remote).calls["get"] == 1
    moved = list((tmp_path / QUARANTINE_DIR).iterdir())
    assert [p.read_bytes() for p in moved] == [corrupt]
    await cache.flush(5)
    assert CODEC.decode(await disk.get(okey) or b"", okey) == b"good", "written through afresh"
    await disk.close()


async def test_signed_cache_refuses_unsigned_entries() -> None:
    remote = tier("mem://r")
    seed(remote, "k", b"unsigned pickle")
    local = tier("mem://local")
    cache = TieredCache(local, [remote], Codec(signing_keys=(b"key".ljust(32, b"."),)), NS)
    assert await cache.get("fx-graph", "k") is None
    assert remote.stats.misses["unsigned"] == 1
    assert mem(local).calls["put"] == 0


async def test_single_flight_shares_one_fetch() -> None:
    remote = tier("mem://r", timeout=60)
    mem(remote).hold_until = gate = asyncio.Event()
    seed(remote, "k", b"v")
    cache, _ = make(remote)
    asked = Counter[str]()
    do = cache._flight.do

    async def counted(key: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        asked["do"] += 1  # a caller arriving while the fetch is held back joins it
        return await do(key, fn)

    cache._flight.do = counted  # type: ignore[method-assign]
    lookups = asyncio.gather(*(cache.get("fx-graph", "k") for _ in range(20)))
    await until(lambda: asked["do"] == 20, what="20 lookups asking")
    gate.set()
    assert await lookups == [b"v"] * 20
    assert mem(remote).calls["get"] == 1
    assert cache.stats.single_flight_shared == 19


async def test_hanging_tier_costs_one_deadline_then_the_breaker_skips_it() -> None:
    hung = tier("mem://hung", timeout=0.1)
    mem(hung).fault = "hang"
    cache, _ = make(hung)
    for i in range(3):
        started = time.perf_counter()
        assert await cache.get("fx-graph", f"k{i}") is None
        assert time.perf_counter() - started < 10  # the hang itself lasts an hour
    assert hung.breaker.state == "open" and hung.stats.breaker_opened == 1
    asked = mem(hung).calls["get"]
    assert await cache.get("fx-graph", "k-next") is None
    assert mem(hung).calls["get"] == asked, "open breaker: no call at all"
    assert hung.stats.misses["timeout"] == 3


# --- keys: what a machine that only verifies, or signs, accepts of its own and others' -------


def verify_only_codec() -> Codec:
    return Codec(verify_keys=(Ed25519PrivateKey.generate().public_key(),))


async def test_a_verifying_machine_reads_its_own_unsigned_local_entries(tmp_path: Path) -> None:
    """Local entries are checked for digest and binding, not signature: a machine that can
    only verify (no key to sign with) still reads back what it wrote itself."""
    codec = verify_only_codec()
    local = disk_tier(tmp_path)
    cache = TieredCache(local, [], codec, Namespace("e"))
    await put(cache, "fx-graph", "k", b"mine")
    hit = read_local_sync(cache, "fx-graph", "k")
    assert hit is not None and hit[0] == b"mine"
    for item in (b"a", b"b"):
        await update_record(cache, "pgo", "r", appending(item))
    assert await get_record(cache, "pgo", "r") == b"a,b"
    assert not cache.stats.records_unreadable


async def test_lookups_are_counted_once_each() -> None:
    remote = tier("mem://r")
    cache, _ = make(remote)
    seed(remote, "k", b"v")
    for _ in range(2):  # a remote hit, written through, then a local hit
        assert await cache.get("fx-graph", "k") == b"v"
        await cache.flush(5)
    assert await cache.get("fx-graph", "gone") is None
    assert cache.stats.gets == Counter({"fx-graph": 3}) and cache.stats.hits == Counter(
        {"fx-graph": 2}
    )
    assert cache.stats.served_by == Counter({"mem://r": 1, "mem://local": 1})
    assert cache.stats.lookups_served_by == cache.stats.served_by
    assert cache.stats.write_through == 1
    assert cache.stats.lookup.total == 3 and 0.01 < cache.stats.lookup.sum_ms < 60_000


async def test_a_payload_over_the_offload_size_round_trips() -> None:
    remote = tier("mem://r")
    cache, local = make(remote)
    big = random.Random(7).randbytes(OFFLOAD_BYTES + 1)
    await put(cache, "fx-graph", "big", big)
    await cache.flush(5)
    okey = NS.object_key("fx-graph", "big")
    assert CODEC.decode(mem(remote).data[okey], okey) == big
    assert CODEC.decode(mem(local).data[okey], okey) == big
    # read back from the remote (verified in a worker thread), and refused there when bad
    fresh, _ = make(remote)
    assert await fresh.get("fx-graph", "big") == big
    entry = mem(remote).data[okey]
    mem(remote).data[okey] = entry[:-1] + bytes([entry[-1] ^ 1])
    again, _ = make(remote)
    assert await again.get("fx-graph", "big") is None
    assert remote.stats.misses["corrupt"] == 1
    assert remote.stats.kinds["fx-graph"]["corrupt"] == 1


# --- node leases through the cache: what the other processes of the node see ---------------


async def test_a_write_through_tells_the_waiting_processes_it_landed(tmp_path: Path) -> None:
    remote = tier("mem://r")
    okey = seed(remote, "k", b"payload")
    entry = mem(remote).data[okey]
    cache = leased_cache(tmp_path, remote)
    assert cache.local_store is not None and cache.leases is not None
    claim, lease = await cache.leases.claim(okey)
    assert claim is Claim.HELD and lease is not None
    other = NodeLeases(str(tmp_path), hold_s=30)  # another rank of the node
    store = cache.local_store
    waiter = asyncio.ensure_future(
        other.lookup(okey, read=functools.partial(store.read_sync, okey), look_first=False)
    )
    await blocked_on(lease_path(str(tmp_path), okey))
    await cache.write_through(okey, entry, lease)
    assert await asyncio.wait_for(waiter, 60) == (Claim.LANDED, None, entry)
    assert cache.stats.write_through == 1
    await cache.close()


async def test_a_write_through_that_did_not_land_lets_the_waiters_fetch(tmp_path: Path) -> None:
    """The local tier refuses the entry before any write (its max_size): the lease is let go
    of without an outcome at once, not held until its deadline."""
    local = Tier(
        DiskBackend(parse_tier_url(f"disk://{tmp_path}")),
        RetryPolicy(timeout_s=2.0, retries=0),
        CircuitBreaker(5, 60),
        TierFlags(max_size=10),
    )
    remote = tier("mem://r")
    okey = seed(remote, "k", b"payload over ten bytes")
    cache = leased_cache(tmp_path, remote, local=local)
    assert cache.leases is not None
    claim, lease = await cache.leases.claim(okey)
    assert claim is Claim.HELD and lease is not None
    waiter = asyncio.ensure_future(NodeLeases(str(tmp_path), hold_s=30).claim(okey))
    await blocked_on(lease_path(str(tmp_path), okey))
    await cache.write_through(okey, mem(remote).data[okey], lease)
    claim, theirs = await asyncio.wait_for(waiter, 60)
    assert claim is Claim.HELD and theirs is not None  # it fetches for itself, now
    await theirs.release("")
    assert cache.stats.write_through == 0
    await cache.close()


async def test_a_write_through_whose_write_failed_lets_the_waiters_fetch(tmp_path: Path) -> None:
    """The write ran and failed (a file where the entry's folder should be): the lease is
    let go of without an outcome."""
    remote = tier("mem://r")
    okey = seed(remote, "k", b"payload")
    cache = leased_cache(tmp_path, remote)
    assert cache.leases is not None
    claim, lease = await cache.leases.claim(okey)
    assert claim is Claim.HELD and lease is not None
    folder = tmp_path / okey.rpartition("/")[0]
    for name in os.listdir(folder):  # only the lease file: the folder becomes a file
        os.rename(folder / name, tmp_path / name)
    folder.rmdir()
    folder.write_bytes(b"not a folder")
    await cache.write_through(okey, mem(remote).data[okey], lease)
    # Another process's claim (its lease path now runs through a file) is not told it landed.
    waiter = NodeLeases(str(tmp_path), hold_s=30).claim(okey)
    claim, theirs = await asyncio.wait_for(waiter, 30)
    assert claim is not Claim.LANDED
    if theirs is not None:
        await theirs.release("")
    assert cache.stats.write_through == 0
    await cache.close()


async def test_remote_lookups_hits_and_backfills_add_up() -> None:
    near, far = tier("mem://near"), tier("mem://far")
    keys = [seed(far, f"k{i}", b"v%d" % i) for i in range(2)]
    cache, _ = make(near, far)
    assert await cache.get_object(NS.object_key("fx-graph", "absent")) == (None, "")
    assert cache.recorded == set(), "a miss is not part of the run"
    for i in range(2):
        assert await cache.get("fx-graph", f"k{i}") == b"v%d" % i
    await cache.flush(5)
    assert cache.recorded == set(keys)
    assert cache.stats.served_by["mem://far"] == cache.stats.lookups_served_by["mem://far"] == 2
    assert far.stats.hits == 2 and far.stats.kinds["fx-graph"]["hit"] == 2
    assert cache.stats.backfills == 2 and all(k in mem(near).data for k in keys)
    assert not cache._background, "finished background tasks are let go of"


async def test_tiers_skipped_by_their_breaker_are_counted_and_the_next_one_asked() -> None:
    skipped, asked = tier("mem://skipped"), tier("mem://asked")
    seed(asked, "k", b"v")
    for _ in range(3):
        skipped.breaker.failure()
    cache, _ = make(skipped, asked)
    for key in ("k", "absent"):
        await cache.get("fx-graph", key)
    assert skipped.stats.misses["breaker"] == 2
    assert skipped.stats.kinds["fx-graph"]["breaker"] == 2
    assert mem(skipped).calls["get"] == 0 and mem(asked).calls["get"] == 2


class GatedPuts(MemoryBackend):
    """A memory backend whose puts wait for ``gate`` (reads answer at once)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.gate = asyncio.Event()

    async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
        await self.gate.wait()
        return await super().put(key, data, mode)


def gated_tier(name: str, timeout: float = 30) -> tuple[Tier, GatedPuts]:
    backend = GatedPuts(name)
    return Tier(backend, RetryPolicy(timeout_s=timeout, retries=0), CircuitBreaker(3, 60)), backend


async def test_a_lookup_during_a_write_through_is_served_from_memory() -> None:
    remote = tier("mem://r")
    seed(remote, "k", b"v")
    local, gated = gated_tier("mem://local")
    cache = TieredCache(local, [remote], CODEC, NS)
    assert await cache.get("fx-graph", "k") == b"v"
    assert await cache.get("fx-graph", "k") == b"v"  # the write-through is still waiting
    assert mem(remote).calls["get"] == 1
    gated.gate.set()
    await cache.flush(5)
    assert await cache.get("fx-graph", "k") == b"v"
    assert gated.calls["get"] == 2, "the second lookup did not read the local tier"


async def test_a_leased_lookup_that_raises_lets_its_lease_go(tmp_path: Path) -> None:
    remote = tier("mem://r")
    okey = seed(remote, "k", b"v")
    cache = leased_cache(tmp_path, remote)

    async def broken(okey: str, cap: int, reasons: list[str] | None = None) -> None:
        raise RuntimeError("a bug in the remote race")

    cache.race_remotes = broken  # type: ignore[method-assign,assignment]
    with pytest.raises(RuntimeError):
        await cache.get_object(okey)
    claim, lease = await asyncio.wait_for(NodeLeases(str(tmp_path), hold_s=90).claim(okey), 30)
    assert claim is Claim.HELD and lease is not None  # not waited for: it was let go of
    await lease.release("")
    await cache.close(1)


async def test_a_local_entry_over_its_kind_s_remote_cap_is_served() -> None:
    """Caps bound what a remote tier may hand this machine; the local tier's entries were
    checked on the way in."""
    local = tier("mem://local")
    cache = TieredCache(local, [], CODEC, NS, caps=SizeCaps(per_kind={"fx-graph": 64}))
    big = random.Random(3).randbytes(500)
    seed(local, "k", big)
    assert await cache.get("fx-graph", "k") == big


async def test_flush_gives_up_on_hung_background_work_at_its_timeout() -> None:
    near, gated = gated_tier("mem://near")  # its back-fill never gets through
    far = tier("mem://far")
    seed(far, "k", b"v")
    cache, _ = make(near, far)
    assert await cache.get("fx-graph", "k") == b"v"
    started = time.monotonic()
    await cache.flush(0.2)
    assert time.monotonic() - started < 15  # the back-fill's own deadline is 30 s
    assert cache._background, "the back-fill is still waiting"
    gated.gate.set()
    await cache.flush(5)


async def test_a_tier_that_cannot_be_read_is_passed_over_for_the_next() -> None:
    write_only = tier("mem://wo", flags=TierFlags(write_only=True))
    readable = tier("mem://r")
    seed(readable, "k", b"v")
    cache, local = make(write_only, readable)
    assert await cache.get("fx-graph", "k") == b"v"
    assert mem(write_only).calls["get"] == 0
    await cache.flush(5)
    assert await cache.get("fx-graph", "k") == b"v"  # now from the local tier, slow path
    assert local.stats.hits == 1 and local.stats.kinds["fx-graph"]["hit"] == 1


def test_a_key_that_is_not_an_object_key_gets_the_default_cap() -> None:
    cache, _ = make()
    assert cache.cap("not-an-object-key") == cache.caps.default
