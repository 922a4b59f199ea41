"""The sync bridge: many threads, deadlines, fork safety."""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from objcache.bridge import Bridge, BridgeTimeout


async def _echo(x: int) -> int:
    await asyncio.sleep(0.001)
    return x


def test_calls_from_many_threads() -> None:
    bridge = Bridge()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: bridge.call(lambda: _echo(i), 5), range(200)))
    assert results == list(range(200))
    bridge.stop()


def test_deadline_raises_and_cancels() -> None:
    bridge = Bridge()
    cancelled = threading.Event()

    async def hang() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(BridgeTimeout):
        bridge.call(hang, 0.1)
    assert cancelled.wait(60)
    bridge.stop()


def test_forked_child_gets_its_own_loop() -> None:
    bridge = Bridge()
    assert bridge.call(lambda: _echo(1), 5) == 1
    parent_loop = bridge.loop
    pid = os.fork()
    if pid == 0:  # child: must not touch the parent's (absent) loop thread
        code = 1
        try:
            ok = bridge.call(lambda: _echo(7), 5) == 7 and bridge.loop is not parent_loop
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert bridge.call(lambda: _echo(3), 5) == 3
    bridge.stop()


def test_sync_call_from_the_loop_thread_is_refused() -> None:
    bridge = Bridge()

    async def reenter() -> None:
        bridge.call(lambda: _echo(1), 1)

    with pytest.raises(RuntimeError, match="loop thread"):
        bridge.call(reenter, 5)
    bridge.stop()
