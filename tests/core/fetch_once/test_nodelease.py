"""Lease files of cross-process single-flight (objcache/core/fetch_once/nodelease.py), on a
real filesystem.

Other holders are separate open file descriptions (flock locks conflict between them even in
one process) or real subprocesses, so the kernel's lock semantics are what is tested.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from objcache.backends.base import PutMode, TierSpec
from objcache.backends.disk.store import DiskBackend
from objcache.backends.fs_store import FsStore
from objcache.core.fetch_once import nodelease
from objcache.core.fetch_once.nodelease import (
    POLL_FIRST_S,
    POLL_MAX_S,
    RECORD_BYTES,
    Claim,
    NodeLeases,
    lease_path,
    poll_pause,
)
from objcache.core.fetch_once.singleflight import SingleFlight
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.read_decision import LEASED_ELSEWHERE
from objcache.core.tier import Tier
from objcache.core.tiered import TieredCache
from objcache.entry.codec import Codec
from objcache.entry.layout import Namespace
from tests.support.flock import blocked_on
from tests.support.memory_backend import MemoryBackend
from tests.support.node_worker import REPO
from tests.support.waiting import until

KEY = "v1/env/fx-graph/ab/key1"
NS = Namespace("testenv")
CODEC = Codec()


def write_record(path: str, record: dict[str, object]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(json.dumps(record).encode().ljust(RECORD_BYTES))


def read_json(path: str) -> dict[str, object]:
    with open(path, "rb") as f:
        record: dict[str, object] = json.load(f)
    return record


@pytest.fixture
def held(tmp_path: Path) -> Iterator[int]:
    """A lease of KEY held (flock) by another open file description, record not yet due."""
    path = lease_path(str(tmp_path), KEY)
    write_record(path, {"pid": 1, "host": "elsewhere", "deadline": time.time() + 60})
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    yield fd
    os.close(fd)


async def test_first_claim_holds_and_release_retires_the_file(tmp_path: Path) -> None:
    leases = NodeLeases(str(tmp_path), hold_s=5)
    claim, lease = await leases.claim(KEY)
    assert claim is Claim.HELD and lease is not None and not lease.took_over
    record = read_json(lease.path)
    deadline = record["deadline"]
    assert record["pid"] == os.getpid()
    assert isinstance(deadline, float) and deadline > time.time()
    assert record["host"]
    await lease.release("hit")
    with pytest.raises(FileNotFoundError):
        os.stat(lease.path)
    # the next claim starts on a fresh file
    claim, again = await leases.claim(KEY)
    assert claim is Claim.HELD and again is not None and not again.took_over
    await again.release("")


async def test_a_stale_lease_file_left_by_a_crash_is_taken_over_at_once(tmp_path: Path) -> None:
    path = lease_path(str(tmp_path), KEY)
    write_record(path, {"pid": 999_999_999, "host": "h", "deadline": time.time() + 3600})
    started = time.monotonic()
    claim, lease = await NodeLeases(str(tmp_path), hold_s=60).claim(KEY)
    assert claim is Claim.HELD and lease is not None and lease.took_over
    assert time.monotonic() - started < 20  # not the 60 s a waiter may wait
    await lease.release("hit")


async def test_waiters_see_the_holders_outcome(tmp_path: Path, held: int) -> None:
    fd = held
    leases = NodeLeases(str(tmp_path), hold_s=5)
    waiters = [asyncio.ensure_future(leases.claim(KEY)) for _ in range(3)]
    await blocked_on(lease_path(str(tmp_path), KEY), count=3)
    assert not any(w.done() for w in waiters)
    assert await leases.claim(KEY, wait=False) == (Claim.BUSY, None)
    os.pwrite(fd, json.dumps({"outcome": "hit", "deadline": 0}).encode().ljust(RECORD_BYTES), 0)
    assert [await w for w in waiters] == [(Claim.LANDED, None)] * 3


async def test_a_shared_miss_is_not_fetched_again(tmp_path: Path, held: int) -> None:
    fd = held
    waiter = asyncio.ensure_future(NodeLeases(str(tmp_path), hold_s=5).claim(KEY))
    await blocked_on(lease_path(str(tmp_path), KEY))
    os.pwrite(fd, json.dumps({"outcome": "miss"}).encode().ljust(RECORD_BYTES), 0)
    assert await waiter == (Claim.MISSED, None)


# --- lookup: the local entry read in the lease's own hops ---------------------------------


class Reads:
    """A blocking read of the entry that answers from ``answers`` in turn (the last
    repeats) and records the thread of every call."""

    def __init__(self, *answers: bytes | None) -> None:
        self.answers = list(answers)
        self.threads: list[str] = []

    def __call__(self) -> bytes | None:
        self.threads.append(threading.current_thread().name)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


async def test_lookup_of_an_entry_already_there_opens_no_lease_file(tmp_path: Path) -> None:
    read = Reads(b"entry")
    leases = NodeLeases(str(tmp_path), hold_s=5)
    assert await leases.lookup(KEY, read=read) == (Claim.LOCAL, None, b"entry")
    assert not exists(lease_path(str(tmp_path), KEY)) and len(read.threads) == 1
    # without look_first (the caller knows it is absent) the lease is taken, then it looks
    claim, lease, entry = await leases.lookup(KEY, read=Reads(None), look_first=False)
    assert claim is Claim.HELD and lease is not None and entry is None
    await lease.release("")


async def test_lookup_lets_go_of_a_lease_whose_entry_landed_meanwhile(tmp_path: Path) -> None:
    """Absent at the first look, there once the lease is taken: a hit, and the lease let go
    of as one (so a process waiting on it reads the entry too)."""
    read = Reads(None, b"entry")
    leases = NodeLeases(str(tmp_path), hold_s=5)
    assert await leases.lookup(KEY, read=read) == (Claim.LANDED, None, b"entry")
    assert len(read.threads) == 2 and read.threads[0] == read.threads[1]  # one hop
    assert not exists(lease_path(str(tmp_path), KEY))
    claim, lease = await leases.claim(KEY)  # not held by anyone
    assert claim is Claim.HELD and lease is not None and not lease.took_over
    await lease.release("")


async def test_a_waiter_gets_the_landed_entry_with_the_outcome(tmp_path: Path, held: int) -> None:
    read = Reads(None, b"entry")
    waiter = asyncio.ensure_future(NodeLeases(str(tmp_path), hold_s=5).lookup(KEY, read=read))
    await blocked_on(lease_path(str(tmp_path), KEY))
    assert not waiter.done() and read.threads and len(read.answers) == 1  # looked, missed
    os.pwrite(held, json.dumps({"outcome": "hit", "deadline": 0}).encode().ljust(RECORD_BYTES), 0)
    fcntl.flock(held, fcntl.LOCK_UN)
    assert await waiter == (Claim.LANDED, None, b"entry")


async def test_a_failing_read_is_a_miss_and_the_lease_is_taken(tmp_path: Path) -> None:
    def broken() -> bytes | None:
        raise OSError(5, "Input/output error")

    claim, lease, entry = await NodeLeases(str(tmp_path), hold_s=5).lookup(KEY, read=broken)
    assert claim is Claim.HELD and lease is not None and entry is None
    await lease.release("")


def test_waiters_poll_in_proportion_to_their_wait() -> None:
    """A short fetch is seen within a millisecond; a long wait polls rarely, never sleeps long."""
    assert poll_pause(0.0) == POLL_FIRST_S == 0.001
    assert poll_pause(0.004) == POLL_FIRST_S
    assert poll_pause(0.040) == pytest.approx(0.005)  # at most an eighth more wait
    assert poll_pause(0.5) == poll_pause(30.0) == POLL_MAX_S == 0.016


def exists(path: str) -> bool:
    return os.path.lexists(path)


def _no_space(fd: int, record: dict[str, object]) -> None:
    raise OSError(28, "No space left on device")


async def test_a_record_that_cannot_be_written_leaves_no_lease_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk: the claim goes unleased and no empty lease file is left behind."""
    monkeypatch.setattr("objcache.core.fetch_once.nodelease._write_record", _no_space)
    claim, lease = await NodeLeases(str(tmp_path), hold_s=5).claim(KEY)
    assert (claim, lease) == (Claim.UNLEASED, None)
    assert not exists(lease_path(str(tmp_path), KEY))


async def test_an_outcome_that_cannot_be_written_still_retires_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills while the holder fetches: its file goes; a waiter starts over."""
    leases = NodeLeases(str(tmp_path), hold_s=5)
    claim, first = await leases.claim(KEY)
    assert claim is Claim.HELD and first is not None
    waiter = asyncio.ensure_future(leases.claim(KEY))
    await blocked_on(first.path)  # else a late waiter makes a new file before the check
    # The waiter takes a new lease file at the same path as soon as the first is retired,
    # so the first file is watched through a descriptor of its own, not by its path.
    watch = os.open(first.path, os.O_RDONLY)
    write_record = nodelease._write_record

    def outcome_finds_no_space(fd: int, record: dict[str, object]) -> None:
        # only the holder's outcome: the waiter, woken as the file goes, claims while this
        # is still patched, and its own record must land
        if "outcome" in record:
            _no_space(fd, record)
        write_record(fd, record)

    try:
        with monkeypatch.context() as m:
            m.setattr("objcache.core.fetch_once.nodelease._write_record", outcome_finds_no_space)
            await first.release("hit")
        assert os.fstat(watch).st_nlink == 0
    finally:
        os.close(watch)
    claim, second = await asyncio.wait_for(waiter, 30)
    assert claim is Claim.HELD and second is not None
    await second.release("hit")
    assert not exists(second.path)


async def test_a_holder_that_gives_up_hands_the_lease_on(tmp_path: Path) -> None:
    leases = NodeLeases(str(tmp_path), hold_s=5)
    claim, first = await leases.claim(KEY)
    assert claim is Claim.HELD and first is not None
    waiter = asyncio.ensure_future(leases.claim(KEY))
    await blocked_on(first.path)
    await first.release("")  # failed without an outcome: the waiter must fetch itself
    claim, second = await asyncio.wait_for(waiter, 30)
    assert claim is Claim.HELD and second is not None
    await second.release("hit")


async def test_an_overdue_live_holder_is_taken_over(tmp_path: Path, held: int) -> None:
    fd = held
    os.pwrite(fd, json.dumps({"pid": 1, "deadline": time.time() + 0.2}).encode().ljust(256), 0)
    started = time.monotonic()
    claim, lease = await NodeLeases(str(tmp_path), hold_s=60).claim(KEY)
    waited = time.monotonic() - started
    assert claim is Claim.HELD and lease is not None
    assert 0.15 < waited < 20  # its deadline, not the 60 s a waiter may wait
    assert os.fstat(fd).st_nlink == 0  # the overdue holder's file was retired
    await lease.release("hit")


async def test_a_waiter_never_waits_past_its_budget(tmp_path: Path, held: int) -> None:
    fd = held
    os.pwrite(fd, b" " * RECORD_BYTES, 0)  # a holder that never wrote its deadline
    started = time.monotonic()
    claim, lease = await NodeLeases(str(tmp_path), hold_s=0.3).claim(KEY)
    assert (claim, lease) == (Claim.UNLEASED, None)
    assert time.monotonic() - started < 15  # the holder never lets go: without a budget, forever


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("POLL_MAX_S", 30.0),  # polls 30 s apart: only the blocked lock wakes it in time
        ("MAX_BLOCKED", 0),  # no thread to spare: it polls
    ],
)
async def test_a_waiter_sees_the_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, value: float
) -> None:
    monkeypatch.setattr(f"objcache.core.fetch_once.nodelease.{setting}", value)
    polls: list[float] = []
    monkeypatch.setattr(
        "objcache.core.fetch_once.nodelease.poll_pause",
        lambda waited: polls.append(waited) or poll_pause(waited),
    )
    before = lease_wait_threads()
    leases = NodeLeases(str(tmp_path), hold_s=60)
    claim, first = await leases.claim(KEY)
    assert claim is Claim.HELD and first is not None
    waiter = asyncio.ensure_future(leases.claim(KEY))
    if setting == "MAX_BLOCKED":
        await until(lambda: len(polls) >= 2, what="the waiter polling")
    else:
        await blocked_on(first.path)
    assert not waiter.done()
    if setting == "MAX_BLOCKED":
        assert lease_wait_threads() <= before  # (earlier tests' threads may still be ending)
    await first.release("hit")
    assert await asyncio.wait_for(waiter, 60) == (Claim.LANDED, None)


def lease_wait_threads() -> int:
    return sum(t.name == "objcache-lease-wait" for t in threading.enumerate())


WAITS_ON_A_HUNG_HOLDER = """
import asyncio, fcntl, os, sys
from objcache.core.fetch_once.nodelease import Claim, NodeLeases, lease_path
root, key = sys.argv[1], sys.argv[2]
path = lease_path(root, key)
os.makedirs(os.path.dirname(path), exist_ok=True)
hung = os.open(path, os.O_RDWR | os.O_CREAT)  # a holder that never lets go
fcntl.flock(hung, fcntl.LOCK_EX)
claim, _ = asyncio.run(NodeLeases(root, hold_s=0.3).claim(key))
print(claim.value, flush=True)
"""


def test_a_thread_blocked_on_a_hung_holder_never_holds_up_exit(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WAITS_ON_A_HUNG_HOLDER, str(tmp_path), KEY],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "unleased"


HOLDER = """
import asyncio, sys, time
from objcache.core.fetch_once.nodelease import NodeLeases
async def main():
    claim, lease = await NodeLeases(sys.argv[1], hold_s=60).claim(sys.argv[2])
    print(claim.value, flush=True)
    time.sleep(600)
asyncio.run(main())
"""


async def test_a_holder_killed_mid_fetch_is_taken_over(tmp_path: Path) -> None:
    proc = subprocess.Popen(  # noqa: ASYNC220 - the holder must be another process
        [sys.executable, "-c", HOLDER, str(tmp_path), KEY], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        leases = NodeLeases(str(tmp_path), hold_s=30)
        waiter = asyncio.ensure_future(leases.claim(KEY))
        await blocked_on(lease_path(str(tmp_path), KEY))
        assert not waiter.done()
        proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        claim, lease = await asyncio.wait_for(waiter, 60)
        assert claim is Claim.HELD and lease is not None and lease.took_over
        assert time.monotonic() - killed < 15  # not the holder's 60 s deadline
        await lease.release("hit")
    finally:
        proc.kill()
        proc.wait()


def test_stale_lease_files_are_swept_and_never_listed(tmp_path: Path) -> None:
    store = FsStore(str(tmp_path), fsync=False, touch_on_read=False)
    store.write(KEY, b"entry", PutMode.CREATE)
    old = lease_path(str(tmp_path), "v1/env/fx-graph/ab/gone")
    fresh = lease_path(str(tmp_path), "v1/env/fx-graph/ab/busy")
    write_record(old, {"pid": 1})
    write_record(fresh, {"pid": 1})
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert set(store.scan_all()) == {KEY}
    assert not os.path.exists(old) and os.path.exists(fresh)


# --- two "processes" (two TieredCaches, one local dir) in one loop -------------------------


def rank(root: Path, remote: MemoryBackend) -> TieredCache:
    policy = RetryPolicy(timeout_s=2.0, retries=0)
    spec = TierSpec(url=f"disk://{root}", scheme="disk", location="", path=str(root))
    local = Tier(DiskBackend(spec), policy, CircuitBreaker(5, 60))
    return TieredCache(
        local,
        [Tier(remote, policy, CircuitBreaker(5, 60))],
        CODEC,
        NS,
        leases=NodeLeases(str(root), hold_s=3.0),
    )


async def test_a_holder_whose_fetch_failed_shares_no_miss(tmp_path: Path) -> None:
    sick, healthy = MemoryBackend("mem://sick"), MemoryBackend("mem://healthy")
    sick.fault, sick.hold_until = "transient", asyncio.Event()
    okey = NS.object_key("fx-graph", "k")
    healthy.data[okey] = CODEC.encode(b"value", okey)
    first, second = rank(tmp_path, sick), rank(tmp_path, healthy)
    holder = asyncio.ensure_future(first.get("fx-graph", "k"))
    await until(lambda: first.stats.node_leases["held"] == 1)
    waiter = asyncio.ensure_future(second.get("fx-graph", "k"))
    await blocked_on(lease_path(str(tmp_path), okey))
    sick.hold_until.set()  # now the holder's GET fails
    assert await waiter == b"value"
    assert await holder is None
    assert second.stats.node_leases["held"] == 1 and healthy.calls["get"] == 1


async def test_absent_everywhere_is_one_remote_get_per_node(tmp_path: Path) -> None:
    slow, other = MemoryBackend("mem://a"), MemoryBackend("mem://b")
    slow.hold_until = asyncio.Event()
    first, second = rank(tmp_path, slow), rank(tmp_path, other)
    holder = asyncio.ensure_future(first.get("fx-graph", "k"))
    await until(lambda: first.stats.node_leases["held"] == 1)
    waiter = asyncio.ensure_future(second.get("fx-graph", "k"))
    await blocked_on(lease_path(str(tmp_path), NS.object_key("fx-graph", "k")))
    slow.hold_until.set()
    assert await waiter is None
    assert await holder is None
    assert second.stats.node_leases["missed"] == 1 and other.calls["get"] == 0


def holding_value() -> tuple[MemoryBackend, str]:
    """A remote tier holding b"value" under ("fx-graph", "k"), and its object key."""
    remote = MemoryBackend("mem://r")
    okey = NS.object_key("fx-graph", "k")
    remote.data[okey] = CODEC.encode(b"value", okey)
    return remote, okey


async def test_a_leased_lookup_is_one_local_miss_and_a_local_hit_no_lease_file(
    tmp_path: Path,
) -> None:
    remote, okey = holding_value()
    first = rank(tmp_path, remote)
    assert await first.get("fx-graph", "k") == b"value"
    assert first.local is not None and first.local.stats.misses["absent"] == 1
    assert first.stats.node_leases["held"] == 1
    await first.flush(5)
    second = rank(tmp_path, remote)
    for _ in range(2):
        assert await second.get("fx-graph", "k") == b"value"
    assert second.local is not None and second.local.stats.hits == 2
    assert second.local.stats.bytes_read == 2 * len(remote.data[okey])
    assert second.local.stats.kinds == {"fx-graph": Counter({"hit": 2})}
    assert second.local.stats.misses["absent"] == 0 and not second.stats.node_leases
    assert remote.calls["get"] == 1
    assert not exists(lease_path(str(tmp_path), okey))


async def test_a_corrupt_local_entry_found_by_the_leased_look_is_quarantined(
    tmp_path: Path,
) -> None:
    remote, okey = holding_value()
    good = remote.data[okey]
    corrupt = good[:-1] + bytes([good[-1] ^ 1])
    store = FsStore(str(tmp_path), fsync=False, touch_on_read=False)
    store.write(okey, corrupt, PutMode.CREATE)
    cache = rank(tmp_path, remote)
    assert await cache.get("fx-graph", "k") == b"value"
    assert cache.local is not None and sum(cache.local.stats.misses.values()) == 1
    assert remote.calls["get"] == 1
    await cache.flush(5)
    assert store.read(okey) == good  # written through over the quarantined one


async def test_a_lookup_that_joined_a_prefetch_left_to_another_rank_waits(
    tmp_path: Path,
) -> None:
    slow, other = MemoryBackend("mem://a"), MemoryBackend("mem://b")
    okey = NS.object_key("fx-graph", "k")
    slow.data[okey] = other.data[okey] = CODEC.encode(b"value", okey)
    slow.hold_until = asyncio.Event()
    first, second = rank(tmp_path, slow), rank(tmp_path, other)
    holder = asyncio.ensure_future(first.get("fx-graph", "k"))
    await until(lambda: first.stats.node_leases["held"] == 1)
    prefetch = asyncio.ensure_future(second.get_object(okey, wait=False))
    lookup = asyncio.ensure_future(second.get("fx-graph", "k"))
    assert await prefetch == (None, LEASED_ELSEWHERE)
    await blocked_on(lease_path(str(tmp_path), okey))  # the lookup waits on the holder
    slow.hold_until.set()
    assert await lookup == b"value"
    assert await holder == b"value"
    assert other.calls["get"] == 0  # the second rank read what the first wrote through
    await first.flush(5)


async def test_a_finished_fetch_whose_cleanup_has_not_run_is_not_joined() -> None:
    """A task's done callbacks run a loop turn after it finishes; a lookup arriving in that
    window must start a new fetch, or a retry after a prefetch left a key to another rank
    would get the same "leased elsewhere" answer again (a miss)."""
    flight: SingleFlight[str] = SingleFlight()
    finished = asyncio.get_running_loop().create_future()
    finished.set_result("old answer")
    flight._inflight["k"] = finished  # done, cleanup pending

    async def fetch() -> str:
        return "fresh"

    assert await flight.do("k", fetch) == ("fresh", False)
