"""Waiting for other threads or processes to block on a file lock (Linux /proc/locks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.waiting import until

LOCKS = Path("/proc/locks")
HAS_LOCKS = LOCKS.exists()


def blocked_count(inode: int) -> int:
    """How many lock requests wait on the file with ``inode`` (``->`` lines of /proc/locks)."""
    tag = f":{inode} "
    return sum("->" in line and tag in line for line in LOCKS.read_text().splitlines())


async def blocked_on(path: str, count: int = 1) -> None:
    """Wait until ``count`` processes (or threads of this one) are blocked on the flock of
    ``path``, so what follows is seen by a waiter, not a latecomer."""
    if not HAS_LOCKS:
        pytest.skip("needs /proc/locks to see who waits on a lock")
    inode = os.stat(path).st_ino
    await until(lambda: blocked_count(inode) >= count, what=f"{count} waiter(s) on {path}")
