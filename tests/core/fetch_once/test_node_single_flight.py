"""Ranks of one node sharing a fresh local dir fetch each entry from Redis about once.

Real subprocesses (``tests/support/node_worker.py``) against a real redis-server; remote GETs
are counted by the server (``INFO commandstats``), not by objcache.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from objcache.client import Client
from objcache.config.settings import Config
from objcache.core.fetch_once.nodelease import LEASE_PREFIX
from tests.support.flock import blocked_count
from tests.support.node_worker import KIND, payload_for, results, start_ranks
from tests.support.proxy import FaultProxy
from tests.support.servers import RedisServer
from tests.support.waiting import wait_until

pytestmark = pytest.mark.servers

RANKS = 6
ENTRIES = 60
SIZE = 60_000


def server_gets(raw: redis.Redis) -> int:
    """Reads of values: tiers read through a size cap (GETRANGE), records and tools by GET."""
    stats: dict[str, Any] = raw.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("get", "getrange"))


def seed(url: str, work: Path, job: str, keys: list[str]) -> None:
    """A CI run stores the entries and leaves the job's manifest."""
    client = Client(Config(tiers=url, local_dir=work / "seed", job=job, prefetch=False))
    for key in keys:
        client.put(KIND, key, payload_for(key, SIZE))
    client.close()


@pytest.mark.parametrize("prefetch", [False, True], ids=["no-prefetch", "prefetch"])
def test_ranks_of_a_node_fetch_each_entry_once(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path, prefetch: bool
) -> None:
    job = f"node-{uuid.uuid4().hex[:8]}"
    url = f"{redis_server.url}?prefix={job}"
    keys = [f"k{i:04d}-{uuid.uuid4().hex[:8]}" for i in range(ENTRIES)]
    seed(url, tmp_path, job, keys)
    spec = {
        "tiers": url,
        "local_dir": str(tmp_path / "node"),
        "job": job,
        "prefetch": prefetch,
        "keys": keys,
        "size": SIZE,
        "timeout_ms": 10_000,
    }
    go = tmp_path / "go"
    procs = start_ranks([spec] * RANKS, go)
    redis_client.config_resetstat()
    go.touch()
    ranks = results(procs)
    gets = server_gets(redis_client)
    assert [r["hits"] for r in ranks] == [ENTRIES] * RANKS, [
        (r["seconds"], r["prefetch"], r["cache"]["node_leases"], r["misses"]) for r in ranks
    ]
    assert [r["wrong"] for r in ranks] == [0] * RANKS
    per_entry = gets / ENTRIES  # the reads of the job's manifest included
    assert per_entry <= 1.05, (gets, [r["cache"]["node_leases"] for r in ranks])
    assert not list((tmp_path / "node").rglob(LEASE_PREFIX + "*"))  # every lease retired


def test_other_ranks_get_the_entry_when_the_holder_is_killed_mid_fetch(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """The holder reaches Redis through a black-holed proxy and hangs in its GET with the
    lease held; it is SIGKILLed; the waiting ranks take the lease over and get the entry
    within one deadline (their timeout_ms) of the kill."""
    job = f"kill-{uuid.uuid4().hex[:8]}"
    key = f"k-{uuid.uuid4().hex}"
    seed(f"{redis_server.url}?prefix={job}", tmp_path, job, [key])
    deadline_s = 20.0  # the waiters' budget: one that is not woken by the kill waits it out
    node = tmp_path / "node"
    common = {"local_dir": str(node), "job": job, "keys": [key], "size": SIZE}
    with FaultProxy(redis_server.host, redis_server.port) as proxy:
        proxy.blackhole()
        hung_url = f"redis://{proxy.host}:{proxy.port}/0?prefix={job}"
        holder = start_ranks(
            [{**common, "tiers": hung_url, "timeout_ms": 60_000}], tmp_path / "go-holder"
        )[0]
        try:
            (tmp_path / "go-holder").touch()
            lease_file = _wait_for_lease(node, holder.pid)
            waiter = {**common, "tiers": f"{redis_server.url}?prefix={job}"}
            waiters = start_ranks(
                [{**waiter, "timeout_ms": int(deadline_s * 1000)}] * 3, tmp_path / "go"
            )
            redis_client.config_resetstat()
            (tmp_path / "go").touch()
            inode = lease_file.stat().st_ino
            wait_until(lambda: blocked_count(inode) == 3, what="three ranks waiting")
            holder.send_signal(signal.SIGKILL)
            killed_at = time.time()
            ranks = results(waiters)
        finally:
            holder.kill()
            holder.wait()
    assert [r["hits"] for r in ranks] == [1, 1, 1]
    assert [r["wrong"] for r in ranks] == [0, 0, 0]
    assert max(r["done_at"] for r in ranks) - killed_at < deadline_s / 2
    assert sum(r["cache"]["node_leases"].get("took_over", 0) for r in ranks) == 1
    assert server_gets(redis_client) == 1


def _wait_for_lease(node: Path, pid: int) -> Path:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for path in node.rglob(LEASE_PREFIX + "*"):
            try:
                if json.loads(path.read_bytes()).get("pid") == pid:
                    return path
            except (OSError, ValueError):
                pass
        time.sleep(0.01)
    raise AssertionError("the holder never took the lease")
