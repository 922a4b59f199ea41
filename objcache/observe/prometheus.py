"""The process's counters in the Prometheus text format, for the node_exporter textfile
collector (docs/operations.md, "Prometheus").

With ``OBJCACHE_PROMETHEUS_TEXTFILE`` set, the client renders a snapshot of its stats every
``OBJCACHE_PROMETHEUS_INTERVAL_S`` and at exit, through ``prometheus_client`` with a registry
of its own (nothing is added to the default registry an application may serve), and writes
it atomically with :func:`objcache.observe.publish.publish`: a random temporary name beside the
target, created ``O_EXCL | O_NOFOLLOW``, then a rename, so a symlink planted in the shared
textfile folder is never followed (docs/security.md, "Files in shared folders"). Rendering
and writing happen off the event loop; a failure is logged once and never raises: metrics
never fail or block a compile.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from objcache.backends.shared import to_daemon_thread
from objcache.observe.publish import publish

log = logging.getLogger("objcache")

#: At exit, wait at most this long for the last write (a hung filesystem must not hang exit).
EXIT_WRITE_TIMEOUT_S = 2.0
#: The textfile's mode: node_exporter, often another user, reads it.
TEXTFILE_MODE = 0o644


class StatsCollector(Collector):
    """Metric families from the latest ``TieredCache.stats_dict()`` snapshot."""

    def __init__(self) -> None:
        self.snapshot: dict[str, Any] = {}

    def collect(self) -> Iterator[Metric]:
        stats = self.snapshot
        cache = stats.get("cache", {})
        tiers = stats.get("tiers", [])
        hits = CounterMetricFamily(
            "objcache_hits",
            "Lookups a tier answered with a verified entry.",
            labels=["tier", "kind"],
        )
        misses = CounterMetricFamily(
            "objcache_misses",
            "Lookups a tier did not answer with a verified entry, by reason.",
            labels=["tier", "kind", "reason"],
        )
        for t in tiers:
            for kind, outcomes in sorted(t.get("kinds", {}).items()):
                hits.add_metric([t["name"], kind], outcomes.get("hit", 0))
                for reason, n in sorted(outcomes.items()):
                    if reason != "hit":
                        misses.add_metric([t["name"], kind, reason], n)
        yield hits
        yield misses
        yield _by_label(
            "objcache_lookups", "Lookups the caller made, by kind.", "kind", cache.get("gets", {})
        )
        yield _by_label(
            "objcache_lookup_hits",
            "Lookups the caller got an entry for, by kind.",
            "kind",
            cache.get("hits", {}),
        )
        yield _lookup_histogram(cache)
        per_tier: list[tuple[str, str, str, Callable[[dict[str, Any]], float]]] = [
            ("objcache_breaker_open", "1 while the tier's circuit breaker is open.", "gauge",
             lambda t: float(t.get("breaker") == "open")),
            ("objcache_breaker_opened", "Times the tier's circuit breaker opened.", "counter",
             lambda t: t.get("breaker_opened", 0)),
            ("objcache_read_bytes", "Entry bytes read from the tier.", "counter",
             lambda t: t.get("bytes_read", 0)),
            ("objcache_written_bytes", "Entry bytes written to the tier.", "counter",
             lambda t: t.get("bytes_written", 0)),
            ("objcache_puts", "Entries written to the tier.", "counter",
             lambda t: t.get("puts", 0)),
        ]  # fmt: skip
        for name, doc, typ, value in per_tier:
            family: Metric = (
                GaugeMetricFamily(name, doc, labels=["tier"])
                if typ == "gauge"
                else CounterMetricFamily(name, doc, labels=["tier"])
            )
            for t in tiers:
                family.add_metric([t["name"]], value(t))  # type: ignore[attr-defined]
            yield family
        put_errors = CounterMetricFamily(
            "objcache_put_errors", "Writes the tier refused or failed, by reason.",
            labels=["tier", "reason"],
        )  # fmt: skip
        for t in tiers:
            for reason, n in sorted(t.get("put_errors", {}).items()):
                put_errors.add_metric([t["name"], reason], n)
        yield put_errors
        for key, doc in (
            ("write_behind_dropped", "Remote writes dropped because the queue was full."),
            ("write_behind_dropped_bytes", "Bytes of remote writes dropped (queue full)."),
            ("write_through", "Remote hits written through to the local tier."),
            ("backfills", "Remote hits back-filled into nearer tiers."),
            ("single_flight_shared", "Lookups that joined another lookup's fetch."),
        ):
            yield CounterMetricFamily(f"objcache_{key}", doc, value=cache.get(key, 0))
        yield GaugeMetricFamily(
            "objcache_write_behind_pending",
            "Remote writes queued and not yet done.",
            value=stats.get("write_behind_pending", 0),
        )


def _by_label(name: str, doc: str, label: str, counts: dict[str, int]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, n in sorted(counts.items()):
        family.add_metric([key], n)
    return family


def _lookup_histogram(cache: dict[str, Any]) -> Metric:
    buckets = cache.get("lookup_buckets", {})
    bounds, counts = buckets.get("le_ms", []), buckets.get("counts", [])
    cumulative, running = [], 0
    for bound_ms, n in zip([*bounds, None], counts, strict=False):
        running += n
        cumulative.append(("+Inf" if bound_ms is None else repr(bound_ms / 1000), running))
    if not cumulative or cumulative[-1][0] != "+Inf":
        cumulative.append(("+Inf", running))
    return HistogramMetricFamily(
        "objcache_lookup_seconds",
        "Wall time of lookups, local fast path included.",
        buckets=cumulative,
        sum_value=float(cache.get("lookup_ms_total", 0.0)) / 1000,
    )


class TextfileExporter:
    """Writes snapshots to one ``.prom`` file; never raises, logs the first failure."""

    def __init__(self, path: Path, interval_s: float) -> None:
        self.path = path
        self.interval_s = interval_s
        self.collector = StatsCollector()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._lock = threading.Lock()
        self._warned = False
        self.writes = 0
        self.failures = 0

    def write(self, snapshot: dict[str, Any]) -> bool:
        """Render ``snapshot`` and replace the file with it; False (logged once) on failure."""
        try:
            with self._lock:
                self.collector.snapshot = snapshot
                publish(self.path, generate_latest(self.registry), TEXTFILE_MODE)
            self.writes += 1
            return True
        except Exception as exc:
            self.failures += 1
            if not self._warned:
                self._warned = True
                log.warning(
                    "objcache: cannot write Prometheus metrics to %s: %s (not retried in the "
                    "log; the cache goes on)",
                    self.path,
                    " ".join(str(exc).split()) or type(exc).__name__,
                )
            return False

    async def run(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        """Every ``interval_s``: take a snapshot on the loop, write it in a worker thread."""
        if self.interval_s <= 0:
            return
        while True:
            await asyncio.sleep(self.interval_s)
            await to_daemon_thread(self.write, snapshot())

    def write_at_exit(self, snapshot: dict[str, Any]) -> None:
        """The last write, in a daemon thread waited for at most ``EXIT_WRITE_TIMEOUT_S``."""
        thread = threading.Thread(
            target=self.write, args=(snapshot,), name="objcache-prometheus", daemon=True
        )
        thread.start()
        thread.join(EXIT_WRITE_TIMEOUT_S)
