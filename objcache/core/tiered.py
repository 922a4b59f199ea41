"""TieredCache: the read engine (docs/architecture.md, "Read path").

Read:  local tier -> (miss) every readable remote tier concurrently -> first valid hit in
       priority order -> write through to local -> back-fill faster remote tiers.

Entries are verified (digest, signature) before they are returned, written through or
back-filled; a refused entry is a counted miss and, in the local tier, quarantined. What is
built on this engine has its own module in ``objcache/core/`` (docs/architecture.md,
"Modules, top to bottom"): the write path (``writes``), the fast path and batches
(``reads``), records (``tiered_records``), guarded candidates (``candidates``), prefetch
manifests (``manifest``). Its parts: what a lookup makes of the tiers' answers, decided
without I/O (``read_decision``: the race's winner and grace, lease outcomes, write-through and
back-fill), the node lease claim (``leased_lookup``), the remote write targets
(``writebehind``), the lookup lines (``lookup_log``), ``ENV.json`` (``env_note``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from objcache.backends.base import LocalStore, PutMode
from objcache.core.env_note import EnvNote
from objcache.core.fetch_once.leased_lookup import claim, let_go
from objcache.core.fetch_once.nodelease import Lease, NodeLeases
from objcache.core.fetch_once.singleflight import SingleFlight
from objcache.core.lookup_log import LookupLog, new_trail
from objcache.core.prefetch_elsewhere import PrefetchElsewhere
from objcache.core.read_decision import (
    BREAKER,
    HIT,
    REFUSED,
    UNSHARED,
    Ask,
    Race,
    after_race,
    ask,
    fetch_again,
    lease_outcome_of_write,
)
from objcache.core.tier import Tier
from objcache.core.writebehind import WriteBehind, write_remotes, write_targets
from objcache.entry.caps import SizeCaps
from objcache.entry.codec import MAX_PAYLOAD, Codec
from objcache.entry.layout import Namespace, parse_object_key
from objcache.errors import EntryError
from objcache.observe.metrics import LOOKUP_TRAIL, CacheStats
from objcache.observe.prefetch_timeline import PrefetchTimeline

log = logging.getLogger("objcache")

#: Entries at least this big are encoded/decoded in a worker thread, off the event loop.
OFFLOAD_BYTES = 1 << 20
#: How long a hit from a lower-priority tier waits for higher-priority tiers still running.
#: Entries under one key are interchangeable (verified, same environment), so a slow or
#: hung near tier must not hold a far hit back for a whole deadline.
PRIORITY_GRACE_S = 0.020


#: Lookups whose order a process remembers (a manifest's largest, core/manifest.py).
MAX_ASKED = 200_000


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
        self.local_store: LocalStore | None = (
            local.backend if local and isinstance(local.backend, LocalStore) else None
        )
        self.remotes = list(remotes)
        self.codec = codec
        self.namespace = namespace
        self.read_only = read_only
        self.stats = CacheStats()
        self._flight: SingleFlight[tuple[bytes | None, str]] = SingleFlight()
        self._writes = WriteBehind(
            lambda okey, entry: write_remotes(self.remotes, self.write_to, okey, entry),
            self.stats,
            write_behind_max_bytes,
        )
        self._background: set[asyncio.Task[Any]] = set()
        #: The environment's fields, and ``ENV.json`` written once (objcache/core/env_note.py).
        self.env_note = EnvNote(env_fields)
        self.priority_grace_s = priority_grace_s
        self.write_to = write_to
        #: Cross-process single-flight over the local tier (None: off).
        self.leases = leases
        #: Object keys this process read (hits) or wrote: the run's prefetch manifest.
        self.recorded: set[str] = set()
        #: Object keys the job's manifests listed at start-up.
        self.prefetched: set[str] = set()
        self._folders: dict[str, list[str]] = {}
        #: Records this process has read once (objcache/core/tiered_records.py).
        self.records_read: set[str] = set()
        self._folders_of: set[str] | None = None
        #: Object keys in the order this process first looked each up, or wrote one no
        #: lookup asked for, and candidate folders (``<key>!/``) in the order it listed them
        #: (at most :data:`MAX_ASKED`): the order a manifest asks the next machine to fetch
        #: them in (core/manifest.py, ``record_run``).
        self.asked: dict[str, None] = {}
        #: Told (on the loop thread) each prefetched object key as it is fetched, with its
        #: payload, or found local (None); a listener only queues work (core/manifest.py).
        self.prefetch_listeners: list[Callable[[str, bytes | None], None]] = []
        #: Remote hits whose write-through to the local tier has not finished: a lookup that
        #: arrives after the shared fetch ended but before the entry is on disk is served
        #: from here instead of issuing a second remote GET.
        self._landing: dict[str, bytes] = {}
        #: Bytes held by the write-throughs of :attr:`_landing` (entry and payload), which a
        #: bulk prefetch keeps under its budget (objcache/core/manifest.py).
        self.landing_bytes = 0
        #: Called each time such a write-through ends (a prefetch waiting for room).
        self.on_landed: Callable[[], None] | None = None
        #: Called with the object key each time such a write-through ends (landed or not):
        #: a prefetch run for another process tells it the entry is done with.
        self.on_landed_key: Callable[[str], None] | None = None
        #: A start-up prefetch another process runs into the local tier, whose entries a
        #: lookup waits for (objcache/core/prefetch_elsewhere.py); None: none.
        self.prefetch_elsewhere: PrefetchElsewhere | None = None
        #: The lookup lines (objcache/core/lookup_log.py).
        self.lookups = LookupLog()
        #: The start-up prefetch's time line, once one started (objcache/core/manifest.py).
        self.prefetch_timeline: PrefetchTimeline | None = None

    @property
    def env_fields(self) -> dict[str, str]:
        """The fingerprint fields of this cache's environment (empty when not given)."""
        return self.env_note.fields

    @property
    def local_name(self) -> str | None:
        """The local tier's name (None without one)."""
        return self.local.name if self.local is not None else None

    @property
    def tiers(self) -> list[Tier]:
        return ([self.local] if self.local else []) + self.remotes

    # --- read path ---------------------------------------------------------------------

    async def get(self, kind: str, key: str) -> bytes | None:
        """The verified payload stored under (kind, key), or None."""
        self.stats.gets[kind] += 1
        started = time.perf_counter()
        okey = self.namespace.object_key(kind, key)
        self.note_asked(okey)
        trail = new_trail()
        token = LOOKUP_TRAIL.set(trail)
        timeline = self.prefetch_timeline
        state = None if timeline is None else timeline.state(okey)
        try:
            payload, tier = await self.get_object(okey)
        finally:
            LOOKUP_TRAIL.reset(token)
        ms = (time.perf_counter() - started) * 1000
        self.stats.lookup.observe(ms)
        if timeline is not None:
            found = payload is not None
            timeline.lookup(kind, okey, state, ms / 1000, tier, found, self.local_name)
        if payload is not None:
            self.stats.hits[kind] += 1
            self.stats.served_by[tier] += 1
            self.stats.lookups_served_by[tier] += 1
        if trail is not None:
            size = None if payload is None else len(payload)
            self.lookups.lookup(kind, okey, tier, size, ms, trail, local=self.local_name)
        return payload

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
        if fetch_again(wait, result[1]):
            result, shared = await self._flight.do(okey, lambda: self._fetch(okey, True))
        if shared:
            self.stats.single_flight_shared += 1
        if result[0] is not None:
            self.recorded.add(okey)
        return result

    def prefetched_under(self, prefix: str) -> list[str]:
        """The keys the job's manifests listed under candidate folder ``prefix`` (a folder's
        index built once per manifest set)."""
        if self._folders_of is not self.prefetched:
            folders: dict[str, list[str]] = {}
            for okey in self.prefetched:
                cut = okey.rfind("!/")
                if cut >= 0:
                    folders.setdefault(okey[: cut + 2], []).append(okey)
            self._folders, self._folders_of = folders, self.prefetched
        return self._folders.get(prefix, [])

    def landing_pending(self, okey: str) -> bool:
        """Whether a remote hit of ``okey`` is still being written to the local tier."""
        return okey in self._landing

    def note_asked(self, okey: str) -> None:
        """Remember that a lookup asked for ``okey`` (the first time only; bounded)."""
        if okey not in self.asked and len(self.asked) < MAX_ASKED:
            self.asked[okey] = None

    def fetching(self, okey: str) -> bool:
        """Whether a fetch of ``okey`` is under way (a lookup of it would join it)."""
        return self._flight.pending(okey)

    async def _fetch(
        self, okey: str, wait: bool = True, absent_locally: bool = False
    ) -> tuple[bytes | None, str]:
        lease: Lease | None = None
        if self.local is not None:
            landing = self._landing.get(okey)
            if landing is not None:
                return landing, self.local.name
            if self.prefetch_elsewhere is not None and not absent_locally:
                # the entry may be on its way from the prefetch's process: wait (bounded)
                # rather than fetch it a second time, then look locally as always
                await self.prefetch_elsewhere.wait(okey)
            if self._leased():
                found, lease, elsewhere = await self.claim(okey, wait, absent_locally)
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
            hit = await self.race_remotes(okey, self.cap(okey), reasons)
        except BaseException:
            if lease is not None:
                await lease.release(UNSHARED)
            raise
        absent_in = [] if hit is None else hit[3]
        then = after_race(
            hit is not None,
            reasons,
            [t.writable for t in absent_in],
            local=self.local is not None,
            leased=lease is not None,
            read_only=self.read_only,
        )
        if then.release is not None:
            assert lease is not None
            await lease.release(then.release)
        if hit is None:
            return None, ""
        winner, entry, payload, _ = hit
        if then.write_through:
            self._landing[okey] = payload
            self.landing_bytes += len(entry) + len(payload)
            self.spawn(self._land(okey, entry, payload, lease))
        for i in then.backfill:  # never a ?read_only=1 tier, nothing in read-only mode
            self.stats.backfills += 1
            self.spawn(absent_in[i].put(okey, entry, PutMode.CREATE))
        return payload, winner.name

    async def race_remotes(
        self, okey: str, cap: int, reasons: list[str] | None = None
    ) -> tuple[Tier, bytes, bytes, list[Tier]] | None:
        """Ask every readable remote tier at once; the first valid hit in priority order wins:
        ``(tier, entry, payload, the nearer tiers that answered absent)``, or None.

        ``cap`` is the size cap of the key's kind (an entry over it is not read whole).

        A hit from tier i is taken as soon as every tier before it has missed; while a
        faster tier is still running, it waits at most ``priority_grace_s`` for it
        (:class:`objcache.core.read_decision.Race` decides; this asks and verifies). On a
        miss, ``reasons`` receives each tier's reason (a skipped tier's is "breaker").
        """
        reasons = [] if reasons is None else reasons
        tiers = []
        for t in self.remotes:
            asked = ask(t.readable, t.readable and t.breaker_open())
            if asked is Ask.BREAKER:  # skipped: still a miss of this tier, with its reason
                t.missed(okey, BREAKER)
                reasons.append(BREAKER)
            elif asked is Ask.ASK:
                tiers.append(t)
        if not tiers:
            return None
        if len(tiers) == 1:  # nothing to race: no task, no wait (a bulk pull's every key)
            found, reason = await self._get_verified(tiers[0], okey, cap)
            if found is None:
                reasons.append(reason)
                return None
            return tiers[0], found[0], found[1], []
        tasks: dict[asyncio.Future[Any], int] = {
            asyncio.ensure_future(self._get_verified(t, okey, cap)): i for i, t in enumerate(tiers)
        }
        hits: dict[int, tuple[bytes, bytes]] = {}
        race = Race(len(tiers), self.priority_grace_s)
        clock = asyncio.get_running_loop().time
        pending: set[asyncio.Future[Any]] = set(tasks)
        try:
            while not race.settled:
                done, pending = await asyncio.wait(
                    pending, timeout=race.wait_s(clock()), return_when=asyncio.FIRST_COMPLETED
                )
                if not done:  # the grace ran out: the held hit wins
                    race.grace_over()
                    continue
                now = clock()
                for task in done:
                    i = tasks[task]
                    found, reason = task.result()
                    if found is not None:
                        hits[i] = found
                    race.answer(i, reason, now)
        finally:
            for task in pending:
                task.cancel()
        won = race.outcome()
        reasons.extend(won.reasons)
        if won.winner is None:
            return None
        entry, payload = hits[won.winner]
        return tiers[won.winner], entry, payload, [tiers[i] for i in won.absent_nearer]

    async def _get_verified(
        self, tier: Tier, okey: str, cap: int
    ) -> tuple[tuple[bytes, bytes] | None, str]:
        entry, reason = await tier.get(okey, cap)
        if entry is None:
            return None, reason
        payload = await self.verify(tier, okey, entry, cap)
        if payload is None:
            return None, REFUSED
        tier.hit(okey)
        return (entry, payload), HIT

    def cap(self, okey: str) -> int:
        """The size cap of the kind ``okey`` belongs to, parsed out of the key: for a caller
        that has only the object key (:meth:`get_object`); one that knows the kind asks
        ``caps.for_kind``."""
        parsed = parse_object_key(okey)
        return self.caps.for_kind(parsed[1]) if parsed else self.caps.default

    async def verify(
        self, tier: Tier, okey: str, entry: bytes, cap: int | None = None
    ) -> bytes | None:
        """The payload of ``entry``, read from ``tier``, or None: refused, counted as the
        tier's miss and, from the local tier, quarantined. ``cap``: the size cap of the key's
        kind (None: :meth:`cap`); a local entry is checked against MAX_PAYLOAD."""
        # Signatures are checked where an entry enters the machine (a remote tier); a local
        # hit checks the digest and its binding to okey (docs/security.md).
        local = tier is self.local
        limit = MAX_PAYLOAD if local else self.cap(okey) if cap is None else cap
        decode = functools.partial(self.codec.decode, signature=not local)
        try:
            if len(entry) >= OFFLOAD_BYTES:
                return await asyncio.to_thread(decode, entry, okey, limit)
            return decode(entry, okey, limit)
        except EntryError as exc:
            tier.refused(okey, exc)
            if tier is self.local and self.local_store is not None:
                await self.local_store.quarantine(okey)
            return None

    async def claim(
        self, okey: str, wait: bool, absent_locally: bool
    ) -> tuple[bytes | None, Lease | None, str | None]:
        """The local look and the key's node lease (``fetch_once/leased_lookup.py``'s
        ``claim``) over this cache's local tier; only where :meth:`_leased`."""
        assert self.leases is not None and self.local_store is not None and self.local
        verify = functools.partial(self.verify, self.local)
        return await claim(
            self.leases, self.local_store, self.local, self.stats, verify, okey,
            wait=wait, absent_locally=absent_locally,
        )  # fmt: skip

    def _leased(self) -> bool:
        """Whether lookups go through node leases (a disk local tier and a remote to ask)."""
        return self.leases is not None and self.local_store is not None and self._remote_readable()

    async def _read_local(self, okey: str) -> bytes | None:
        """The verified local entry, accounted as a local hit, or None."""
        assert self.local is not None
        entry, _ = await self.local.get(okey)
        if entry is None:
            return None
        payload = await self.verify(self.local, okey, entry)
        if payload is not None:
            self.local.hit(okey)  # served_by is counted per lookup, in get()
        return payload

    def _remote_readable(self) -> bool:
        return any(t.readable for t in self.remotes)

    async def _land(self, okey: str, entry: bytes, payload: bytes, lease: Lease | None) -> None:
        """:meth:`write_through` of a remote hit held in :attr:`_landing`."""
        try:
            await self.write_through(okey, entry, lease)
        finally:
            self.landing_bytes -= len(entry) + len(payload)
            if self.on_landed is not None:
                self.on_landed()
            if self.on_landed_key is not None:
                self.on_landed_key(okey)

    async def write_through(self, okey: str, entry: bytes, lease: Lease | None = None) -> None:
        """A verified remote entry into the local tier (OVERWRITE), letting go of the key's
        node lease, if held, once it landed."""
        assert self.local is not None
        landed = False
        # The lease is let go of in the thread that wrote the entry: a waiting process wakes
        # one hop sooner. The release below only covers a write that never ran or that
        # failed (the first release wins). A lease implies a LocalStore (_leased).
        then = None if lease is None else functools.partial(let_go, lease)
        try:
            landed = await self.local.put(okey, entry, PutMode.OVERWRITE, then=then)
            if landed:
                self.stats.write_through += 1
        finally:
            self._landing.pop(okey, None)
            if lease is not None:
                await lease.release(lease_outcome_of_write(landed))

    # --- what the write path is built on (objcache/core/writes.py) ----------------------

    def remote_writable(self) -> bool:
        """Whether a write may go to a remote tier at all."""
        return not self.read_only and any(t.writable for t in self.remotes)

    def queue(self, okey: str, entry: bytes) -> bool:
        """Queue an encoded entry for the write targets (write-behind, CREATE mode); False
        when it was dropped, over the queue's byte budget (counted)."""
        return self._writes.submit(okey, entry)

    def write_targets(self) -> list[Tier]:
        """Remote tiers a new entry goes to (objcache/core/writebehind.py, ``write_to``)."""
        return write_targets(self.remotes, self.write_to)

    # --- lifecycle ---------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background; :meth:`flush` waits for it."""
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
        stats = {
            "env": self.namespace.env,
            "cache": self.stats.as_dict(),
            "write_behind_pending": len(self._writes),
            "tiers": [
                {**t.stats.as_dict(), "breaker": t.breaker.state, "local": t is self.local}
                for t in self.tiers
            ],
        }
        if self.prefetch_elsewhere is not None:
            stats["prefetch_process"] = self.prefetch_elsewhere.as_dict()
        return stats
