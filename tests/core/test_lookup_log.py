"""``OBJCACHE_LOG_LEVEL=DEBUG`` logs every lookup (one line: kind, outcome, tier, size,
latency), INFO one line per miss cause per run (docs/troubleshooting.md, "Logs")."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from objcache.backends.base import PutMode
from objcache.client import Client, build_cache
from objcache.config.settings import Config
from objcache.core.lookup_log import new_trail
from objcache.core.tiered import TieredCache
from objcache.core.writes import put

LINE = re.compile(
    r"lookup kind=(?P<kind>\S+) outcome=(?P<outcome>\S+) (?:cause=(?P<cause>\S+) )?"
    r"tier=(?P<tier>\S+) size=(?P<size>\d+) ms=(?P<ms>[0-9.]+) tiers=(?P<tiers>\S+) key=\S+"
)


def config(tmp_path: Path, local: str, **options: object) -> Config:
    return Config(
        tiers=f"file://{tmp_path / 'store'}",
        local_dir=tmp_path / local,
        prefetch=False,
        **options,  # type: ignore[arg-type]
    )


def lookups(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    found = []
    for record in caplog.records:
        if record.name == "objcache" and record.levelno == logging.DEBUG:
            match = LINE.fullmatch(record.getMessage().split(" via=")[0])
            if match:
                found.append(match.groupdict())
    return found


def causes(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.INFO and "lookups miss:" in r.getMessage()
    ]


async def test_debug_logs_each_lookup_and_info_each_miss_cause_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="objcache")
    writer = build_cache(config(tmp_path, "a"))
    assert await writer.get("fx-graph", "k1") is None
    assert await writer.get("fx-graph", "k2") is None
    await put(writer, "fx-graph", "k1", b"v" * 300)
    await writer.close(30)
    remote = writer.remotes[0].name
    first = lookups(caplog)
    assert [(m["kind"], m["outcome"], m["cause"], m["size"]) for m in first] == [
        ("fx-graph", "miss", "absent", "0"),
        ("fx-graph", "miss", "absent", "0"),
    ]
    assert first[0]["tiers"] == f"{writer.local.name}=absent,{remote}=absent"  # type: ignore[union-attr]
    assert len(causes(caplog)) == 1  # two misses, one cause: one INFO line
    assert "fx-graph lookups miss: absent" in causes(caplog)[0]

    caplog.clear()
    reader = build_cache(config(tmp_path, "b"))
    assert await reader.get("fx-graph", "k1") == b"v" * 300  # remote hit, written through
    await reader.flush(30)
    assert await reader.get("fx-graph", "k1") == b"v" * 300  # local hit
    bad = reader.namespace.object_key("fx-graph", "bad")
    await reader.remotes[0].put(bad, b"OBJC not an entry", PutMode.CREATE)
    assert await reader.get("fx-graph", "bad") is None  # refused
    await reader.close(30)
    seen = [(m["outcome"], m["cause"], m["tier"], m["size"]) for m in lookups(caplog)]
    assert seen == [
        ("remote-hit", None, remote, "300"),
        ("local-hit", None, reader.local.name, "300"),  # type: ignore[union-attr]
        ("refused", "corrupt", "-", "0"),
    ]
    assert all(float(m["ms"]) >= 0 for m in lookups(caplog))
    assert len(causes(caplog)) == 1 and "fx-graph lookups miss: corrupt" in causes(caplog)[0]


async def test_nothing_is_collected_or_logged_below_info(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="objcache")
    cache: TieredCache = build_cache(config(tmp_path, "a"))
    assert new_trail() is None
    assert await cache.get("fx-graph", "k") is None
    await cache.close(30)
    assert lookups(caplog) == [] and causes(caplog) == []


def test_a_local_hit_on_the_fast_path_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="objcache")
    client = Client(config(tmp_path, "a", log_level="DEBUG"))
    try:
        client.put("fx-graph", "k", b"x" * 40)
        assert client.get("fx-graph", "k") == b"x" * 40
        client.stats()  # the hit is accounted (and logged) on the loop thread: wait for it
    finally:
        client.close()
    fast = [
        r.getMessage()
        for r in caplog.records
        if "outcome=local-hit" in r.getMessage() and "via=fast" in r.getMessage()
    ]
    assert len(fast) == 1, [r.getMessage() for r in caplog.records]
    assert "kind=fx-graph" in fast[0] and "size=" in fast[0]
