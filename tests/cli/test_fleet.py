"""Fleet behaviour on real stores (SeaweedFS, moto, Redis) through fault proxies.

What a multi-region training fleet relies on, checked end to end with request counts taken
at the wire (``FaultProxy.http_requests``), not with objcache's own counters:

- run manifests from many concurrent writers merge with no lost update, also while a reader
  compacts them, and compaction never deletes runs whose merged manifest was not stored;
- a lookup of a key that the start-up prefetch is fetching joins that fetch (one GET);
- a hit found only in the far region is back-filled into the near one, and the next fresh
  machine is served by the near region;
- ``write_to=nearest`` writes to the nearest healthy tier plus the ``home=1`` tier;
- every CLI command against S3 (SeaweedFS) and Redis, and ``doctor`` on a broken tier.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from objcache.cli import main as cli
from objcache.client import Client, build_cache
from objcache.config.settings import Config
from objcache.core.manifest import Manifest, compact, list_manifests, read_job, write_run
from objcache.core.reads import read_local_sync
from objcache.core.tiered import TieredCache
from objcache.core.writes import put
from objcache.entry.codec import Codec
from tests.conftest import BucketServer
from tests.support.cloud import s3_url
from tests.support.proxy import FaultProxy
from tests.support.servers import MotoS3, RedisServer, S3Server, SeaweedS3
from tests.support.waiting import until, wait_until

pytestmark = pytest.mark.servers

MakeProxy = Callable[[str, int], FaultProxy]
MakeBucket = Callable[[BucketServer], str]


def uid() -> str:
    return uuid.uuid4().hex[:10]


def port_of(server: S3Server) -> int:
    return int(server.endpoint_url.rsplit(":", 1)[1])


def cache_for(tiers: str, local: Path, **options: Any) -> TieredCache:
    """A cache with generous deadlines: these tests are about routing, not deadlines, and the
    shared 2-core machine can stall a loopback request for seconds."""
    options.setdefault("timeout_ms", 15_000)
    return build_cache(Config(tiers=tiers, local_dir=local, prefetch=False, **options))


def gets_of(proxy: FaultProxy, okey: str) -> int:
    """GETs of exactly this object (path-style target, query string ignored)."""
    return sum(
        1 for r in proxy.http_requests if r.method == "GET" and r.path.split("?")[0].endswith(okey)
    )


def puts_of(proxy: FaultProxy, okey: str) -> int:
    return sum(
        1 for r in proxy.http_requests if r.method == "PUT" and r.path.split("?")[0].endswith(okey)
    )


@pytest.fixture
async def caches() -> AsyncIterator[list[TieredCache]]:
    """Caches a test builds; closed (flushed) at teardown."""
    made: list[TieredCache] = []
    yield made
    for cache in made:
        await cache.close(10)


# --- manifests under concurrency -----------------------------------------------------------


async def test_manifest_merge_8_writers_with_compaction_running(
    seaweed_s3: SeaweedS3, tmp_path: Path, caches: list[TieredCache]
) -> None:
    url = s3_url(seaweed_s3, f"fleet-{uid()}")
    job = "train"
    writers = [cache_for(url, tmp_path / f"w{i}") for i in range(8)]
    compactor = cache_for(url, tmp_path / "compactor")
    caches.extend([*writers, compactor])
    expected: set[str] = set()
    writing = True
    compacted_while_writing = 0

    async def writer(i: int, cache: TieredCache) -> None:
        for r in range(4):
            if r == 3:  # the last runs are written only once a compaction has happened
                await until(lambda: compacted_while_writing >= 1, what="a compaction")
            keys = {cache.namespace.object_key("fx-graph", f"w{i}-r{r}-k{j}") for j in range(5)}
            expected.update(keys)
            await write_run(cache, job, keys)
            assert await cache.flush(30) == 0
            await asyncio.sleep(random.uniform(0, 0.05))

    async def compact_loop() -> None:
        nonlocal compacted_while_writing
        while writing:
            keys, names = await read_job(compactor, job)
            if await compact(compactor, job, keys, names):
                compacted_while_writing += 1
            await asyncio.sleep(0.02)

    loop_task = asyncio.ensure_future(compact_loop())
    await asyncio.gather(*(writer(i, c) for i, c in enumerate(writers)))
    writing = False
    await loop_task

    assert compacted_while_writing >= 1, "compaction never ran while the writers were writing"
    fresh = cache_for(url, tmp_path / "reader")
    caches.append(fresh)
    keys, names = await read_job(fresh, job)
    assert len(expected) == 8 * 4 * 5
    assert keys == expected, f"lost {len(expected - keys)} keys"
    # One more compaction folds whatever runs are left: the union stays the same.
    await compact(fresh, job, keys, names)
    after = await list_manifests(fresh, job)
    assert sum("/run-" in n for n in after) <= 8
    assert (await read_job(fresh, job))[0] == expected


async def test_compaction_keeps_runs_when_merged_manifest_is_refused(
    seaweed_s3: SeaweedS3, tmp_path: Path, caches: list[TieredCache]
) -> None:
    """A merged manifest the tier does not store (here: over the tier's max_size) must not
    cost the runs it merged; they are deleted only once the merged one is stored."""
    job = "big"
    codec = Codec()
    prefix = f"fleet-{uid()}"
    probe = cache_for(s3_url(seaweed_s3, prefix), tmp_path / "probe")
    caches.append(probe)
    keys = [probe.namespace.object_key("fx-graph", os.urandom(32).hex()) for _ in range(12)]
    run_size = max(
        len(codec.encode(Manifest(job, frozenset([k]), 0.0).to_bytes(), k)) for k in keys
    )
    merged_size = len(codec.encode(Manifest(job, frozenset(keys), 0.0).to_bytes(), keys[0]))
    max_size = (run_size + merged_size) // 2
    assert run_size < max_size < merged_size
    cache = cache_for(s3_url(seaweed_s3, prefix, max_size=max_size), tmp_path / "c")
    caches.append(cache)
    for k in keys:
        await write_run(cache, job, [k])
    assert await cache.flush(30) == 0
    union, names = await read_job(cache, job)
    assert union == set(keys) and len(names) == 12
    assert not await compact(cache, job, union, names)
    assert (await read_job(cache, job))[0] == set(keys), "compaction lost run manifests"


# --- prefetch single-flight ------------------------------------------------------------------


def test_lookup_during_prefetch_joins_the_fetch(
    seaweed_s3: SeaweedS3, fault_proxy: MakeProxy, tmp_path: Path
) -> None:
    """torch looks a key up (sync Client.get) while the start-up prefetch is fetching it:
    the server sees exactly one GET of that object."""
    prefix, job = f"fleet-{uid()}", "warm"
    values = {f"graph-{i:02d}": os.urandom(1024) * random.randint(50, 100) for i in range(16)}
    seeder = Client(
        Config(tiers=s3_url(seaweed_s3, prefix), local_dir=tmp_path / "ci", prefetch=False, job=job)
    )
    for key, value in values.items():
        seeder.put("fx-graph", key, value)
    seeder.close()  # flushes the entries and writes the run manifest

    proxy = fault_proxy("127.0.0.1", port_of(seaweed_s3))
    proxy.set_rtt_ms(200)
    url = s3_url(seaweed_s3, prefix, endpoint_url=proxy.url())
    client = Client(
        Config(
            tiers=url,
            local_dir=tmp_path / "fresh",
            prefetch=True,
            prefetch_process=False,  # in this process: its fetch is the one a lookup joins
            job=job,
            timeout_ms=15_000,
        )
    )
    try:
        target = "graph-15"
        okey = client.cache.namespace.object_key("fx-graph", target)
        wait_until(lambda: client.cache.fetching(okey), what="the prefetch fetching the key")
        assert client.get("fx-graph", target) == values[target]
        assert client.prefetch_result is not None
        result = client.prefetch_result.result(60)
        assert result["fetched"] == 16 and result["manifests"] == 1
        for key, value in values.items():  # torch's later lookups: all local now
            assert client.get("fx-graph", key) == value
        stats = client.stats()
        assert stats["cache"]["single_flight_shared"] >= 1
        per_key = {
            k: gets_of(proxy, client.cache.namespace.object_key("fx-graph", k)) for k in values
        }
        assert per_key[target] == 1, f"a second GET was issued: {proxy.http_requests}"
        assert set(per_key.values()) == {1}, per_key
    finally:
        client.close()


# --- multi-region read-repair and write policy -----------------------------------------------


async def test_far_hit_is_backfilled_into_near_region(
    seaweed_s3: SeaweedS3,
    moto_s3: MotoS3,
    make_bucket: MakeBucket,
    fault_proxy: MakeProxy,
    tmp_path: Path,
    caches: list[TieredCache],
) -> None:
    near_proxy = fault_proxy("127.0.0.1", port_of(seaweed_s3))
    far_proxy = fault_proxy("127.0.0.1", port_of(moto_s3))
    near_proxy.set_rtt_ms(10)
    far_proxy.set_rtt_ms(120)
    near_bucket, far_bucket = make_bucket(seaweed_s3), make_bucket(moto_s3)
    near = s3_url(seaweed_s3, "cache", bucket=near_bucket, endpoint_url=near_proxy.url())
    far = s3_url(moto_s3, "cache", bucket=far_bucket, endpoint_url=far_proxy.url())

    seed = cache_for(s3_url(moto_s3, "cache", bucket=far_bucket), tmp_path / "seed")
    caches.append(seed)
    value = os.urandom(200_000)
    await put(seed, "fx-graph", "only-far", value)
    assert await seed.flush(30) == 0
    okey = seed.namespace.object_key("fx-graph", "only-far")

    first = cache_for(f"{near},{far}", tmp_path / "machine-1")
    caches.append(first)
    assert await first.get("fx-graph", "only-far") == value
    assert await first.flush(30) == 0
    assert first.stats.backfills == 1
    assert dict(first.stats.served_by) == {first.remotes[1].name: 1}
    assert (gets_of(near_proxy, okey), puts_of(near_proxy, okey)) == (1, 1), "miss, back-fill"
    assert (gets_of(far_proxy, okey), puts_of(far_proxy, okey)) == (1, 0)
    stored = seaweed_s3.client().get_object(Bucket=near_bucket, Key=f"cache/{okey}")["Body"]
    assert Codec().decode(stored.read(), okey) == value, "near region holds the verified entry"

    near_proxy.reset_counters()
    far_proxy.reset_counters()
    second = cache_for(f"{near},{far}", tmp_path / "machine-2")
    caches.append(second)
    assert await second.get("fx-graph", "only-far") == value
    assert await second.flush(30) == 0
    assert dict(second.stats.served_by) == {second.remotes[0].name: 1}, "served by near"
    assert second.stats.backfills == 0
    assert (gets_of(near_proxy, okey), puts_of(near_proxy, okey)) == (1, 0)
    assert puts_of(far_proxy, okey) == 0
    assert second.remotes[1].stats.hits == 0, "the far answer (if any) was not used"


async def test_write_to_nearest_plus_home(
    redis_server: RedisServer,
    seaweed_s3: SeaweedS3,
    moto_s3: MotoS3,
    make_bucket: MakeBucket,
    fault_proxy: MakeProxy,
    tmp_path: Path,
    caches: list[TieredCache],
) -> None:
    redis_proxy = fault_proxy("127.0.0.1", redis_server.port)
    # connecting through the proxy on a loaded machine can take seconds (the default is 2)
    region = f"redis://127.0.0.1:{redis_proxy.port}/0?prefix=fleet-{uid()}/&connect_timeout=10"
    near_bucket, home_bucket = make_bucket(seaweed_s3), make_bucket(moto_s3)
    near = s3_url(seaweed_s3, "c", bucket=near_bucket)
    home = s3_url(moto_s3, "c", bucket=home_bucket, home=1)
    cache = cache_for(
        f"{region},{near},{home}",
        tmp_path / "w",
        write_to="nearest",
        breaker_failures=1,
        retries=0,
        timeout_ms=5000,
    )
    caches.append(cache)
    redis_tier, near_tier, home_tier = cache.remotes

    async def where(key: str) -> list[str]:
        okey = cache.namespace.object_key("fx-graph", key)
        found = []
        for name, tier in (("redis", redis_tier), ("near", near_tier), ("home", home_tier)):
            if await tier.backend.get(okey) is not None:
                found.append(name)
        return found

    await put(cache, "fx-graph", "k1", b"one" * 1000)
    assert await cache.flush(30) == 0
    assert await where("k1") == ["redis", "home"]

    redis_proxy.refuse()  # the region's redis goes down
    await put(cache, "fx-graph", "k2", b"two" * 1000)
    await cache.flush(30)
    assert redis_tier.breaker_open()
    await put(cache, "fx-graph", "k3", b"three" * 1000)
    assert await cache.flush(30) == 0
    redis_proxy.passthrough()
    assert await where("k2") == ["home"], "the failed nearest write is not redirected"
    assert await where("k3") == ["near", "home"], "next healthy tier + home"


# --- the CLI on real stores --------------------------------------------------------------


@pytest.fixture(params=["s3", "redis"])
def fleet_store(request: pytest.FixtureRequest) -> Iterator[tuple[str, Callable[[str], str]]]:
    """``(kind, url(prefix))`` for a real store."""
    if request.param == "s3":
        server: SeaweedS3 = request.getfixturevalue("seaweed_s3")
        yield "s3", lambda p: s3_url(server, p)
    else:
        redis: RedisServer = request.getfixturevalue("redis_server")
        yield "redis", lambda p: f"{redis.url}?prefix={p}/"


def corrupt(kind: str, url: str, okey: str, server: Any) -> None:
    """Flip bytes of an entry at rest, straight in the store."""
    if kind == "s3":
        bucket, prefix = url.split("://", 1)[1].split("?")[0].split("/", 1)
        key = f"{prefix}/{okey}"
        body = server.client().get_object(Bucket=bucket, Key=key)["Body"].read()
        server.client().put_object(Bucket=bucket, Key=key, Body=body[:-3] + b"xyz")
    else:
        import redis as redis_sync

        r = redis_sync.Redis(host="127.0.0.1", port=server.port)
        name = url.split("prefix=")[1] + okey
        value = r.get(name)
        assert value is not None
        r.set(name, value[:-3] + b"xyz")
        r.close()


def test_every_cli_command_on_a_real_store(
    fleet_store: tuple[str, Callable[[str], str]],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kind, url_of = fleet_store
    server = request.getfixturevalue("seaweed_s3" if kind == "s3" else "redis_server")
    prefix = f"fleet-{uid()}"
    url, seeded = url_of(prefix), url_of(f"{prefix}-seeded")
    for name, value in {
        "OBJCACHE_TIERS": url,
        "OBJCACHE_LOCAL_DIR": str(tmp_path / "local"),
        "OBJCACHE_STATS_FILE": str(tmp_path / "stats.json"),
        "OBJCACHE_PREFETCH": "0",
        "OBJCACHE_JOB": "fleetcli",
    }.items():
        monkeypatch.setenv(name, value)
    runner = CliRunner()

    def run(*args: str, code: int = 0, **env: str) -> str:
        result = runner.invoke(cli.app, list(args), env=env or None, catch_exceptions=False)
        assert result.exit_code == code, f"{args}: {result.output}"
        return result.output

    def listed(tier: str) -> set[str]:
        return {e["key"] for e in json.loads(run("ls", "--json", "--tier", tier))}

    client = Client(Config.from_env())
    keys = [f"key-{i}" for i in range(6)]
    for i, key in enumerate(keys):
        client.put("fx-graph", key, os.urandom(2000) * (i + 1))
    assert client.get("fx-graph", "key-0") is not None
    client.close()  # flush + run manifest for job fleetcli + stats file

    assert "FAILED" not in run("doctor")
    assert set(keys) <= listed(url)
    envs = json.loads(run("ls", "--envs", "--json"))
    assert sum(e["entries"] for e in envs.values()) >= 7  # 6 entries + the manifest
    stats = json.loads(run("stats", "--json"))
    assert stats["cache"]["hits"] == {"fx-graph": 1}

    pushed = run("push", "--tier", seeded)
    assert "7 copied" in pushed, pushed  # 6 entries and the manifest
    assert set(keys) <= listed(seeded)
    assert "0 copied" in run("push", "--tier", seeded)

    fresh = str(tmp_path / "fresh")
    assert "already there" in run("pull", "--tier", seeded, OBJCACHE_LOCAL_DIR=fresh)
    reader = Client(Config.from_env(tiers="", local_dir=fresh))
    assert all(read_local_sync(reader.cache, "fx-graph", k) for k in keys)
    reader.close()
    by_job = run("pull", "--job", "fleetcli", OBJCACHE_LOCAL_DIR=str(tmp_path / "fresh2"))
    assert "6 fetched" in by_job, by_job
    run("pull", "--job", "nosuchjob", code=0, OBJCACHE_LOCAL_DIR=str(tmp_path / "fresh3"))

    okey = client.cache.namespace.object_key("fx-graph", "key-3")
    corrupt(kind, url, okey, server)
    bad = run("verify", "--tier", url, code=1)
    assert "corrupt" in bad and "1 bad" in bad, bad
    run("verify", "--tier", url, "--delete")
    assert "key-3" not in listed(url)
    assert "0 bad" in run("verify", "--tier", url)

    before = listed(url)
    dry = run("gc", "--keep-env", "someotherenv", "--dry-run")
    assert "would delete" in dry
    assert listed(url) == before, "a dry run deletes nothing"
    run("gc", "--keep-env", "someotherenv", "--yes")
    assert listed(url) == set()
    assert set(keys) <= listed(seeded), "gc touched only its tier"


# --- doctor on broken tiers ----------------------------------------------------------------


def test_doctor_bad_endpoint_and_missing_bucket_one_line(
    seaweed_s3: SeaweedS3, moto_s3: MotoS3, tmp_path: Path
) -> None:
    from tests.support.ports import free_port

    bad_endpoint = s3_url(seaweed_s3, "p", endpoint_url=f"http://127.0.0.1:{free_port()}")
    # moto, not SeaweedFS: SeaweedFS creates a missing bucket on the first PUT.
    missing = s3_url(moto_s3, "p", bucket=f"no-such-bucket-{uid()}")
    env = {
        **os.environ,
        "OBJCACHE_TIERS": f"{bad_endpoint},{missing}",
        "OBJCACHE_LOCAL_DIR": str(tmp_path / "local"),
        "OBJCACHE_TIMEOUT_MS": "2000",
        "OBJCACHE_PREFETCH": "0",
        "COLUMNS": "80",
    }
    r = subprocess.run(
        [sys.executable, "-m", "objcache.cli", "doctor"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    lines = r.stdout.splitlines()
    reasons = [line for line in lines if line.startswith("FAILED ")]
    assert len(reasons) == 2, r.stdout
    endpoint_line = next(line for line in reasons if "no-such-bucket" not in line)
    bucket_line = next(line for line in reasons if "no-such-bucket" in line)
    assert "connect" in endpoint_line.lower() or "refused" in endpoint_line.lower(), r.stdout
    assert "bucket" in bucket_line.lower() and "no-such-bucket" in bucket_line, r.stdout


async def test_lookup_right_after_a_remote_hit_issues_no_second_get(
    seaweed_s3: SeaweedS3, fault_proxy: MakeProxy, tmp_path: Path, caches: list[TieredCache]
) -> None:
    """The shared fetch ends before its write-through to local disk lands; torch's next
    lookup of the key in that window must not go back to the store."""
    prefix = f"fleet-{uid()}"
    seed = cache_for(s3_url(seaweed_s3, prefix), tmp_path / "seed")
    proxy = fault_proxy("127.0.0.1", port_of(seaweed_s3))
    proxy.set_rtt_ms(20)
    cache = cache_for(s3_url(seaweed_s3, prefix, endpoint_url=proxy.url()), tmp_path / "fresh")
    caches.extend([seed, cache])
    values = {f"k{i}": os.urandom(300_000) for i in range(5)}
    for key, value in values.items():
        await put(seed, "fx-graph", key, value)
    assert await seed.flush(30) == 0
    for key, value in values.items():
        assert await cache.get("fx-graph", key) == value
        assert await cache.get("fx-graph", key) == value  # before the write-through lands
    for key in values:
        assert gets_of(proxy, cache.namespace.object_key("fx-graph", key)) == 1, key
