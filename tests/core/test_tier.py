"""A ``Tier`` counts its own outcomes (hit, refused, miss, list failures) and a maintenance
command's tier has its own policy: the deadline, no retries, no breaker
(docs/architecture.md, "Policies")."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from objcache.backends.base import PutMode
from objcache.config.urls import parse_tier_url
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.tier import Tier, TierFlags
from objcache.errors import (
    ClockSkew,
    CorruptEntry,
    EntryTooLarge,
    InvalidKey,
    PermanentBackendError,
    TransientBackendError,
)
from tests.support.memory_backend import MemoryBackend
from tests.support.tiers import CODEC, NS, Versions, appending, disk_tier, make, mem, seed, tier


def test_hit_refused_and_miss_are_counted_by_the_tier(caplog: pytest.LogCaptureFixture) -> None:
    t = tier("mem://counted")
    t.hit("a")
    t.missed("b", "breaker")
    with caplog.at_level(logging.WARNING, logger="objcache"):
        t.refused("c", CorruptEntry("digest mismatch"))
        t.refused("d", CorruptEntry("digest mismatch"))
    stats = t.stats.as_dict()
    assert stats["hits"] == 1
    assert stats["misses"] == {"breaker": 1, "corrupt": 2}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, "a refusal is logged once per reason"


async def test_a_lookup_counts_each_tier_outcome_on_that_tier() -> None:
    good, bad = tier("mem://good"), tier("mem://bad")
    cache, local = make(bad, good)
    seed(good, "k", b"payload")
    okey = NS.object_key("fx-graph", "k")
    mem(bad).data[okey] = b"garbage"
    assert await cache.get("fx-graph", "k") == b"payload"
    assert local.stats.misses["absent"] == 1
    assert bad.stats.misses["corrupt"] == 1 and bad.stats.hits == 0
    assert good.stats.hits == 1
    assert cache.stats.served_by[good.name] == 1


async def test_list_is_public_and_a_failure_is_a_counted_miss() -> None:
    t = tier("mem://listed")
    mem(t).data = {"p/a": b"1", "p/b": b"2", "q/c": b"3"}
    infos = await t.list("p/")
    assert infos is not None and sorted(i.key for i in infos) == ["p/a", "p/b"]
    mem(t).fault = "permanent"
    assert await t.list("p/") is None
    assert t.stats.misses["list"] == 1


async def test_a_node_down_in_a_sharded_store_misses_its_keys_and_spares_the_breaker() -> None:
    """A partial outage (a Redis Cluster primary down while the others answer) is the key's
    miss, never the tier's failure: past the breaker's threshold the tier still serves; the
    same number of whole-tier failures opens the breaker."""
    t = tier("mem://sharded")
    seed(t, "k", b"payload")
    mem(t).fault = "partial"
    for _ in range(t.breaker.threshold * 3):
        assert await t.get("v1/x") == (None, "error")
    assert not t.breaker_open()
    mem(t).fault = ""
    data, reason = await t.get(NS.object_key("fx-graph", "k"))
    assert data is not None and reason == ""
    mem(t).fault = "transient"
    for _ in range(t.breaker.threshold):
        await t.get("v1/x")
    assert t.breaker_open()


async def test_a_command_tier_tries_once_and_has_no_breaker() -> None:
    backend = MemoryBackend("mem://cmd")
    backend.fault = "transient"
    bounded = Tier.for_command(backend, timeout_ms=30_000).bounded()
    for _ in range(10):  # well past any breaker threshold
        with pytest.raises(TransientBackendError, match="injected"):
            await bounded.get("k")
    assert backend.calls["get"] == 10, "one call each: no retries, never skipped"
    backend.fault = "permanent"
    with pytest.raises(PermanentBackendError):
        await bounded.exists("k")


async def test_a_command_tier_bounds_each_call_and_each_listing_page() -> None:
    backend = MemoryBackend("mem://hung")
    backend.data = {"k": CODEC.encode(b"x", "k")}
    bounded = Tier.for_command(backend, timeout_ms=50).bounded()
    assert [i.key async for i in bounded.list("")] == ["k"]
    backend.fault = "hang"
    with pytest.raises(TransientBackendError, match="get: no answer within 50 ms"):
        await bounded.get("k")
    with pytest.raises(TransientBackendError, match="list: no answer within 50 ms"):
        _ = [i async for i in bounded.list("")]
    await asyncio.wait_for(bounded.close(), 30)  # a hung close costs one deadline, no error


async def test_a_command_queues_calls_past_a_backends_own_bound_before_their_deadline() -> None:
    """A backend whose calls run on a bounded pool of threads (GCS: ``max_in_flight``): a
    bulk command's calls past the bound wait for a slot before their deadline starts, so a
    queue behind a slow call is not a store that does not answer (a push of 1,000 entries to
    GCS 50 ms away lost a fifth of them to "no answer within 3001 ms")."""
    from objcache.core.tier import COMMAND_FLOOR_BYTES_PER_S

    backend = MemoryBackend("mem://pool")
    backend.max_in_flight = 1
    bounded = Tier.for_command(backend, timeout_ms=50).bounded()
    backend.hold_until = asyncio.Event()
    big = b"x" * (2 * COMMAND_FLOOR_BYTES_PER_S)  # two seconds more than the plain deadline
    first = asyncio.create_task(bounded.put("big", big))
    queued = [asyncio.create_task(bounded.put(f"k{i}", b"v")) for i in range(3)]
    while backend.calls["put"] < 1:
        await asyncio.sleep(0)
    await asyncio.sleep(0.2)  # four plain deadlines of a queued put
    assert backend.calls["put"] == 1, "the bound holds the other calls back"
    backend.hold_until.set()
    assert await first is True
    assert await asyncio.gather(*queued) == [True, True, True]


def test_the_tier_deadline_comes_from_its_url_else_the_default() -> None:

    own = MemoryBackend("mem://own")
    own.spec = parse_tier_url("file:///tmp/x?timeout_ms=1500")
    assert Tier.for_command(own, timeout_ms=300).policy.timeout_s == 1.5
    plain = MemoryBackend("mem://plain")
    assert Tier.for_command(plain, timeout_ms=300).policy.timeout_s == 0.3


async def test_a_command_write_gets_time_for_its_bytes() -> None:
    """A command's put has the tier's deadline plus one second per 4 MiB it sends
    (docs/architecture.md, "Policies"): a put of 8 MiB held past the plain deadline lands;
    a put that never answers still fails, at the longer deadline it was given."""
    from objcache.backends.base import PutMode
    from objcache.core.tier import COMMAND_FLOOR_BYTES_PER_S

    backend = MemoryBackend("mem://big")
    bounded = Tier.for_command(backend, timeout_ms=50).bounded()
    backend.hold_until = asyncio.Event()
    big = b"x" * (2 * COMMAND_FLOOR_BYTES_PER_S)
    put = asyncio.create_task(bounded.put("big", big, PutMode.CREATE))
    with pytest.raises(TransientBackendError, match="get: no answer within 50 ms"):
        await bounded.get("other")  # held as long as the plain deadline: too long for a get
    backend.hold_until.set()
    assert await put is True
    assert backend.data["big"] == big
    backend.fault = "hang"
    small = b"y" * (COMMAND_FLOOR_BYTES_PER_S // 100)  # 10 ms more
    with pytest.raises(TransientBackendError, match="put: no answer within 60 ms"):
        await bounded.put("small", small, PutMode.CREATE)


def test_tier_options_override_the_global_policy() -> None:
    backend = MemoryBackend("mem://opts")
    backend.spec.options.update(
        {"timeout_ms": "250", "retries": "4", "max_size": "1000", "write_only": "1", "home": "1"}
    )
    t = Tier.from_backend(
        backend, timeout_ms=3000, retries=2, breaker_failures=7, breaker_cooldown_s=9
    )
    assert (t.policy.timeout_s, t.policy.retries) == (0.25, 4)
    assert t.flags == TierFlags(write_only=True, max_size=1000, home=True)
    assert (t.breaker.threshold, t.breaker.cooldown_s) == (7, 9)
    plain = Tier.from_backend(
        MemoryBackend("mem://plain"),
        timeout_ms=3000,
        retries=2,
        breaker_failures=5,
        breaker_cooldown_s=30,
    )
    assert (plain.policy.timeout_s, plain.policy.retries) == (3.0, 2)
    assert plain.flags == TierFlags() and plain.readable and plain.writable


async def test_tier_delete_tells_deleted_absent_and_failed_apart() -> None:
    t = tier("mem://del")
    mem(t).data["k"] = b"v"
    assert await t.delete("k") is True
    assert await t.delete("k") is False
    mem(t).fault = "permanent"
    for _ in range(3):
        assert await t.delete("k") is None, "a failure is neither deleted nor absent"
    assert t.stats.breaker_opened == 1 and t.breaker_open(), "and counts against the breaker"


async def test_tier_counts_hits_misses_and_bytes_by_reason() -> None:
    t = tier("mem://stats")
    okey = NS.object_key("fx-graph", "k")
    mem(t).data[okey] = b"12345"
    assert await t.get(okey) == (b"12345", "")
    assert await t.get(okey, max_bytes=5) == (b"12345", "")
    assert await t.get(okey, max_bytes=4) == (None, "too_large")
    assert await t.get(NS.object_key("fx-graph", "absent")) == (None, "absent")
    mem(t).fault = "permanent"
    assert await t.get(okey) == (None, "error")
    assert t.stats.bytes_read == 10
    assert dict(t.stats.misses) == {"too_large": 1, "absent": 1, "error": 1}
    assert dict(t.stats.kinds["fx-graph"]) == {"too_large": 1, "absent": 1, "error": 1}
    assert t.stats.get_latency.total == 5


async def test_tier_put_accounting_and_its_size_limit() -> None:
    t = tier("mem://puts", flags=TierFlags(max_size=4))
    assert await t.put("a", b"1234") is True, "max_size itself is allowed"
    assert await t.put("a", b"1234") is True, "an existing entry counts as stored"
    assert await t.put("b", b"12345") is False
    assert (t.stats.puts, t.stats.bytes_written, t.stats.put_skipped_exists) == (1, 4, 1)
    mem(t).fault = "permanent"
    assert await t.put("c", b"1") is False
    assert dict(t.stats.put_errors) == {"too_large": 1, "error": 1}
    assert t.stats.put_latency.total == 3, "a refusal by size makes no call"
    assert sorted(mem(t).data) == ["a"]


def test_tier_defaults_come_from_the_global_policy() -> None:
    t = Tier.from_backend(
        MemoryBackend("mem://plain"),
        timeout_ms=2500,
        retries=3,
        breaker_failures=4,
        breaker_cooldown_s=8,
        read_only=True,
    )
    assert (t.policy.timeout_s, t.policy.retries) == (2.5, 3)
    assert (t.breaker.threshold, t.breaker.cooldown_s) == (4, 8)
    assert t.flags == TierFlags(read_only=True) and not t.writable and t.readable


# --- Tier: every failure is a miss with its reason, counted -----------------------------


class Raising(MemoryBackend):
    """Every call raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc

    async def _enter(self, op: str) -> None:
        self.calls[op] += 1
        raise self.exc


def one_shot_tier(backend: MemoryBackend) -> Tier:
    """A tier whose breaker opens on the first failure; no retries."""
    return Tier(backend, RetryPolicy(timeout_s=2.0, retries=0), CircuitBreaker(1, 60))


@pytest.mark.parametrize(
    ("exc", "reason", "tier_at_fault"),
    [
        (TimeoutError(), "timeout", True),
        (EntryTooLarge("over the limit"), "too_large", False),
        (InvalidKey("../escape"), "invalid_key", False),
        (ClockSkew("RequestTimeTooSkewed"), "clock_skew", False),
        (PermanentBackendError("AccessDenied"), "error", True),
        (TransientBackendError("connection reset"), "error", True),
        (OSError(5, "I/O error"), "error", True),
    ],
)
async def test_a_failure_is_a_miss_with_its_reason(
    exc: BaseException, reason: str, tier_at_fault: bool
) -> None:
    """The reason names the failure; only the tier's own faults count against its breaker."""
    backend = Raising(exc)
    tier = one_shot_tier(backend)
    assert await tier.get("k") == (None, reason)
    assert tier.stats.misses == Counter({reason: 1})
    assert tier.breaker_open() is tier_at_fault
    assert tier.stats.breaker_opened == int(tier_at_fault)
    if not tier_at_fault:  # answered, so the next call goes through and counts again
        assert not await tier.put("k", b"v") and not await tier.put("k", b"v")
        assert await tier.exists("k") is None and await tier.delete("k") is None
        assert await tier.get("k") == (None, reason)
        assert tier.stats.misses == Counter({reason: 2})
        assert tier.stats.put_errors == Counter({reason: 2})
        assert backend.calls == Counter({"get": 2, "put": 2, "exists": 1, "delete": 1})


async def test_each_time_the_breaker_opens_is_counted() -> None:
    backend = MemoryBackend("mem://flaky")
    tier = Tier(backend, RetryPolicy(timeout_s=2.0, retries=0), CircuitBreaker(1, 0.0))
    assert tier.stats.name == "mem://flaky"
    for fault in ("transient", "", "transient", "", "transient"):
        backend.fault = fault  # no cooldown: a probe that succeeds closes it again
        assert await tier.get("k") == ((None, "error") if fault else (None, "absent"))
    assert tier.stats.breaker_opened == 3


async def test_a_probe_without_a_verdict_lets_the_next_call_probe() -> None:
    """A half-open probe that ends in one node's outage, or that its caller cancels, neither
    closes nor re-opens the breaker, and gives its slot back: a cluster whose probe hit the
    dead primary's key served again once the replica took over (a slot left claimed refused
    every later call of the process)."""
    backend = MemoryBackend()
    tier = Tier(backend, RetryPolicy(timeout_s=2.0, retries=0), CircuitBreaker(1, 0.0))
    backend.fault = "transient"
    assert await tier.get("k") == (None, "error")  # opened; half-open at once (no cooldown)
    backend.fault = "partial"
    assert await tier.get("k") == (None, "error")  # the probe: one node's outage
    assert tier.breaker.state == "half-open" and tier.breaker.probe is None
    backend.fault = "hang"
    asked = backend.calls["get"]
    probe = asyncio.ensure_future(tier.get("k"))
    while backend.calls["get"] == asked:  # the probe reached the backend
        await asyncio.sleep(0)
    assert tier.breaker.probe is not None and await tier.get("k") == (None, "breaker")
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert tier.breaker.probe is None
    backend.fault = ""
    assert await tier.get("k") == (None, "absent")  # the next probe closes it
    assert tier.breaker.state == "closed"


async def test_an_open_breaker_is_a_breaker_miss_without_a_call() -> None:
    backend = MemoryBackend()
    backend.fault = "permanent"
    tier = one_shot_tier(backend)
    assert await tier.get("k") == (None, "error")
    backend.fault = ""
    for _ in range(2):
        assert await tier.get("k") == (None, "breaker")
    assert not await tier.put("k", b"v")
    assert await tier.exists("k") is None and await tier.delete("k") is None
    assert tier.stats.misses == Counter({"error": 1, "breaker": 2})
    assert tier.stats.put_errors == Counter({"breaker": 1})
    assert backend.calls == Counter({"get": 1})


async def test_tier_counters_add_up() -> None:
    """Counts and byte totals accumulate; latencies are milliseconds of the call."""
    backend = MemoryBackend()
    backend.delay_s = 0.02
    tier = Tier(backend, RetryPolicy(timeout_s=2.0, retries=0), CircuitBreaker(5, 60))
    for _ in range(2):
        assert await tier.get("gone") == (None, "absent")
    assert tier.stats.misses == Counter({"absent": 2})
    assert await tier.put("a", b"12345") and await tier.put("b", b"123")
    assert await tier.put("a", b"other", PutMode.CREATE)  # exists: stored, not written
    assert await tier.put("a", b"other", PutMode.CREATE)
    assert backend.data["a"] == b"12345"
    assert await tier.put("a", b"new", PutMode.OVERWRITE)
    assert backend.data["a"] == b"new"
    assert tier.stats.puts == 3 and tier.stats.put_skipped_exists == 2
    assert tier.stats.bytes_written == 5 + 3 + 3
    assert await tier.exists("b") is True and await tier.exists("gone") is False
    for latency in (tier.stats.get_latency, tier.stats.put_latency):
        assert latency.total and 15 <= latency.sum_ms / latency.total <= 2000  # ms, not s


async def test_oversized_puts_are_refused_before_the_call_and_counted() -> None:
    backend = MemoryBackend()
    tier = Tier(
        backend,
        RetryPolicy(timeout_s=2.0, retries=0),
        CircuitBreaker(5, 60),
        TierFlags(max_size=4),
    )
    for _ in range(2):
        assert not await tier.put("k", b"12345")
    assert tier.stats.put_errors == Counter({"too_large": 2}) and backend.calls["put"] == 0


async def test_record_updates_are_counted_per_outcome(tmp_path: Path) -> None:
    tier = disk_tier(tmp_path)

    assert await tier.update_record("v1/env/pgo/ab/rec", appending(b"a")) == "stored"
    assert await tier.update_record("v1/env/pgo/ab/rec", appending(b"b")) == "stored"
    assert await tier.update_record("v1/env/pgo/ab/rec", appending(b"a")) == "unchanged"
    assert tier.stats.records == Counter({"stored": 2, "unchanged": 1})
    assert tier.stats.record_conflicts == 0
    (tmp_path / "not-a-dir").write_bytes(b"")
    broken = disk_tier(tmp_path, "/not-a-dir")
    for _ in range(2):
        assert await broken.update_record("v1/env/pgo/ab/rec", appending(b"a")) == "error"
    assert broken.stats.records == Counter({"error": 2})
    memory = one_shot_tier(MemoryBackend())  # no conditional writes
    for _ in range(2):
        assert await memory.update_record("k", appending(b"a")) == "unsupported"
    assert memory.stats.records == Counter({"unsupported": 2})


def suffix(current: bytes | None) -> bytes | None:
    return (current or b"") + b"!"


async def test_each_operations_failure_is_logged_once_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One WARNING per (operation, reason), naming the operation; repeats go to DEBUG."""
    backend = Versions(f"mem://log-{time.monotonic_ns()}")  # log_once is per tier name
    # Faults that answer at once get a deadline no busy machine reaches; the hang gets a
    # short one, as what it tests is the deadline's message.
    tier = Tier(backend, RetryPolicy(timeout_s=30, retries=0), CircuitBreaker(100, 60))
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "get": lambda: tier.get("k"),
        "put": lambda: tier.put("k", b"v"),
        "exists": lambda: tier.exists("k"),
        "delete": lambda: tier.delete("k"),
        "record": lambda: tier.update_record("k", suffix),
    }
    expected = []
    with caplog.at_level(logging.DEBUG, logger="objcache"):
        for fault, words in (("transient", "failed"), ("permanent", "failed"), ("hang", "")):
            backend.fault = fault
            if fault == "hang":
                tier.policy = RetryPolicy(timeout_s=0.05, retries=0)
            for op, call in calls.items():
                if fault == "hang" and op == "record":
                    # Its own budget is 90% of the deadline: the margin must outlast a busy
                    # loop's turn, or the deadline's timeout is logged instead of the drop.
                    tier.policy = RetryPolicy(timeout_s=3.0, retries=0)
                for _ in range(2):
                    before = len(caplog.records)
                    await call()
                    for record in caplog.records[before:]:  # the DEBUG repeats name it too
                        assert f"{op} {words or 'exceeded'}" in record.getMessage()
                # a permanent fault has the same reason ("error") as a transient one; a hung
                # record update is dropped at its own budget, inside the deadline (not logged)
                if fault == "transient" or (fault == "hang" and op != "record"):
                    expected.append(f"{op} {words or 'exceeded'}")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(expected) == 9, warnings
    for message, start in zip(warnings, expected, strict=True):
        assert start in message, (start, message)


async def test_record_conflicts_add_up_across_updates() -> None:
    backend = Versions("mem://records", conflicts=2)
    tier = Tier(backend, RetryPolicy(timeout_s=2.0, retries=0), CircuitBreaker(5, 60))
    assert await tier.update_record("k", suffix) == "stored"
    backend.conflicts = 3
    assert await tier.update_record("k", suffix) == "stored"
    assert tier.stats.record_conflicts == 5 and tier.stats.records == Counter({"stored": 2})


async def test_a_conflict_storm_is_dropped_within_the_tiers_deadline() -> None:
    """The read-modify-write gets most of the tier's deadline (not all: it ends as a
    counted drop, not a timeout), and not much less."""
    backend = Versions("mem://storm", conflicts=10**9)
    # The 10% left for the last answer must outlast a busy loop's turn: 200 ms of 2 s.
    tier = Tier(backend, RetryPolicy(timeout_s=2.0, retries=0), CircuitBreaker(5, 60))
    started = time.monotonic()
    assert await tier.update_record("k", suffix) == "dropped"
    assert time.monotonic() - started >= 1.6
    assert tier.stats.records == Counter({"dropped": 1}) and not tier.breaker_open()
    assert tier.stats.record_conflicts >= 3


async def test_a_put_with_then_needs_a_local_store(tmp_path: Path) -> None:
    called: list[bool] = []
    local = disk_tier(tmp_path)
    assert await local.put("k", b"v", PutMode.OVERWRITE, then=called.append)
    assert await local.put("k", b"other", PutMode.CREATE, then=called.append)  # kept
    assert (await local.get("k"))[0] == b"v"
    assert await local.put("k", b"new", PutMode.OVERWRITE, then=called.append)  # replaced
    assert (await local.get("k"))[0] == b"new"
    assert called == [True, False, True] and local.stats.puts == 2
    with pytest.raises(TypeError):
        await tier("mem://remote").put("k", b"v", then=called.append)


async def test_a_tier_without_a_deadline_updates_records(tmp_path: Path) -> None:
    tier = disk_tier(tmp_path, timeout=0)
    assert await tier.update_record("v1/env/pgo/ab/rec", suffix) == "stored"
    assert tier.stats.records == Counter({"stored": 1})


async def test_a_command_write_tells_its_outcome_once_whatever_the_store(tmp_path: Path) -> None:
    """``put_then`` of a command's tier: a local store calls ``then`` in the thread that
    wrote (it counts a write even when the command is cancelled right after); any other
    store calls it once with the answer, ``False`` when the write failed."""
    from objcache.backends.disk.store import DiskBackend

    seen: list[tuple[bool, bool]] = []
    loop_thread = threading.get_ident()

    def then(stored: bool) -> None:
        seen.append((stored, threading.get_ident() != loop_thread))

    disk = DiskBackend(parse_tier_url(f"disk://{tmp_path}"))
    assert (
        await Tier.for_command(disk, timeout_ms=30_000)
        .bounded()
        .put_then("a/k", b"v", PutMode.CREATE, then)
    )
    remote = MemoryBackend("mem://remote")
    bounded = Tier.for_command(remote, timeout_ms=30_000).bounded()
    assert await bounded.put_then("a/k", b"v", PutMode.CREATE, then)
    remote.fault = "transient"
    with pytest.raises(TransientBackendError):
        await bounded.put_then("a/k2", b"v", PutMode.CREATE, then)
    assert seen == [(True, True), (True, False), (False, False)]
