"""A tier: one backend plus its policy (deadline, retries, breaker, flags) and stats.

This is the only place that turns backend errors into misses. Nothing here raises: every
outcome is a value and a counter, and each distinct failure is logged once. A tier counts its
own outcomes, those the caller decides too (hit, refused, missed); a maintenance command's tier
(:meth:`Tier.for_command`) raises instead, for the command to report (docs/architecture.md,
"Policies").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sized
from dataclasses import dataclass, replace
from typing import TypeVar

from objcache.backends.base import (
    Backend,
    Describes,
    LocalStore,
    ObjectInfo,
    PendingWrite,
    PutMode,
    Sharded,
    TierSpec,
    WritesInPieces,
)
from objcache.backends.records_contract import RecordBackend
from objcache.config.urls import flag
from objcache.core.policy import CircuitBreaker, NoBreaker, RetryPolicy, call_with_policy
from objcache.core.records import Change, read_modify_write
from objcache.errors import (
    BackendError,
    ClockSkew,
    EntryError,
    EntryTooLarge,
    InvalidKey,
    PartialOutage,
    PermanentBackendError,
    TransientBackendError,
)
from objcache.observe.metrics import TierStats, log_once

T = TypeVar("T")
S = TypeVar("S", bound=Sized)

#: Share of the tier deadline a record update may spend on conflicts before it is dropped
#: (the rest is left for the last attempt's answer, so a storm never trips the breaker).
RECORD_BUDGET = 0.9


#: The slowest transfer a command's deadline allows for the bytes it sends, on top of the
#: tier's deadline (docs/architecture.md, "Policies").
COMMAND_FLOOR_BYTES_PER_S = 4 << 20


def deadline_s(spec: TierSpec, default_ms: int) -> float:
    """A tier's deadline in seconds: its ``?timeout_ms=``, else ``default_ms``
    (OBJCACHE_TIMEOUT_MS). The one place ``timeout_ms`` is read."""
    return int(spec.options.get("timeout_ms") or default_ms) / 1000


@dataclass(frozen=True)
class TierFlags:
    read_only: bool = False
    write_only: bool = False
    #: Largest entry this tier stores (0: no limit); bigger ones go to the next tier.
    max_size: int = 0
    #: A home tier receives every write even when writes go to the nearest tier only.
    home: bool = False


class Failed(Exception):
    """:meth:`Tier.call` failed for ``reason`` (already counted and logged)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class Tier:
    def __init__(
        self,
        backend: Backend,
        policy: RetryPolicy,
        breaker: CircuitBreaker,
        flags: TierFlags = TierFlags(),
    ) -> None:
        self.backend = backend
        self.policy = policy
        self.breaker = breaker
        self.flags = flags
        self.stats = TierStats(backend.name)
        if isinstance(backend, Sharded) and policy.timeout_s > 0:
            # a silent server of a sharded store answers as a PartialOutage within the deadline
            backend.bound_nodes(policy.timeout_s)

    @classmethod
    def from_backend(
        cls,
        backend: Backend,
        *,
        timeout_ms: int,
        retries: int,
        breaker_failures: int,
        breaker_cooldown_s: float,
        read_only: bool = False,
    ) -> Tier:
        """Build a tier; per-tier URL options override the global defaults."""
        opts = backend.spec.options
        policy = RetryPolicy(
            timeout_s=deadline_s(backend.spec, timeout_ms),
            retries=int(opts.get("retries", retries)),
        )
        flags = TierFlags(
            read_only=read_only or flag(backend.spec, "read_only"),
            write_only=flag(backend.spec, "write_only"),
            max_size=int(opts.get("max_size", 0)),
            home=flag(backend.spec, "home"),
        )
        return cls(backend, policy, CircuitBreaker(breaker_failures, breaker_cooldown_s), flags)

    @classmethod
    def for_command(cls, backend: Backend, *, timeout_ms: int) -> Tier:
        """A maintenance command's tier (opened by objcache/stores.py): the tier's deadline,
        no retries (a command reports the first error), no breaker (every call is tried)."""
        policy = RetryPolicy(timeout_s=deadline_s(backend.spec, timeout_ms), retries=0)
        return cls(backend, policy, NoBreaker())

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def readable(self) -> bool:
        return not self.flags.write_only

    @property
    def writable(self) -> bool:
        return not self.flags.read_only

    # --- calls -------------------------------------------------------------------------

    async def call(self, op: str, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn`` under the tier's policy and breaker; raises :class:`Failed` (counted
        against the breaker where the tier is at fault, logged once) on any failure."""
        if not self.breaker.allow():
            raise Failed("breaker")
        probe = self.breaker.probe
        try:
            result = await call_with_policy(fn, self.policy)
        except (asyncio.TimeoutError, TimeoutError):
            raise self._failed(
                op, "timeout", f"{self.name}: {op} exceeded {self.policy.timeout_s}s"
            ) from None
        except EntryTooLarge as exc:
            self.breaker.success()
            log_once.warn(self.name, f"{op}-too_large", f"{self.name}: {op} refused: {exc}")
            raise Failed("too_large") from None
        except InvalidKey as exc:
            # The caller's key, not the tier, is at fault: not a breaker failure, or a few
            # oversized keys would take a healthy tier down for everyone (and like
            # EntryTooLarge it ends a half-open probe).
            self.breaker.success()
            log_once.warn(self.name, f"{op}-invalid_key", f"{self.name}: {op} refused: {exc}")
            raise Failed("invalid_key") from None
        except ClockSkew as exc:
            # This machine's clock, not the tier, is at fault: the tier answered, so like
            # InvalidKey it is no breaker failure (and ends a half-open probe).
            self.breaker.success()
            log_once.warn(self.name, f"{op}-clock_skew", f"{op} refused: {exc}")
            raise Failed("clock_skew") from None
        except PartialOutage as exc:
            # One node of a sharded store, not the tier: its keys miss, the others are
            # served, so it neither counts against the breaker nor closes or re-opens it; a
            # probe's slot is given back (the next call probes, perhaps a healthy node's key).
            log_once.warn(self.name, f"{op}-partial", f"{self.name}: {op} failed: {exc}")
            raise Failed("error") from None
        except PermanentBackendError as exc:
            # A permanent error says the tier is misconfigured: count it against the breaker.
            raise self._failed(op, "error", f"{op} failed: {exc}") from None
        except (BackendError, OSError) as exc:
            raise self._failed(op, "error", f"{self.name}: {op} failed: {exc}") from None
        finally:
            # a probe that ended without a verdict (a partial outage, a call its caller
            # cancelled, an error of no kind above) gives its slot back: one left claimed
            # would refuse every later call of the process
            if probe is not None:
                self.breaker.release(probe)
        self.breaker.success()
        return result

    def _failed(self, op: str, reason: str, message: str) -> Failed:
        """Count a failure of the tier against its breaker and log it once per (op, reason);
        the :class:`Failed` to raise, whose reason the caller counts as the miss."""
        if self.breaker.failure():
            self.stats.breaker_opened += 1
            log_once.warn(
                self.name,
                "breaker",
                f"{self.name}: skipping this tier for {self.breaker.cooldown_s:.0f}s "
                f"after {self.breaker.threshold} consecutive failures",
            )
        log_once.warn(self.name, f"{op}-{reason}", message)
        return Failed(reason)

    async def get(self, key: str, max_bytes: int = 0) -> tuple[bytes | None, str]:
        """``(data, "")`` on a hit, ``(None, reason)`` on a miss of any kind; an object over
        a non-zero ``max_bytes`` is a ``too_large`` miss."""
        backend = self.backend
        return await self.get_with(
            key, lambda: backend.get_capped(key, max_bytes) if max_bytes else backend.get(key)
        )

    async def get_with(
        self, key: str, read: Callable[[], Awaitable[S | None]]
    ) -> tuple[S | None, str]:
        """:meth:`get` of what ``read`` returns (the body, or what a body streamed elsewhere
        left: objcache/core/streamed.py), timed and counted as a get: ``(it, "")`` on a hit,
        ``(None, reason)`` on a miss."""
        started = time.perf_counter()
        try:
            data = await self.call("get", read)
        except Failed as f:
            self.missed(key, f.reason)
            return None, f.reason
        finally:
            self.stats.get_latency.observe((time.perf_counter() - started) * 1000)
        if data is None:
            self.missed(key, "absent")
            return None, "absent"
        self.stats.bytes_read += len(data)
        return data, ""

    async def list(self, prefix: str) -> list[ObjectInfo] | None:
        """Every object under ``prefix``, the whole listing under the tier's policy (a retry
        lists again from the start); None, counted as a ``list`` miss, when it could not."""

        async def collect() -> list[ObjectInfo]:
            # the whole listing is held anyway: an object a Redis SCAN listed twice is kept
            # once (docs/architecture.md, "Listings")
            return list({info.key: info async for info in self.backend.list(prefix)}.values())

        try:
            return await self.call("list", collect)
        except Exception:
            self.stats.misses["list"] += 1
            return None
        finally:
            self.stats.undecodable_names = self.backend.undecodable_names

    # --- outcomes decided by the caller, counted here ------------------------------------
    # TieredCache verifies what get() returned and looks at the local tier outside it (the
    # fast path, node leases); it tells the tier the outcome and the tier counts it.

    def hit(self, key: str) -> None:
        """A verified entry of this tier served ``key``."""
        self.stats.hits += 1
        self.stats.note(key, "hit")

    def missed(self, key: str, reason: str) -> None:
        """A miss of ``key`` for ``reason`` (``absent``, ``breaker`` for a tier skipped while
        its breaker is open, or a failure reason)."""
        self.stats.misses[reason] += 1
        self.stats.note(key, reason)

    def refused(self, key: str, exc: EntryError) -> None:
        """An entry of this tier failed verification: a miss with its reason, logged once."""
        self.missed(key, exc.reason)
        log_once.warn(self.name, exc.reason, f"{self.name}: refused entry {key}: {exc}")

    def read_outside(self, nbytes: int, ms: float | None = None) -> None:
        """Bytes of this tier read without :meth:`get` (the local fast path, a lease's look)."""
        self.stats.bytes_read += nbytes
        if ms is not None:
            self.stats.get_latency.observe(ms)

    def put_skipped(self, reason: str) -> None:
        """A write this tier was not asked for (its breaker is open): counted, not silent."""
        self.stats.put_errors[reason] += 1

    async def put(
        self,
        key: str,
        data: bytes,
        mode: PutMode = PutMode.CREATE,
        *,
        then: Callable[[bool], None] | None = None,
    ) -> bool:
        """Whether the bytes are now stored (an existing entry under CREATE counts).

        ``then`` (a local tier only, :class:`LocalStore`): called with whether the backend
        stored the bytes, in the worker thread that wrote them. It is not called when the
        write never started (size limit, open breaker): the caller handles that case.
        """
        if self.flags.max_size and len(data) > self.flags.max_size:
            self.stats.put_errors["too_large"] += 1
            return False
        backend = self.backend
        call: Callable[[], Awaitable[bool]]
        if then is None:
            call = functools.partial(backend.put, key, data, mode)
        elif isinstance(backend, LocalStore):
            call = functools.partial(backend.put_then, key, data, mode, then)
        else:
            raise TypeError(f"{self.name}: put(then=...) needs a local store")
        return await self._counted_put(len(data), call)

    async def publish(
        self, pending: PendingWrite, mode: PutMode, then: Callable[[bool], None] | None
    ) -> bool:
        """:meth:`put` of an entry written in pieces (``pending``, a local store's:
        objcache/core/streamed.py), counted as a put; ``then`` as :meth:`put`'s. False where
        it was not stored (never published: the caller drops ``pending``)."""
        backend = self.backend
        if not isinstance(backend, WritesInPieces):
            raise TypeError(f"{self.name}: publish() needs a store that writes in pieces")
        return await self._counted_put(
            pending.size, functools.partial(backend.publish_then, pending, mode, then)
        )

    async def _counted_put(self, nbytes: int, call: Callable[[], Awaitable[bool]]) -> bool:
        started = time.perf_counter()
        try:
            written = await self.call("put", call)
        except Failed as f:
            self.stats.put_errors[f.reason] += 1
            return False
        finally:
            self.stats.put_latency.observe((time.perf_counter() - started) * 1000)
        if written:
            self.stats.puts += 1
            self.stats.bytes_written += nbytes
        else:
            self.stats.put_skipped_exists += 1
        return True

    async def exists(self, key: str) -> bool | None:
        """None when the tier could not answer."""
        try:
            return await self.call("exists", lambda: self.backend.exists(key))
        except Failed:
            return None

    async def delete(self, key: str) -> bool | None:
        try:
            return await self.call("delete", lambda: self.backend.delete(key))
        except Failed:
            return None

    def breaker_open(self) -> bool:
        return self.breaker.state == "open"

    # --- maintenance commands ------------------------------------------------------------

    async def run(self, op: str, fn: Callable[[], Awaitable[T]], nbytes: int = 0) -> T:
        """``fn`` under the tier's policy, raising what the backend raised (a command reports
        it); a missed deadline is a :class:`TransientBackendError`. A call sending ``nbytes``
        gets :data:`COMMAND_FLOOR_BYTES_PER_S` more time for them (docs/architecture.md,
        "Policies"): a 64 MiB upload is not a 3 s call."""
        policy = self.policy
        if nbytes and policy.timeout_s > 0:
            extra = nbytes / COMMAND_FLOOR_BYTES_PER_S
            policy = replace(policy, timeout_s=policy.timeout_s + extra)
        try:
            return await call_with_policy(fn, policy)
        except (asyncio.TimeoutError, TimeoutError):
            raise TransientBackendError(
                f"{op}: no answer within {policy.timeout_s * 1000:.0f} ms", tier=self.name
            ) from None

    def bounded(self) -> Backend:
        """The backend with every call, and every page of a listing, under :meth:`run`: what
        the maintenance commands use (build the tier with :meth:`for_command`)."""
        return _Bounded(self)

    async def update_record(self, key: str, change: Change, max_bytes: int = 0) -> str:
        """Read-modify-write of the record ``key`` within the deadline: the outcome
        (stored, unchanged, dropped) or the failure reason, counted in ``stats.records``.
        A stored record over a non-zero ``max_bytes`` is not read: a ``too_large`` miss,
        replaced by this write (docs/security.md, "Records")."""
        backend = self.backend
        if not isinstance(backend, RecordBackend):
            self.stats.records["unsupported"] += 1
            return "unsupported"
        budget = self.policy.timeout_s * RECORD_BUDGET if self.policy.timeout_s > 0 else 3600.0

        def too_large() -> None:
            self.missed(key, "too_large")
            log_once.warn(
                self.name,
                "record-too_large",
                f"{self.name}: record {key} is over the {max_bytes}-byte cap; replacing it",
            )

        try:
            outcome, conflicts = await self.call(
                "record",
                lambda: read_modify_write(
                    backend,
                    key,
                    change,
                    timeout_s=budget,
                    max_bytes=max_bytes,
                    on_too_large=too_large,
                ),
            )
        except Failed as f:
            self.stats.records[f.reason] += 1
            return f.reason
        self.stats.records[outcome.value] += 1
        self.stats.record_conflicts += conflicts
        return outcome.value


class _Bounded(Backend):
    """See :meth:`Tier.bounded`: a black-holed endpoint costs a command one deadline, not
    the SDK's read timeout (docs/architecture.md, "Policies")."""

    def __init__(self, tier: Tier) -> None:
        super().__init__(tier.backend.spec)
        self.tier = tier
        self.inner = tier.backend
        self.max_in_flight = self.inner.max_in_flight
        #: a backend's own bound on calls at once: the calls past it wait here, before their
        #: deadline starts (a bulk copy keeps hundreds in flight)
        self._slots = asyncio.Semaphore(self.max_in_flight) if self.max_in_flight else None

    async def _run(self, op: str, fn: Callable[[], Awaitable[T]], nbytes: int = 0) -> T:
        if self._slots is None:
            return await self.tier.run(op, fn, nbytes)
        async with self._slots:
            return await self.tier.run(op, fn, nbytes)

    async def get(self, key: str) -> bytes | None:
        return await self._run("get", lambda: self.inner.get(key))

    async def get_capped(self, key: str, max_bytes: int) -> bytes | None:
        # the inner backend's own capped read: refused before the body is read
        return await self._run("get", lambda: self.inner.get_capped(key, max_bytes))

    async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
        return await self._run("put", lambda: self.inner.put(key, data, mode), len(data))

    async def put_then(
        self, key: str, data: bytes, mode: PutMode, then: Callable[[bool], None]
    ) -> bool:
        """:meth:`put`, then ``then(stored)``: a local store calls it in the worker thread
        that wrote the bytes, so a command cancelled once they are in place (Ctrl-C) still
        counts them; any other store, once its answer is back."""
        inner = self.inner
        if isinstance(inner, LocalStore):
            return await self._run("put", lambda: inner.put_then(key, data, mode, then), len(data))
        stored = False
        try:
            stored = await self.put(key, data, mode)
            return stored
        finally:
            then(stored)

    async def exists(self, key: str) -> bool:
        return await self._run("exists", lambda: self.inner.exists(key))

    async def delete(self, key: str) -> bool:
        return await self._run("delete", lambda: self.inner.delete(key))

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        pages = aiter(self.inner.list(prefix))
        while True:
            try:
                item = await self.tier.run("list", lambda: anext(pages))
            except StopAsyncIteration:
                return
            finally:
                self.undecodable_names = self.inner.undecodable_names
            yield item

    async def describe(self) -> str:
        """The inner backend's line on its store (:class:`Describes`) within the deadline;
        empty for a backend that tells nothing."""
        inner = self.inner
        if not isinstance(inner, Describes):
            return ""
        return await self.tier.run("describe", inner.describe)

    async def close(self) -> None:
        # A client stuck on a dead connection must not hold the command past its deadline.
        with contextlib.suppress(TransientBackendError):
            await self.tier.run("close", self.inner.close)
