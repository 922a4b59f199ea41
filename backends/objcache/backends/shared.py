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
import concurrent.futures
import contextvars
import functools
import os
import queue
import random
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, Generic, ParamSpec, TypeVar

#: objcache's own random numbers (a sweep's one in N, a retry's jitter, a prefetch's order),
#: never Python's shared ``random`` stream: a program that seeded ``random`` expects its next
#: numbers to be its own (an adversarial review saw a seeded program's data change under
#: objcache: the local store's sweep drew from it). Reseeded in a forked child, as ``random``
#: reseeds its own, so forked processes do not repeat each other's orders.
RANDOM = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=RANDOM.seed)

K = TypeVar("K", bound=Hashable)
C = TypeVar("C")
P = ParamSpec("P")
T = TypeVar("T")


class _Slot(Generic[C]):
    __slots__ = ("client", "creating", "owners")

    def __init__(self, creating: asyncio.Task[C]) -> None:
        self.creating: asyncio.Task[C] | None = creating
        self.client: C | None = None
        self.owners: weakref.WeakSet[object] = weakref.WeakSet()


async def _cancellable(opening: Coroutine[Any, Any, C]) -> C:
    """``opening``, ending as cancelled when it was cancelled: a client library may turn the
    cancellation into an error of its own (redis-py's read timeout), and a task cancelled
    by ``asyncio.run``'s shutdown that ends in an error is logged there with its traceback
    (Ctrl-C during a command's first connection printed one)."""
    try:
        return await opening
    except Exception:
        cancelling = getattr(asyncio.current_task(), "cancelling", None)  # Python 3.11+
        if cancelling is not None and cancelling():
            raise asyncio.CancelledError from None
        raise


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
            slot = slots[key] = _Slot(loop.create_task(_cancellable(self._create(key))))
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


class DaemonThreadPool(concurrent.futures.Executor):
    """A thread pool for blocking SDK calls whose threads never hold up interpreter exit.

    ``ThreadPoolExecutor`` joins its workers at exit, so one call stuck on a dead connection
    kept a finished process alive until the SDK's own read timeout (20 s for
    google-cloud-storage). The caller has already given up on such a call at its deadline;
    here its thread is a daemon and is simply abandoned at exit.
    """

    def __init__(self, max_workers: int, name: str) -> None:
        self._queue: queue.SimpleQueue[_WorkItem | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._max_workers = max_workers
        self._name = name
        self._shutdown = False

    def submit(
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put(_WorkItem(future, functools.partial(fn, *args, **kwargs)))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max_workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            item.run()
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


class _WorkItem:
    __slots__ = ("call", "future")

    def __init__(self, future: concurrent.futures.Future[Any], call: Callable[[], Any]) -> None:
        self.future = future
        self.call = call

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.call()
        except BaseException as exc:  # handed to the waiting caller, as ThreadPoolExecutor does
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)


#: Workers of :func:`to_daemon_thread`, as many as asyncio's default executor would have.
BLOCKING_THREADS = min(32, (os.cpu_count() or 1) + 4)
_blocking: tuple[int, DaemonThreadPool] | None = None
_blocking_lock = threading.Lock()


def blocking_pool() -> DaemonThreadPool:
    """The process's pool for blocking filesystem calls (a new one in a forked child)."""
    global _blocking
    pool = _blocking
    if pool is None or pool[0] != os.getpid():
        with _blocking_lock:
            pool = _blocking
            if pool is None or pool[0] != os.getpid():
                pool = _blocking = (os.getpid(), DaemonThreadPool(BLOCKING_THREADS, "objcache-io"))
    return pool[1]


async def to_daemon_thread(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``asyncio.to_thread`` on :func:`blocking_pool`: a call stuck in the kernel (a lock,
    a hung NFS server) never holds up interpreter exit, where asyncio's default executor
    joins its threads (docs/security.md, "Records"). Context variables go along."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(blocking_pool(), call)
