"""The clients a process's stores share (``objcache/backends/shared.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

import pytest

from objcache.backends.shared import SharedClients


class Owner:
    """A store holding a shared client (owners are held weakly)."""


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.cancelling() is Python 3.11's")
def test_a_client_opening_cut_short_by_the_process_end_prints_nothing() -> None:
    """Ctrl-C during a command's first connection: the caller is cancelled and the shared
    opening, shielded from it, is cancelled by ``asyncio.run`` as it ends. A client library
    that turns that cancellation into an error of its own (redis-py: a read timeout) made
    asyncio log the opening's traceback; it now ends as cancelled, and nothing is logged."""
    logged: list[dict[str, Any]] = []
    started = asyncio.Event()

    async def open_client(key: str) -> str:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise TimeoutError("Timeout reading from the server") from None
        return key

    async def close_client(client: str) -> None:
        return None

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, context: logged.append(context))
        clients: SharedClients[str, str] = SharedClients(open_client, close_client)
        owner = Owner()
        caller = asyncio.create_task(clients.acquire("k", owner))
        await started.wait()
        caller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await caller

    asyncio.run(main())  # cancels the opening still under way as it ends
    assert logged == []


async def test_an_opening_that_fails_on_its_own_still_fails() -> None:
    async def open_client(key: str) -> str:
        raise TimeoutError("no answer")

    async def close_client(client: str) -> None:
        return None

    clients: SharedClients[str, str] = SharedClients(open_client, close_client)
    owner = Owner()
    with pytest.raises(TimeoutError, match="no answer"):
        await clients.acquire("k", owner)
