"""Single-flight: concurrent requests for one key share one in-flight task."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._inflight: dict[Hashable, asyncio.Future[T]] = {}

    def pending(self, key: Hashable) -> bool:
        return key in self._inflight

    async def do(self, key: Hashable, fn: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """``(result, shared)``: shared is True when another caller's fetch was joined.

        The fetch runs as its own task, so one caller being cancelled (its deadline passed)
        does not cancel the fetch for the others.
        """
        fut = self._inflight.get(key)
        # A finished fetch stays listed until its done callback runs (a loop turn later);
        # a caller arriving in between starts a new fetch instead of reusing a stale answer.
        if fut is not None and not fut.done():
            return await asyncio.shield(fut), True
        task: asyncio.Task[T] = asyncio.ensure_future(fn())
        self._inflight[key] = task
        task.add_done_callback(lambda t: self._done(key, t))
        return await asyncio.shield(task), False

    def _done(self, key: Hashable, task: asyncio.Future[T]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved: a failed shared fetch is not an unhandled error
