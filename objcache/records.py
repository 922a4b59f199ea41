"""Records: values updated in place, by read-modify-write with a conditional write.

Immutable entries are created once; a record (a PGO profile, a pointer) is read, changed and
written back only if nobody wrote it in between (the backend's compare-and-set, see
``backends/_records.py``). On a conflict the change is applied again to the new value, with
jittered backoff, until the deadline; then the write is dropped and counted. Never a hang.
See docs/architecture.md, "Records".
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections.abc import Callable

from objcache.backends._records import RecordBackend

#: ``change(current)``: the new value for the current one (None: absent or unreadable), or
#: None when there is nothing to write. Must be pure: it may run once per attempt.
Change = Callable[[bytes | None], bytes | None]

#: First pause after a conflict; doubles per conflict up to 64x, jittered.
CONFLICT_BACKOFF_S = 0.005


class Outcome(str, enum.Enum):
    STORED = "stored"
    UNCHANGED = "unchanged"
    #: Not confirmed by the deadline (conflicts, or a slow store): counted as dropped. A
    #: write the deadline cut off after the store applied it may still be there.
    DROPPED = "dropped"


async def _attempt(store: RecordBackend, key: str, change: Change) -> Outcome | None:
    """One read, change and conditional write: the outcome, or None on a conflict."""
    current = await store.get_versioned(key)
    new = change(None if current is None else current.data)
    if new is None or (current is not None and new == current.data):
        return Outcome.UNCHANGED
    version = None if current is None else current.version
    if await store.put_if_version(key, new, version):
        return Outcome.STORED
    return None


async def read_modify_write(
    store: RecordBackend, key: str, change: Change, *, timeout_s: float
) -> tuple[Outcome, int]:
    """Apply ``change`` to the record ``key`` of ``store``: ``(outcome, conflicts)``.

    Backend errors propagate (the tier counts them); the deadline ends the loop with
    :attr:`Outcome.DROPPED`, including one that passes inside a store call.
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    conflicts = 0
    while True:
        remaining = end - loop.time()
        if remaining <= 0:
            return Outcome.DROPPED, conflicts
        try:
            outcome = await asyncio.wait_for(_attempt(store, key, change), remaining)
        except (asyncio.TimeoutError, TimeoutError):
            return Outcome.DROPPED, conflicts
        if outcome is not None:
            return outcome, conflicts
        conflicts += 1
        pause = random.uniform(0, CONFLICT_BACKOFF_S * 2 ** min(conflicts, 6))
        await asyncio.sleep(min(pause, max(0.0, end - loop.time())))
