"""A Redis Cluster (3 primaries, 3 replicas on 127.0.0.1) as a job's remote tier.

Entries written through one node are read back and listed by a fresh client; a primary that
crashes mid-job costs the calls on its keys at most the deadline (misses, never an
exception) and the tier serves again once its replica took over, without a restart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from objcache.bridge import BridgeTimeout
from objcache.client import Client
from objcache.config.settings import Config
from tests.faults.conftest import BREAKER_FAILURES, DEADLINE_MS, warm_up
from tests.faults.test_network import CALL_BOUND_MS, remote_stats, timed
from tests.support.servers import RedisClusterNode, RedisClusterServer, RedisServer
from tests.support.waiting import wait_until

pytestmark = pytest.mark.servers

KIND = "blob"
#: Below what a call costs where no deadline bounds it (the failover test's minute-long socket
#: timeouts), far above the deadline: a loaded machine's stalls fit.
UNBOUNDED_MS = 20_000
MakeClient = Callable[..., Client]


def value(i: int) -> bytes:
    return f"entry {i} ".encode() * (10 + i % 50)


@pytest.fixture
def make_client(tmp_path: Path) -> Iterator[MakeClient]:
    """Factory: a Client whose one remote tier is ``url``, with a local tier of its own (a
    fresh machine each time)."""
    made: list[Client] = []

    def make(url: str, **config: Any) -> Client:
        options: dict[str, Any] = {
            "tiers": url,
            "local_dir": tmp_path / f"local-{uuid.uuid4().hex[:6]}",
            "timeout_ms": DEADLINE_MS,
            "breaker_failures": BREAKER_FAILURES,
            "breaker_cooldown_s": 60.0,
            "prefetch": False,
            "stats_file": tmp_path / "stats.json",
            "flush_timeout_s": 5.0,
            **config,
        }
        client = Client(Config(**options))
        made.append(client)
        warm_up(client)
        return client

    yield make
    for client in made:
        client.close()
        client.bridge.stop()


def objcache_cli(args: list[str], tiers: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``objcache ARGS`` in a process of its own on ``tiers``, with 2 s deadlines."""
    env = {
        **os.environ,
        "OBJCACHE_TIERS": tiers,
        "OBJCACHE_LOCAL_DIR": str(tmp_path / "cli-local"),
        "OBJCACHE_TIMEOUT_MS": "2000",
        "OBJCACHE_PREFETCH": "0",
        "COLUMNS": "80",
    }
    command = [sys.executable, "-m", "objcache.cli", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def redis_key(client: Client, prefix: str, key: str) -> str:
    return prefix + client.cache.namespace.object_key(KIND, key)


def test_entries_written_through_one_node_are_read_back_and_listed(
    redis_cluster: RedisClusterServer, make_client: MakeClient, tmp_path: Path
) -> None:
    prefix = f"c-{uuid.uuid4().hex[:10]}/"
    first, other = redis_cluster.nodes[0], redis_cluster.nodes[-1]
    keys = [f"k{i}" for i in range(300)]
    writer = make_client(f"{first.url}?prefix={prefix}", timeout_ms=5000)
    for i, key in enumerate(keys):
        writer.put(KIND, key, value(i))
    assert writer.flush(60) == 0
    stored = remote_stats(writer)
    assert stored["puts"] == 301 and not stored["put_errors"]  # the entries and ENV.json
    owners = {redis_cluster.owner(redis_key(writer, prefix, k)).port for k in keys}
    assert len(owners) == redis_cluster.primaries  # the keys are spread over every primary

    # a fresh machine, naming another node of the cluster
    reader = make_client(f"{other.url}?prefix={prefix}", timeout_ms=5000)
    found: dict[str, bytes] = {}

    def read_back() -> bool:
        # a loaded machine can miss a node's share of the deadline on a connect (that node's
        # keys miss, counted): what is missing is asked again, what is served must be right
        found.update(reader.get_many(KIND, [k for k in keys if k not in found]))
        return len(found) == len(keys)

    wait_until(read_back, what="every entry read back")
    assert found == {k: value(i) for i, k in enumerate(keys)}
    assert remote_stats(reader)["hits"] == 300

    listed = objcache_cli(
        ["ls", "--kind", KIND, "--json"], f"{other.url}?prefix={prefix}", tmp_path
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert len(json.loads(listed.stdout)) == 300, listed.stdout[:2000]


@pytest.fixture
def own_cluster() -> Iterator[RedisClusterServer]:
    """A cluster of this test's own: crashing a node changes it for good."""
    with RedisClusterServer() as cluster:
        yield cluster


def test_a_crashed_primary_costs_the_deadline_then_its_replica_serves(
    own_cluster: RedisClusterServer, make_client: MakeClient
) -> None:
    cluster = own_cluster
    victim = cluster.primary_nodes()[0]
    named: RedisClusterNode = next(n for n in cluster.nodes if n is not victim)
    url = f"{named.url}?prefix=failover/"
    keys = [f"k{i}" for i in range(60)]
    writer = make_client(url, timeout_ms=5000)
    for i, key in enumerate(keys):
        writer.put(KIND, key, value(i))
    assert writer.flush(30) == 0
    wait_until(cluster.replicated, what="the replicas acknowledged every write")
    lost = [k for k in keys if victim.serves(redis_key(writer, "failover/", k))]
    kept = [k for k in keys if k not in lost]
    assert lost and kept

    # a fresh machine with a breaker that cools down fast: the tier is tried again soon; its
    # sockets would wait a minute where no deadline bounded them, so a missed deadline fails
    # the bound below however long a loaded machine's stalls (4.4 s seen beside a compile)
    reader = make_client(f"{url}&socket_timeout=60&connect_timeout=60", breaker_cooldown_s=0.2)
    assert reader.get(KIND, kept[0]) == value(keys.index(kept[0]))
    victim.crash()

    tier = reader.cache.remotes[0]
    okey = reader.cache.namespace.object_key(KIND, lost[0])
    for key in lost[: BREAKER_FAILURES + 2]:
        got, ms = timed(lambda key=key: reader.get(KIND, key))  # type: ignore[misc]
        assert got is None  # a miss, never an exception
        assert ms < UNBOUNDED_MS, ms
        stored, ms = timed(lambda: reader.bridge.call(lambda: tier.put(okey, b"x"), 30))
        assert stored is False
        assert ms < UNBOUNDED_MS, ms
    misses = remote_stats(reader)["misses"]
    assert isinstance(misses, dict)
    assert sum(misses.get(r, 0) for r in ("error", "timeout", "breaker")) >= len(
        lost[: BREAKER_FAILURES + 2]
    ), misses

    cluster.wait_healthy()  # the replica was promoted
    # the same client, no restart: the breaker's probe finds the new primary
    wait_until(
        lambda: reader.get(KIND, lost[0]) == value(keys.index(lost[0])),
        what="a key of the crashed primary served by its promoted replica",
    )
    # every key, each node's share within the 250 ms deadline (a loaded machine can miss it
    # once: a partial answer, never a wrong one)
    every = {k: value(i) for i, k in enumerate(keys)}

    def every_key_served() -> bool:
        try:
            return reader.get_many(KIND, keys) == every
        except BridgeTimeout:  # the batch's own deadline, missed on a loaded machine: again
            return False

    wait_until(every_key_served, what="every key served again")
    wait_until(
        lambda: reader.bridge.call(lambda: tier.put(okey + "-new", b"new"), 10) is True,
        what="a write to the promoted replica",
    )
    assert remote_stats(reader)["breaker"] == "closed"


# --- bad input: uncovered slots, CLUSTERDOWN, a replica only ---------------------------------


@pytest.fixture(scope="module")
def half_covered() -> Iterator[RedisClusterNode]:
    """A cluster node alone, serving slots 0-8191: the others have no primary, so it says
    ``cluster_state:fail`` and answers CLUSTERDOWN."""
    with RedisClusterNode(node_timeout_ms=1500) as node:
        node.command("CLUSTER", "ADDSLOTSRANGE", 0, 8191)
        wait_until(lambda: node.slots() == [range(0, 8192)], what="slots 0-8191 assigned")
        yield node


@pytest.fixture(scope="module")
def replica_only() -> Iterator[RedisServer]:
    """A standalone replica of a primary of its own."""
    # the primary's first sync starts at once, not after the default 5 s
    fast_sync = ("--repl-diskless-sync-delay", "0")
    with (
        RedisServer(unix_socket=False, extra_args=fast_sync) as primary,
        RedisServer(
            unix_socket=False, extra_args=("--replicaof", primary.host, str(primary.port))
        ) as replica,
    ):
        wait_until(
            lambda: replica.command("INFO", "replication").get("master_link_status") == "up",
            what="the replica's link to its primary",
        )
        yield replica


def test_a_bad_cluster_or_a_replica_is_a_counted_miss_within_the_deadline(
    half_covered: RedisClusterNode, replica_only: RedisServer, make_client: MakeClient
) -> None:
    for url in (f"{half_covered.url}?prefix=bad/", f"{half_covered.url}?prefix=bad/&cluster=no"):
        client = make_client(url)
        tier = client.cache.remotes[0]
        for i in range(BREAKER_FAILURES):
            got, ms = timed(partial(client.get, KIND, f"k{i}"))
            assert got is None
            assert ms < CALL_BOUND_MS, (url, ms)
        misses = remote_stats(client)["misses"]
        assert isinstance(misses, dict) and set(misses) <= {"error", "breaker"}, (url, misses)
        assert sum(misses.values()) == BREAKER_FAILURES, (url, misses)
        assert client.bridge.call(partial(tier.put, "v1/x/k", b"v"), 10) is False

    reader = make_client(f"{replica_only.url}?prefix=bad/")
    tier = reader.cache.remotes[0]
    assert reader.get(KIND, "absent") is None  # a replica answers reads
    assert remote_stats(reader)["misses"] == {"absent": 1}
    stored, ms = timed(lambda: reader.bridge.call(lambda: tier.put("v1/x/k", b"v"), 10))
    assert stored is False and ms < CALL_BOUND_MS
    assert remote_stats(reader)["put_errors"] == {"error": 1}


def test_doctor_reports_the_topology_and_each_bad_tier_in_one_line(
    redis_cluster: RedisClusterServer,
    half_covered: RedisClusterNode,
    replica_only: RedisServer,
    tmp_path: Path,
) -> None:
    good = f"{redis_cluster.nodes[-1].url}?prefix=doctor/"
    bad = {
        "half": f"{half_covered.url}?prefix=doctor/",
        "replica": f"{replica_only.url}?prefix=doctor/",
        "single": f"{redis_cluster.url}?prefix=doctor/&cluster=no",
    }
    done = objcache_cli(["doctor"], ",".join([good, *bad.values()]), tmp_path)
    out = done.stdout
    assert done.returncode == 1 and "Traceback" not in out + done.stderr, out + done.stderr
    lines = out.splitlines()
    assert f"{good}: Redis Cluster: 3 primaries, 3 replicas, 16384 of 16384 slots covered" in out
    failed = {
        name: [ln for ln in lines if ln.startswith(f"FAILED {url}")] for name, url in bad.items()
    }
    assert all(len(found) == 1 for found in failed.values()), out
    assert "8192 of 16384 slots covered, cluster_state:fail" in failed["half"][0], out
    assert "keys there answer CLUSTERDOWN" in failed["half"][0], out
    assert "this server is a replica" in failed["replica"][0], out
    assert "remove cluster=no" in failed["single"][0], out
    assert not [ln for ln in lines if ln.startswith("FAILED ") and good in ln], out


def test_a_new_client_starts_while_the_primary_of_slot_0_is_dead(
    own_cluster: RedisClusterServer, make_client: MakeClient
) -> None:
    """redis-py asks the primary of slot 0 for its command table when a client starts:
    with that primary dead every new client failed, every call of the tier with it, and the
    breaker opened although the other primaries served. A fresh client started through a
    live node serves their keys."""
    cluster = own_cluster
    victim = next(n for n in cluster.primary_nodes() if any(0 in r for r in n.slots()))
    named = next(n for n in cluster.primary_nodes() if n is not victim)
    url = f"{named.url}?prefix=slot0/"
    keys = [f"k{i}" for i in range(40)]
    writer = make_client(url, timeout_ms=5000)
    for i, key in enumerate(keys):
        writer.put(KIND, key, value(i))
    assert writer.flush(30) == 0
    kept = [k for k in keys if not victim.serves(redis_key(writer, "slot0/", k))]
    assert kept and len(kept) < len(keys)
    victim.crash()

    # a fresh client: it starts with the primary of slot 0 dead. Its deadline is the
    # writer's: what is tested is that it starts and serves, and its first call opens the
    # connections to the live primaries, which took over 250 ms on a loaded 2-core machine
    reader = make_client(url, timeout_ms=5000)
    assert reader.get_many(KIND, kept) == {k: value(keys.index(k)) for k in kept}
    assert remote_stats(reader)["breaker"] == "closed"
