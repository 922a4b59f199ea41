"""Store maintenance, independent of any UI: listing, copying, verifying, collecting garbage.

The CLI (:mod:`objcache.cli`) renders these; each takes an optional ``progress`` callback,
called once per object done with the bytes it moved, so long work can show a bar with bytes
and rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from objcache.backends.base import Backend, Describes, ObjectInfo, PutMode, TierSpec
from objcache.config.urls import flag
from objcache.entry.caps import SizeCaps
from objcache.entry.codec import MAX_PAYLOAD, Codec
from objcache.entry.layout import ENV_FILE, LAYOUT_VERSION, parse_object_key
from objcache.errors import BackendError, EntryError, EntryTooLarge, InvalidKey, ReadOnlyRefused
from objcache.observe import run_summary as summary
from objcache.observe.keycards import CARDS_ENV

log = logging.getLogger("objcache")
Progress = Callable[[int], None]
CONCURRENCY = 64
#: Objects a bulk copy (``push``, ``pull``, ``pull --job``) keeps in flight: at +50 ms RTT 64
#: left the copy waiting on round trips (2,000 small entries: push 3.5 s -> 2.5 s, pull
#: 3.5 s -> 2.9 s with 256), and straight to the server it costs nothing; the S3 pool
#: (``max_pool_connections``) is as large (docs/architecture.md, "S3 requests").
BULK_CONCURRENCY = 256
#: Bytes of entries of at least :data:`BUDGETED_BYTES` a bulk copy holds at once (an entry
#: larger than this goes alone): with 256 in flight, the count alone no longer bounds
#: the memory of a copy of large entries.
BULK_BYTE_BUDGET = 256 << 20
BUDGETED_BYTES = 1 << 20
#: Entries at least this big are verified in a worker thread (hashlib releases the GIL), so
#: a bulk copy hashes on one core while the event loop drives the transfers on another.
VERIFY_OFFLOAD_BYTES = 64 * 1024
#: Longest an interrupted copy waits for its local writes under way before it reports.
SETTLE_S = 5.0
#: Largest ``ENV.json`` read (a real one is under 1 KiB): docs/security.md, "Bulk commands".
ENV_FILE_MAX_BYTES = 64 << 10


def refuse_read_only(action: str, specs: Iterable[TierSpec], *, read_only: bool = False) -> None:
    """Fail closed before ``action`` writes or deletes anything: a read-only configuration
    (``OBJCACHE_READ_ONLY``) or a ``?read_only=1`` tier among ``specs`` refuses it."""
    if read_only:
        raise ReadOnlyRefused(
            f"{action} refused: the configuration is read-only (OBJCACHE_READ_ONLY)"
        )
    for spec in specs:
        if flag(spec, "read_only"):
            raise ReadOnlyRefused(f"{action} refused: {spec.display} is read-only (read_only=1)")


def is_env_file(okey: str) -> bool:
    """Whether ``okey`` is an environment's ``v1/<env>/ENV.json`` (plain JSON, no entry)."""
    parts = okey.split("/")
    return len(parts) == 3 and parts[0] == LAYOUT_VERSION and parts[2] == ENV_FILE


def read_cap(caps: SizeCaps, okey: str) -> int:
    """The most bytes a bulk command reads of ``okey``, and the largest payload it accepts
    there: the cap of the object's kind, as a lookup applies it (docs/security.md)."""
    if is_env_file(okey):
        return ENV_FILE_MAX_BYTES
    parsed = parse_object_key(okey)
    return caps.for_kind(parsed[1]) if parsed else caps.default


async def verify_entry(
    codec: Codec, data: bytes, okey: str, max_payload: int = MAX_PAYLOAD
) -> None:
    """``codec.verify(data, okey, max_payload)``, off the event loop when ``data`` is big."""
    if len(data) >= VERIFY_OFFLOAD_BYTES:
        await asyncio.to_thread(codec.verify, data, okey, max_payload)
    else:
        codec.verify(data, okey, max_payload)


@dataclass(frozen=True)
class Entry:
    info: ObjectInfo
    env: str
    kind: str
    key: str

    @property
    def age_days(self) -> float:
        return (time.time() - self.info.mtime) / 86400


async def entries(
    backend: Backend,
    *,
    env: str | None = None,
    kind: str | None = None,
) -> AsyncIterator[Entry]:
    """Every objcache entry in ``backend``, optionally of one env and kind."""
    prefix = f"{LAYOUT_VERSION}/"
    if env:
        prefix += f"{env}/"
        if kind:
            prefix += f"{kind}/"
    async for info in backend.list(prefix):
        parsed = parse_object_key(info.key)
        if parsed is None:
            continue
        e_env, e_kind, e_key = parsed
        if kind and e_kind != kind:
            continue
        yield Entry(info, e_env, e_kind, e_key)


async def environments(backend: Backend, codec: Codec | None = None) -> dict[str, dict[str, Any]]:
    """env id -> {"fields": ENV.json content or {}, "entries": n, "bytes": n}.

    ``ENV.json`` is read capped (:data:`ENV_FILE_MAX_BYTES`); one that is too big, not JSON
    or not an object gives ``{"error": ...}`` fields, never an exception. An environment
    without one (its processes only looked up, or wrote only run summaries) is described by
    its newest run summary's fields, read and verified with ``codec`` as ``objcache report``
    reads it (docs/architecture.md, "Run summaries")."""
    envs: dict[str, dict[str, Any]] = {}
    summaries: dict[str, tuple[float, str]] = {}
    async for info in backend.list(f"{LAYOUT_VERSION}/"):
        parts = info.key.split("/")
        if len(parts) < 3:
            continue
        env = envs.setdefault(parts[1], {"fields": {}, "entries": 0, "bytes": 0})
        if parts[2] == ENV_FILE:
            continue
        env["entries"] += 1
        env["bytes"] += info.size
        if parts[2] == summary.KIND and info.mtime >= summaries.get(parts[1], (-1.0, ""))[0]:
            summaries[parts[1]] = (info.mtime, info.key)
    for env_id, env in envs.items():
        try:
            okey = f"{LAYOUT_VERSION}/{env_id}/{ENV_FILE}"
            raw = await backend.get_capped(okey, ENV_FILE_MAX_BYTES)
        except EntryTooLarge:
            env["fields"] = {"error": "ENV.json too large"}
            continue
        except InvalidKey:  # an env folder no call can address
            env["fields"] = {"error": "unreadable ENV.json"}
            continue
        if raw:
            try:
                fields = json.loads(raw)
            except (ValueError, RecursionError):
                fields = None
            ok = isinstance(fields, dict)
            env["fields"] = fields if ok else {"error": "unreadable ENV.json"}
        elif codec is not None and env_id in summaries:
            env["fields"] = await _summary_env(backend, codec, summaries[env_id][1])
    return envs


async def _summary_env(backend: Backend, codec: Codec, okey: str) -> dict[str, Any]:
    """The environment fields a run summary carries ({} when it cannot be used)."""
    try:
        data = await backend.get_capped(okey, 2 * summary.MAX_BYTES)
        if data is None:
            return {}
        return dict(summary.parse(codec.decode(data, okey, summary.MAX_BYTES))["env"])
    except Exception:  # too large, refused, invalid, unreadable: described as unknown
        log.debug("cannot read the environment of run summary %s", okey, exc_info=True)
        return {}


class Newest:
    """The ``limit`` newest of the items offered, kept in memory of ``limit`` items whatever
    a listing yields, and how many were left out (``objcache report`` and ``explain`` read
    the newest runs first, within a budget that does not depend on the store)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.left_out = 0
        self._heap: list[tuple[float, str, Any]] = []

    def offer(self, started: float, name: str, item: Any) -> None:
        entry = (started, name, item)
        if len(self._heap) < self.limit:
            heapq.heappush(self._heap, entry)
            return
        self.left_out += 1
        if self._heap and entry[:2] > self._heap[0][:2]:
            heapq.heapreplace(self._heap, entry)

    def newest_first(self) -> list[tuple[float, str, Any]]:
        return sorted(self._heap, key=lambda e: e[:2], reverse=True)


def _moved(item: Any, result: Any) -> int:
    """The bytes an ``fn`` of :func:`bounded` moved: its result when that is a count."""
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


async def bounded(
    items: list[Any],
    fn: Callable[[Any], Any],
    progress: Progress | None,
    weight: Callable[[Any, Any], int] = _moved,
    concurrency: int = CONCURRENCY,
) -> list[Any]:
    """``fn`` over ``items``, ``concurrency`` at a time; ``progress(weight(item, result))``
    after each (by default ``fn`` returns the bytes it moved)."""
    limit = asyncio.Semaphore(concurrency)

    async def one(item: Any) -> Any:
        async with limit:
            result = await fn(item)
        if progress:
            progress(weight(item, result))
        return result

    return list(await asyncio.gather(*(one(i) for i in items)))


class ByteBudget:
    """At most ``limit`` bytes held at once by those that :meth:`hold` them; a claim larger
    than ``limit`` waits until nothing else is held and then goes alone."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, nbytes: int) -> AsyncIterator[None]:
        nbytes = min(nbytes, self.limit)
        async with self._changed:
            await self._changed.wait_for(lambda: self.held + nbytes <= self.limit)
            self.held += nbytes
        try:
            yield
        finally:
            async with self._changed:
                self.held -= nbytes
                self._changed.notify_all()


@dataclass
class CopyReport:
    copied: int = 0
    existed: int = 0
    refused: int = 0
    failed: int = 0
    bytes: int = 0
    errors: list[str] = field(default_factory=list)
    #: Writes to a local target under way in worker threads (see :meth:`settle`).
    writing: int = 0
    _lock: threading.Condition = field(default_factory=threading.Condition, repr=False)

    def landed(self, nbytes: int) -> None:
        """One entry written, counted in the worker thread that wrote it: a Ctrl-C that
        cancels the copy after the rename still counts the entry it left."""
        with self._lock:
            self.copied += 1
            self.bytes += nbytes

    def begin_write(self) -> None:
        with self._lock:
            self.writing += 1

    def end_write(self) -> None:
        with self._lock:
            self.writing -= 1
            self._lock.notify_all()

    def settle(self, timeout_s: float = SETTLE_S) -> None:
        """Wait (at most ``timeout_s``) for the local writes under way to finish, so the
        count an interrupted copy reports covers every entry it left in place."""
        with self._lock:
            self._lock.wait_for(lambda: self.writing <= 0, timeout=timeout_s)


async def copy(
    source: Backend,
    targets: list[Backend],
    keys: list[str],
    codec: Codec,
    progress: Progress | None = None,
    *,
    read_only: bool = False,
    caps: SizeCaps | None = None,
    report: CopyReport | None = None,
    sizes: dict[str, int] | None = None,
) -> CopyReport:
    """Copy entries, verifying each before writing it (a bad entry is never propagated).

    :data:`BULK_CONCURRENCY` at a time; entries whose listed size (``sizes``) is at least
    :data:`BUDGETED_BYTES` also hold their bytes of :data:`BULK_BYTE_BUDGET` while copied.

    Each read is capped by its kind's size cap (``caps``, default :class:`SizeCaps`): an
    object over it is refused without being read whole (docs/security.md, "Bulk commands").
    Refused before any call when the configuration or a target is read-only. ``report``,
    when given, is filled as entries are done, so a caller interrupted half-way can say
    what was copied (every backend writes an object whole or not at all)."""
    refuse_read_only("copy", (t.spec for t in targets), read_only=read_only)
    report = report if report is not None else CopyReport()
    caps = caps or SizeCaps()

    async def put(target: Backend, okey: str, data: bytes) -> bool:
        """Whether ``okey`` was created in ``target`` (False: it was there already). A
        refused write of an object the target already holds (a store that answers an
        existing name with an error instead of "exists": a read-only replica, a write-once
        bucket policy) is "already there", not a failure."""
        try:
            return await target.put(okey, data, PutMode.CREATE)
        except (BackendError, OSError):
            if await already_there(target, okey):
                return False
            raise

    async def already_there(target: Backend, okey: str) -> bool:
        try:
            return await target.exists(okey)
        except (BackendError, OSError):
            return False

    # A single target counts each entry once its write is answered: a local store (pull) in
    # the worker thread that wrote it, so a Ctrl-C after the rename still counts it; a
    # command's bounded remote tier (push to one tier) once its answer is back.
    local = getattr(targets[0], "put_then", None) if len(targets) == 1 else None

    async def put_local(okey: str, data: bytes) -> bool | None:
        """:func:`put` to the local target; None when the entry was written (and counted).

        The write's thread and this coroutine settle its count once between them: a deadline
        that ends the wait while the thread still writes gives the write up (its ``then``
        then counts nothing; the entry is "already there" or failed, as its store says), and a
        write whose thread counted it is never counted again, whatever the answer said."""
        assert local is not None
        guard = threading.Lock()
        finished = stored = given_up = False

        def then(created: bool) -> None:
            nonlocal finished, stored
            with guard:
                if given_up:
                    return
                finished, stored = True, created
            if created:
                report.landed(len(data))
            report.end_write()

        report.begin_write()
        try:
            created: bool = await local(okey, data, PutMode.CREATE, then)
        except (BackendError, OSError):
            with guard:
                counted, landed = finished, stored
                given_up = not counted
            if not counted:  # no answer from its thread (not run, or still writing)
                report.end_write()
            elif landed:
                return None
            if await already_there(targets[0], okey):  # as :func:`put`, without a 2nd write
                return False
            raise
        return None if created else False

    budget = ByteBudget(BULK_BYTE_BUDGET)
    sizes = sizes or {}

    async def one(okey: str) -> int:
        size = sizes.get(okey, 0)
        if size < BUDGETED_BYTES:
            return await copy_one(okey)
        async with budget.hold(size):
            return await copy_one(okey)

    async def copy_one(okey: str) -> int:
        cap = read_cap(caps, okey)
        try:
            data = await source.get_capped(okey, cap)
            if data is None:
                return 0
            if not is_env_file(okey):
                await verify_entry(codec, data, okey, cap)
            if local is not None:
                created = await put_local(okey, data)
                if created is None:
                    return len(data)
                results = [created]
            else:
                results = await asyncio.gather(*(put(t, okey, data) for t in targets))
        except (EntryError, EntryTooLarge) as exc:
            report.refused += 1
            report.errors.append(f"{okey}: {exc}")
            return 0
        except (BackendError, OSError) as exc:
            report.failed += 1
            report.errors.append(f"{okey}: {exc}")
            return 0
        if any(results):
            report.landed(len(data))
        else:
            report.existed += 1
        return len(data)

    await bounded(keys, one, progress, concurrency=BULK_CONCURRENCY)
    return report


@dataclass
class VerifyReport:
    checked: int = 0
    bad: list[tuple[str, str]] = field(default_factory=list)
    deleted: int = 0


#: Bad entries ``verify --delete`` leaves in place: a name no call can address, and an entry
#: only over the caps of whoever runs the command (docs/security.md, "Bulk commands").
KEPT_BY_DELETE = frozenset({"invalid_key", "too_large"})


async def verify(
    backend: Backend,
    codec: Codec,
    *,
    env: str | None = None,
    delete: bool = False,
    progress: Progress | None = None,
    read_only: bool = False,
    caps: SizeCaps | None = None,
) -> VerifyReport:
    """Check every entry's digest (and signature when keys are configured), each read and
    checked with its kind's size cap (``caps``): an entry over it is bad (``too_large``).

    ``delete`` is refused before any call when the configuration or the tier is read-only."""
    if delete:
        refuse_read_only("verify --delete", [backend.spec], read_only=read_only)
    report = VerifyReport()
    caps = caps or SizeCaps()
    found = [e async for e in entries(backend, env=env)]

    async def one(entry: Entry) -> int:
        okey = entry.info.key
        cap = read_cap(caps, okey)
        data: bytes | None = None
        try:
            data = await backend.get_capped(okey, cap)
            if data is None:
                return 0
            await verify_entry(codec, data, okey, cap)
            reason = ""
        except EntryTooLarge:
            reason = "too_large"  # refused before its body was read
        except InvalidKey:
            reason = "invalid_key"  # a name no call can address (not UTF-8): not deletable
        except EntryError as exc:
            reason = exc.reason
        report.checked += 1
        if reason:
            report.bad.append((okey, reason))
            # Over this caller's cap is not corrupt: another machine with larger caps
            # (OBJCACHE_MAX_ENTRY_BYTES) serves it. Only entries that fail the check go.
            if delete and reason not in KEPT_BY_DELETE and await backend.delete(okey):
                report.deleted += 1
        return len(data) if data is not None else 0

    await bounded(found, one, progress)
    return report


@dataclass
class GcPlan:
    delete: list[Entry] = field(default_factory=list)
    keep_bytes: int = 0

    @property
    def delete_bytes(self) -> int:
        return sum(e.info.size for e in self.delete)


async def plan_gc(
    backend: Backend,
    *,
    keep_envs: set[str] | None = None,
    older_than_days: float | None = None,
    max_bytes: int | None = None,
) -> GcPlan:
    """What ``gc`` would delete: other envs, old entries, then oldest until under max_bytes."""
    plan = GcPlan()
    keep: list[Entry] = []
    # every entry is held anyway: one a Redis SCAN listed twice counts once, so the bytes
    # kept are not overstated into deleting more (docs/architecture.md, "Listings")
    seen: set[str] = set()
    async for entry in entries(backend):
        if entry.info.key in seen:
            continue
        seen.add(entry.info.key)
        # key cards are shared by every environment (docs/architecture.md, "Key cards"):
        # only age and size remove them
        other_env = entry.env not in keep_envs if keep_envs is not None else False
        if (other_env and entry.env != CARDS_ENV) or (
            older_than_days is not None and entry.age_days > older_than_days
        ):
            plan.delete.append(entry)
        else:
            keep.append(entry)
    if max_bytes is not None:
        keep.sort(key=lambda e: e.info.mtime)
        total = sum(e.info.size for e in keep)
        while keep and total > max_bytes:
            victim = keep.pop(0)
            total -= victim.info.size
            plan.delete.append(victim)
    plan.keep_bytes = sum(e.info.size for e in keep)
    return plan


async def run_gc(
    backend: Backend, plan: GcPlan, progress: Progress | None = None, *, read_only: bool = False
) -> int:
    """Delete what ``plan`` lists; refused when the configuration or the tier is read-only."""
    refuse_read_only("gc", [backend.spec], read_only=read_only)

    async def one(entry: Entry) -> bool:
        try:
            return await backend.delete(entry.info.key)
        except BackendError:
            return False

    deleted = await bounded(plan.delete, one, progress, lambda e, gone: e.info.size if gone else 0)
    return sum(deleted)


@dataclass
class ProbeResult:
    ok: bool
    steps: dict[str, float] = field(default_factory=dict)  # step -> ms
    error: str = ""
    #: the store's shape, from a backend that describes it (base.Describes)
    about: str = ""


async def probe(backend: Backend, codec: Codec, *, write: bool = True) -> ProbeResult:
    """The store's shape where the backend tells it, then read (and unless read-only,
    create + read back + delete) a probe object."""
    key = f"{LAYOUT_VERSION}/_doctor/{socket.gethostname()}-{secrets.token_hex(4)}"
    result = ProbeResult(ok=False)
    payload = secrets.token_bytes(1024)
    try:
        if isinstance(backend, Describes):  # a command's tier: every backend (Tier.bounded)
            result.about = await backend.describe()
        if write:
            started = time.perf_counter()
            if not await backend.put(key, codec.encode(payload, key), PutMode.CREATE):
                raise BackendError("create of a fresh probe key reported 'exists'")
            result.steps["create"] = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        data = await backend.get(key)
        result.steps["read"] = (time.perf_counter() - started) * 1000
        if write:
            if data is None or codec.decode(data, key) != payload:
                raise BackendError("probe read back different bytes")
            started = time.perf_counter()
            await backend.delete(key)
            result.steps["delete"] = (time.perf_counter() - started) * 1000
        result.ok = True
    except (BackendError, EntryError, OSError) as exc:
        result.error = str(exc)
        log.debug("probe of %s failed", backend.name, exc_info=True)
    return result
