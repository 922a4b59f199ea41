"""TieredCache policy: concurrent remote lookup, write-through, single-flight, write-behind,
breakers, read-only, refusal of bad entries. Uses the in-process MemoryBackend; the real
backends are covered by the contract suite."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from objcache.backends.base import LocalStore, PutMode
from objcache.backends.disk.store import DiskBackend
from objcache.backends.fs_store import QUARANTINE_DIR
from objcache.backends.records_contract import Versioned
from objcache.config.urls import parse_tier_url
from objcache.core.candidates import candidate_digest, get_candidates
from objcache.core.nodelease import Claim, NodeLeases, lease_path
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.reads import note_local_hit, read_local_sync
from objcache.core.tier import Tier, TierFlags
from objcache.core.tiered import OFFLOAD_BYTES, PRIORITY_GRACE_S, TieredCache
from objcache.core.tiered_records import get_record, update_record
from objcache.core.writes import put, write
from objcache.entry.caps import SizeCaps
from objcache.entry.codec import Codec
from objcache.entry.layout import Namespace
from objcache.errors import (
    ClockSkew,
    EntryTooLarge,
    InvalidKey,
    PermanentBackendError,
    TransientBackendError,
)
from objcache.observe.metrics import FailureLog
from tests.support.flock import blocked_on
from tests.support.memory_backend import MemoryBackend
from tests.support.waiting import until

NS = Namespace("testenv")
CODEC = Codec()


def tier(name: str, *, timeout: float = 30.0, flags: TierFlags | None = None) -> Tier:
    """A memory tier; its deadline is one no busy machine reaches unless a test says so."""
    policy = RetryPolicy(timeout_s=timeout, retries=1, backoff_initial_s=0.001)
    return Tier(MemoryBackend(name), policy, CircuitBreaker(3, 60), flags or TierFlags())


def mem(t: Tier) -> MemoryBackend:
    assert isinstance(t.backend, MemoryBackend)
    return t.backend


def disk_tier(root: Path, query: str = "", *, timeout: float = 30.0) -> Tier:
    """A disk:// tier on ``root`` (``query`` appended to its URL), no retries."""
    return Tier(
        DiskBackend(parse_tier_url(f"disk://{root}{query}")),
        RetryPolicy(timeout_s=timeout, retries=0),
        CircuitBreaker(5, 60),
    )


def make(*remotes: Tier, read_only: bool = False, **kw: int) -> tuple[TieredCache, Tier]:
    local = tier("mem://local")
    cache = TieredCache(
        local, list(remotes), CODEC, NS, read_only=read_only, env_fields={"torch": "t"}, **kw
    )
    return cache, local


def seed(t: Tier, key: str, payload: bytes, kind: str = "fx-graph") -> str:
    okey = NS.object_key(kind, key)
    mem(t).data[okey] = CODEC.encode(payload, okey)
    return okey


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


async def test_writes_go_local_now_and_remote_behind() -> None:
    remote = tier("mem://r")
    mem(remote).hold_until = gate = asyncio.Event()  # the remote write cannot finish yet
    cache, local = make(remote)
    await asyncio.wait_for(put(cache, "fx-graph", "k", b"v"), 30)  # remote write does not block
    okey = NS.object_key("fx-graph", "k")
    assert okey in mem(local).data and okey not in mem(remote).data
    gate.set()
    assert await cache.flush(5) == 0
    assert CODEC.decode(mem(remote).data[okey], okey) == b"v"
    assert NS.env_file in mem(remote).data


async def test_write_behind_coalesces_and_drops_over_the_bound() -> None:
    remote = tier("mem://r", timeout=1.0)
    mem(remote).fault = "hang"
    cache, _ = make(remote, write_behind_max_bytes=4000)
    big = b"\x00" * 1500
    import os

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


async def test_create_mode_keeps_the_first_remote_writer() -> None:
    remote = tier("mem://r")
    okey = NS.object_key("fx-graph", "k")
    assert await remote.put(okey, CODEC.encode(b"first", okey), PutMode.CREATE)
    cache, _ = make(remote)
    await put(cache, "fx-graph", "k", b"second")
    await cache.flush(5)
    assert CODEC.decode(mem(remote).data[okey], okey) == b"first"
    assert remote.stats.put_skipped_exists == 1


async def test_write_only_and_size_limited_tiers() -> None:
    wo = tier("mem://wo", flags=TierFlags(write_only=True))
    small = tier("mem://small", flags=TierFlags(max_size=100))
    seed(wo, "k", b"v")
    cache, _ = make(wo, small)
    assert await cache.get("fx-graph", "k") is None
    assert mem(wo).calls["get"] == 0
    await put(cache, "fx-graph", "big", bytes(range(256)) * 4)
    await cache.flush(5)
    assert small.stats.put_errors["too_large"] == 1
    assert NS.object_key("fx-graph", "big") in mem(wo).data


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


def test_an_integration_failure_is_counted_every_time_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counters: Counter[str] = Counter()
    failed = FailureLog(logging.getLogger("objcache.test"), "test", counters, "errors:", "%s: %r")
    with caplog.at_level(logging.DEBUG, logger="objcache.test"):
        for _ in range(3):
            failed("store", RuntimeError("boom"))
    assert counters == Counter({"errors:store": 3})
    levels = [r.levelno for r in caplog.records if r.name == "objcache.test"]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]


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


class Versions(MemoryBackend):
    """A record backend in memory: every conditional write meets ``conflicts`` other
    writers first (each bumps the version), and ``fault`` applies as to every call."""

    def __init__(self, name: str, conflicts: int = 0) -> None:
        super().__init__(name)
        self.conflicts = conflicts
        self.version = 0

    async def get_versioned(self, key: str) -> Versioned | None:
        await self._enter("get_versioned")
        data = self.data.get(key)
        return None if data is None else Versioned(data, str(self.version))

    async def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        await self._enter("put_if_version")
        if self.conflicts:
            self.conflicts -= 1
            self.version += 1
            self.data[key] = self.data.get(key, b"") + b"+"
            return False
        if version != (None if key not in self.data else str(self.version)):
            return False
        self.version += 1
        self.data[key] = data
        return True


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


# --- keys: what a machine that only verifies, or signs, accepts of its own and others' -------


def verify_only_codec() -> Codec:
    return Codec(verify_keys=(Ed25519PrivateKey.generate().public_key(),))


def appending(item: bytes) -> Callable[[bytes | None], bytes | None]:
    """A record change adding ``item`` to a comma-separated set (None: already there)."""

    def change(current: bytes | None) -> bytes | None:
        items = [i for i in (current or b"").split(b",") if i]
        return None if item in items else b",".join([*items, item])

    return change


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


async def remote_only(cache: TieredCache, kind: str, key: str, payload: bytes) -> bool:
    """The run summary's write (objcache/run_observer.py): queued for the remote tiers only."""
    okey = cache.namespace.object_key(kind, key)
    return (await write(cache, okey, payload, local=False)).queued


async def test_a_remote_only_write_queues_for_the_remote_tiers_only() -> None:
    remote = tier("mem://r")
    cache, local = make(remote)
    assert await remote_only(cache, "summary", "run-1", b"report")
    await cache.flush(5)
    okey = NS.object_key("summary", "run-1")
    assert CODEC.decode(mem(remote).data[okey], okey) == b"report"
    assert not mem(local).data
    reader, _ = make(tier("mem://r2"), read_only=True)
    assert not await remote_only(reader, "summary", "run-1", b"report")
    frozen, _ = make(tier("mem://r3", flags=TierFlags(read_only=True)))
    assert not await remote_only(frozen, "summary", "run-1", b"report")
    await reader.flush(5)
    await frozen.flush(5)
    assert not mem(reader.remotes[0]).data and not mem(frozen.remotes[0]).data


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


def leased_cache(root: Path, *remotes: Tier, local: Tier | None = None) -> TieredCache:
    """A cache whose disk local tier on ``root`` is shared with other processes' leases."""
    local = local or disk_tier(root, "?max_bytes=1M")
    return TieredCache(local, list(remotes), CODEC, NS, leases=NodeLeases(str(root), hold_s=30))


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


async def test_local_puts_overwrite_and_are_recorded_and_env_json_is_readable() -> None:
    remote = tier("mem://r")
    local = tier("mem://local")
    cache = TieredCache(local, [remote], CODEC, NS, env_fields={"torch": "2", "cuda": "12"})
    for payload in (b"first", b"second"):
        await put(cache, "fx-graph", "k", payload)
    okey = NS.object_key("fx-graph", "k")
    assert CODEC.decode(mem(local).data[okey], okey) == b"second"
    assert cache.recorded == {okey}
    await cache.flush(5)
    body = mem(remote).data[NS.env_file]
    assert body == json.dumps({"cuda": "12", "torch": "2"}, indent=1, sort_keys=True).encode()
    stats = cache.stats_dict()
    assert set(stats) == {"env", "cache", "write_behind_pending", "tiers"}
    assert stats["env"] == "testenv" and stats["write_behind_pending"] == 0
    assert [(t["breaker"], t["local"]) for t in stats["tiers"]] == [
        ("closed", True),
        ("closed", False),
    ]


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


async def test_failed_candidate_listings_are_counted_and_logged_naming_the_listing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = tier(f"mem://list-{time.monotonic_ns()}", timeout=30)
    mem(broken).fault = "permanent"
    cache, _ = make(broken)
    with caplog.at_level(logging.DEBUG, logger="objcache"):
        for _ in range(2):
            assert await get_candidates(cache, "fx-graph", "k", include_single=False) == []
    assert broken.stats.misses["list"] == 2
    assert any("list failed" in r.getMessage() for r in caplog.records), caplog.records


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


async def test_candidate_fetches_stay_within_their_concurrency() -> None:
    class Counting(MemoryBackend):
        in_flight = peak = 0

        async def get_capped(self, key: str, max_bytes: int) -> bytes | None:
            Counting.in_flight += 1
            Counting.peak = max(Counting.peak, Counting.in_flight)
            await asyncio.sleep(0.01)
            Counting.in_flight -= 1
            return await super().get_capped(key, max_bytes)

    remote = Tier(Counting("mem://r"), RetryPolicy(timeout_s=5), CircuitBreaker(3, 60))
    cache, _ = make(remote)
    for i in range(4):
        payload = b"v%d" % i
        okey = NS.candidate_key("fx-graph", "k", candidate_digest(payload))
        mem(remote).data[okey] = CODEC.encode(payload, okey)
    found = await get_candidates(cache, "fx-graph", "k", concurrency=1, include_single=False)
    assert len(found) == 4 and Counting.peak == 1


async def test_a_remote_candidate_over_its_cap_is_not_transferred() -> None:
    remote = tier("mem://r")
    cache = TieredCache(
        tier("mem://local"), [remote], CODEC, NS, caps=SizeCaps(per_kind={"fx-graph": 64})
    )
    payload = random.Random(5).randbytes(300)
    okey = NS.candidate_key("fx-graph", "k", candidate_digest(payload))
    mem(remote).data[okey] = CODEC.encode(payload, okey)
    assert await get_candidates(cache, "fx-graph", "k", include_single=False) == []
    assert remote.stats.bytes_read == 0 and remote.stats.misses["too_large"] == 1


def test_a_key_that_is_not_an_object_key_gets_the_default_cap() -> None:
    cache, _ = make()
    assert cache.cap("not-an-object-key") == cache.caps.default
