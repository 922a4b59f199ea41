"""Waiting on a condition, never on the clock: polled, with a ceiling that only matters when
the code is broken."""

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
