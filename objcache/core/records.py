"""Records: values updated in place, by read-modify-write with a conditional write.

Immutable entries are created once; a record (a PGO profile, a pointer) is read, changed and
written back only if nobody wrote it in between (the backend's compare-and-set, see
``backends/records_contract.py``). On a conflict the change is applied again to the new value, with
jittered backoff, until the deadline; then the write is dropped and counted. Never a hang.
See docs/architecture.md, "Records".

A record is untrusted input like an entry (docs/security.md, "Records"): with
``max_bytes`` an oversized one is never read (the change sees None and the write replaces
it), and ``change`` (unpickle, join, pickle) runs in a worker thread, not on the loop.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import time
from collections.abc import Callable

from objcache.backends.records_contract import RECORD_DEADLINE, RECORD_MAX_BYTES, RecordBackend
from objcache.backends.shared import RANDOM, to_daemon_thread

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


async def _attempt(
    store: RecordBackend,
    key: str,
    change: Change,
    max_bytes: int,
    on_too_large: Callable[[], None] | None,
) -> Outcome | None:
    """One read, change and conditional write: the outcome, or None on a conflict."""
    if max_bytes and _takes_cap(store):
        current = await store.get_versioned(key, max_bytes)
    else:  # a third-party backend may predate the cap: its record is checked once read
        current = await store.get_versioned(key)
    data = None if current is None else current.data
    if current is not None and (current.too_large or (max_bytes and len(current.data) > max_bytes)):
        data = None  # never decoded: replaced by this write
        if on_too_large is not None:
            on_too_large()
    new = await to_daemon_thread(change, data)
    if new is None or (current is not None and new == current.data):
        return Outcome.UNCHANGED
    version = None if current is None else current.version
    if await store.put_if_version(key, new, version):
        return Outcome.STORED
    return None


_TAKES_CAP: dict[type, bool] = {}


def _takes_cap(store: RecordBackend) -> bool:
    """Whether ``store.get_versioned`` accepts ``max_bytes`` (every built-in backend)."""
    cls = type(store)
    if cls not in _TAKES_CAP:
        try:
            params = inspect.signature(store.get_versioned).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        _TAKES_CAP[cls] = "max_bytes" in params or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
        )
    return _TAKES_CAP[cls]


async def read_modify_write(
    store: RecordBackend,
    key: str,
    change: Change,
    *,
    timeout_s: float,
    max_bytes: int = 0,
    on_too_large: Callable[[], None] | None = None,
) -> tuple[Outcome, int]:
    """Apply ``change`` to the record ``key`` of ``store``: ``(outcome, conflicts)``.

    Backend errors propagate (the tier counts them); the deadline ends the loop with
    :attr:`Outcome.DROPPED`, including one that passes inside a store call (and a backend
    that waits on a lock waits no longer: :data:`RECORD_DEADLINE`). A record over a
    non-zero ``max_bytes`` is not read: ``change`` gets None, ``on_too_large`` is called.
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    token = RECORD_DEADLINE.set(time.monotonic() + timeout_s)
    cap_token = RECORD_MAX_BYTES.set(max_bytes)
    try:
        return await _loop(store, key, change, end, max_bytes, on_too_large)
    finally:
        RECORD_MAX_BYTES.reset(cap_token)
        RECORD_DEADLINE.reset(token)


async def _loop(
    store: RecordBackend,
    key: str,
    change: Change,
    end: float,
    max_bytes: int,
    on_too_large: Callable[[], None] | None,
) -> tuple[Outcome, int]:
    loop = asyncio.get_running_loop()
    conflicts = 0
    while True:
        remaining = end - loop.time()
        if remaining <= 0:
            return Outcome.DROPPED, conflicts
        try:
            outcome = await asyncio.wait_for(
                _attempt(store, key, change, max_bytes, on_too_large), remaining
            )
        except (asyncio.TimeoutError, TimeoutError):
            return Outcome.DROPPED, conflicts
        if outcome is not None:
            return outcome, conflicts
        conflicts += 1
        pause = RANDOM.uniform(0, CONFLICT_BACKOFF_S * 2 ** min(conflicts, 6))
        await asyncio.sleep(min(pause, max(0.0, end - loop.time())))
