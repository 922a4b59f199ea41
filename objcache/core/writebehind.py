"""Write-behind: remote puts that never block the caller.

Bounded in bytes; a second put of a pending key replaces the pending bytes (coalescing);
a put that would exceed the bound is dropped, counted and logged once. ``flush`` waits for
everything pending within a deadline and reports what it could not write. Which remote tiers
a write goes to is :func:`write_targets` (``write_to``; docs/architecture.md, "Write path").
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from objcache.backends.base import PutMode
from objcache.core.tier import Tier
from objcache.observe.metrics import CacheStats

log = logging.getLogger("objcache")

#: Writes one object key's bytes to every target tier.
Writer = Callable[[str, bytes], Awaitable[None]]


def write_targets(remotes: list[Tier], write_to: str) -> list[Tier]:
    """Remote tiers a new entry goes to.

    ``write_to="all"``: every writable tier. ``"nearest"``: the first writable tier whose
    breaker is closed, plus every ``home`` tier (multi-region fleets: write to the
    region, and to the home bucket that seeds the others).
    """
    healthy = [t for t in remotes if t.writable and not t.breaker_open()]
    if write_to == "all":
        return healthy
    nearest = healthy[:1]
    return nearest + [t for t in healthy if t.flags.home and t not in nearest]


async def write_remotes(remotes: list[Tier], write_to: str, okey: str, entry: bytes) -> None:
    """A :data:`Writer`: ``entry`` to the write targets in CREATE mode; a writable tier
    skipped for its open breaker is counted, not silently passed over."""
    for tier in remotes:
        if tier.writable and tier.breaker_open():
            tier.put_skipped("breaker")
    targets = write_targets(remotes, write_to)
    await asyncio.gather(*(t.put(okey, entry, PutMode.CREATE) for t in targets))


class WriteBehind:
    def __init__(
        self, writer: Writer, stats: CacheStats, max_bytes: int, concurrency: int = 8
    ) -> None:
        self._writer = writer
        self._stats = stats
        self.max_bytes = max_bytes
        self._concurrency = concurrency
        self._pending: OrderedDict[str, bytes] = OrderedDict()
        self._pending_bytes = 0
        self._active: set[asyncio.Task[None]] = set()
        self._active_bytes: dict[asyncio.Task[None], int] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._warned_drop = False

    def __len__(self) -> int:
        return len(self._pending) + len(self._active)

    def submit(self, okey: str, data: bytes) -> bool:
        """Queue a write of the object key ``okey``; False when it was dropped because the
        queue is full."""
        old = self._pending.pop(okey, None)
        if old is not None:
            self._pending_bytes -= len(old)
            self._stats.write_behind_coalesced += 1
        if self._pending_bytes + len(data) > self.max_bytes:
            self._drop(len(data))
            return False
        self._pending[okey] = data
        self._pending_bytes += len(data)
        self._idle.clear()
        self._pump()
        return True

    def _drop(self, size: int) -> None:
        self._stats.write_behind_dropped += 1
        self._stats.write_behind_dropped_bytes += size
        if not self._warned_drop:
            self._warned_drop = True
            log.warning(
                "objcache: write-behind queue full (%d bytes pending, limit %d): dropping "
                "remote writes; raise OBJCACHE_WRITE_BEHIND_MAX_BYTES or check tier health",
                self._pending_bytes,
                self.max_bytes,
            )

    def _pump(self) -> None:
        while self._pending and len(self._active) < self._concurrency:
            okey, data = self._pending.popitem(last=False)
            self._pending_bytes -= len(data)
            task = asyncio.ensure_future(self._write(okey, data))
            self._active.add(task)
            self._active_bytes[task] = len(data)
            task.add_done_callback(self._finished)

    async def _write(self, okey: str, data: bytes) -> None:
        try:
            await self._writer(okey, data)
        except Exception:  # the writer counts its own failures; never lose the loop
            log.debug("write-behind of %s failed", okey, exc_info=True)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._active.discard(task)
        self._active_bytes.pop(task, None)
        self._pump()
        if not self._pending and not self._active:
            self._idle.set()

    async def flush(self, timeout: float) -> int:
        """Wait for every pending write; returns how many were left undone (0 = all done)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            left = len(self)
            log.warning("objcache: %d remote writes still pending after %.1fs", left, timeout)
            return left
        return 0

    async def abandon(self) -> int:
        """Drop everything pending and cancel in-flight writes; returns how many."""
        n = len(self)
        for data in self._pending.values():
            self._stats.write_behind_dropped += 1
            self._stats.write_behind_dropped_bytes += len(data)
        self._pending.clear()
        self._pending_bytes = 0
        for task in list(self._active):
            if not task.done():  # cancelled mid-write: as lost as a pending one
                self._stats.write_behind_dropped += 1
                self._stats.write_behind_dropped_bytes += self._active_bytes.get(task, 0)
            task.cancel()
        await asyncio.gather(*self._active, return_exceptions=True)
        self._idle.set()
        return n
