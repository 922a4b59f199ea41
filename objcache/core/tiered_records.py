"""Records across the tiers (docs/architecture.md, "Records"): the nearest verified value, and a
change applied by every tier to its own value with a conditional write (objcache/core/records.py),
built on the read engine (objcache/core/tiered.py)."""

from __future__ import annotations

from objcache.core.records import Change
from objcache.core.tiered import TieredCache
from objcache.errors import EntryError
from objcache.observe.metrics import log_once


async def get_record(cache: TieredCache, kind: str, key: str) -> bytes | None:
    """The record's verified value: the nearest remote tier that has one (every
    readable remote tier is asked at once), else the local tier's. Nothing is written
    through or back-filled: a record changes, so a copy would go stale."""
    cache.stats.gets[kind] += 1
    okey = cache.namespace.object_key(kind, key)
    cap = cache.caps.for_kind(kind)
    if okey in cache.prefetched and okey not in cache.records_read:
        # The start-up prefetch read it from the store a moment ago: its first read in this
        # process is that copy, from the local tier, not a far round trip on the compile's
        # path (docs/architecture.md, "Records"); later reads ask the remote tiers again.
        cache.records_read.add(okey)
        payload = await _prefetched_copy(cache, okey, cap)
        if payload is not None:
            cache.stats.hits[kind] += 1
            return payload
    hit = await cache.race_remotes(okey, cap)
    payload = hit[2] if hit is not None else None
    if payload is None and cache.local is not None:
        entry, _ = await cache.local.get(okey, cap)
        if entry is not None:
            payload = await cache.verify(cache.local, okey, entry)
    if payload is not None:
        cache.stats.hits[kind] += 1
        cache.recorded.add(okey)  # the next start's prefetch brings it (core/manifest.py)
    return payload


async def _prefetched_copy(cache: TieredCache, okey: str, cap: int) -> bytes | None:
    """The local copy of a record the start-up prefetch brought (waiting, bounded, for one
    still on its way), verified; None if there is none."""
    if cache.local is None:
        return None
    elsewhere = cache.prefetch_elsewhere
    if elsewhere is not None and elsewhere.pending(okey):
        await elsewhere.wait(okey)
    elif cache.fetching(okey):
        await cache.get_object(okey)
    entry, _ = await cache.local.get(okey, cap)
    return None if entry is None else await cache.verify(cache.local, okey, entry)


async def update_record(cache: TieredCache, kind: str, key: str, change: Change) -> None:
    """Apply ``change`` to the record (kind, key): in the local tier now, in every remote
    write target in the background (like every remote write; :meth:`TieredCache.flush`
    waits for them). Each tier applies it to its own current value with a conditional
    write, again on each conflict, within its deadline. ``change`` gets the current payload,
    or None when there is none or it cannot be read (counted, then replaced)."""
    okey = cache.namespace.object_key(kind, key)
    cap = cache.caps.for_kind(kind)  # stored bytes and payload alike (docs/security.md, "Records")
    # the run's manifest names the record it wrote, as it names the entries it wrote: the
    # next start's prefetch brings it instead of the compile reading it from a far tier
    # (docs/architecture.md, "Records")
    cache.recorded.add(okey)
    if cache.local is not None:
        # the local copy is checked like a local hit: digest and binding, no signature
        change_local = _entry_change(cache, kind, okey, cap, change, False)
        await cache.local.update_record(okey, change_local, cap)
    if not cache.read_only:
        entry_change = _entry_change(cache, kind, okey, cap, change, True)
        for tier in cache.write_targets():
            cache.spawn(tier.update_record(okey, entry_change, cap))


def _entry_change(
    cache: TieredCache, kind: str, okey: str, cap: int, change: Change, signature: bool
) -> Change:
    """``change`` on stored entries: decode within the kind's ``cap`` (a refused entry
    counts as unreadable and is treated as absent), apply, encode. Runs in a worker
    thread (objcache/core/records.py)."""

    def on_entry(entry: bytes | None) -> bytes | None:
        current = None
        if entry is not None:
            try:
                current = cache.codec.decode(entry, okey, cap, signature=signature)
            except EntryError as exc:
                cache.stats.records_unreadable[kind] += 1
                log_once.warn("records", exc.reason, f"unreadable record {okey}: {exc}")
        new = change(current)
        return None if new is None else cache.codec.encode(new, okey)

    return on_entry
