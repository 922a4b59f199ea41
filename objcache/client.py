"""The synchronous face of objcache, shared process-wide.

``get_client()`` builds one :class:`TieredCache` per process (again in a forked child) from
:class:`Config` and serves it through the :class:`Bridge`. Every method has a deadline. The
lookups and writes torch's hooks call (``get``, ``put`` and the record calls) return a value:
a failure is a miss, counted in ``stats()``, never an exception into torch. The batch and
maintenance calls (``get_many``, ``put_many``, ``write``, ``listing``) raise
:class:`BridgeTimeout` on a missed deadline: their callers (prefetch, the CLI) count their
own failures.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from objcache import prefetch_process, stores
from objcache.backends.base import ObjectInfo, PutMode
from objcache.backends.fs import FsBackend
from objcache.bridge import Bridge, BridgeTimeout
from objcache.config import logs
from objcache.config.fingerprint import env_id, fingerprint
from objcache.config.settings import Config, user_cache_dir
from objcache.core import candidates, reads, tiered_records, writes
from objcache.core.candidates import Candidate
from objcache.core.fetch_once.nodelease import NodeLeases
from objcache.core.manifest import default_job_name, prefetch, record_run
from objcache.core.records import Change
from objcache.core.tiered import TieredCache
from objcache.core.writes import Remote, Written
from objcache.entry.layout import Namespace
from objcache.observe import keycards, process_stats
from objcache.observe.publish import publish
from objcache.prefetch_process import PrefetchProcess
from objcache.run_observer import RunObserver

log = logging.getLogger("objcache")
T = TypeVar("T")

#: Added to the longest tier deadline for the whole sync call (local I/O, decoding).
_CALL_MARGIN_S = 1.0


def sync_deadline_s(cache: TieredCache) -> float:
    """How long a synchronous call may wait: the longest tier deadline plus a margin.

    Remote tiers are asked concurrently, so the slowest one allowed bounds a lookup; a far
    tier's own ``?timeout_ms=`` above ``OBJCACHE_TIMEOUT_MS`` is honoured, not cut short.
    """
    return max((t.policy.timeout_s for t in cache.tiers), default=0.0) + _CALL_MARGIN_S


def build_cache(
    config: Config, env_fields: dict[str, str] | None = None, *, local_only: bool = False
) -> TieredCache:
    """A TieredCache for ``config`` (no I/O happens until the first call); ``local_only``:
    its local tier alone (a child that only reads what its parent's prefetch brought)."""
    fields = fingerprint() if env_fields is None else env_fields
    local = stores.open_tier(stores.local_spec(config, evict=True), config)
    remotes = [
        stores.open_tier(spec, config, read_only=config.read_only)
        for spec in ([] if local_only else config.effective_tiers())
    ]
    leases = None
    if config.node_single_flight:
        hold_s = max((t.policy.timeout_s for t in remotes), default=0.0) + _CALL_MARGIN_S
        # Through the local tier's own store: its folder walk and checks (docs/security.md).
        store = local.backend.store if isinstance(local.backend, FsBackend) else None
        leases = NodeLeases(str(config.local_dir), hold_s=hold_s, store=store)
    return TieredCache(
        local,
        remotes,
        config.codec(),
        Namespace(env_id(fields)),
        write_behind_max_bytes=config.write_behind_max_bytes,
        read_only=config.read_only,
        env_fields=fields,
        write_to=config.write_to,
        leases=leases,
        caps=config.max_entry_bytes,
    )


class Client:
    """Synchronous, deadline-bound access to one TieredCache."""

    def __init__(self, config: Config, bridge: Bridge | None = None) -> None:
        self.config = config
        logs.configure(config.log_level)
        self.bridge = bridge or Bridge()
        self.cache = build_cache(config)
        self.call_timeout_s = sync_deadline_s(self.cache)
        self.timeouts = 0
        self._closed = False
        self.job = config.job or default_job_name()
        self.prefetch_result: concurrent.futures.Future[dict[str, Any]] | None = None
        #: The prefetch's own process, where it runs in one (objcache/prefetch_process.py).
        self.prefetch_process: PrefetchProcess | None = None
        if config.prefetch and any(t.readable for t in self.cache.remotes):
            self.prefetch_result = self._start_prefetch()
            self.prefetch_result.add_done_callback(self._prefetch_done)
        self.observer = RunObserver(config, self.cache, self.bridge)

    def _start_prefetch(self) -> concurrent.futures.Future[dict[str, Any]]:
        """The start-up prefetch: in a child process from a network store (on another core,
        docs/architecture.md, "The prefetch in its own process"), else on the bridge."""
        if prefetch_process.wanted(self.config):
            try:
                self.prefetch_process = PrefetchProcess(
                    self.cache, self.bridge, self.config, self.job
                )
                return self.prefetch_process.future
            except Exception as exc:  # no child to be had (fork refused, ...): in-process
                log.debug("objcache: no prefetch process: %r", exc)
        return self.bridge.submit(lambda: prefetch(self.cache, self.job))

    def _run(self, factory: Callable[[], Coroutine[Any, Any, T]], default: T) -> T:
        try:
            return self.bridge.call(factory, self.call_timeout_s)
        except BridgeTimeout:
            self.timeouts += 1
            log.debug("objcache call timed out", exc_info=True)
            return default

    def _prefetch_done(self, done: concurrent.futures.Future[dict[str, Any]]) -> None:
        """The prefetch's time, a phase of the run (it runs beside the compiles)."""
        if done.cancelled() or done.exception() is not None:
            return
        seconds = done.result().get("seconds")
        if isinstance(seconds, (int, float)):
            self.bridge.loop.call_soon_threadsafe(
                self.cache.stats.add_phase, "prefetch (beside the compiles)", seconds * 1000
            )

    def get(self, kind: str, key: str) -> bytes | None:
        started = time.perf_counter()
        hit = reads.read_local_sync(self.cache, kind, key)
        if hit is not None:
            payload, okey, size = hit
            ms = (time.perf_counter() - started) * 1000
            self.bridge.loop.call_soon_threadsafe(
                reads.note_local_hit, self.cache, kind, okey, size, ms
            )
            return payload
        return self._run(lambda: self.cache.get(kind, key), None)

    def get_local(self, kind: str, key: str) -> bytes | None:
        """A verified payload from the local tier only, no lookup counted (work a prefetch
        does beside the compile: objcache/integrations/torch/kernels/kernel_places.py)."""
        hit = reads.read_local_sync(self.cache, kind, key)
        return None if hit is None else hit[0]

    def put(self, kind: str, key: str, payload: bytes) -> None:
        """Local write now, remote writes in the background."""
        self._run(lambda: writes.put(self.cache, kind, key, payload), None)

    def replace(self, kind: str, entries: dict[str, bytes]) -> list[Written]:
        """Entries whose content changes under one key (a precompile entry grows as its
        function compiles more frames and variants), stored here and on every writable remote
        tier now, replacing what is there (OVERWRITE, all at once), in the run's prefetch
        manifest: a write-behind put is CREATE and keeps the first version, which a new
        machine would then be served for good. Within OBJCACHE_FLUSH_TIMEOUT_S; raises like
        :meth:`write`. Call it off the compile's thread (it waits for the stores)."""

        async def all_of() -> list[Written]:
            return list(
                await asyncio.gather(
                    *(
                        writes.write(
                            self.cache,
                            self.object_key(kind, key),
                            payload,
                            mode=PutMode.OVERWRITE,
                            remote=Remote.DIRECT,
                            manifest=True,
                        )
                        for key, payload in entries.items()
                    )
                )
            )

        return self.bridge.call(all_of, self.config.flush_timeout_s + 5)

    def put_local(self, kind: str, key: str, payload: bytes) -> None:
        """Stored on this machine only: never published, never in the prefetch manifest
        (imports: bundle kernels, seeded artifacts; a key no other process can compute).
        Raises like :meth:`write`."""
        self.write(self.object_key(kind, key), payload, remote=Remote.NONE)

    @property
    def env(self) -> str:
        """This environment's id (the namespace entries are stored under)."""
        return self.cache.namespace.env

    def object_key(self, kind: str, key: str) -> str:
        """The object key of (kind, key) in this environment."""
        return self.cache.namespace.object_key(kind, key)

    def get_object(self, okey: str) -> bytes | None:
        """The verified payload under a full object key (another namespace's, too), or None."""
        missed: tuple[bytes | None, str] = (None, "")
        return self._run(lambda: self.cache.get_object(okey), missed)[0]

    def get_many(
        self,
        kind: str,
        keys: list[str],
        *,
        follow: Callable[[str, bytes], list[str]] | None = None,
    ) -> dict[str, bytes]:
        """The payloads of those ``keys`` that exist, fetched concurrently in one call.

        ``follow(key, payload)`` names keys to fetch once ``key`` is found (a second round
        in the same call, which then gets twice the deadline). Unlike :meth:`get`, a missed
        deadline raises :class:`BridgeTimeout`: a batch's caller counts its own failures.
        """
        scale = 2.0 if follow is not None else 1.0
        return self.bridge.call(
            lambda: reads.get_many(self.cache, kind, keys, follow), self.call_timeout_s * scale
        )

    def put_many(self, kind: str, items: dict[str, bytes]) -> None:
        """:meth:`put` of every item, concurrently in one call; raises like :meth:`get_many`."""

        async def put_all() -> None:
            await asyncio.gather(*(writes.put(self.cache, kind, k, p) for k, p in items.items()))

        self.bridge.call(put_all, self.call_timeout_s)

    def write(
        self,
        okey: str,
        payload: bytes,
        *,
        mode: PutMode = PutMode.CREATE,
        remote: Remote = Remote.BEHIND,
        local: bool = True,
    ) -> Written:
        """:func:`objcache.core.writes.write`, within OBJCACHE_FLUSH_TIMEOUT_S (a direct write waits
        for every remote tier); a missed deadline raises :class:`BridgeTimeout`."""
        return self.bridge.call(
            lambda: writes.write(self.cache, okey, payload, mode=mode, remote=remote, local=local),
            self.config.flush_timeout_s + 5,
        )

    def listing(self, kind: str) -> tuple[list[tuple[str, ObjectInfo]], list[str]]:
        """``(tier name, object)`` of every object of ``kind`` in this environment, tier by
        tier in order, and the tiers that could not list (skipped, counted); raises like
        :meth:`write`."""
        return self.bridge.call(
            lambda: reads.listing(self.cache, kind), self.config.flush_timeout_s + 5
        )

    def leave_out_of_manifest(self, kind: str, key: str) -> None:
        """Keep (kind, key) out of this run's prefetch manifest (objcache/manifest.py)."""
        okey = self.cache.namespace.object_key(kind, key)
        self.bridge.loop.call_soon_threadsafe(self.cache.recorded.discard, okey)

    def get_record(self, kind: str, key: str) -> bytes | None:
        """A record's value (nearest remote tier first; see objcache/core/tiered_records.py)."""
        return self._run(lambda: tiered_records.get_record(self.cache, kind, key), None)

    def update_record(self, kind: str, key: str, change: Change) -> None:
        """Read-modify-write of a record: local now, remote tiers in the background."""
        self._run(lambda: tiered_records.update_record(self.cache, kind, key, change), None)

    def get_candidates(
        self, kind: str, key: str, *, prefetched_only: bool = False
    ) -> list[Candidate]:
        """Every verified guarded candidate of ``key``, local first (a LIST, then GETs);
        ``prefetched_only``: those the start-up prefetch brought, from the local tier only
        (objcache/core/candidates.py)."""
        try:
            return self.bridge.call(
                lambda: candidates.get_candidates(
                    self.cache, kind, key, prefetched_only=prefetched_only
                ),
                2 * self.call_timeout_s,
            )
        except BridgeTimeout:
            self.timeouts += 1
            return []

    def put_candidate(self, kind: str, key: str, payload: bytes) -> None:
        """Store one guarded candidate of ``key`` (local now, remote in the background)."""
        self._run(lambda: candidates.put_candidate(self.cache, kind, key, payload), "")

    def adopt_candidate(self, candidate: Candidate) -> None:
        """Keep a candidate that passed its guards in the local tier."""
        self._run(lambda: candidates.adopt_candidate(self.cache, candidate), None)

    def flush(self, timeout: float | None = None) -> int:
        t = self.config.flush_timeout_s if timeout is None else timeout
        try:
            return self.bridge.call(lambda: self.cache.flush(t), t + _CALL_MARGIN_S)
        except BridgeTimeout:
            return -1

    def stats(self) -> dict[str, Any]:
        def snapshot() -> Coroutine[Any, Any, dict[str, Any]]:
            async def run() -> dict[str, Any]:
                return self.cache.stats_dict()

            return run()

        empty: dict[str, Any] = {}
        result = self._run(snapshot, empty)
        result["sync_timeouts"] = self.timeouts
        return result

    def close(self) -> None:
        """Flush within OBJCACHE_FLUSH_TIMEOUT_S and close every tier (idempotent)."""
        if self._closed:
            return
        self._closed = True
        t = self.config.flush_timeout_s
        if self.prefetch_process is not None:
            self.prefetch_process.stop()

        async def finish() -> int:
            if self.prefetch_result is not None and not self.prefetch_result.done():
                self.prefetch_result.cancel()
            try:
                await record_run(self.cache, self.job, self.observer.run_id)
            except Exception:
                log.debug("writing the run manifest failed", exc_info=True)
            # The summary counts the bytes the flush wrote: flush first, then queue it. A
            # flush that left writes behind (a hung tier) gets no summary to wait for too.
            started = time.monotonic()
            if await self.cache.flush(t) == 0:
                await self.observer.write_summary(self.job)
            return await self.cache.close(max(1.0, t - (time.monotonic() - started)))

        try:
            left = self.bridge.call(finish, t + 5)
        except BridgeTimeout:
            left = -1
        if left:
            log.warning("objcache: %s remote writes were not flushed at exit", left)
        _write_stats_file(self)
        self.observer.close()


def stats_file(config: Config) -> Path:
    """Where a process leaves its stats at exit for ``objcache stats``."""
    return config.stats_file or user_cache_dir() / "last-stats.json"


def _write_stats_file(client: Client) -> None:
    """Leave this process's stats where ``objcache stats`` finds them (if it did anything)."""
    data = client.cache.stats_dict()
    if not data["cache"]["gets"] and not any(t["puts"] for t in data["tiers"]):
        return
    # whose stats these are: `objcache stats` on a shared machine must say
    data.update(written_at=time.time(), host=socket.gethostname(), pid=os.getpid(), job=client.job)
    target = stats_file(client.config)
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # whoever can write the folder cannot make this write land elsewhere; the processes
        # of one start (vLLM's three, a job's ranks) share the file
        process_stats.combined(target, data, publish)
    except OSError:
        log.debug("cannot write stats file %s", target, exc_info=True)


_lock = threading.Lock()
_client: Client | None = None
_client_pid = 0
#: Told each process-wide client once it is built (on the thread that built it, after the
#: lock): work an integration starts beside the client's prefetch, whichever path built it
#: (``install()``, or a first lookup on the zero-code path). A listener that raises is
#: logged and dropped.
client_listeners: list[Callable[[Client], None]] = []


def get_client(config: Config | None = None) -> Client:
    """The process-wide client (a forked child builds its own on first use)."""
    global _client, _client_pid
    pid = os.getpid()
    client = _client
    if client is not None and _client_pid == pid and config is None:
        return client
    with _lock:
        if _client is not None and _client_pid == pid and config is None:
            return _client  # another thread built it meanwhile
        if _client is not None and _client_pid == pid:
            _client.close()
        client = _client = Client(config or Config.from_env())
        _client_pid = pid
        process_stats.run_group()  # named before this process starts others
    for listener in list(client_listeners):
        try:
            listener(client)
        except Exception:
            log.debug("client listener %r failed; dropped", listener, exc_info=True)
            with contextlib.suppress(ValueError):
                client_listeners.remove(listener)
    return client


def current_client() -> Client | None:
    """The process-wide client where this process has built one, else None (builds none)."""
    client = _client
    return client if client is not None and _client_pid == os.getpid() else None


# Whether key cards are kept is this client's configuration: observe reads it through the
# switch handed in here, never by calling up into the client (docs/architecture.md, "Layers").
keycards.configure(lambda: get_client().config.key_cards)


def reset_client() -> None:
    """Close and forget the process-wide client (tests, reconfiguration)."""
    global _client
    with _lock:
        if _client is not None and _client_pid == os.getpid():
            _client.close()
        _client = None


@atexit.register
def _close_at_exit() -> None:
    client = _client
    if client is not None and _client_pid == os.getpid():
        client.close()


def _register_early_exit_hook() -> None:
    """Close the client before thread pools refuse work, not after.

    ``atexit`` runs after ``threading._shutdown`` has stopped every ``ThreadPoolExecutor``
    (``concurrent.futures.thread._python_exit``), so an exit-time flush that needs
    ``asyncio.to_thread`` (the disk and file backends) fails with "cannot schedule new futures
    after shutdown": the last write-behind entries and the run manifest were lost. Hooks
    registered with ``threading._register_atexit`` run in reverse order *before* that, so
    concurrent.futures.thread is imported first (registering its hook first, running last).
    The ``atexit`` hook above stays as the fallback; closing twice is a no-op.
    """
    import concurrent.futures.thread  # noqa: F401

    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        with contextlib.suppress(RuntimeError):  # interpreter already shutting down
            register(_close_at_exit)


_register_early_exit_hook()


def _after_fork_in_child() -> None:
    global _client, _lock
    _lock = threading.Lock()
    _client = None


os.register_at_fork(after_in_child=_after_fork_in_child)
