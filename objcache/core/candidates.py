"""Guarded candidates (docs/architecture.md, "Guarded candidates"): every guard variant of a
key, stored as content-addressed objects beside the key's single value, built on the read
engine (objcache/core/tiered.py) and the write path (objcache/core/writes.py)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass

from objcache.core.lookup_log import new_trail
from objcache.core.tier import Tier
from objcache.core.tiered import TieredCache
from objcache.core.writes import write
from objcache.observe.metrics import LOOKUP_TRAIL

#: Guarded candidates: at most this many per key are fetched on a lookup (newest first).
MAX_CANDIDATES = 16
#: Candidate GETs in flight at once for one lookup.
CANDIDATE_FETCHES = 8


def candidate_digest(payload: bytes) -> str:
    """Content address of a guarded candidate (BLAKE2b-128 of the payload, hex)."""
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


@dataclass(frozen=True)
class Candidate:
    """One verified guarded candidate of a key (see :func:`get_candidates`)."""

    okey: str
    payload: bytes
    entry: bytes
    tier: str
    #: Already in the local tier: nothing to write through when it is adopted.
    local: bool
    mtime: float


async def get_candidates(
    cache: TieredCache,
    kind: str,
    key: str,
    *,
    limit: int = MAX_CANDIDATES,
    concurrency: int = CANDIDATE_FETCHES,
    include_single: bool = True,
    prefetched_only: bool = False,
) -> list[Candidate]:
    """Every verified candidate of ``key``: local tier first, then remote, newest first.

    With ``include_single``, the key's single value (:meth:`TieredCache.get`) comes last,
    unless its bytes are already a candidate.

    Each readable tier's candidate folder is listed concurrently (one LIST per tier);
    an object in several tiers is fetched from the nearest. At most ``limit`` are
    fetched (local ones first, then the newest remote ones), ``concurrency`` at a time.
    Nothing is written through here: the caller adopts the candidates it uses
    (:func:`adopt_candidate`).

    With ``prefetched_only``, a key whose candidates the job's manifests listed is answered
    from the local tier alone, once the start-up prefetch brought them (waiting, bounded,
    for those still on their way): no remote LIST or GET on a far store for what the
    prefetch listed a moment ago. The caller asks again without it if none of them fits
    (docs/architecture.md, "Guarded candidates"). Empty where the manifests listed none.
    """
    if prefetched_only and (
        cache.local is None or not cache.prefetched_under(cache.namespace.object_prefix(kind, key))
    ):
        return []  # not a lookup: the caller asks every tier
    cache.stats.gets[kind] += 1
    # the folder stands for every candidate in it (manifest.record_run: the order of need)
    cache.note_asked(cache.namespace.object_prefix(kind, key))
    started = time.perf_counter()
    trail = new_trail()
    token = LOOKUP_TRAIL.set(trail)
    try:
        if prefetched_only:
            candidates = await _prefetched_candidates(cache, kind, key, limit, concurrency)
        else:
            candidates = await _get_candidates(cache, kind, key, limit, concurrency, include_single)
    finally:
        LOOKUP_TRAIL.reset(token)
    if candidates:
        cache.stats.hits[kind] += 1
        nearest = next((c for c in candidates if c.local), candidates[0])
        cache.stats.lookups_served_by[nearest.tier] += 1
    ms = (time.perf_counter() - started) * 1000
    cache.stats.lookup.observe(ms)
    if trail is not None:
        size = sum(len(c.payload) for c in candidates) if candidates else None
        where = nearest.tier if candidates else ""
        okey = cache.namespace.object_prefix(kind, key)
        cache.lookups.lookup(
            kind, okey, where, size, ms, trail,
            local=cache.local_name, how=f"{len(candidates)}-candidates",
        )  # fmt: skip
    return candidates


async def _prefetched_candidates(
    cache: TieredCache, kind: str, key: str, limit: int, concurrency: int
) -> list[Candidate]:
    assert cache.local is not None
    # those still on their way: wait for them (bounded), as a lookup does
    for okey in cache.prefetched_under(cache.namespace.object_prefix(kind, key)):
        elsewhere = cache.prefetch_elsewhere
        if elsewhere is not None and elsewhere.pending(okey):
            await elsewhere.wait(okey)
        elif cache.fetching(okey):
            await cache.get_object(okey)
    return await _get_candidates(
        cache, kind, key, limit, concurrency, include_single=False, tiers=[cache.local]
    )


async def _get_candidates(
    cache: TieredCache,
    kind: str,
    key: str,
    limit: int,
    concurrency: int,
    include_single: bool,
    tiers: list[Tier] | None = None,
) -> list[Candidate]:
    prefix = cache.namespace.object_prefix(kind, key)
    if tiers is None:
        tiers = [t for t in cache.tiers if t.readable and not t.breaker_open()]
    # The key's single value too (seeded entries, writers with candidates off), fetched
    # alongside the listings: no extra round trip on the critical path.
    single_okey = cache.namespace.object_key(kind, key)
    single = asyncio.ensure_future(cache.get_object(single_okey)) if include_single else None
    listings = await asyncio.gather(*(t.list(prefix) for t in tiers))
    where: dict[str, tuple[int, float]] = {}
    for i, infos in enumerate(listings):
        for info in infos or ():
            if info.key not in where:
                where[info.key] = (i, info.mtime)
    ordered = sorted(
        where.items(),
        key=lambda kv: (tiers[kv[1][0]] is not cache.local, -kv[1][1], kv[1][0], kv[0]),
    )[: max(0, limit)]
    sem = asyncio.Semaphore(max(1, concurrency))
    cap = cache.caps.for_kind(kind)  # the kind is known: not parsed back out of each key

    async def fetch(okey: str, i: int, mtime: float) -> Candidate | None:
        async with sem:
            tier = tiers[i]
            entry, _ = await tier.get(okey, 0 if tier is cache.local else cap)
            if entry is None:
                return None
            payload = await cache.verify(tier, okey, entry, cap)
            if payload is None:
                return None
            tier.hit(okey)
            cache.stats.served_by[tier.name] += 1
            local = tier is cache.local
            return Candidate(okey, payload, entry, tier.name, local, mtime)

    found = await asyncio.gather(*(fetch(k, i, m) for k, (i, m) in ordered))
    candidates = [c for c in found if c is not None]
    if single is not None:
        payload, tier_name = await single
        digests = {candidate_digest(c.payload) for c in candidates}
        if payload is not None and candidate_digest(payload) not in digests:
            # get_object already wrote a remote hit through to the local tier.
            cache.stats.served_by[tier_name] += 1
            candidates.append(Candidate(single_okey, payload, b"", tier_name, True, 0.0))
    return candidates


async def adopt_candidate(cache: TieredCache, candidate: Candidate) -> None:
    """A candidate the caller used: keep it in the local tier and in the run's manifest."""
    cache.recorded.add(candidate.okey)
    if cache.local is not None and not candidate.local:
        cache.spawn(cache.write_through(candidate.okey, candidate.entry))


async def put_candidate(cache: TieredCache, kind: str, key: str, payload: bytes) -> str:
    """Store ``payload`` as one content-addressed candidate of ``key``; returns its key.

    Local now, remote through write-behind in CREATE mode: the same bytes written by
    many processes make one object (:func:`objcache.core.writes.write`, a lookup's entry).
    """
    okey = cache.namespace.candidate_key(kind, key, candidate_digest(payload))
    await write(cache, okey, payload, manifest=True)
    return okey
