"""Read-only means no write call of any kind, counted at a real S3 server (SeaweedFS).

Every CLI command that writes or deletes refuses in one line (exit 2) on a read-only
configuration (``OBJCACHE_READ_ONLY=1``) or a ``?read_only=1`` tier, and the fault proxy in
front of the server sees zero PUT/POST/DELETE/PATCH requests. Control runs without
read-only show that the same commands do write through the same proxy.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from objcache.client import Client, build_cache
from objcache.config.settings import Config
from objcache.core.manifest import COMPACT_AFTER, write_run
from objcache.core.tiered_records import update_record
from objcache.core.writes import put
from tests.support.cloud import s3_url
from tests.support.paths import ROOT as REPO_ROOT
from tests.support.proxy import FaultProxy
from tests.support.servers import SeaweedS3

pytestmark = pytest.mark.servers

WRITES = ("PUT", "POST", "DELETE", "PATCH")


def writes(proxy: FaultProxy) -> list[str]:
    return [f"{r.method} {r.path}" for r in proxy.http_requests if r.method in WRITES]


@dataclass
class Store:
    direct: str  # seeding goes around the proxy
    proxied: str
    proxy: FaultProxy
    env: dict[str, str]

    def run(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "objcache.cli", *args],
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.fixture
def counted_s3_store(
    seaweed_s3: SeaweedS3, fault_proxy: Callable[[str, int], FaultProxy], tmp_path: Path
) -> Store:
    prefix = f"ro-{uuid.uuid4().hex[:10]}"
    proxy = fault_proxy("127.0.0.1", int(seaweed_s3.endpoint_url.rsplit(":", 1)[1]))
    direct = s3_url(seaweed_s3, prefix)
    env = {
        **os.environ,
        "OBJCACHE_TIERS": s3_url(seaweed_s3, prefix, endpoint_url=proxy.url()),
        "OBJCACHE_LOCAL_DIR": str(tmp_path / "local"),
        "OBJCACHE_STATS_FILE": str(tmp_path / "stats.json"),
        "OBJCACHE_PREFETCH": "0",
        "OBJCACHE_JOB": "rojob",
        "OBJCACHE_TIMEOUT_MS": "15000",
    }
    client = Client(Config.from_env(env, tiers=direct))
    for i in range(4):
        client.put("fx-graph", f"key-{i}", os.urandom(500) * (i + 1))
    client.close()

    async def more_runs() -> None:
        cache = build_cache(Config.from_env(env, tiers=direct))
        for i in range(COMPACT_AFTER + 1):
            await write_run(cache, "rojob", [cache.namespace.object_key("fx-graph", f"key-{i}")])
        await cache.close(30)

    asyncio.run(more_runs())
    proxy.reset_counters()
    return Store(direct, env["OBJCACHE_TIERS"], proxy, env)


def read_only_tier(url: str) -> str:
    return url + "&read_only=1"


#: (name, arguments given the tier URL the command is pointed at)
COMMANDS: list[tuple[str, Callable[[str], list[str]]]] = [
    ("push", lambda url: ["push"]),
    ("push --tier", lambda url: ["push", "--tier", url]),
    ("gc", lambda url: ["gc", "--older-than", "0", "--yes"]),
    ("gc --tier", lambda url: ["gc", "--tier", url, "--keep-env", "other", "--yes"]),
    ("verify --delete", lambda url: ["verify", "--tier", url, "--delete"]),
]


def assert_refused(r: subprocess.CompletedProcess[str], why: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused" in lines[0] and why in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(("name", "args"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_write_commands_refuse_a_read_only_config(
    counted_s3_store: Store, name: str, args: Callable[[str], list[str]]
) -> None:
    r = counted_s3_store.run(*args(counted_s3_store.proxied), OBJCACHE_READ_ONLY="1")
    assert_refused(r, "OBJCACHE_READ_ONLY")
    assert writes(counted_s3_store.proxy) == []


@pytest.mark.parametrize(("name", "args"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_write_commands_refuse_a_read_only_tier(
    counted_s3_store: Store, name: str, args: Callable[[str], list[str]]
) -> None:
    url = read_only_tier(counted_s3_store.proxied)
    r = counted_s3_store.run(*args(url), OBJCACHE_TIERS=url)
    assert_refused(r, "read_only=1")
    assert writes(counted_s3_store.proxy) == []


def test_control_the_same_commands_write_without_read_only(counted_s3_store: Store) -> None:
    """The counter sees writes when they happen: push copies, gc deletes."""
    other = counted_s3_store.proxied.replace("/ro-", "/ro-other-", 1)
    assert counted_s3_store.run("push", "--tier", other).returncode == 0
    assert any(w.startswith("PUT") for w in writes(counted_s3_store.proxy))
    counted_s3_store.proxy.reset_counters()
    r = counted_s3_store.run("gc", "--older-than", "0", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert any(w.startswith("DELETE") for w in writes(counted_s3_store.proxy))


def test_configured_read_only_tiers_are_skipped_not_written(
    counted_s3_store: Store, tmp_path: Path
) -> None:
    """With a writable tier beside a read-only one, push writes only the writable one."""
    writable = f"file://{tmp_path}/second"
    tiers = f"{read_only_tier(counted_s3_store.proxied)},{writable}"
    r = counted_s3_store.run("push", OBJCACHE_TIERS=tiers)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "skipping read-only tier" in r.stderr
    assert writes(counted_s3_store.proxy) == []
    assert list((tmp_path / "second").rglob("key-*"))


@pytest.mark.parametrize("how", ["config", "tier"])
def test_pull_by_job_compacts_nothing_when_read_only(counted_s3_store: Store, how: str) -> None:
    extra = (
        {"OBJCACHE_READ_ONLY": "1"}
        if how == "config"
        else {"OBJCACHE_TIERS": read_only_tier(counted_s3_store.proxied)}
    )
    r = counted_s3_store.run("pull", "--job", "rojob", **extra)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fetched" in r.stdout
    assert writes(counted_s3_store.proxy) == []
    counted_s3_store.proxy.reset_counters()
    control = counted_s3_store.run(
        "pull", "--job", "rojob"
    )  # more runs than COMPACT_AFTER: compacts
    assert control.returncode == 0, control.stdout + control.stderr
    assert any(w.startswith("DELETE") for w in writes(counted_s3_store.proxy))


# --- the cache itself: a ?read_only=1 tier is never written ---------------------------------


async def test_read_only_tier_gets_no_put_backfill_or_manifest(
    seaweed_s3: SeaweedS3, fault_proxy: Callable[[str, int], FaultProxy], tmp_path: Path
) -> None:
    """A ``?read_only=1`` S3 tier in front of a writable file:// tier: a far hit that the
    read-only tier lacks (back-fill), its write-through, new puts (write-behind), a record's
    conditional write, run manifests and their compaction all leave zero write requests at
    the server, while the tier is read (it is in the chain)."""
    proxy = fault_proxy("127.0.0.1", int(seaweed_s3.endpoint_url.rsplit(":", 1)[1]))
    prefix = f"ro-{uuid.uuid4().hex[:10]}"
    near = s3_url(seaweed_s3, prefix, endpoint_url=proxy.url(), read_only=1)
    far = f"file://{tmp_path}/far"
    # The job's run manifests sit in both tiers (manifests are listed from the first tier);
    # the entry they list only in the far one, so a hit there back-fills the near one.
    seed = build_cache(Config(tiers=far, local_dir=tmp_path / "seed", prefetch=False))
    await put(seed, "fx-graph", "seeded", b"far value" * 100)
    await seed.close(30)
    both = f"{s3_url(seaweed_s3, prefix)},{far}"
    runs = build_cache(Config(tiers=both, local_dir=tmp_path / "runs", prefetch=False))
    for _ in range(COMPACT_AFTER + 1):
        await write_run(runs, "job", [runs.namespace.object_key("fx-graph", "seeded")])
    await runs.close(30)

    cache = build_cache(
        Config(
            tiers=f"{near},{far}",
            local_dir=tmp_path / "local",
            prefetch=False,
            timeout_ms=15_000,
        )
    )
    try:
        assert [t.writable for t in cache.remotes] == [False, True]
        from objcache.core.manifest import prefetch, record_run

        # Fetches the far entry (back-fill, write-through) and compacts the job's runs.
        result = await prefetch(cache, "job")
        assert result["fetched"] == 1 and result["compacted"], result
        assert await cache.get("fx-graph", "seeded") == b"far value" * 100
        for i in range(5):
            await put(cache, "fx-graph", f"new-{i}", os.urandom(1000))
        await update_record(cache, "pgo", "profile", lambda current: b"joined")  # a record
        assert await cache.flush(30) == 0
        assert await record_run(cache, "job") is not None  # a run manifest was written
    finally:
        await cache.close(30)
    assert cache.stats.write_through >= 1, "the far hit was written through to local disk"
    assert proxy.count_requests("GET") >= 1, "the read-only tier was read"
    assert writes(proxy) == []
    assert list((tmp_path / "far").rglob("new-*")), "the writable tier got the puts"
    assert list((tmp_path / "far").rglob("profile")), "and the record"


@pytest.mark.parametrize("typo", ["read_onyl=1", "endpointurl=http://127.0.0.1:9", "regoin=x"])
def test_mistyped_tier_option_is_refused_before_any_request(
    counted_s3_store: Store, typo: str
) -> None:
    """``?read_onyl=1`` once left the tier writable and ``?endpointurl=`` sent requests to
    AWS: now the command stops at the configuration, naming the option."""
    url = f"{counted_s3_store.proxied}&{typo}"
    r = counted_s3_store.run("push", "--tier", url, OBJCACHE_TIERS=url)
    assert r.returncode == 2, r.stdout + r.stderr
    name = typo.split("=")[0]
    assert r.stderr.count("\n") == 1 and f"unknown option {name!r}; did you mean" in r.stderr
    assert counted_s3_store.proxy.http_requests == []


# --- a read-only fleet still reports: run summaries to a separate location -------------------

LOOKUPS = """
import objcache
client = objcache.get_client()
print(sum(client.get("fx-graph", key) is not None for key in ("key-0", "key-1", "nosuch")))
"""


def test_read_only_run_writes_its_summary_only_to_the_summaries_location_at_exit(
    counted_s3_store: Store, tmp_path: Path
) -> None:
    """``OBJCACHE_READ_ONLY=1`` with ``OBJCACHE_SUMMARIES_URL``: the process looks up and
    exits; its tiers get zero write requests, the summaries location exactly one object (the
    run summary, written at exit), and ``objcache report`` finds the run there."""
    summaries = tmp_path / "summaries"
    extra = {"OBJCACHE_READ_ONLY": "1", "OBJCACHE_SUMMARIES_URL": f"file://{summaries}"}
    env = {**counted_s3_store.env, **extra, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", LOOKUPS], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2"]
    assert counted_s3_store.proxy.count_requests("GET") >= 1, "the tiers were read"
    assert writes(counted_s3_store.proxy) == []
    written = [p for p in summaries.rglob("*") if p.is_file()]
    assert len(written) == 1 and "/run/" in str(written[0]), written

    r = counted_s3_store.run("report", "--job", "rojob", "--json", **extra)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = json.loads(r.stdout)["runs"]
    assert [(run["hits"], run["lookups"]) for run in runs] == [(2, 3)]
    assert runs[0]["env_fields"]["torch"]  # the environment travels with the summary
    assert writes(counted_s3_store.proxy) == []

    # Without a summaries location, read-only keeps its promise: nothing is written.
    control = subprocess.run(
        [sys.executable, "-c", LOOKUPS],
        env={**env, "OBJCACHE_SUMMARIES_URL": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert control.returncode == 0, control.stderr
    assert writes(counted_s3_store.proxy) == []
    assert len([p for p in summaries.rglob("*") if p.is_file()]) == 1
