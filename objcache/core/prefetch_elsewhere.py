"""A start-up prefetch that another process runs into this process's local tier: which keys
it will bring and which it has brought, so that a lookup waits for the entry instead of
fetching it a second time (docs/architecture.md, "The prefetch in its own process").

Pure bookkeeping on the event loop's thread; :mod:`objcache.prefetch_process` feeds it from
the child's messages. Every wait is bounded: a plan that does not come within
``plan_wait_s`` (waited for once per process: later lookups do not wait for it), a key not
brought within ``key_wait_s``, or a child that ended, and the lookup goes its own way (the
local tier, the node lease, the remote tiers), as without a prefetch. Nothing here decides
what is served: the lookup still reads and verifies the local tier itself.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable

#: What a lookup's wait ended with.
BROUGHT, NOT_PLANNED, NO_PLAN, TIMED_OUT, ENDED = (
    "brought",
    "not planned",
    "no plan in time",
    "timed out",
    "prefetch ended",
)


class PrefetchElsewhere:
    """The keys another process's prefetch will bring here (event loop thread only)."""

    def __init__(self, plan_wait_s: float, key_wait_s: float) -> None:
        self.plan_wait_s = plan_wait_s
        self.key_wait_s = key_wait_s
        self._planned = asyncio.Event()
        self._pending: dict[str, asyncio.Event] = {}
        self._plan_late = False
        self.ended = False
        #: How lookups' waits ended, and the seconds they waited in all.
        self.waits: Counter[str] = Counter()
        self.waited_s = 0.0
        #: The other process's tiers' counts, once it ended (what it fetched and failed to).
        self.tiers: list[object] = []

    # --- what the other process says ------------------------------------------------------

    def plan(self, missing: Iterable[str]) -> None:
        """The keys it will fetch (those not local already); once, before any ``brought``."""
        if self.ended or self._planned.is_set():
            return
        for okey in missing:
            self._pending.setdefault(okey, asyncio.Event())
        self._planned.set()

    def brought(self, okey: str) -> None:
        """``okey`` is done with: in the local tier, or not to be had from this prefetch."""
        event = self._pending.pop(okey, None)
        if event is not None:
            event.set()

    def end(self) -> None:
        """No more news (the prefetch finished, failed or its process is gone)."""
        self.ended = True
        self._planned.set()
        for event in self._pending.values():
            event.set()
        self._pending.clear()

    def pending(self, okey: str) -> bool:
        """Whether ``okey`` is planned and not brought yet."""
        return okey in self._pending

    def as_dict(self) -> dict[str, object]:
        """How lookups' waits ended, for ``objcache stats``."""
        return {
            "waits": dict(self.waits),
            "waited_ms": round(self.waited_s * 1000, 1),
            "tiers": self.tiers,
        }

    # --- a lookup -------------------------------------------------------------------------

    async def wait(self, okey: str) -> str:
        """Wait, bounded, until the prefetch brought ``okey`` or will not: the outcome."""
        if self.ended:
            return ENDED
        started = time.perf_counter()
        outcome = await self._wait(okey)
        if outcome != NOT_PLANNED:
            self.waits[outcome] += 1
            self.waited_s += time.perf_counter() - started
        return outcome

    async def _wait(self, okey: str) -> str:
        if not self._planned.is_set():
            if self._plan_late:
                return NO_PLAN  # one wait for a late plan per process, not one per lookup
            try:
                await asyncio.wait_for(self._planned.wait(), self.plan_wait_s)
            except asyncio.TimeoutError:
                self._plan_late = True
                return NO_PLAN
        event = self._pending.get(okey)
        if event is None:
            return ENDED if self.ended else NOT_PLANNED
        try:
            await asyncio.wait_for(event.wait(), self.key_wait_s)
        except asyncio.TimeoutError:
            return TIMED_OUT
        return BROUGHT
