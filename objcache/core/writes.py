"""The write path (docs/architecture.md, "Write path"): every write into the tiers is one call,
:func:`write`, built on the read engine's tiers and write-behind queue (objcache/core/tiered.py).

Write: encode -> local tier (awaited) -> write-behind to the remote write targets, or each
writable remote tier awaited (``Remote.DIRECT``), or none (``Remote.NONE``).
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

from objcache.backends.base import PutMode
from objcache.core.tiered import OFFLOAD_BYTES, TieredCache


class Remote(enum.Enum):
    """How :func:`write` writes the remote tiers."""

    #: Queued for the write targets, written in the background (:meth:`TieredCache.flush`).
    BEHIND = "behind"
    #: Written to every writable remote tier before the call returns; each answer counted.
    DIRECT = "direct"
    #: Not written remotely (the local tier only).
    NONE = "none"


@dataclass(frozen=True)
class Written:
    """What :func:`write` wrote where."""

    okey: str
    #: The local tier stored the entry.
    local: bool
    #: How remote tiers were written: NONE when none was (asked for, read-only, or none
    #: writable).
    remote: Remote
    #: BEHIND: queued for write-behind (False: over its byte budget, dropped and counted).
    queued: bool = False
    #: DIRECT: remote tiers that stored it (an existing object under CREATE counts), of
    #: those asked.
    stored: int = 0
    asked: int = 0

    @property
    def everywhere(self) -> bool:
        """DIRECT: at least one remote tier was asked and every one stored it."""
        return self.asked > 0 and self.stored == self.asked


async def write(
    cache: TieredCache,
    okey: str,
    data: bytes,
    *,
    mode: PutMode = PutMode.CREATE,
    remote: Remote = Remote.BEHIND,
    local: bool = True,
    encoded: bool = False,
    manifest: bool = False,
) -> Written:
    """The one write into the tiers (docs/architecture.md, "Write path").

    ``data`` is a payload, encoded here (in a worker thread when large), or with
    ``encoded`` an entry already encoded for ``okey``. With ``local`` the local tier
    stores it now (always OVERWRITE: this machine's copy is replaced). ``mode`` is the
    remote write's: CREATE keeps an object already there, OVERWRITE replaces it. Remote
    tiers are written per ``remote``: BEHIND queues for the write targets (CREATE only:
    a queued overwrite could land after a later one), DIRECT awaits every writable remote
    tier's answer, NONE writes none; a read-only cache writes none. With ``manifest``
    (a lookup's entry, :func:`put`) the key joins the run's prefetch manifest and, before
    the first such remote write, the environment's ``ENV.json`` is queued
    (objcache/core/env_note.py). Never raises for tier errors: the result says what was
    written where.
    """
    if remote is Remote.BEHIND and mode is not PutMode.CREATE:
        raise ValueError("write-behind writes in CREATE mode only")
    if manifest:
        cache.recorded.add(okey)
        # an entry no lookup asked for (a kernel's place record) is needed where it is made
        cache.note_asked(okey)
        if cache.remote_writable():
            body = cache.env_note.take()
            if body is not None:
                cache.queue(cache.namespace.env_file, body)
    if encoded:
        entry = data
    elif len(data) >= OFFLOAD_BYTES:
        entry = await asyncio.to_thread(cache.codec.encode, data, okey)
    else:
        entry = cache.codec.encode(data, okey)
    stored_locally = False
    if local and cache.local is not None:
        stored_locally = await cache.local.put(okey, entry, PutMode.OVERWRITE)
    if remote is Remote.NONE or not cache.remote_writable():
        return Written(okey, stored_locally, Remote.NONE)
    if remote is Remote.BEHIND:
        return Written(okey, stored_locally, remote, queued=cache.queue(okey, entry))
    targets = [t for t in cache.remotes if t.writable]
    stored = await asyncio.gather(*(t.put(okey, entry, mode) for t in targets))
    return Written(okey, stored_locally, remote, stored=sum(stored), asked=len(targets))


async def put(cache: TieredCache, kind: str, key: str, payload: bytes) -> None:
    """A lookup's entry under (kind, key): :func:`write` with ``manifest``, local now and
    remote in the background (CREATE). Never raises for tier errors."""
    await write(cache, cache.namespace.object_key(kind, key), payload, manifest=True)
