"""Guarded candidates across the tiers (objcache/core/candidates.py): listings that fail are
counted, fetches stay within their concurrency and their kind's cap. What torch makes of them:
tests/integrations/torch/remote/test_guarded_candidates.py."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator

import pytest

from objcache.backends.base import ObjectInfo
from objcache.core.candidates import candidate_digest, get_candidates
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.tier import Tier
from objcache.core.tiered import TieredCache
from objcache.entry.caps import SizeCaps
from tests.support.memory_backend import MemoryBackend
from tests.support.tiers import CODEC, NS, make, mem, tier


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


async def test_prefetched_candidates_come_from_the_local_tier_without_a_remote_listing() -> None:
    """The candidates the job's manifests listed are handed over from the local tier alone:
    no remote LIST or GET for them; a key the manifests did not list is not answered here
    (the caller asks every tier)."""

    class Listing(MemoryBackend):
        lists = 0

        async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
            Listing.lists += 1
            async for info in super().list(prefix):
                yield info

    local = tier("mem://local")
    remote = Tier(Listing("mem://far"), RetryPolicy(timeout_s=5), CircuitBreaker(3, 60))
    cache = TieredCache(local, [remote], CODEC, NS)
    keys = {}
    for payload, where in ((b"prefetched", local), (b"written-elsewhere-since", remote)):
        okey = NS.candidate_key("fx-graph", "k", candidate_digest(payload))
        mem(where).data[okey] = CODEC.encode(payload, okey)
        keys[payload] = okey
    mem(remote).data[keys[b"prefetched"]] = mem(local).data[keys[b"prefetched"]]
    cache.prefetched = {keys[b"prefetched"]}

    found = await get_candidates(cache, "fx-graph", "k", prefetched_only=True)
    assert [c.payload for c in found] == [b"prefetched"] and found[0].local
    assert Listing.lists == 0 and remote.stats.hits == 0
    assert await get_candidates(cache, "fx-graph", "other", prefetched_only=True) == []
    assert cache.stats.gets["fx-graph"] == 1  # the unlisted key's call was no lookup
    everywhere = await get_candidates(cache, "fx-graph", "k")  # what the caller asks next
    assert {c.payload for c in everywhere} == {b"prefetched", b"written-elsewhere-since"}
    assert Listing.lists == 1
