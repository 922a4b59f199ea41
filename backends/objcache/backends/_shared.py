"""Clients shared by every backend instance with the same configuration on one event loop.

Torch constructs cache objects (and so backends) several times per process, so backends
create nothing in ``__init__``. The first call on a loop creates the client for that
(loop, configuration) pair; later calls and other instances reuse it. Each instance that
used a client is recorded as an owner; ``release`` drops one owner and the client is
closed when none are left. An owner that is garbage-collected without ``close`` simply
disappears from the owner set (the client stays open for the others).

Loops are held weakly: after a fork, or when a loop is discarded, its clients go with it.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
C = TypeVar("C")


class _Slot(Generic[C]):
    __slots__ = ("client", "creating", "owners")

    def __init__(self, creating: asyncio.Task[C]) -> None:
        self.creating: asyncio.Task[C] | None = creating
        self.client: C | None = None
        self.owners: weakref.WeakSet[object] = weakref.WeakSet()


class SharedClients(Generic[K, C]):
    """One client per (event loop, key), created on first use and reference-counted."""

    def __init__(
        self,
        create: Callable[[K], Coroutine[Any, Any, C]],
        close: Callable[[C], Awaitable[None]],
    ) -> None:
        self._create = create
        self._close = close
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[K, _Slot[C]]] = (
            weakref.WeakKeyDictionary()
        )

    async def acquire(self, key: K, owner: object) -> C:
        """The client for ``key`` on the running loop; records ``owner`` as a user."""
        loop = asyncio.get_running_loop()
        slots = self._by_loop.get(loop)
        if slots is None:
            slots = self._by_loop[loop] = {}
        slot = slots.get(key)
        if slot is not None and slot.client is not None:
            slot.owners.add(owner)
            return slot.client
        if slot is None:
            slot = slots[key] = _Slot(loop.create_task(self._create(key)))
        slot.owners.add(owner)
        creating = slot.creating
        assert creating is not None
        try:
            # shield: one cancelled caller must not cancel the creation the others await
            client = await asyncio.shield(creating)
        except asyncio.CancelledError:
            raise
        except BaseException:
            if slots.get(key) is slot:
                del slots[key]  # let the next call try again
            raise
        slot.client, slot.creating = client, None
        return client

    async def release(self, key: K, owner: object) -> None:
        """Drop ``owner``; close the client when it was the last one (idempotent)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - close() outside a loop
            return
        slots = self._by_loop.get(loop)
        slot = slots.get(key) if slots else None
        if slots is None or slot is None or owner not in slot.owners:
            return
        slot.owners.discard(owner)
        if slot.owners:
            return
        del slots[key]
        if slot.creating is not None:
            try:
                slot.client = await asyncio.shield(slot.creating)
            except Exception:
                return
        if slot.client is not None:
            await self._close(slot.client)

    def peek(self, key: K) -> C | None:
        """The client for ``key`` on the running loop, if one is open: for tests."""
        slots = self._by_loop.get(asyncio.get_running_loop())
        slot = slots.get(key) if slots else None
        return slot.client if slot else None


class Memo(Generic[C]):
    """One instance's memo of the client it acquired on the running loop: the fast path of
    every call skips the shared registry (and a coroutine). Cleared by ``close``."""

    __slots__ = ("_client", "_loop")

    def __init__(self) -> None:
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._client: C | None = None

    def get(self) -> C | None:
        loop = self._loop
        if loop is not None and loop() is asyncio.get_running_loop():
            return self._client
        return None

    def set(self, client: C) -> C:
        self._loop = weakref.ref(asyncio.get_running_loop())
        self._client = client
        return client

    def clear(self) -> None:
        self._loop = self._client = None
