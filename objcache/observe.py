"""What a client leaves behind for people watching a fleet: its run summary (written to the
remote tiers at exit for ``objcache report``) and, when configured, a Prometheus textfile.

Nothing here may fail or block the process: each step is bounded and swallows its errors
(logged once or at DEBUG). See docs/operations.md ("Fleet report", "Prometheus").
"""

from __future__ import annotations

import concurrent.futures
import logging
import sys
import time
from typing import Any

from objcache import keycards, summary
from objcache.bridge import Bridge
from objcache.config import Config
from objcache.tiered import TieredCache

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
                from objcache.prometheus import TextfileExporter
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
        """Whether this process looked anything up or wrote anything."""
        data = self.cache.stats_dict()
        return bool(data["cache"]["gets"]) or any(t["puts"] for t in data["tiers"])

    async def write_summary(self, job: str) -> bool:
        """Queue this run's summary for the remote tiers (on the loop, before the flush)."""
        if not self.config.run_summary or self.cache.read_only or not self.used():
            return False
        try:
            cards, dropped = keycards.missed()
            body = summary.build(
                self.cache.stats_dict(), job=job, run=self.run_id, started=self.started,
                ended=time.time(), time_saved=_time_saved(),
                miss_cards={"recorded": len(cards), "dropped": dropped},
            )  # fmt: skip
            await keycards.write_misses(self.cache, job, self.run_id)
            return await self.cache.put_remote(
                summary.KIND, f"{job}/{self.run_id}", summary.encode(body)
            )
        except Exception:
            log.debug("objcache: writing the run summary failed", exc_info=True)
            return False

    def close(self) -> None:
        """Stop the periodic metrics and write them one last time (bounded)."""
        if self._periodic is not None:
            self._periodic.cancel()
        if self.exporter is not None:
            self.exporter.write_at_exit(self.cache.stats_dict())


def _time_saved() -> dict[str, float]:
    """Compile time this process's hits saved, per kind, when the torch integration is loaded
    (never imports torch)."""
    module = sys.modules.get("objcache.integrations.torch.time_saved")
    return dict(module.snapshot()) if module is not None else {}
