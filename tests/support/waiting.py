"""Waiting on a condition, never on the clock.

The condition is polled; the ceiling only matters when the code under test is broken, so it
is generous enough that a busy machine never reaches it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

CEILING_S = 60.0


def wait_until(
    condition: Callable[[], object], timeout_s: float = CEILING_S, what: str = "condition"
) -> None:
    give_up = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > give_up:
            raise AssertionError(f"{what} not reached in {timeout_s:g} s")
        time.sleep(0.005)


async def until(
    condition: Callable[[], object], timeout_s: float = CEILING_S, what: str = "condition"
) -> None:
    give_up = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > give_up:
            raise AssertionError(f"{what} not reached in {timeout_s:g} s")
        await asyncio.sleep(0.005)
