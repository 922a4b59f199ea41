"""A ``Tier`` counts its own outcomes (hit, refused, miss, list failures) and a maintenance
command's tier has its own policy: the deadline, no retries, no breaker
(docs/architecture.md, "Policies")."""

from __future__ import annotations

import asyncio
import logging

import pytest

from objcache.core.tier import Tier
from objcache.errors import CorruptEntry, PermanentBackendError, TransientBackendError
from tests.core.test_tiered import CODEC, NS, make, mem, seed, tier
from tests.support.memory_backend import MemoryBackend


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


def test_the_tier_deadline_comes_from_its_url_else_the_default() -> None:
    from objcache.config.urls import parse_tier_url

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
