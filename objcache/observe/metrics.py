"""Counters that explain every hit and miss, per tier (docs/operations.md, Monitoring).

A miss has a reason: ``absent`` (no such key), ``corrupt`` / ``version`` / ``unsigned`` /
``bad_signature`` (refused by the decoder), ``error`` (the call failed), ``timeout`` (the
deadline passed), ``breaker`` (tier skipped while its breaker is open), ``too_large``,
``invalid_key`` (a key the store cannot hold, e.g. too long; not held against the breaker),
``clock_skew`` (the server refused this machine's clock; not held against the breaker).
Counters are only touched from the event loop thread, so plain ints suffice.
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("objcache")

#: The per-tier outcomes of the lookup running in this context, as ``(tier, outcome)`` pairs:
#: set by the read path only while the ``objcache`` logger wants lookups logged (DEBUG) or
#: miss causes (INFO), so a lookup costs nothing more otherwise (docs/troubleshooting.md).
LOOKUP_TRAIL: ContextVar[list[tuple[str, str]] | None] = ContextVar(
    "objcache_lookup_trail", default=None
)

#: Upper bounds (ms) of the latency histogram buckets; the last bucket is open-ended.
LATENCY_BUCKETS_MS = (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_MS) + 1))
    total: int = 0
    sum_ms: float = 0.0

    def observe(self, ms: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS_MS, ms)] += 1
        self.total += 1
        self.sum_ms += ms

    def quantile(self, q: float) -> float | None:
        """Upper bound of the bucket holding the q-quantile (None when empty)."""
        if not self.total:
            return None
        rank, seen = q * self.total, 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank and c:
                return LATENCY_BUCKETS_MS[i] if i < len(LATENCY_BUCKETS_MS) else float("inf")
        return float("inf")

    def as_dict(self) -> dict[str, Any]:
        p50, p99 = self.quantile(0.5), self.quantile(0.99)
        return {
            "count": self.total,
            "mean_ms": round(self.sum_ms / self.total, 3) if self.total else None,
            "p50_ms_le": p50,
            "p99_ms_le": p99,
        }


@dataclass
class TierStats:
    name: str
    hits: int = 0
    misses: Counter[str] = field(default_factory=Counter)
    puts: int = 0
    put_skipped_exists: int = 0
    put_errors: Counter[str] = field(default_factory=Counter)
    bytes_read: int = 0
    bytes_written: int = 0
    get_latency: Histogram = field(default_factory=Histogram)
    put_latency: Histogram = field(default_factory=Histogram)
    breaker_opened: int = 0
    #: Record updates by outcome (stored, unchanged, dropped) or failure reason.
    records: Counter[str] = field(default_factory=Counter)
    #: Conditional writes that lost to another writer and were applied again.
    record_conflicts: int = 0
    #: Lookups by the entry kind of the object key: kind -> "hit" or the miss reason.
    kinds: dict[str, Counter[str]] = field(default_factory=dict)
    #: Stored names the tier's listings skipped, not being UTF-8 (docs/architecture.md,
    #: "Listings").
    undecodable_names: int = 0

    def note(self, okey: str, outcome: str) -> None:
        """Count one lookup of ``okey`` by its kind: ``"hit"`` or a miss reason."""
        kind = kind_of(okey)
        counts = self.kinds.get(kind)
        if counts is None:
            counts = self.kinds[kind] = Counter()
        counts[outcome] += 1
        trail = LOOKUP_TRAIL.get()
        if trail is not None:
            trail.append((self.name, outcome))

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hits": self.hits,
            "misses": dict(self.misses),
            "puts": self.puts,
            "put_skipped_exists": self.put_skipped_exists,
            "put_errors": dict(self.put_errors),
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "get_latency": self.get_latency.as_dict(),
            "put_latency": self.put_latency.as_dict(),
            "breaker_opened": self.breaker_opened,
            "records": dict(self.records),
            "record_conflicts": self.record_conflicts,
            "kinds": {k: dict(v) for k, v in self.kinds.items()},
            "undecodable_names": self.undecodable_names,
        }


@dataclass
class CacheStats:
    """Whole-cache counters: what the caller saw, independent of which tier served it."""

    gets: Counter[str] = field(default_factory=Counter)  # by kind
    hits: Counter[str] = field(default_factory=Counter)  # by kind
    served_by: Counter[str] = field(default_factory=Counter)  # tier name -> hits served
    #: tier name -> lookups it answered, once per lookup (the nearest tier of a candidate set)
    lookups_served_by: Counter[str] = field(default_factory=Counter)
    #: tier name -> entries the start-up prefetch fetched from it (not lookups)
    prefetch_fetched: Counter[str] = field(default_factory=Counter)
    write_through: int = 0
    backfills: int = 0
    write_behind_dropped: int = 0
    write_behind_dropped_bytes: int = 0
    write_behind_coalesced: int = 0
    single_flight_shared: int = 0
    #: Cross-process single-flight: claims by outcome (held, landed, missed, busy,
    #: unleased) and leases taken over from a dead or overdue holder (took_over).
    node_leases: Counter[str] = field(default_factory=Counter)
    #: Stored records that could not be read (corrupt, unsigned, foreign): replaced by the
    #: next write, counted by kind.
    records_unreadable: Counter[str] = field(default_factory=Counter)
    #: Wall time of every lookup the caller made (local fast path included).
    lookup: Histogram = field(default_factory=Histogram)
    #: Time spent in objcache's own phases of a start (node lease, prefetch): name ->
    #: [milliseconds, times] (run summaries' phase times).
    phase_ms: dict[str, list[float]] = field(default_factory=dict)

    def add_phase(self, name: str, ms: float) -> None:
        entry = self.phase_ms.setdefault(name, [0.0, 0])
        entry[0] += ms
        entry[1] += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "gets": dict(self.gets),
            "hits": dict(self.hits),
            "served_by": dict(self.served_by),
            "lookups_served_by": dict(self.lookups_served_by),
            "prefetch_fetched": dict(self.prefetch_fetched),
            "write_through": self.write_through,
            "backfills": self.backfills,
            "write_behind_dropped": self.write_behind_dropped,
            "write_behind_dropped_bytes": self.write_behind_dropped_bytes,
            "write_behind_coalesced": self.write_behind_coalesced,
            "single_flight_shared": self.single_flight_shared,
            "node_leases": dict(self.node_leases),
            "records_unreadable": dict(self.records_unreadable),
            "lookup": self.lookup.as_dict(),
            "lookup_buckets": {"le_ms": list(LATENCY_BUCKETS_MS), "counts": self.lookup.counts},
            "lookup_ms_total": round(self.lookup.sum_ms, 3),
            "phase_ms": {k: (round(v[0], 3), int(v[1])) for k, v in self.phase_ms.items()},
        }


def kind_of(okey: str) -> str:
    """The kind segment of ``v1/<env>/<kind>/...`` (``"other"`` for any other key)."""
    parts = okey.split("/", 3)
    return parts[2] if len(parts) == 4 and parts[0] == "v1" else "other"


class LogOnce:
    """Log each distinct (tier, reason) at WARNING once per process, then at DEBUG."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()

    def failure(
        self, logger: logging.Logger, scope: str, what: str, message: str, *args: object
    ) -> None:
        """``message % args`` at WARNING the first time ``what`` fails in ``scope`` (say
        ``"torch"``), later failures at DEBUG with their traceback: a hook that fails on
        every call must not flood the log of the job it serves."""
        if (scope, what) in self._seen:
            logger.debug(message, *args, exc_info=True)
            return
        self._seen.add((scope, what))
        logger.warning(message, *args)

    def warn(self, tier: str, reason: str, message: str) -> None:
        if (tier, reason) in self._seen:
            log.debug("%s", message)
            return
        self._seen.add((tier, reason))
        log.warning("%s (further %s errors of this tier are logged at DEBUG)", message, reason)


log_once = LogOnce()


@dataclass(frozen=True)
class FailureLog:
    """Failures of one part of an integration: each is counted under ``prefix + what`` in
    ``counters`` and logged through :data:`log_once` (``message`` gets ``what`` and the
    exception). Integrations never raise into their host; this is how they stay loud."""

    logger: logging.Logger
    scope: str
    counters: Counter[str]
    prefix: str
    message: str

    def __call__(self, what: str, exc: BaseException) -> None:
        self.counters[self.prefix + what] += 1
        log_once.failure(self.logger, self.scope, what, self.message, what, exc)
