"""Waiting for another thread or process to block on a file lock (Linux /proc/locks)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path


async def blocked_on(path: str) -> None:
    """Wait until a process (or a thread of this one) is blocked on the flock of ``path``
    (``->`` lines of /proc/locks), so what follows is seen by a waiter, not a latecomer."""
    inode = f":{os.stat(path).st_ino} "
    for _ in range(500):
        try:
            locks = await asyncio.to_thread(Path("/proc/locks").read_text)
        except OSError:  # no /proc/locks: give the waiter time instead
            await asyncio.sleep(0.3)
            return
        if any("->" in line and inode in line for line in locks.splitlines()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"nobody waits on {path}")
