"""The synchronous call deadline honours every tier's own deadline.

A far tier configured with ``?timeout_ms=`` above the global ``OBJCACHE_TIMEOUT_MS`` (as
docs/operations.md recommends for a cross-region bucket) must get its whole deadline: the
sync call around it may not give up first. Exercised through a real Redis server behind a
slow link.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from objcache.client import Client, build_cache, sync_deadline_s
from objcache.config.settings import Config
from tests.support.proxy import FaultProxy
from tests.support.servers import RedisServer

MakeProxy = Callable[[str, int], FaultProxy]


def test_the_sync_deadline_is_the_longest_tier_deadline_plus_a_margin(tmp_path: Path) -> None:
    config = Config(
        tiers=f"file://{tmp_path}/near?timeout_ms=500,file://{tmp_path}/far?timeout_ms=10000",
        local_dir=tmp_path,
        prefetch=False,
        timeout_ms=300,
    )
    cache = build_cache(config, env_fields={"torch": "t"})
    assert sync_deadline_s(cache) == 10.0 + 1.0


@pytest.mark.servers
def test_far_tier_gets_its_own_deadline(
    redis_server: RedisServer, fault_proxy: MakeProxy, tmp_path: Path
) -> None:
    prefix = f"deadline-{uuid.uuid4().hex[:8]}"
    value = b"compiled graph " * 100
    seeder = Client(
        Config(
            tiers=f"{redis_server.url}?prefix={prefix}", local_dir=tmp_path / "seed", prefetch=False
        )
    )
    seeder.put("fx-graph", "far", value)
    seeder.close()

    proxy = fault_proxy(redis_server.host, redis_server.port)
    far = f"redis://{proxy.host}:{proxy.port}/0?prefix={prefix}&timeout_ms=10000"
    # The global deadline alone (300 ms + the 1 s sync margin) is shorter than one round trip.
    client = Client(
        Config(tiers=far, local_dir=tmp_path / "reader", prefetch=False, timeout_ms=300)
    )
    try:
        assert client.get("fx-graph", "warm-up") is None  # connects before the link slows
        proxy.set_rtt_ms(1800)
        started = time.monotonic()
        assert client.get("fx-graph", "far") == value
        assert time.monotonic() - started >= 1.8
        assert client.stats()["sync_timeouts"] == 0
    finally:
        proxy.set_rtt_ms(0)
        client.close()
