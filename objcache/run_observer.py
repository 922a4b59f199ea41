"""What a client leaves behind for people watching a fleet: its run summary (written to the
remote tiers at exit for ``objcache report``) and, when configured, a Prometheus textfile.

Nothing here may fail or block the process: each step is bounded and swallows its errors
(logged once or at DEBUG). See docs/operations.md ("Fleet report", "Prometheus").
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import sys
import time
from typing import Any

from objcache.backends.base import PutMode
from objcache.bridge import Bridge
from objcache.config.settings import Config
from objcache.core.tiered import TieredCache
from objcache.core.writes import write
from objcache.observe import keycards, process_stats
from objcache.observe import run_summary as summary
from objcache.stores import open_tier

log = logging.getLogger("objcache")


class RunObserver:
    """One run of one process: its id, start time and optional metrics exporter."""

    def __init__(self, config: Config, cache: TieredCache, bridge: Bridge) -> None:
        self.config = config
        self.cache = cache
        self.started = time.time()
        self.run_id = summary.new_run_id(self.started)
        self.exporter: Any = None
        self._periodic: concurrent.futures.Future[None] | None = None
        if config.prometheus_textfile is not None:
            try:
                from objcache.observe.prometheus import TextfileExporter
            except ImportError:
                log.warning(
                    "objcache: OBJCACHE_PROMETHEUS_TEXTFILE is set but prometheus_client is "
                    "not installed (pip install 'objcache[metrics]'); no metrics are written"
                )
                return
            self.exporter = TextfileExporter(
                config.prometheus_textfile, config.prometheus_interval_s
            )
            exporter = self.exporter
            self._periodic = bridge.submit(lambda: exporter.run(cache.stats_dict))

    def used(self) -> bool:
        """Whether this process looked anything up, wrote anything or compiled anything (a
        warm-local run whose compiles torch's own caches answered has phase times: the run
        ``objcache explain --time`` compares a new machine with)."""
        data = self.cache.stats_dict()
        return (
            bool(data["cache"]["gets"])
            or any(t["puts"] for t in data["tiers"])
            or any(name.startswith("torch:") for name in _phases())
        )

    async def write_summary(self, job: str) -> bool:
        """Queue this run's summary for the remote tiers (on the loop, before the flush), or
        write it to ``OBJCACHE_SUMMARIES_URL`` when that is set (docs/architecture.md, "Run
        summaries"): the only write a read-only configuration makes."""
        separate = self.config.summaries_url is not None
        if not self.config.run_summary or not self.used():
            return False
        if self.cache.read_only and not separate:
            return False
        try:
            cards, dropped = keycards.missed()
            body = summary.build(
                self.cache.stats_dict(), job=job, run=self.run_id, started=self.started,
                ended=time.time(), time_saved=_time_saved(), env=self.cache.env_fields,
                miss_cards={"recorded": len(cards), "dropped": dropped},
                group=os.environ.get(process_stats.RUN_GROUP_ENV) or None,
                phases=_phases(), recompiles=_recompiles(), prefetch=self._prefetch(),
            )  # fmt: skip
            misses = keycards.misses_object(job, self.run_id)
            okey = self.cache.namespace.object_key(summary.KIND, f"{job}/{self.run_id}")
            # the missed cards first, the summary last: its result is the answer
            objects = [*([misses] if misses is not None else []), (okey, summary.encode(body))]
            if separate:
                return (await self._write_separately(objects))[-1]
            # Remote only: bookkeeping no lookup of this machine reads.
            written = [await write(self.cache, k, data, local=False) for k, data in objects]
            return written[-1].queued
        except Exception:
            log.debug("objcache: writing the run summary failed", exc_info=True)
            return False

    def _prefetch(self) -> dict[str, Any] | None:
        """The prefetch's time line, when this run had one (its errors swallowed: a summary
        without it is still written)."""
        timeline = self.cache.prefetch_timeline
        try:
            return None if timeline is None else timeline.as_dict()
        except Exception:
            log.debug("objcache: the prefetch's time line was not recorded", exc_info=True)
            return None

    async def _write_separately(self, objects: list[tuple[str, bytes]]) -> list[bool]:
        """The run's missed cards and its summary, each encoded like any entry, to the
        summaries location (one store client for both) in CREATE mode, under the tier
        deadline and retries; a failure is counted by the tier and logged once, never
        raised."""
        spec = self.config.summaries_url
        assert spec is not None
        tier = open_tier(spec, self.config)
        try:
            return [
                await tier.put(okey, self.cache.codec.encode(payload, okey), PutMode.CREATE)
                for okey, payload in objects
            ]
        finally:
            try:
                await tier.backend.close()
            except Exception:
                log.debug("closing %s failed", tier.name, exc_info=True)

    def close(self) -> None:
        """Stop the periodic metrics and write them one last time (bounded)."""
        if self._periodic is not None:
            self._periodic.cancel()
        if self.exporter is not None:
            self.exporter.write_at_exit(self.cache.stats_dict())


def _phases() -> dict[str, tuple[float, int]]:
    """torch's phase times of this process when the torch integration is loaded (never
    imports torch)."""
    module = sys.modules.get("objcache.integrations.torch.timing.phase_times")
    return dict(module.snapshot()) if module is not None else {}


def _recompiles() -> list[tuple[str, str, float]]:
    """torch's recompiles of this process, with their reasons (never imports torch)."""
    module = sys.modules.get("objcache.integrations.torch.timing.phase_times")
    return list(module.recompiles()) if module is not None else []


def _time_saved() -> dict[str, float]:
    """Compile time this process's hits saved, per kind, when the torch integration is loaded
    (never imports torch)."""
    module = sys.modules.get("objcache.integrations.torch.timing.time_saved")
    return dict(module.snapshot()) if module is not None else {}
