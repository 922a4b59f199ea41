"""A prefetch another process runs: a lookup's bounded wait for the keys it brings
(objcache/core/prefetch_elsewhere.py)."""

from __future__ import annotations

import asyncio

from objcache.core.prefetch_elsewhere import (
    BROUGHT,
    ENDED,
    NO_PLAN,
    NOT_PLANNED,
    TIMED_OUT,
    PrefetchElsewhere,
)


async def test_a_lookup_waits_for_a_planned_key_until_it_is_brought() -> None:
    e = PrefetchElsewhere(plan_wait_s=5, key_wait_s=5)
    e.plan(["a", "b"])
    waiting = asyncio.ensure_future(e.wait("a"))
    await asyncio.sleep(0)
    assert not waiting.done()
    e.brought("a")
    assert await waiting == BROUGHT
    assert not e.pending("a") and e.pending("b")
    assert e.as_dict()["waits"] == {BROUGHT: 1}


async def test_a_key_outside_the_plan_does_not_wait_and_is_not_counted() -> None:
    e = PrefetchElsewhere(plan_wait_s=5, key_wait_s=5)
    e.plan(["a"])
    assert await asyncio.wait_for(e.wait("z"), 1) == NOT_PLANNED
    e.brought("a")
    assert await asyncio.wait_for(e.wait("a"), 1) == NOT_PLANNED  # local by now
    assert e.as_dict()["waits"] == {}


async def test_a_lookup_before_the_plan_waits_for_it_then_for_its_key() -> None:
    e = PrefetchElsewhere(plan_wait_s=5, key_wait_s=5)
    waiting = asyncio.ensure_future(e.wait("a"))
    await asyncio.sleep(0)
    e.plan(["a"])
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiting.done()
    e.brought("a")
    assert await waiting == BROUGHT


async def test_every_wait_is_bounded() -> None:
    e = PrefetchElsewhere(plan_wait_s=0.01, key_wait_s=0.01)
    assert await e.wait("a") == NO_PLAN  # no plan in time: the lookup goes its own way
    e.plan_wait_s = 60  # a late plan is waited for once, not by every later lookup
    assert await asyncio.wait_for(e.wait("b"), 1) == NO_PLAN
    e.plan(["a"])
    assert await e.wait("a") == TIMED_OUT
    assert e.as_dict()["waits"] == {NO_PLAN: 2, TIMED_OUT: 1}


async def test_the_end_releases_every_wait_and_later_lookups_do_not_wait() -> None:
    e = PrefetchElsewhere(plan_wait_s=5, key_wait_s=5)
    before_plan = asyncio.ensure_future(e.wait("x"))
    await asyncio.sleep(0)
    e.plan(["a"])
    planned = asyncio.ensure_future(e.wait("a"))
    await asyncio.sleep(0)
    e.end()  # the child failed or is gone
    assert await planned == BROUGHT  # released: the lookup reads the local tier, as always
    assert await before_plan == ENDED
    assert await e.wait("a") == ENDED
    e.plan(["b"])  # nothing after the end
    assert not e.pending("b")
