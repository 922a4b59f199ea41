"""``disk:///dir?max_bytes=10G``: the machine-local tier, with LRU eviction by bytes.

* **No fsync** (``?fsync=1`` turns it on): the local tier is a cache of data that exists
  elsewhere; after a power loss an entry may come back empty or torn, the entry codec's
  digest refuses it and :meth:`DiskBackend.quarantine` moves it aside. Atomic publish
  (temp file + link/rename) still guarantees that running readers never see partial data.
* **LRU clock**: a hit stamps the entry's atime with ``os.utime`` (at most once a minute
  per entry), so the order survives restarts and works on ``noatime`` mounts; in memory
  every hit counts.
* **Size accounting**: sizes are file lengths (``st_size``). The tree is scanned once at
  first use, in the background; from then on this process's puts, hits and deletes keep
  the total, and a rescan every five minutes (when there is traffic) picks up what other
  processes sharing the folder (DDP ranks) wrote and read.
* **Eviction**: when the total passes ``max_bytes`` a background task deletes the least
  recently used entries until it is under 90% of the limit. Puts never wait for it.
  ``max_bytes=0`` (the default) means unlimited and skips all of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import ClassVar

from objcache.backends.base import PendingWrite, PutMode, TierSpec
from objcache.backends.fs import FsBackend, os_error
from objcache.backends.fs_folders import check_key
from objcache.backends.fs_store import FsStore
from objcache.backends.fs_store import PendingWrite as FsPendingWrite
from objcache.backends.options import opt_int
from objcache.errors import BackendError

log = logging.getLogger(__name__)


def _write_then(
    store: FsStore, key: str, data: bytes, mode: PutMode, then: Callable[[bool], None] | None
) -> bool:
    """``store.write``, then ``then(stored)`` whatever happened (False if it raised)."""
    return _then(functools.partial(store.write, key, data, mode), then)


def _publish_then(
    pending: FsPendingWrite, mode: PutMode, then: Callable[[bool], None] | None
) -> bool:
    """``pending.publish``, then ``then(stored)`` whatever happened (False if it raised)."""
    return _then(functools.partial(pending.publish, mode), then)


def _then(store: Callable[[], bool], then: Callable[[bool], None] | None) -> bool:
    stored = False
    try:
        stored = store()
        return stored
    finally:
        if then is not None:
            with contextlib.suppress(OSError):
                then(stored)


class _Index:
    """This process's view of the tier: size and last use of every entry."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.used: dict[str, float] = {}
        self.total = 0
        self.ready = False
        self.scanned_at = 0.0
        #: Changes made while a scan runs, replayed on top of its result.
        self._journal: list[tuple[str, int, float]] | None = None

    def seen(self, key: str, size: int, now: float) -> None:
        if self._journal is not None:
            self._journal.append((key, size, now))
        self.total += size - self.sizes.get(key, 0)
        self.sizes[key] = size
        self.used[key] = now

    def gone(self, key: str) -> None:
        if self._journal is not None:
            self._journal.append((key, -1, 0.0))
        self.total -= self.sizes.pop(key, 0)
        self.used.pop(key, None)

    def begin_rebuild(self) -> dict[str, float]:
        """Start journaling; returns a copy of the in-memory clock for :func:`_scan`."""
        self._journal = []
        return dict(self.used)

    def abort_rebuild(self) -> None:
        self._journal = None
        self.ready = True  # fall back to what this process has seen
        self.scanned_at = time.monotonic()

    def finish_rebuild(self, sizes: dict[str, int], used: dict[str, float], total: int) -> None:
        journal, self._journal = self._journal or [], None
        self.sizes, self.used, self.total = sizes, used, total
        for key, size, now in journal:
            if size < 0:
                self.gone(key)
            else:
                self.seen(key, size, now)
        self.ready = True
        self.scanned_at = time.monotonic()


# The two functions below run in a worker thread: on a large cache they take a while, and the
# event loop also serves torch's synchronous calls. They only see copies of the index.


def _scan(store: FsStore, seen: dict[str, float]) -> tuple[dict[str, int], dict[str, float], int]:
    """Sizes and last use of every entry on disk, the last use being the later of the
    entry's atime and this process's own (more precise) clock."""
    scanned = store.scan_all()
    sizes = {k: size for k, (size, _) in scanned.items()}
    used = {k: max(atime, seen.get(k, 0.0)) for k, (_, atime) in scanned.items()}
    return sizes, used, sum(sizes.values())


def _evict(store: FsStore, sizes: dict[str, int], used: dict[str, float], excess: int) -> list[str]:
    """Delete least recently used entries until ``excess`` bytes are gone. An entry the
    store refuses to touch (in a folder another user could write, docs/security.md) is
    passed over, so one such folder never stops eviction of the rest."""
    removed: list[str] = []
    for key in sorted(sizes, key=lambda k: used.get(k, 0.0)):
        if excess <= 0:
            break
        try:
            store.delete(key)  # already gone counts as freed
        except BackendError:
            continue
        removed.append(key)
        excess -= sizes[key]
    return removed


class DiskBackend(FsBackend):
    """Machine-local store with LRU eviction and quarantine."""

    touch_on_read: ClassVar[bool] = True
    #: Eviction stops below this fraction of ``max_bytes``.
    low_water: ClassVar[float] = 0.9
    rescan_interval_s: ClassVar[float] = 300.0
    #: After an eviction pass that failed or freed nothing, wait this long before retrying.
    evict_backoff_s: ClassVar[float] = 30.0

    def __init__(self, spec: TierSpec) -> None:
        super().__init__(spec)
        self.max_bytes = opt_int(spec, "max_bytes")
        self._index = _Index()
        self._task: asyncio.Task[None] | None = None
        self._pending = False
        self._evict_after = 0.0

    @property
    def total_bytes(self) -> int:
        """Bytes in the tier as this process knows them (only tracked with max_bytes)."""
        return self._index.total

    async def get(self, key: str) -> bytes | None:
        data = await super().get(key)
        if self.max_bytes:
            if data is None:
                self._index.gone(key)
            else:
                self._index.seen(key, len(data), time.time())
            self._kick()
        return data

    def read_sync(self, key: str) -> bytes | None:
        """Blocking read in the caller's thread: the local-hit fast path of the sync client
        (no event-loop or worker-thread hop). Errors are raised as for :meth:`get`."""
        check_key(key)
        try:
            return self.store.read(key)
        except OSError as exc:
            raise os_error(exc, self.name, f"get {key}") from exc

    def note_hit(self, key: str, size: int) -> None:
        """Called on the event loop after a :meth:`read_sync` hit (LRU bookkeeping)."""
        if self.max_bytes:
            self._index.seen(key, size, time.time())
            self._kick()

    async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
        return await self.put_then(key, data, mode, None)

    async def put_then(
        self, key: str, data: bytes, mode: PutMode, then: Callable[[bool], None] | None
    ) -> bool:
        """:meth:`put`, then ``then(stored)`` in the same worker-thread hop (see
        :class:`~objcache.backends.base.LocalStore`)."""
        check_key(key)
        stored = await self._run(f"put {key}", _write_then, self.store, key, data, mode, then)
        if self.max_bytes:
            if stored:
                self._index.seen(key, len(data), time.time())
            self._kick()
        return stored

    def open_write(self, key: str) -> PendingWrite:
        """An entry of ``key`` written in pieces (see
        :class:`~objcache.backends.base.WritesInPieces`), in the caller's (worker) thread;
        each piece's write raises ``OSError`` as it comes."""
        check_key(key)
        try:
            return self.store.open_write(key)
        except OSError as exc:
            raise os_error(exc, self.name, f"put {key}") from exc

    async def publish_then(
        self, pending: PendingWrite, mode: PutMode, then: Callable[[bool], None] | None
    ) -> bool:
        """``pending.publish(mode)``, then ``then(stored)`` in the same worker-thread hop."""
        assert isinstance(pending, FsPendingWrite)
        stored = await self._run(f"put {pending.key}", _publish_then, pending, mode, then)
        if self.max_bytes:
            if stored:
                self._index.seen(pending.key, pending.size, time.time())
            self._kick()
        return stored

    async def delete(self, key: str) -> bool:
        existed = await super().delete(key)
        self._index.gone(key)
        return existed

    async def quarantine(self, key: str) -> bool:
        """Move a bad entry to ``<root>/.objcache-quarantine/``: no longer served or listed,
        deleted after a day. Returns whether there was an entry to move."""
        check_key(key)
        moved = await self._run(f"quarantine {key}", self.store.quarantine, key)
        self._index.gone(key)
        return moved

    async def wait_idle(self) -> None:
        """Wait for background scanning and eviction to finish (tests, shutdown)."""
        while (task := self._current_task()) is not None and not task.done():
            await asyncio.shield(task)

    async def close(self) -> None:
        await super().close()
        await self.wait_idle()

    # --- background maintenance ---------------------------------------------------------

    def _kick(self) -> None:
        """Start maintenance when the index is missing, stale or over the limit."""
        if self.closed or not self._due():
            return
        task = self._current_task()
        if task is not None and not task.done():
            self._pending = True
            return
        self._task = asyncio.get_running_loop().create_task(self._maintain())

    def _current_task(self) -> asyncio.Task[None] | None:
        """The maintenance task, unless it belongs to another event loop: the sync bridge's
        loop of a parent process (after fork) or one that was replaced. That loop will never
        run it, so it must neither block new maintenance nor be awaited."""
        if self._task is not None and self._task.get_loop() is not asyncio.get_running_loop():
            self._task = None
        return self._task

    def _due(self) -> bool:
        idx, now = self._index, time.monotonic()
        if not idx.ready or now - idx.scanned_at > self.rescan_interval_s:
            return True
        return idx.total > self.max_bytes and now >= self._evict_after

    async def _maintain(self) -> None:
        while True:
            self._pending = False
            try:
                idx = self._index
                if not idx.ready or time.monotonic() - idx.scanned_at > self.rescan_interval_s:
                    await self._rescan()
                if idx.total > self.max_bytes and time.monotonic() >= self._evict_after:
                    await self._evict()
            except Exception as exc:
                log.warning("%s: cache maintenance failed: %s", self.name, exc)
                self._evict_after = time.monotonic() + self.evict_backoff_s
                return
            if not self._pending or self.closed:
                return

    async def _rescan(self) -> None:
        seen = self._index.begin_rebuild()
        try:
            merged = await self._run("scan", _scan, self.store, seen)
        except BaseException:
            self._index.abort_rebuild()
            raise
        self._index.finish_rebuild(*merged)

    async def _evict(self) -> None:
        idx = self._index
        excess = idx.total - int(self.max_bytes * self.low_water)
        sizes, used = dict(idx.sizes), dict(idx.used)
        removed = await self._run("evict", _evict, self.store, sizes, used, excess)
        for key in removed:
            self._index.gone(key)
        if not removed:  # nothing left to evict that this process knows of
            self._evict_after = time.monotonic() + self.evict_backoff_s
        log.debug(
            "%s: evicted %d entries, %d bytes left", self.name, len(removed), self.total_bytes
        )
