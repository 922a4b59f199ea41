"""The sync bridge: one asyncio loop in a daemon thread per process.

Torch calls its cache backends synchronously on the compiling thread (and from compile
worker threads); they reach the async core through :meth:`Bridge.call`, which waits at most
a deadline. The loop starts lazily on first use. After ``fork`` the child's copy of the loop
thread does not exist, so the child starts its own on first use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BridgeTimeout(TimeoutError):
    """The call did not finish within its deadline (it is cancelled)."""


class Bridge:
    def __init__(self, name: str = "objcache-loop") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop of this process, started on first use."""
        if self._pid != os.getpid():
            self._after_fork()
        loop = self._loop
        if loop is not None:
            return loop
        with self._lock:
            if self._loop is None:
                ready = threading.Event()
                new_loop = asyncio.new_event_loop()

                def run() -> None:
                    asyncio.set_event_loop(new_loop)
                    new_loop.call_soon(ready.set)
                    new_loop.run_forever()

                self._thread = threading.Thread(target=run, name=self._name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = new_loop
            return self._loop

    def _after_fork(self) -> None:
        # The parent's loop thread was not copied into this process: start afresh. The old
        # loop object is abandoned, not closed (its selector belongs to the parent).
        self._lock = threading.Lock()
        self._loop = None
        self._thread = None
        self._pid = os.getpid()

    def in_loop_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def call(self, factory: Callable[[], Coroutine[Any, Any, T]], timeout: float | None) -> T:
        """Run ``factory()`` on the loop and wait at most ``timeout`` seconds.

        Raises :class:`BridgeTimeout` on the deadline; other exceptions propagate (the
        cache layer turns tier errors into values, so those are programming errors).
        """
        loop = self.loop
        if self.in_loop_thread():
            raise RuntimeError("objcache: synchronous call from the objcache loop thread")
        future = asyncio.run_coroutine_threadsafe(factory(), loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise BridgeTimeout(f"objcache call exceeded {timeout}s") from None

    def submit(self, factory: Callable[[], Coroutine[Any, Any, T]]) -> concurrent.futures.Future[T]:
        """Start ``factory()`` on the loop without waiting."""
        return asyncio.run_coroutine_threadsafe(factory(), self.loop)

    def stop(self, timeout: float = 5.0) -> None:
        if self._pid != os.getpid() or self._loop is None:
            return
        loop, thread = self._loop, self._thread
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout)
        self._loop = None
        self._thread = None
