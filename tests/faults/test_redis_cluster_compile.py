"""torch.compile against a Redis Cluster whose primary dies between two jobs.

A cold compile fills the cluster; one primary is killed (SIGKILL); a fresh machine compiles
with correct outputs, its lookups of the dead primary's keys counted misses within the
deadline; once the primary's replica has taken over, another fresh machine is served every
entry again, the lost ones included, by the same tier URL.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from objcache.demo.demo_jobs import objcache_hits
from tests.support import torch_runs as ts
from tests.support.servers import RedisClusterNode, RedisClusterServer
from tests.support.waiting import wait_until

pytest.importorskip("torch")
pytestmark = [
    pytest.mark.compile,
    pytest.mark.servers,
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
]

#: The prefetch in the compiling process, whose tiers count what it fetched and failed to
#: (in its own process the child's tiers count them: tests/test_prefetch_process.py).
IN_PROCESS = {"OBJCACHE_PREFETCH_PROCESS": "0"}
PREFIX = "failover/"
#: Long enough that the cluster never promotes the replica on its own during the reader's
#: job: the test promotes it (CLUSTER FAILOVER TAKEOVER) when it chooses.
NODE_TIMEOUT_MS = 120_000
#: What a call that reached the dead primary is counted as.
FAILED = ("error", "timeout")


def kinds_held(node: RedisClusterNode) -> Counter[str]:
    """Entries under PREFIX on ``node`` by kind (``v1/<env>/<kind>/...``)."""
    keys = node.command("KEYS", f"{PREFIX}v1/*")
    return Counter(str(k)[len(PREFIX) :].split("/")[2] for k in keys)


def replica_of(cluster: RedisClusterServer, primary: RedisClusterNode) -> RedisClusterNode:
    return next(
        n
        for n in cluster.live_nodes()
        if n.role() == "slave"
        and int(n.command("INFO", "replication")["master_port"]) == primary.port
    )


def serves_in_every_view(cluster: RedisClusterServer, node: RedisClusterNode) -> bool:
    """Every live node says ``cluster_state:ok`` and names ``node`` a primary with slots."""
    address = f"{node.host}:{node.port}@"
    for live in cluster.live_nodes():
        if live.cluster_info().get("cluster_state") != "ok":
            return False
        lines = [ln.split() for ln in str(live.command("CLUSTER", "NODES")).splitlines()]
        (fields,) = [f for f in lines if f[1].startswith(address)]
        if "master" not in fields[2].split(",") or len(fields) < 9:
            return False
    return True


def failed(tier: dict[str, Any], kind: str) -> int:
    return sum(tier["kinds"].get(kind, {}).get(r, 0) for r in FAILED)


def test_a_primary_killed_between_jobs_costs_misses_then_its_replica_serves(
    tmp_path: Path,
) -> None:
    with RedisClusterServer(node_timeout_ms=NODE_TIMEOUT_MS) as cluster:
        cold_env = ts.compile_env(tmp_path / "cold", f"{cluster.url}?prefix={PREFIX}")
        # the seeding job's writes must all land: on a loaded machine a 400 ms deadline can
        # time one out (a counted error, as designed), which is not what this test measures
        seed_deadline = {"OBJCACHE_TIMEOUT_MS": "5000"}
        cold = ts.run_compile({**cold_env, **ts.PLAIN_PATH, **IN_PROCESS, **seed_deadline})
        assert cold["match"], cold["max_abs_err"]
        stored = ts.tier_stats(cold, "redis://")
        # flushed at exit (a failed put: its warning is in the run's stderr)
        assert stored["puts"] > 0 and not stored["put_errors"], (stored, cold["stderr_tail"])
        looked_up = set(stored["kinds"])  # pgo, aot-autograd, fx-graph, kernel
        wait_until(cluster.replicated, what="the replicas acknowledged every write")

        held = {n.port: kinds_held(n) for n in cluster.primary_nodes()}
        victim = max(cluster.primary_nodes(), key=lambda n: held[n.port]["kernel"])
        alive = sum((c for port, c in held.items() if port != victim.port), Counter[str]())
        assert held[victim.port]["kernel"] and alive["kernel"], held
        replica = replica_of(cluster, victim)
        victim.crash()
        url = f"{cluster.live_nodes()[0].url}?prefix={PREFIX}"  # any live node

        def reader(machine: str) -> dict[str, Any]:
            # the default breaker: a dead primary's keys (and the LISTs that need every
            # primary) are partial outages, which never open it for the whole cluster
            return ts.run_compile(
                {**ts.compile_env(tmp_path / machine, url), **ts.PLAIN_PATH, **IN_PROCESS}
            )

        # a fresh machine while the primary is dead and not yet replaced
        during = reader("during")
        assert during["match"], during["max_abs_err"]  # eager's outputs: the compile ran
        hurt = ts.tier_stats(during, "redis://")
        assert set(hurt["misses"]) <= {"absent", "list", *FAILED}, hurt["misses"]
        assert sum(hurt["misses"].get(r, 0) for r in FAILED) > 0, hurt["misses"]
        # entries looked up under the key they were stored at: a hit on a live primary, a
        # counted miss on the dead one; a failed lookup is no answer, so a kernel the
        # prefetch failed to fetch is looked up once more when the compile loads it
        kernels = hurt["kinds"]["kernel"]
        assert 0 < failed(hurt, "kernel") <= 2 * held[victim.port]["kernel"], (kernels, held)
        assert 0 < kernels.get("hit", 0) <= alive["kernel"], (kernels, held)
        pgo = hurt["kinds"]["pgo"]  # the job's one PGO record
        assert (failed(hurt, "pgo"), pgo.get("hit", 0)) == (
            (1, 0) if held[victim.port]["pgo"] else (0, 1)
        ), (pgo, held)

        replica.command("CLUSTER", "FAILOVER", "TAKEOVER")
        wait_until(
            lambda: serves_in_every_view(cluster, replica),
            what="the replica promoted in every live node's view, cluster_state:ok",
        )

        # another fresh machine, the same URL: the lost entries are served again
        after = reader("after")
        assert after["match"], after["max_abs_err"]
        healed = ts.tier_stats(after, "redis://")
        for label, tier in (("primary dead", hurt), ("after the takeover", healed)):
            print(f"redis tier, {label}: {tier['hits']} hits, misses {tier['misses']}")
            print(f"  by kind: {tier['kinds']}")
        assert set(healed["misses"]) <= {"absent"}, healed["misses"]
        for kind in ("kernel", "pgo"):  # looked up under the stored key: every one a hit
            assert set(healed["kinds"][kind]) == {"hit"}, healed["kinds"]
        # more kernels served than the live primaries held: the lost ones are back
        assert healed["kinds"]["kernel"]["hit"] > alive["kernel"], (healed["kinds"], held)
        served = healed["kinds"]
        assert all(served.get(kind, {}).get("hit") for kind in looked_up), (looked_up, served)
        got = objcache_hits(after)
        # kernels the prefetch placed where torch looks are never asked for: no lookup
        asked = looked_up - ({"kernel"} if "kernel" not in got else set())
        assert all(got[kind][0] == got[kind][1] > 0 for kind in asked), got
        assert after["integration"]["kernels"].get("builds", 0) == 0, after["integration"]
        assert after["torch"].get("fxgraph_cache_hit") == 2, after["torch"]
