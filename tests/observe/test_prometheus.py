"""The Prometheus textfile: parsed with prometheus_client's own parser, written atomically,
and an unwritable path is logged once and never raises."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from objcache.client import Client
from objcache.config.settings import Config
from objcache.observe.prometheus import TextfileExporter
from tests.support.waiting import wait_until


def samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def test_textfile_carries_the_conventional_series(tmp_path: Path) -> None:
    prom = tmp_path / "objcache.prom"
    config = Config(
        tiers=f"file://{tmp_path / 'store'}",
        local_dir=tmp_path / "local",
        prefetch=False,
        prometheus_textfile=prom,
        prometheus_interval_s=0.05,
    )
    client = Client(config)
    assert client.get("fx-graph", "k") is None
    client.put("fx-graph", "k", b"v" * 1000)
    assert client.get("fx-graph", "k") == b"v" * 1000
    wait_until(prom.exists, what="the periodic write, before exit")
    client.close()

    found = samples(prom)
    local, remote = client.cache.local, client.cache.remotes[0]
    assert local is not None
    assert found[("objcache_hits_total", (("kind", "fx-graph"), ("tier", local.name)))] == 1
    miss = (("kind", "fx-graph"), ("reason", "absent"), ("tier", remote.name))
    assert found[("objcache_misses_total", miss)] == 1
    assert found[("objcache_lookups_total", (("kind", "fx-graph"),))] == 2
    assert found[("objcache_lookup_seconds_count", ())] == 2
    assert found[("objcache_lookup_seconds_bucket", (("le", "+Inf"),))] == 2
    assert found[("objcache_breaker_open", (("tier", remote.name),))] == 0
    assert found[("objcache_write_behind_dropped_total", ())] == 0
    assert found[("objcache_written_bytes_total", (("tier", remote.name),))] > 0
    assert not list(tmp_path.glob("objcache.prom.*")), "no temporary file left behind"


def test_unwritable_path_is_logged_once_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    exporter = TextfileExporter(blocker / "objcache.prom", interval_s=0)
    with caplog.at_level(logging.WARNING, logger="objcache"):
        assert exporter.write({}) is False
        assert exporter.write({"cache": {"gets": {"x": 1}}}) is False
    warnings = [r for r in caplog.records if "Prometheus" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    assert exporter.failures == 2


def test_a_client_with_an_unwritable_textfile_still_serves(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    config = Config(
        tiers=f"file://{tmp_path / 'store'}",
        local_dir=tmp_path / "local",
        prefetch=False,
        prometheus_textfile=blocker / "x.prom",
        prometheus_interval_s=0.01,
    )
    client = Client(config)
    client.put("blob", "k", b"v")
    exporter = client.observer.exporter
    wait_until(lambda: exporter.failures >= 2, what="two periodic writes failing")
    assert client.get("blob", "k") == b"v"
    client.close()
