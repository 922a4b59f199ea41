"""Reads built on the read engine (objcache/core/tiered.py; docs/architecture.md, "Read path"):
the local-hit fast path run in the caller's thread, a batch of lookups, a kind's listing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from objcache.backends.base import ObjectInfo
from objcache.core.tiered import TieredCache

log = logging.getLogger("objcache")


def read_local_sync(cache: TieredCache, kind: str, key: str) -> tuple[bytes, str, int] | None:
    """The local-hit fast path, run in the *caller's* thread: ``(payload, okey, size)``.

    Anything but a verified hit returns None and the caller takes the async path, which
    counts, quarantines and asks the remote tiers. Counters are not touched here: the
    caller posts :func:`note_local_hit` to the loop thread.
    """
    store = cache.local_store
    if store is None:
        return None
    okey = cache.namespace.object_key(kind, key)
    try:
        entry = store.read_sync(okey)
        if entry is None:
            return None
        return cache.codec.decode(entry, okey, signature=False), okey, len(entry)
    except Exception:
        return None


def note_local_hit(cache: TieredCache, kind: str, okey: str, size: int, ms: float) -> None:
    """Account a fast-path hit (event loop thread)."""
    local = cache.local
    assert local is not None
    cache.note_asked(okey)
    cache.stats.gets[kind] += 1
    cache.stats.hits[kind] += 1
    cache.stats.served_by[local.name] += 1
    cache.stats.lookups_served_by[local.name] += 1
    local.hit(okey)
    local.read_outside(size, ms)
    cache.stats.lookup.observe(ms)
    cache.recorded.add(okey)
    timeline = cache.prefetch_timeline
    if timeline is not None:
        state = timeline.state(okey)
        timeline.lookup(kind, okey, state, ms / 1000, local.name, True, local.name)
    if cache.local_store is not None:
        cache.local_store.note_hit(okey, size)
    if log.isEnabledFor(logging.DEBUG):
        name = local.name
        cache.lookups.lookup(kind, okey, name, size, ms, [(name, "hit")], local=name, how="fast")


async def get_many(
    cache: TieredCache,
    kind: str,
    keys: list[str],
    follow: Callable[[str, bytes], list[str]] | None = None,
) -> dict[str, bytes]:
    """:meth:`TieredCache.get` of every key at once: the payloads found. ``follow(key,
    payload)`` names further keys to fetch once ``key`` is found (one more round)."""
    payloads = await asyncio.gather(*(cache.get(kind, k) for k in keys))
    found = {k: p for k, p in zip(keys, payloads, strict=True) if p is not None}
    if follow is not None:
        more = [m for k, p in list(found.items()) for m in follow(k, p)]
        more = [m for m in dict.fromkeys(more) if m not in found]
        payloads = await asyncio.gather(*(cache.get(kind, k) for k in more))
        found.update({k: p for k, p in zip(more, payloads, strict=True) if p is not None})
    return found


async def listing(cache: TieredCache, kind: str) -> tuple[list[tuple[str, ObjectInfo]], list[str]]:
    """``(tier name, object)`` of every object of ``kind``, tier by tier in order, and the
    names of the tiers that could not list (their deadline passed, they failed)."""
    prefix = cache.namespace.kind_prefix(kind)
    found: list[tuple[str, ObjectInfo]] = []
    failed: list[str] = []
    for t in cache.tiers:
        listed = await t.list(prefix)
        if listed is None:
            failed.append(t.name)
        found.extend((t.name, info) for info in listed or ())
    return found, failed
