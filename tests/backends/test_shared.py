"""The clients a process's stores share (``objcache/backends/shared.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import objcache
from objcache.backends import shared
from objcache.backends.base import PutMode
from objcache.backends.disk.store import DiskBackend
from objcache.backends.fs_store import SWEEP_ONE_IN
from objcache.backends.shared import SharedClients
from objcache.config.urls import parse_tier_url
from objcache.errors import TransientBackendError


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


async def test_objcache_draws_nothing_from_the_program_s_random_stream(tmp_path: Path) -> None:
    """A program that seeded Python's ``random`` gets its own next numbers whatever objcache
    does beside it: the local store's sweep (one write in 32 looks for stale temp files), a
    retried call's jitter, a prefetch's order draw from objcache's own generator (an
    adversarial review saw a seeded training program fed other data: the sweep drew from the
    program's stream in objcache's I/O threads)."""
    from objcache.core.manifest import Need
    from objcache.core.policy import RetryPolicy, call_with_policy

    random.seed(1234)
    state = random.getstate()
    backend = DiskBackend(parse_tier_url(f"disk://{tmp_path}"))
    for i in range(8 * SWEEP_ONE_IN):  # a sweep's draw each write: dozens of sweeps
        assert await backend.put(f"v1/e/k/{i}", b"x", PutMode.CREATE)
    shuffled = Need(rank={"a": 0, "b": 1}).arrange([*"abcdefgh"], 4)
    assert sorted(shuffled) == [*"abcdefgh"]
    failures = [TransientBackendError("503"), TransientBackendError("503")]

    async def flaky() -> str:
        if failures:
            raise failures.pop()
        return "ok"

    policy = RetryPolicy(timeout_s=5, retries=3, backoff_initial_s=0.001, backoff_max_s=0.01)
    assert await call_with_policy(flaky, policy) == "ok"  # the first retry's wait, then tenacity's
    assert random.getstate() == state


def test_no_module_of_objcache_calls_python_s_shared_random() -> None:
    """Every random number objcache draws comes from ``objcache.backends.shared.RANDOM``."""
    roots = [Path(objcache.__file__).parent, Path(shared.__file__).parent]
    calls = re.compile(r"(?<![\w.])random\.(?!Random\b|getstate\b|setstate\b)[a-z]\w*\(")
    found = [
        f"{path}:{n}"
        for root in roots
        for path in sorted(root.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if calls.search(line.split("#", 1)[0]) and "``" not in line
    ]
    assert found == []
