"""Prefetch manifests: which entries a job used, so its next run fetches them up front.

Each run that used entries not already listed writes its own manifest, in CREATE mode under a
unique name (``<job>/run-<time>-<random>``), so ranks and hosts never overwrite each other.
Readers take the union of all manifests of the job. When a job has many run manifests, a
reader compacts them: it writes one merged manifest (named by its content hash, so two
compactors of the same set write the same object) and only then deletes the runs it merged;
a run written meanwhile is not deleted, so no update is ever lost.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import secrets
import sys
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from objcache.backends.shared import RANDOM
from objcache.core.read_decision import LEASED_ELSEWHERE
from objcache.core.streamed import fetch as stream_fetch
from objcache.core.tier import Failed
from objcache.core.tiered import TieredCache
from objcache.core.writes import Remote, put, write
from objcache.entry.layout import CANDIDATES_MARK, parse_object_key
from objcache.errors import EntryError
from objcache.observe.prefetch_timeline import PrefetchTimeline

KIND = "manifest"
FORMAT = 1
#: Compact when a job has more run manifests than this.
COMPACT_AFTER = 8
#: Entries fetched at once by a prefetch.
PREFETCH_CONCURRENCY = 32
#: Largest manifest accepted (keys), whatever the bytes say.
MAX_KEYS = 200_000


class ManifestError(ValueError):
    """Bytes that are not a manifest."""


def default_job_name(argv: list[str] | None = None) -> str:
    """The entry script's name (``train`` for ``python train.py``)."""
    argv = sys.argv if argv is None else argv
    script = argv[0] if argv and argv[0] else "python"
    if script in ("-c", "-m", "python"):
        return "interactive"
    return Path(script).stem or "python"


@dataclass(frozen=True)
class Manifest:
    job: str
    keys: frozenset[str]
    created: float
    #: Keys in the order the run first asked for them (a subset of ``keys``): the order a
    #: new machine fetches them in. Optional: a manifest without it is fetched unordered.
    order: tuple[str, ...] = ()
    #: Entries of a read ``order`` left out: not in ``keys``, repeated (counted, not fatal).
    order_dropped: int = 0

    def to_bytes(self) -> bytes:
        body: dict[str, Any] = {"format": FORMAT, "job": self.job, "created": self.created}
        body["keys"] = sorted(self.keys)
        if self.order:
            body["order"] = [k for k in dict.fromkeys(self.order) if k in self.keys]
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Strict parse: anything unexpected is a ManifestError, never another exception."""
        try:
            body = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"not JSON: {exc}") from None
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise ManifestError("not a manifest of format 1")
        job, keys, created = body.get("job"), body.get("keys"), body.get("created")
        if not isinstance(job, str) or not isinstance(keys, list) or len(keys) > MAX_KEYS:
            raise ManifestError("bad job or keys")
        if not isinstance(created, (int, float)) or isinstance(created, bool):
            raise ManifestError("bad created time")
        if not all(isinstance(k, str) and parse_object_key(k) for k in keys):
            raise ManifestError("a key is not an objcache object key")
        order = body.get("order", [])
        if not isinstance(order, list) or len(order) > MAX_KEYS:
            raise ManifestError("bad order")
        listed = frozenset(keys)
        kept = tuple(dict.fromkeys(k for k in order if isinstance(k, str) and k in listed))
        return cls(job, listed, float(created), kept, len(order) - len(kept))


def _run_name(job: str) -> str:
    return f"{job}/run-{int(time.time())}-{os.getpid()}-{secrets.token_hex(4)}"


def _merged_name(job: str, keys: Iterable[str]) -> str:
    digest = hashlib.blake2b("\n".join(sorted(keys)).encode(), digest_size=8).hexdigest()
    return f"{job}/merged-{digest}"


async def list_manifests(cache: TieredCache, job: str) -> list[str]:
    """Names of the job's manifests, from the first remote tier that can list them."""
    prefix = cache.namespace.kind_prefix(KIND)
    for tier in [t for t in cache.remotes if t.readable and not t.breaker_open()]:
        infos = await tier.list(prefix)  # within the tier's deadline
        if infos is None:  # an unlistable tier (counted): try the next one
            continue
        parsed = [parse_object_key(info.key) for info in infos]
        return [p[2] for p in parsed if p and p[2].startswith(f"{job}/")]
    return []


async def read_job(cache: TieredCache, job: str) -> tuple[set[str], list[str]]:
    """The union of keys in every manifest of ``job``, and the manifest names read."""
    keys, read, _ = await read_job_ordered(cache, job)
    return keys, read


@dataclass
class Need:
    """When a job's runs first asked for each key: its smallest place in any manifest's
    order (``rank``), and the order entries left out (``dropped``)."""

    rank: dict[str, int]
    dropped: int = 0

    def arrange(self, keys: list[str], window: int) -> list[str]:
        """``keys`` in order of need, the unranked last; shuffled within each ``window``
        (fetched at once anyway), so ranks of a node still fetch in different orders."""
        RANDOM.shuffle(keys)
        ranked = sorted(keys, key=lambda k: self.rank.get(k, len(self.rank)))
        out: list[str] = []
        for i in range(0, len(ranked), max(1, window)):
            chunk = ranked[i : i + max(1, window)]
            RANDOM.shuffle(chunk)
            out.extend(chunk)
        return out


async def read_job_ordered(cache: TieredCache, job: str) -> tuple[set[str], list[str], Need]:
    """:func:`read_job` and the order of need its manifests record (:class:`Need`)."""
    names = await list_manifests(cache, job)
    keys: set[str] = set()
    read: list[str] = []
    need = Need({})
    payloads = await asyncio.gather(
        *(cache.get_object(cache.namespace.object_key(KIND, n)) for n in names)
    )
    for name, (payload, _) in zip(names, payloads, strict=True):
        if payload is None:
            continue
        try:
            parsed = Manifest.from_bytes(payload)
        except (ManifestError, EntryError):
            continue
        keys |= parsed.keys
        need.dropped += parsed.order_dropped
        for place, okey in enumerate(parsed.order):
            if place < need.rank.get(okey, place + 1):
                need.rank[okey] = place
        read.append(name)
    return keys, read, need


async def write_run(
    cache: TieredCache,
    job: str,
    keys: Iterable[str],
    run_id: str | None = None,
    order: Iterable[str] = (),
) -> str:
    """Write a run manifest, named ``<job>/<run_id>`` when given (the run's summary id);
    ``order``: the keys in the order the run first asked for them."""
    name = f"{job}/{run_id}" if run_id else _run_name(job)
    listed = frozenset(keys)
    manifest = Manifest(job, listed, time.time(), tuple(k for k in order if k in listed))
    await put(cache, KIND, name, manifest.to_bytes())
    return name


async def compact(
    cache: TieredCache, job: str, keys: set[str], merged: list[str], order: Iterable[str] = ()
) -> bool:
    """Replace ``merged`` run manifests by one (keeping ``order``, the keys' order of need);
    returns whether anything was compacted."""
    runs = [n for n in merged if "/run-" in n]
    if len(runs) <= COMPACT_AFTER or cache.read_only:
        return False
    name = _merged_name(job, keys)
    okey = cache.namespace.object_key(KIND, name)
    payload = Manifest(job, frozenset(keys), time.time(), tuple(order)).to_bytes()
    # Written directly, not through write-behind: a failed or refused put (error, breaker,
    # max_size) is not "left pending", so only each tier's own answer proves it is stored.
    written = await write(cache, okey, payload, remote=Remote.DIRECT)
    if not written.everywhere:
        return False  # the merged manifest is not safely stored everywhere: keep the runs
    for run in runs:
        okey = cache.namespace.object_key(KIND, run)
        await asyncio.gather(*(t.delete(okey) for t in cache.tiers if t.writable))
    return True


async def prefetch(
    cache: TieredCache,
    job: str,
    *,
    concurrency: int | None = None,
    progress: Callable[[int], None] | None = None,
    planned: Callable[[int], None] | None = None,
    byte_budget: int = 0,
    timeline: PrefetchTimeline | None = None,
    shard: tuple[int, int] = (0, 1),
    streamed: bool = False,
) -> dict[str, Any]:
    """Fetch every entry the job's earlier runs used into the local tier (bounded).

    Lookups that arrive meanwhile join the in-flight fetch of their key (single-flight).
    Its time line (``cache.prefetch_timeline``) is the run summary's ``prefetch``
    (docs/architecture.md, "Prefetch time line"). ``concurrency``: fetches at once
    (default :data:`PREFETCH_CONCURRENCY`, read at the call; a process's start-up prefetch
    shares the machine with its compile; ``objcache pull --job`` has it to itself,
    docs/operations.md). ``planned`` is told how many entries
    will be fetched, ``progress`` each one's bytes as it is done (0: not fetched).
    ``byte_budget`` (0: none): no fetch starts while the entries fetched but not yet
    written to the local tier hold more bytes than this (a bulk pull's many fetches in
    flight must not pile large entries up in memory faster than the disk takes them).
    ``timeline``: the time line to keep (default: a new one); a prefetch run for another
    process passes one that relays each step to it (objcache/prefetch_process.py).
    ``shard``: (index, count): fetch only the entries whose key falls in this one of
    ``count`` shards (:func:`shard_of`; a bulk pull over a process per core,
    objcache/cli/bulk_processes.py); shard 0 compacts the job's manifests.
    ``streamed``: nothing in this process serves the entries (``objcache pull --job``, the
    prefetch process), so each comes into the local tier as it arrives, a large one never
    whole in memory (objcache/core/streamed.py); listeners are then told of none.
    """
    started = time.perf_counter()
    timeline = cache.prefetch_timeline = timeline or PrefetchTimeline()
    keys, names, need = await read_job_ordered(cache, job)
    cache.prefetched = set(keys)
    index, count = shard
    mine = keys if count == 1 else [okey for okey in keys if shard_of(okey, count) == index]
    missing = await _absent_locally(cache, mine)
    timeline.manifest(mine, len(names), missing)
    absent = set(missing)
    for okey in mine:
        if okey not in absent:
            tell(cache, okey, None)
    # In the order the job's runs first asked for each key (the first graph's entries
    # first); ranks of a node still fetch in different orders within each window and leave
    # a key another rank is fetching to it (its lease), so together they fetch each about once.
    window = concurrency or PREFETCH_CONCURRENCY
    # a store whose calls run on a bounded pool of threads: no more at once, so that none
    # waits for a thread inside its deadline
    bounds = [t.backend.max_in_flight for t in cache.remotes if t.backend.max_in_flight]
    window = min([window, *bounds])
    already_local = len(mine) - len(missing)
    missing = need.arrange(missing, window)
    if planned is not None:
        planned(len(missing))
    limit = asyncio.Semaphore(window)
    room = asyncio.Event()  # set as a write-through ends (byte_budget)
    elsewhere = fetched_bytes = 0

    async def fetch(okey: str) -> bool:
        nonlocal elsewhere, fetched_bytes
        async with limit:
            while byte_budget and cache.landing_bytes > byte_budget:
                room.clear()
                await room.wait()
            timeline.request(okey)
            if streamed:
                size, tier = await stream_fetch(cache, okey)
                payload = None
            else:
                payload, tier = await cache.get_object(
                    okey, wait=False, absent_locally=cache.local is not None
                )
                size = None if payload is None else len(payload)
            elsewhere += tier == LEASED_ELSEWHERE
            timeline.arrive(okey, size, tier, elsewhere=tier == LEASED_ELSEWHERE)
            if size is not None:
                cache.stats.prefetch_fetched[tier] += 1
            if payload is not None:
                tell(cache, okey, payload)
            fetched_bytes += size or 0
        if progress is not None:
            progress(size or 0)
        return size is not None

    if byte_budget:
        cache.on_landed = room.set
    try:
        fetched = sum(await asyncio.gather(*(fetch(k) for k in missing)))
    finally:
        if byte_budget:
            cache.on_landed = None
    timeline.end()
    compacted = 0
    if index == 0:
        ranked = sorted(need.rank, key=need.rank.__getitem__)
        compacted = await compact(cache, job, keys, names, ranked)
    return {
        "job": job,
        "manifests": len(names),
        "keys": len(keys),
        "fetched": fetched,
        "bytes": fetched_bytes,
        "already_local": already_local,
        "fetched_by_another_process": elsewhere,
        "ordered": sum(k in need.rank for k in missing),
        "order_dropped": need.dropped,
        "compacted": compacted,
        "seconds": round(time.perf_counter() - started, 3),
    }


def shard_of(okey: str, count: int) -> int:
    """Which of ``count`` shards ``okey`` falls in: the same in every process and release."""
    return zlib.crc32(okey.encode()) % count


def tell(cache: TieredCache, okey: str, payload: bytes | None) -> None:
    """Tell the prefetch's listeners ``okey`` arrived (``payload``) or is local (None); a
    listener that raises is dropped."""
    for listener in list(cache.prefetch_listeners):
        try:
            listener(okey, payload)
        except Exception:
            cache.prefetch_listeners.remove(listener)


#: Keys whose presence in the local tier one worker-thread hop checks.
PRESENCE_BATCH = 512


async def _absent_locally(cache: TieredCache, keys: Iterable[str]) -> list[str]:
    """The keys the local tier lacks (all of them without one). A disk tier answers for
    :data:`PRESENCE_BATCH` keys a hop, not one hop a key: a bulk pull of 10,000 entries
    otherwise spent seconds on these checks before its first fetch (docs/architecture.md,
    "Prefetch manifests"). A tier that cannot answer reports the keys absent."""
    keys = list(keys)
    local, store = cache.local, cache.local_store
    if local is None:
        return keys
    if store is None:
        return [k for k in keys if not await local.exists(k)]
    absent: list[str] = []
    for i in range(0, len(keys), PRESENCE_BATCH):
        batch = keys[i : i + PRESENCE_BATCH]
        try:
            held = await local.call("exists", functools.partial(store.present, batch))
        except Failed:
            held = set()
        absent.extend(k for k in batch if k not in held)
    return absent


async def record_run(cache: TieredCache, job: str, run_id: str | None = None) -> str | None:
    """Write this run's manifest if it used entries the job's manifests did not list."""
    used = {k for k in cache.recorded if parse_object_key(k) and f"/{KIND}/" not in k}
    if not used or used <= cache.prefetched or cache.read_only:
        return None
    listed = used | cache.prefetched
    return await write_run(cache, job, listed, run_id, order=need_order(cache.asked, listed))


def need_order(asked: Iterable[str], listed: set[str]) -> list[str]:
    """The keys of ``listed`` a run asked for, in the order it first did: a candidate
    (``<key>!/<digest>``) where its folder was first listed (``asked`` holds the folder)."""
    place: dict[str, int] = {}
    for i, okey in enumerate(asked):
        place.setdefault(okey, i)
    ranked: list[tuple[int, str]] = []
    for okey in listed:
        cut = okey.rfind(CANDIDATES_MARK + "/")
        folder = place.get(okey[: cut + 2]) if cut >= 0 else None
        seen = [i for i in (place.get(okey), folder) if i is not None]
        if seen:
            ranked.append((min(seen), okey))
    return [okey for _, okey in sorted(ranked)]
