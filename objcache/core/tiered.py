"""TieredCache: the read and write paths (docs/architecture.md, "Read path" and "Write path").

Read:  local tier -> (miss) every readable remote tier concurrently -> first valid hit in
       priority order -> write through to local -> back-fill faster remote tiers.
Write: encode -> local tier (awaited) -> write-behind to every writable remote tier.

Entries are verified (digest, signature) before they are returned, written through or
back-filled; a refused entry is a counted miss and, in the local tier, quarantined.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from objcache.backends.base import LocalStore, ObjectInfo, PutMode
from objcache.core.nodelease import Claim, Lease, NodeLeases
from objcache.core.records import Change
from objcache.core.singleflight import SingleFlight
from objcache.core.tier import Tier
from objcache.core.writebehind import WriteBehind
from objcache.entry.caps import SizeCaps
from objcache.entry.codec import MAX_PAYLOAD, Codec
from objcache.entry.layout import Namespace, parse_object_key
from objcache.errors import EntryError
from objcache.observe.metrics import LOOKUP_TRAIL, CacheStats, log_once
from objcache.observe.plaintext import plain

log = logging.getLogger("objcache")

#: Entries at least this big are encoded/decoded in a worker thread, off the event loop.
OFFLOAD_BYTES = 1 << 20
#: How long a hit from a lower-priority tier waits for higher-priority tiers still running.
#: Entries under one key are interchangeable (verified, same environment), so a slow or
#: hung near tier must not hold a far hit back for a whole deadline.
PRIORITY_GRACE_S = 0.020
#: Guarded candidates: at most this many per key are fetched on a lookup (newest first).
MAX_CANDIDATES = 16
#: Candidate GETs in flight at once for one lookup.
CANDIDATE_FETCHES = 8
#: Tier name :meth:`TieredCache.get_object` reports, without ``wait``, for a key another
#: process of the node is fetching.
LEASED_ELSEWHERE = "~leased-elsewhere"
#: Miss reasons that mean a tier held an entry and the decoder refused it (metrics.py).
REFUSALS = frozenset({"corrupt", "version", "unsigned", "bad_signature", "too_large"})


def miss_cause(trail: Sequence[tuple[str, str]]) -> str:
    """The cause of a lookup that missed, from its per-tier outcomes: the first reason that
    says more than ``absent`` (a refused entry, a timeout, an error), else ``absent``."""
    return next((o for _, o in trail if o not in ("hit", "absent")), "absent")


def _let_go(lease: Lease, stored: bool) -> None:
    """Release a write-through's lease from the thread that wrote the entry."""
    lease.release_sync("hit" if stored else "")


def candidate_digest(payload: bytes) -> str:
    """Content address of a guarded candidate (BLAKE2b-128 of the payload, hex)."""
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


class Remote(enum.Enum):
    """How :meth:`TieredCache.write` writes the remote tiers."""

    #: Queued for the write targets, written in the background (:meth:`TieredCache.flush`).
    BEHIND = "behind"
    #: Written to every writable remote tier before the call returns; each answer counted.
    DIRECT = "direct"
    #: Not written remotely (the local tier only).
    NONE = "none"


@dataclass(frozen=True)
class Written:
    """What :meth:`TieredCache.write` wrote where."""

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


@dataclass(frozen=True)
class Candidate:
    """One verified guarded candidate of a key (see :meth:`TieredCache.get_candidates`)."""

    okey: str
    payload: bytes
    entry: bytes
    tier: str
    #: Already in the local tier: nothing to write through when it is adopted.
    local: bool
    mtime: float


class TieredCache:
    def __init__(
        self,
        local: Tier | None,
        remotes: Sequence[Tier],
        codec: Codec,
        namespace: Namespace,
        *,
        write_behind_max_bytes: int = 256 << 20,
        read_only: bool = False,
        env_fields: dict[str, str] | None = None,
        priority_grace_s: float = PRIORITY_GRACE_S,
        write_to: str = "all",
        leases: NodeLeases | None = None,
        caps: SizeCaps | None = None,
    ) -> None:
        #: Per-kind caps on what a remote tier may hand this machine (docs/security.md).
        self.caps = caps or SizeCaps()
        self.local = local
        #: The local tier's extras (fast path, LRU accounting, quarantine), when it has them.
        self._local_store: LocalStore | None = (
            local.backend if local and isinstance(local.backend, LocalStore) else None
        )
        self.remotes = list(remotes)
        self.codec = codec
        self.namespace = namespace
        self.read_only = read_only
        self.stats = CacheStats()
        self._flight: SingleFlight[tuple[bytes | None, str]] = SingleFlight()
        self._writes = WriteBehind(self._write_remotes, self.stats, write_behind_max_bytes)
        self._background: set[asyncio.Task[Any]] = set()
        self._env_fields = env_fields
        self._env_written = False
        self.priority_grace_s = priority_grace_s
        self.write_to = write_to
        #: Cross-process single-flight over the local tier (None: off).
        self.leases = leases
        #: Object keys this process read (hits) or wrote: the run's prefetch manifest.
        self.recorded: set[str] = set()
        #: Object keys the job's manifests listed at start-up.
        self.prefetched: set[str] = set()
        #: Remote hits whose write-through to the local tier has not finished: a lookup that
        #: arrives after the shared fetch ended but before the entry is on disk is served
        #: from here instead of issuing a second remote GET.
        self._landing: dict[str, bytes] = {}
        #: (kind, cause) pairs already logged at INFO: one line per miss cause per run.
        self._causes_logged: set[tuple[str, str]] = set()

    @property
    def env_fields(self) -> dict[str, str]:
        """The fingerprint fields of this cache's environment (empty when not given)."""
        return dict(self._env_fields or {})

    @property
    def tiers(self) -> list[Tier]:
        return ([self.local] if self.local else []) + self.remotes

    # --- read path ---------------------------------------------------------------------

    async def get(self, kind: str, key: str) -> bytes | None:
        """The verified payload stored under (kind, key), or None."""
        self.stats.gets[kind] += 1
        started = time.perf_counter()
        okey = self.namespace.object_key(kind, key)
        trail = self._trail()
        token = LOOKUP_TRAIL.set(trail)
        try:
            payload, tier = await self.get_object(okey)
        finally:
            LOOKUP_TRAIL.reset(token)
        ms = (time.perf_counter() - started) * 1000
        self.stats.lookup.observe(ms)
        if payload is not None:
            self.stats.hits[kind] += 1
            self.stats.served_by[tier] += 1
            self.stats.lookups_served_by[tier] += 1
        if trail is not None:
            self.log_lookup(kind, okey, tier, None if payload is None else len(payload), ms, trail)
        return payload

    # --- lookup logging (docs/troubleshooting.md, "Logs") ------------------------------------

    @staticmethod
    def _trail() -> list[tuple[str, str]] | None:
        """A list to collect a lookup's per-tier outcomes in, when they will be logged."""
        return [] if log.isEnabledFor(logging.INFO) else None

    def log_lookup(
        self,
        kind: str,
        okey: str,
        tier: str,
        size: int | None,
        ms: float,
        trail: Sequence[tuple[str, str]],
        how: str = "",
    ) -> None:
        """One DEBUG line per lookup (``size`` None: a miss), and one INFO line the first time
        a (kind, cause) misses in this process. Keys and tier names can come from a store's
        listings: they are escaped (objcache/observe/plaintext.py)."""
        tiers = ",".join(f"{plain(name)}={outcome}" for name, outcome in trail) or "-"
        extra = f" via={how}" if how else ""
        if size is not None:
            where = "local" if self.local is not None and tier == self.local.name else "remote"
            log.debug(
                "lookup kind=%s outcome=%s-hit tier=%s size=%d ms=%.3f tiers=%s key=%s%s",
                plain(kind), where, plain(tier), size, ms, tiers, plain(okey), extra,
            )  # fmt: skip
            return
        cause = miss_cause(trail)
        refused = any(outcome in REFUSALS for _, outcome in trail)
        log.debug(
            "lookup kind=%s outcome=%s cause=%s tier=- size=0 ms=%.3f tiers=%s key=%s%s",
            plain(kind), "refused" if refused else "miss", cause, ms, tiers, plain(okey), extra,
        )  # fmt: skip
        if not trail or (kind, cause) in self._causes_logged:
            return  # a lookup that joined another's fetch: that one logs the cause
        self._causes_logged.add((kind, cause))
        log.info(
            "%s lookups miss: %s (first at %s; tiers %s); further %s misses of this cause are "
            "counted in `objcache stats`, not logged (DEBUG logs every lookup)",
            plain(kind), cause, plain(okey), tiers, plain(kind),
        )  # fmt: skip

    async def get_object(
        self, okey: str, *, wait: bool = True, absent_locally: bool = False
    ) -> tuple[bytes | None, str]:
        """``(payload, tier name)`` for a full object key; concurrent callers share a fetch.

        Not a lookup (nothing is counted as one): :meth:`get` counts lookups, prefetch its
        own. Without ``wait`` (prefetch), a key another process of the node is fetching is
        left to it: ``(None, LEASED_ELSEWHERE)``. A waiting caller that joined such a fetch
        starts its own, which waits for the other process. ``absent_locally``: the caller
        knows the local tier lacks the key (prefetch asked), so the local tier is not read
        again (nor counted as a miss) before the remotes.
        """
        result, shared = await self._flight.do(
            okey, lambda: self._fetch(okey, wait, absent_locally)
        )
        if wait and result[1] == LEASED_ELSEWHERE:
            result, shared = await self._flight.do(okey, lambda: self._fetch(okey, True))
        if shared:
            self.stats.single_flight_shared += 1
        if result[0] is not None:
            self.recorded.add(okey)
        return result

    async def get_many(
        self,
        kind: str,
        keys: list[str],
        follow: Callable[[str, bytes], list[str]] | None = None,
    ) -> dict[str, bytes]:
        """:meth:`get` of every key at once: the payloads found. ``follow(key, payload)``
        names further keys to fetch once ``key`` is found (one more round)."""
        payloads = await asyncio.gather(*(self.get(kind, k) for k in keys))
        found = {k: p for k, p in zip(keys, payloads, strict=True) if p is not None}
        if follow is not None:
            more = [m for k, p in list(found.items()) for m in follow(k, p)]
            more = [m for m in dict.fromkeys(more) if m not in found]
            payloads = await asyncio.gather(*(self.get(kind, k) for k in more))
            found.update({k: p for k, p in zip(more, payloads, strict=True) if p is not None})
        return found

    async def listing(self, kind: str) -> tuple[list[tuple[str, ObjectInfo]], list[str]]:
        """``(tier name, object)`` of every object of ``kind``, tier by tier in order, and the
        names of the tiers that could not list (their deadline passed, they failed)."""
        prefix = self.namespace.kind_prefix(kind)
        found: list[tuple[str, ObjectInfo]] = []
        failed: list[str] = []
        for t in self.tiers:
            listed = await t.list(prefix)
            if listed is None:
                failed.append(t.name)
            found.extend((t.name, info) for info in listed or ())
        return found, failed

    def read_local_sync(self, kind: str, key: str) -> tuple[bytes, str, int] | None:
        """The local-hit fast path, run in the *caller's* thread: ``(payload, okey, size)``.

        Anything but a verified hit returns None and the caller takes the async path, which
        counts, quarantines and asks the remote tiers. Counters are not touched here: the
        caller posts :meth:`note_local_hit` to the loop thread.
        """
        store = self._local_store
        if store is None:
            return None
        okey = self.namespace.object_key(kind, key)
        try:
            entry = store.read_sync(okey)
            if entry is None:
                return None
            return self.codec.decode(entry, okey, signature=False), okey, len(entry)
        except Exception:
            return None

    def note_local_hit(self, kind: str, okey: str, size: int, ms: float) -> None:
        """Account a fast-path hit (event loop thread)."""
        assert self.local is not None
        self.stats.gets[kind] += 1
        self.stats.hits[kind] += 1
        self.stats.served_by[self.local.name] += 1
        self.stats.lookups_served_by[self.local.name] += 1
        self.local.hit(okey)
        self.local.read_outside(size, ms)
        self.stats.lookup.observe(ms)
        self.recorded.add(okey)
        if self._local_store is not None:
            self._local_store.note_hit(okey, size)
        if log.isEnabledFor(logging.DEBUG):
            name = self.local.name
            self.log_lookup(kind, okey, name, size, ms, [(name, "hit")], "fast")

    def fetching(self, okey: str) -> bool:
        return self._flight.pending(okey)

    async def _fetch(
        self, okey: str, wait: bool = True, absent_locally: bool = False
    ) -> tuple[bytes | None, str]:
        lease: Lease | None = None
        if self.local is not None:
            landing = self._landing.get(okey)
            if landing is not None:
                return landing, self.local.name
            if self._leased():
                found, lease, elsewhere = await self._claim(okey, wait, absent_locally)
                if found is not None:
                    return found, self.local.name
                if elsewhere is not None:
                    return None, elsewhere
            else:
                found = None if absent_locally else await self._read_local(okey)
                if found is not None:
                    return found, self.local.name
        reasons: list[str] = []
        try:
            hit = await self._race_remotes(okey, reasons)
        except BaseException:
            if lease is not None:
                await lease.release("")
            raise
        if hit is None:
            if lease is not None:
                # Only "absent everywhere" is shared: after an error or a timeout the
                # waiting processes try for themselves.
                absent = bool(reasons) and all(r == "absent" for r in reasons)
                await lease.release("miss" if absent else "")
            return None, ""
        winner, entry, payload, absent_in = hit
        if self.local is not None:
            self._landing[okey] = payload
            self._spawn(self._write_through(okey, entry, lease))
        elif lease is not None:
            await lease.release("")
        if not self.read_only:
            for tier in (t for t in absent_in if t.writable):  # never a ?read_only=1 tier
                self.stats.backfills += 1
                self._spawn(tier.put(okey, entry, PutMode.CREATE))
        return payload, winner.name

    async def _race_remotes(
        self, okey: str, reasons: list[str] | None = None
    ) -> tuple[Tier, bytes, bytes, list[Tier]] | None:
        """Ask every readable remote tier at once; the first valid hit in priority order wins.

        A hit from tier i is taken as soon as every tier before it has missed; while a
        faster tier is still running, it waits at most ``priority_grace_s`` for it. On a
        miss, ``reasons`` receives each tier's reason (a skipped tier's is "breaker").
        """
        reasons = [] if reasons is None else reasons
        tiers = []
        for t in self.remotes:
            if not t.readable:
                continue
            if t.breaker_open():  # skipped: still a miss of this tier, with its reason
                t.missed(okey, "breaker")
                reasons.append("breaker")
                continue
            tiers.append(t)
        if not tiers:
            return None
        tasks: dict[asyncio.Future[Any], int] = {
            asyncio.ensure_future(self._get_verified(t, okey)): i for i, t in enumerate(tiers)
        }
        results: dict[int, tuple[bytes, bytes] | None] = {}
        absent: set[int] = set()
        best: int | None = None
        pending: set[asyncio.Future[Any]] = set(tasks)
        try:
            while pending:
                timeout = self.priority_grace_s if best is not None else None
                done, pending = await asyncio.wait(
                    pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:  # grace expired: the held hit wins
                    break
                for task in done:
                    i = tasks[task]
                    found, reason = task.result()
                    results[i] = found
                    if found is not None and (best is None or i < best):
                        best = i
                    if reason == "absent":
                        absent.add(i)
                    if found is None:
                        reasons.append(reason)
                if best is not None and all(j in results for j in range(best)):
                    break
        finally:
            for task in pending:
                task.cancel()
        if best is None:
            return None
        entry, payload = results[best]  # type: ignore[misc]
        return tiers[best], entry, payload, [tiers[i] for i in sorted(absent) if i < best]

    async def _get_verified(self, tier: Tier, okey: str) -> tuple[tuple[bytes, bytes] | None, str]:
        entry, reason = await tier.get(okey, self.cap(okey))
        if entry is None:
            return None, reason
        payload = await self._verify(tier, okey, entry)
        if payload is None:
            return None, "refused"
        tier.hit(okey)
        return (entry, payload), ""

    def cap(self, okey: str) -> int:
        """The size cap of the kind ``okey`` belongs to."""
        parsed = parse_object_key(okey)
        return self.caps.for_kind(parsed[1]) if parsed else self.caps.default

    async def _verify(self, tier: Tier, okey: str, entry: bytes) -> bytes | None:
        # Signatures are checked where an entry enters the machine (a remote tier); a local
        # hit checks the digest and its binding to okey (docs/security.md).
        local = tier is self.local
        cap = MAX_PAYLOAD if local else self.cap(okey)
        decode = functools.partial(self.codec.decode, signature=not local)
        try:
            if len(entry) >= OFFLOAD_BYTES:
                return await asyncio.to_thread(decode, entry, okey, cap)
            return decode(entry, okey, cap)
        except EntryError as exc:
            tier.refused(okey, exc)
            if tier is self.local and self._local_store is not None:
                await self._local_store.quarantine(okey)
            return None

    def _leased(self) -> bool:
        """Whether lookups go through node leases (a disk local tier and a remote to ask)."""
        return self.leases is not None and self._local_store is not None and self._remote_readable()

    async def _claim(
        self, okey: str, wait: bool, absent_locally: bool
    ) -> tuple[bytes | None, Lease | None, str | None]:
        """The local look and the node lease in one worker-thread hop (nodelease.py):
        ``(payload, None, None)`` on a local hit; ``(None, lease or None, None)`` to fetch
        from the remotes (holding the lease when it is ours); ``(None, None, tier)`` to
        answer the lookup without a fetch: another process found the entry absent
        everywhere (``""``) or, without ``wait``, is fetching it (``LEASED_ELSEWHERE``)."""
        assert self.leases is not None and self._local_store is not None
        assert self.local is not None
        store = self._local_store
        started = time.perf_counter()
        claim, lease, entry = await self.leases.lookup(
            okey,
            read=functools.partial(store.read_sync, okey),
            wait=wait,
            look_first=not absent_locally,
        )
        if claim is not Claim.LOCAL:
            if claim is not Claim.HELD:  # waited on another process's fetch (phase times)
                self.stats.add_phase("node lease", (time.perf_counter() - started) * 1000)
            self.stats.node_leases[claim.value] += 1
            if not absent_locally:  # the look before the lease missed
                self.local.missed(okey, "absent")
        if lease is not None and lease.took_over:
            self.stats.node_leases["took_over"] += 1
        if entry is not None:
            payload = await self._accept_local(okey, entry)
            if payload is not None:
                return payload, None, None
        if claim is Claim.BUSY:
            return None, None, LEASED_ELSEWHERE
        if claim is Claim.MISSED:
            return None, None, ""
        return None, lease, None

    async def _accept_local(self, okey: str, entry: bytes) -> bytes | None:
        """A local entry read outside the tier (``read_sync``): verified and accounted as
        :meth:`_read_local` accounts it."""
        assert self.local is not None and self._local_store is not None
        self.local.read_outside(len(entry))
        payload = await self._verify(self.local, okey, entry)
        if payload is not None:
            self.local.hit(okey)
            self._local_store.note_hit(okey, len(entry))
        return payload

    async def _read_local(self, okey: str) -> bytes | None:
        """The verified local entry, accounted as a local hit, or None."""
        assert self.local is not None
        entry, _ = await self.local.get(okey)
        if entry is None:
            return None
        payload = await self._verify(self.local, okey, entry)
        if payload is not None:
            self.local.hit(okey)  # served_by is counted per lookup, in get()
        return payload

    def _remote_readable(self) -> bool:
        return any(t.readable for t in self.remotes)

    async def _write_through(self, okey: str, entry: bytes, lease: Lease | None = None) -> None:
        assert self.local is not None
        landed = False
        # The lease is let go of in the thread that wrote the entry: a waiting process wakes
        # one hop sooner. The release below only covers a write that never ran or that
        # failed (the first release wins). A lease implies a LocalStore (_leased).
        then = None if lease is None else functools.partial(_let_go, lease)
        try:
            landed = await self.local.put(okey, entry, PutMode.OVERWRITE, then=then)
            if landed:
                self.stats.write_through += 1
        finally:
            self._landing.pop(okey, None)
            if lease is not None:
                await lease.release("hit" if landed else "")

    # --- guarded candidates ------------------------------------------------------------

    async def get_candidates(
        self,
        kind: str,
        key: str,
        *,
        limit: int = MAX_CANDIDATES,
        concurrency: int = CANDIDATE_FETCHES,
        include_single: bool = True,
    ) -> list[Candidate]:
        """Every verified candidate of ``key``: local tier first, then remote, newest first.

        With ``include_single``, the key's single value (:meth:`get`) comes last, unless its
        bytes are already a candidate.

        Each readable tier's candidate folder is listed concurrently (one LIST per tier);
        an object in several tiers is fetched from the nearest. At most ``limit`` are
        fetched (local ones first, then the newest remote ones), ``concurrency`` at a time.
        Nothing is written through here: the caller adopts the candidates it uses
        (:meth:`adopt_candidate`).
        """
        self.stats.gets[kind] += 1
        started = time.perf_counter()
        trail = self._trail()
        token = LOOKUP_TRAIL.set(trail)
        try:
            candidates = await self._get_candidates(kind, key, limit, concurrency, include_single)
        finally:
            LOOKUP_TRAIL.reset(token)
        if candidates:
            self.stats.hits[kind] += 1
            nearest = next((c for c in candidates if c.local), candidates[0])
            self.stats.lookups_served_by[nearest.tier] += 1
        ms = (time.perf_counter() - started) * 1000
        self.stats.lookup.observe(ms)
        if trail is not None:
            size = sum(len(c.payload) for c in candidates) if candidates else None
            where = nearest.tier if candidates else ""
            okey = self.namespace.object_prefix(kind, key)
            self.log_lookup(kind, okey, where, size, ms, trail, f"{len(candidates)}-candidates")
        return candidates

    async def _get_candidates(
        self, kind: str, key: str, limit: int, concurrency: int, include_single: bool
    ) -> list[Candidate]:
        prefix = self.namespace.object_prefix(kind, key)
        tiers = [t for t in self.tiers if t.readable and not t.breaker_open()]
        # The key's single value too (seeded entries, writers with candidates off), fetched
        # alongside the listings: no extra round trip on the critical path.
        single_okey = self.namespace.object_key(kind, key)
        single = asyncio.ensure_future(self.get_object(single_okey)) if include_single else None
        listings = await asyncio.gather(*(t.list(prefix) for t in tiers))
        where: dict[str, tuple[int, float]] = {}
        for i, infos in enumerate(listings):
            for info in infos or ():
                if info.key not in where:
                    where[info.key] = (i, info.mtime)
        ordered = sorted(
            where.items(),
            key=lambda kv: (tiers[kv[1][0]] is not self.local, -kv[1][1], kv[1][0], kv[0]),
        )[: max(0, limit)]
        sem = asyncio.Semaphore(max(1, concurrency))

        async def fetch(okey: str, i: int, mtime: float) -> Candidate | None:
            async with sem:
                tier = tiers[i]
                entry, _ = await tier.get(okey, 0 if tier is self.local else self.cap(okey))
                if entry is None:
                    return None
                payload = await self._verify(tier, okey, entry)
                if payload is None:
                    return None
                tier.hit(okey)
                self.stats.served_by[tier.name] += 1
                local = tier is self.local
                return Candidate(okey, payload, entry, tier.name, local, mtime)

        found = await asyncio.gather(*(fetch(k, i, m) for k, (i, m) in ordered))
        candidates = [c for c in found if c is not None]
        if single is not None:
            payload, tier_name = await single
            digests = {candidate_digest(c.payload) for c in candidates}
            if payload is not None and candidate_digest(payload) not in digests:
                # get_object already wrote a remote hit through to the local tier.
                self.stats.served_by[tier_name] += 1
                candidates.append(Candidate(single_okey, payload, b"", tier_name, True, 0.0))
        return candidates

    async def adopt_candidate(self, candidate: Candidate) -> None:
        """A candidate the caller used: keep it in the local tier and in the run's manifest."""
        self.recorded.add(candidate.okey)
        if self.local is not None and not candidate.local:
            self._spawn(self._write_through(candidate.okey, candidate.entry))

    async def put_candidate(self, kind: str, key: str, payload: bytes) -> str:
        """Store ``payload`` as one content-addressed candidate of ``key``; returns its key.

        Local now, remote through write-behind in CREATE mode: the same bytes written by
        many processes make one object.
        """
        okey = self.namespace.candidate_key(kind, key, candidate_digest(payload))
        await self.put_object(okey, payload)
        return okey

    # --- write path --------------------------------------------------------------------

    async def put(self, kind: str, key: str, payload: bytes) -> None:
        await self.put_object(self.namespace.object_key(kind, key), payload)

    async def put_many(self, kind: str, items: dict[str, bytes]) -> None:
        """:meth:`put` of every item at once."""
        await asyncio.gather(*(self.put(kind, k, p) for k, p in items.items()))

    async def put_object(self, okey: str, payload: bytes) -> None:
        """Store locally now and remotely in the background. Never raises for tier errors."""
        await self._put(okey, payload)

    async def _put(self, okey: str, data: bytes) -> None:
        """A lookup's write: in the run's manifest, with the environment file."""
        self.recorded.add(okey)
        if self._remote_writable():
            self._ensure_env_file()
        await self.write(okey, data)

    async def put_remote(self, kind: str, key: str, payload: bytes) -> bool:
        """Queue ``payload`` for the remote write targets only (write-behind, CREATE mode):
        bookkeeping objects such as run summaries, which no lookup of this machine reads.
        Returns whether it was queued (False when read-only or nothing is writable)."""
        okey = self.namespace.object_key(kind, key)
        return (await self.write(okey, payload, local=False)).queued

    async def write(
        self,
        okey: str,
        data: bytes,
        *,
        mode: PutMode = PutMode.CREATE,
        remote: Remote = Remote.BEHIND,
        local: bool = True,
        encoded: bool = False,
    ) -> Written:
        """The one write into the tiers (docs/architecture.md, "Write path").

        ``data`` is a payload, encoded here (in a worker thread when large), or with
        ``encoded`` an entry already encoded for ``okey``. With ``local`` the local tier
        stores it now (always OVERWRITE: this machine's copy is replaced). ``mode`` is the
        remote write's: CREATE keeps an object already there, OVERWRITE replaces it. Remote
        tiers are written per ``remote``: BEHIND queues for the write targets (CREATE only:
        a queued overwrite could land after a later one), DIRECT awaits every writable remote
        tier's answer, NONE writes none; a read-only cache writes none. Never raises for
        tier errors: the result says what was written where.
        """
        if remote is Remote.BEHIND and mode is not PutMode.CREATE:
            raise ValueError("write-behind writes in CREATE mode only")
        if encoded:
            entry = data
        elif len(data) >= OFFLOAD_BYTES:
            entry = await asyncio.to_thread(self.codec.encode, data, okey)
        else:
            entry = self.codec.encode(data, okey)
        stored_locally = False
        if local and self.local is not None:
            stored_locally = await self.local.put(okey, entry, PutMode.OVERWRITE)
        if remote is Remote.NONE or not self._remote_writable():
            return Written(okey, stored_locally, Remote.NONE)
        if remote is Remote.BEHIND:
            return Written(okey, stored_locally, remote, queued=self._writes.submit(okey, entry))
        targets = [t for t in self.remotes if t.writable]
        stored = await asyncio.gather(*(t.put(okey, entry, mode) for t in targets))
        return Written(okey, stored_locally, remote, stored=sum(stored), asked=len(targets))

    def _remote_writable(self) -> bool:
        """Whether a write may go to a remote tier at all."""
        return not self.read_only and any(t.writable for t in self.remotes)

    def write_targets(self) -> list[Tier]:
        """Remote tiers a new entry goes to.

        ``write_to="all"``: every writable tier. ``"nearest"``: the first writable tier whose
        breaker is closed, plus every ``home`` tier (multi-region fleets: write to the
        region, and to the home bucket that seeds the others).
        """
        healthy = [t for t in self.remotes if t.writable and not t.breaker_open()]
        if self.write_to == "all":
            return healthy
        nearest = healthy[:1]
        return nearest + [t for t in healthy if t.flags.home and t not in nearest]

    async def _write_remotes(self, okey: str, entry: bytes) -> None:
        for tier in self.remotes:
            if tier.writable and tier.breaker_open():  # skipped, not silently
                tier.put_skipped("breaker")
        targets = self.write_targets()
        await asyncio.gather(*(t.put(okey, entry, PutMode.CREATE) for t in targets))

    def _ensure_env_file(self) -> None:
        """Write ``v1/<env>/ENV.json`` once per process so humans can read a bucket."""
        if self._env_written or self._env_fields is None:
            return
        self._env_written = True
        body = json.dumps(self._env_fields, indent=1, sort_keys=True).encode()
        self._writes.submit(self.namespace.env_file, body)

    # --- records -------------------------------------------------------------------------

    async def get_record(self, kind: str, key: str) -> bytes | None:
        """The record's verified value: the nearest remote tier that has one (every
        readable remote tier is asked at once), else the local tier's. Nothing is written
        through or back-filled: a record changes, so a copy would go stale."""
        self.stats.gets[kind] += 1
        okey = self.namespace.object_key(kind, key)
        hit = await self._race_remotes(okey)
        payload = hit[2] if hit is not None else None
        if payload is None and self.local is not None:
            entry, _ = await self.local.get(okey, self.cap(okey))
            if entry is not None:
                payload = await self._verify(self.local, okey, entry)
        if payload is not None:
            self.stats.hits[kind] += 1
        return payload

    async def update_record(self, kind: str, key: str, change: Change) -> None:
        """Apply ``change`` to the record (kind, key): in the local tier now, in every remote
        write target in the background (like every remote write; :meth:`flush` waits for
        them). Each tier applies it to its own current value with a conditional write,
        again on each conflict, within its deadline. ``change`` gets the current payload, or
        None when there is none or it cannot be read (counted, then replaced)."""
        okey = self.namespace.object_key(kind, key)
        cap = self.cap(okey)  # stored bytes and payload alike (docs/security.md, "Records")
        if self.local is not None:
            # the local copy is checked like a local hit: digest and binding, no signature
            change_local = self._entry_change(kind, okey, change, False)
            await self.local.update_record(okey, change_local, cap)
        if not self.read_only:
            entry_change = self._entry_change(kind, okey, change, True)
            for tier in self.write_targets():
                self._spawn(tier.update_record(okey, entry_change, cap))

    def _entry_change(self, kind: str, okey: str, change: Change, signature: bool) -> Change:
        """``change`` on stored entries: decode within the kind's cap (a refused entry
        counts as unreadable and is treated as absent), apply, encode. Runs in a worker
        thread (objcache/core/records.py)."""
        cap = self.cap(okey)

        def on_entry(entry: bytes | None) -> bytes | None:
            current = None
            if entry is not None:
                try:
                    current = self.codec.decode(entry, okey, cap, signature=signature)
                except EntryError as exc:
                    self.stats.records_unreadable[kind] += 1
                    log_once.warn("records", exc.reason, f"unreadable record {okey}: {exc}")
            new = change(current)
            return None if new is None else self.codec.encode(new, okey)

        return on_entry

    # --- lifecycle ---------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def flush(self, timeout: float = 30.0) -> int:
        """Wait for write-through, back-fill and write-behind; returns writes left undone."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout)
        return await self._writes.flush(max(0.0, deadline - loop.time()))

    async def close(self, flush_timeout: float = 30.0) -> int:
        left = await self.flush(flush_timeout)
        if left:
            await self._writes.abandon()
        for tier in self.tiers:
            try:
                await tier.backend.close()
            except Exception:
                log.debug("closing %s failed", tier.name, exc_info=True)
        return left

    def stats_dict(self) -> dict[str, Any]:
        return {
            "env": self.namespace.env,
            "cache": self.stats.as_dict(),
            "write_behind_pending": len(self._writes),
            "tiers": [
                {**t.stats.as_dict(), "breaker": t.breaker.state, "local": t is self.local}
                for t in self.tiers
            ],
        }
