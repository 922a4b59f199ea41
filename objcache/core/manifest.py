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
import random
import secrets
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from objcache.core.leased_lookup import LEASED_ELSEWHERE
from objcache.core.tier import Failed
from objcache.core.tiered import TieredCache
from objcache.core.writes import Remote, put, write
from objcache.entry.layout import parse_object_key
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

    def to_bytes(self) -> bytes:
        body: dict[str, Any] = {"format": FORMAT, "job": self.job, "created": self.created}
        body["keys"] = sorted(self.keys)
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
        return cls(job, frozenset(keys), float(created))


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
    names = await list_manifests(cache, job)
    keys: set[str] = set()
    read: list[str] = []
    payloads = await asyncio.gather(
        *(cache.get_object(cache.namespace.object_key(KIND, n)) for n in names)
    )
    for name, (payload, _) in zip(names, payloads, strict=True):
        if payload is None:
            continue
        try:
            keys |= Manifest.from_bytes(payload).keys
        except (ManifestError, EntryError):
            continue
        read.append(name)
    return keys, read


async def write_run(
    cache: TieredCache, job: str, keys: Iterable[str], run_id: str | None = None
) -> str:
    """Write a run manifest, named ``<job>/<run_id>`` when given (the run's summary id)."""
    name = f"{job}/{run_id}" if run_id else _run_name(job)
    manifest = Manifest(job, frozenset(keys), time.time())
    await put(cache, KIND, name, manifest.to_bytes())
    return name


async def compact(cache: TieredCache, job: str, keys: set[str], merged: list[str]) -> bool:
    """Replace ``merged`` run manifests by one; returns whether anything was compacted."""
    runs = [n for n in merged if "/run-" in n]
    if len(runs) <= COMPACT_AFTER or cache.read_only:
        return False
    name = _merged_name(job, keys)
    okey = cache.namespace.object_key(KIND, name)
    payload = Manifest(job, frozenset(keys), time.time()).to_bytes()
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
    """
    started = time.perf_counter()
    timeline = cache.prefetch_timeline = PrefetchTimeline()
    keys, names = await read_job(cache, job)
    cache.prefetched = set(keys)
    missing = await _absent_locally(cache, keys)
    timeline.manifest(keys, len(names), missing)
    # Ranks of a node prefetch in different orders and leave a key another rank is
    # fetching to it (its lease), so together they fetch each key about once.
    random.shuffle(missing)
    if planned is not None:
        planned(len(missing))
    limit = asyncio.Semaphore(concurrency or PREFETCH_CONCURRENCY)
    room = asyncio.Event()  # set as a write-through ends (byte_budget)
    elsewhere = fetched_bytes = 0

    async def fetch(okey: str) -> bool:
        nonlocal elsewhere, fetched_bytes
        async with limit:
            while byte_budget and cache.landing_bytes > byte_budget:
                room.clear()
                await room.wait()
            timeline.request(okey)
            payload, tier = await cache.get_object(
                okey, wait=False, absent_locally=cache.local is not None
            )
            elsewhere += tier == LEASED_ELSEWHERE
            size = None if payload is None else len(payload)
            timeline.arrive(okey, size, tier, elsewhere=tier == LEASED_ELSEWHERE)
            if payload is not None:
                cache.stats.prefetch_fetched[tier] += 1
            fetched_bytes += size or 0
        if progress is not None:
            progress(size or 0)
        return payload is not None

    if byte_budget:
        cache.on_landed = room.set
    try:
        fetched = sum(await asyncio.gather(*(fetch(k) for k in missing)))
    finally:
        if byte_budget:
            cache.on_landed = None
    timeline.end()
    compacted = await compact(cache, job, keys, names)
    return {
        "job": job,
        "manifests": len(names),
        "keys": len(keys),
        "fetched": fetched,
        "bytes": fetched_bytes,
        "already_local": len(keys) - len(missing),
        "fetched_by_another_process": elsewhere,
        "compacted": compacted,
        "seconds": round(time.perf_counter() - started, 3),
    }


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
    return await write_run(cache, job, used | cache.prefetched, run_id)
