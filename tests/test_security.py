"""Security properties against real stores (issue 6, items 2 and 3).

* Signed entries: a crafted malicious pickle planted under the key a lookup will use, in
  every store kind, unsigned or signed with another key, is refused before anything is
  unpickled: a miss, counted, logged once, never written through.
* Least privilege: read-only mode makes no write call at all (counted at the server);
  hostile user keys are encoded into one safe path segment; oversized keys are misses that
  do not take the tier down.
* Secrets (redis password, AWS keys, signing key) never appear in logs, errors or CLI output.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from objcache.backends.base import Backend, PutMode
from objcache.client import Client
from objcache.codec import Codec
from objcache.config import Config
from objcache.registry import create_backend
from objcache.urls import parse_tier_url
from tests.cloud_support import gcs_url, s3_url
from tests.faults.conftest import port_of, raw
from tests.faults.evil import foreign_signed_entry, malicious_pickle, unsigned_entry
from tests.support.proxy import FaultProxy
from tests.support.servers import FakeGCS, RedisServer, SeaweedS3

ROOT = Path(__file__).resolve().parents[1]
KEY = b"the-victims-signing-key-0123456789"
KIND = "fx-graph"


def close(*clients: Client) -> None:
    for c in clients:
        c.close()
        c.bridge.stop()


def make_backend(url: str) -> Backend:
    return create_backend(parse_tier_url(url))


@pytest.fixture
def remote_url(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str, str | None], str]:
    """``remote_url(kind, endpoint)``: a fresh prefix in a real store of ``kind``."""
    prefix = f"sec-{uuid.uuid4().hex[:10]}"

    def make(kind: str, endpoint: str | None = None) -> str:
        if kind == "file":
            return f"file://{tmp_path / 'file-store'}"
        if kind == "redis":
            server: RedisServer = request.getfixturevalue("redis_server")
            port = port_of(endpoint) if endpoint else server.port
            return f"redis://127.0.0.1:{port}/0?prefix={prefix}/"
        if kind == "s3":
            s3: SeaweedS3 = request.getfixturevalue("seaweed_s3")
            return s3_url(s3, prefix, endpoint_url=endpoint)
        if kind == "gcs":
            gcs: FakeGCS = request.getfixturevalue("fake_gcs")
            return gcs_url(gcs, prefix, endpoint=endpoint)
        raise ValueError(kind)

    return make


# --- signed entries --------------------------------------------------------------------


@pytest.mark.parametrize("forgery", ["unsigned", "bad_signature"])
@pytest.mark.parametrize("kind", ["disk", "file", "redis", "s3", "gcs"])
def test_planted_malicious_pickle_is_refused(
    kind: str,
    forgery: str,
    tmp_path: Path,
    remote_url: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    marker = tmp_path / "PWNED"
    evil = malicious_pickle(marker)
    entry = unsigned_entry(evil) if forgery == "unsigned" else foreign_signed_entry(evil)
    remote = remote_url("file" if kind == "disk" else kind)
    config = Config.from_env(
        {},
        tiers=remote,
        local_dir=tmp_path / "local",
        signing_keys=(KEY,),
        prefetch=False,
        timeout_ms=5000,
        stats_file=tmp_path / "stats.json",
    )
    client = Client(config)
    okey = client.cache.namespace.object_key(KIND, "victim")
    target_url = f"disk://{tmp_path / 'local'}" if kind == "disk" else remote
    target = make_backend(target_url)
    other_url = remote if kind == "disk" else f"disk://{tmp_path / 'local'}"
    other = make_backend(other_url)
    try:
        raw(lambda: target.put(okey, entry, PutMode.OVERWRITE))
        # a genuine entry signed with the victim's key under another key: the control
        good = genuine_entry(b"genuine")
        raw(lambda: target.put(client.cache.namespace.object_key(KIND, "good"), good))

        caplog.set_level(logging.WARNING, logger="objcache")
        got = [client.get(KIND, "victim") for _ in range(3)]
        for value in got:
            if value is not None:
                pickle.loads(value)  # what torch would do with a hit
        assert got == [None, None, None]
        assert not marker.exists()
        assert client.get(KIND, "good") == b"genuine"  # signed entries are served
        assert client.flush(10) == 0

        tiers = client.stats()["tiers"]
        refused_in = tiers[0] if kind == "disk" else tiers[1]
        assert refused_in["misses"].get(forgery, 0) >= 1
        assert sum(t["misses"].get(forgery, 0) for t in tiers) == (
            3 if kind != "disk" else 1  # the local copy is quarantined at the first look
        ), tiers
        refusals = [r for r in caplog.records if "refused entry" in r.getMessage()]
        assert len(refusals) == 1, [r.getMessage() for r in refusals]
        assert refusals[0].levelno == logging.WARNING
        # nothing written through or back-filled anywhere
        assert raw(lambda: other.get(okey)) is None
        # only the genuine entry was copied (from a remote store into the local tier)
        assert client.cache.stats.write_through == (0 if kind == "disk" else 1)
        assert client.cache.stats.backfills == 0
        if kind == "disk":
            assert raw(lambda: target.get(okey)) is None  # quarantined
        else:
            assert raw(lambda: target.get(okey)) == entry  # left alone
    finally:
        close(client)
        raw(target.close)
        raw(other.close)
    assert not marker.exists()


def genuine_entry(payload: bytes) -> bytes:
    return Codec(signing_keys=(KEY,)).encode(payload)


# --- least privilege: read-only --------------------------------------------------------

WRITE_METHODS = ("PUT", "POST", "DELETE", "PATCH")


def redis_write_calls(r: redis.Redis, before: dict[str, int]) -> dict[str, int]:
    """Commands flagged ``write`` by the server (COMMAND) called since ``before``."""
    table = r.command()
    grown = {k: n - before.get(k, 0) for k, n in commandstats(r).items() if n > before.get(k, 0)}
    return {
        name: n
        for name, n in grown.items()
        if "write" in table.get(name.split("|")[0], {}).get("flags", [])
    }


def commandstats(r: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in r.info("commandstats").items()}


@pytest.fixture
def proxies(seaweed_s3: SeaweedS3, fake_gcs: FakeGCS) -> Iterator[dict[str, FaultProxy]]:
    made = {
        "s3": FaultProxy("127.0.0.1", port_of(seaweed_s3.endpoint_url)),
        "gcs": FaultProxy("127.0.0.1", port_of(fake_gcs.endpoint)),
    }
    yield made
    for p in made.values():
        p.close()


@pytest.mark.parametrize("read_only", [True, False])
def test_read_only_makes_no_write_calls(
    read_only: bool,
    tmp_path: Path,
    remote_url: Callable[..., str],
    redis_server: RedisServer,
    proxies: dict[str, FaultProxy],
) -> None:
    """A session of gets (hits in the far tiers that would back-fill the near ones, misses)
    and puts: with read_only, zero PUT/POST/DELETE at S3 and GCS and no redis write command.
    The read_only=False run is the control: the same session does write."""
    tiers = [
        remote_url("redis"),
        remote_url("s3", proxies["s3"].url()),
        remote_url("gcs", proxies["gcs"].url()),
        remote_url("file"),
    ]
    base = {
        "prefetch": True,  # read-only consumers prefetch too; that must not write either
        "job": f"ro-{uuid.uuid4().hex[:6]}",
        "timeout_ms": 5000,
        "stats_file": tmp_path / "stats.json",
    }
    seeder = Client(
        Config.from_env({}, tiers=",".join(tiers[1:]), local_dir=tmp_path / "seed", **base)
    )
    for i in range(4):
        seeder.put(KIND, f"seeded-{i}", os.urandom(2000))
    assert seeder.flush(10) == 0
    close(seeder)  # also writes the job's manifest: the reader will prefetch from it

    admin = redis.Redis(host="127.0.0.1", port=redis_server.port)
    before = commandstats(admin)
    for p in proxies.values():
        p.reset_counters()
    reader = Client(
        Config.from_env(
            {}, tiers=",".join(tiers), local_dir=tmp_path / "reader", read_only=read_only, **base
        )
    )
    if reader.prefetch_result is not None:
        reader.prefetch_result.result(30)
    fresh = Client(
        Config.from_env(
            {},
            tiers=",".join(tiers),
            local_dir=tmp_path / "reader2",
            read_only=read_only,
            **{**base, "prefetch": False},
        )
    )
    for c in (reader, fresh):
        for i in range(4):
            assert c.get(KIND, f"seeded-{i}") is not None  # remote hits (fresh local dir)
        assert c.get(KIND, "absent") is None
        c.put(KIND, f"new-{c is fresh}", os.urandom(1000))
        assert c.flush(10) == 0
    close(reader, fresh)

    writes = {kind: sum(p.count_requests(m) for m in WRITE_METHODS) for kind, p in proxies.items()}
    redis_writes = redis_write_calls(admin, before)
    admin.close()
    gets = {kind: p.count_requests("GET") for kind, p in proxies.items()}
    assert all(n > 0 for n in gets.values()), gets  # the session did talk to both stores
    if read_only:
        assert writes == {"s3": 0, "gcs": 0}, [
            r for p in proxies.values() for r in p.http_requests if r.method in WRITE_METHODS
        ]
        assert redis_writes == {}, redis_writes
    else:
        assert writes["s3"] > 0 and writes["gcs"] > 0
        assert redis_writes  # back-fills and write-behind reached redis


# --- least privilege: hostile keys -----------------------------------------------------

HOSTILE = [
    "../../etc/passwd",
    "/etc/passwd",
    "a/../../b",
    "..",
    ".",
    "x\x00y",
    "a\\..\\b",
    "%2e%2e/x",
    "%2F..%2F..",
    "é/\u2028/\n",
    "~root/.ssh/authorized_keys",
    "k" * 200,
]


def test_hostile_keys_stay_inside_the_stores(tmp_path: Path) -> None:
    store, local = tmp_path / "store", tmp_path / "local"
    client = Client(
        Config.from_env(
            {},
            tiers=f"file://{store}",
            local_dir=local,
            prefetch=False,
            timeout_ms=5000,
            stats_file=tmp_path / "stats.json",
        )
    )
    values = {k: f"value of {k!r}".encode() for k in HOSTILE}
    for k, v in values.items():
        client.put(KIND, k, v)
    assert client.flush(10) == 0
    for k, v in values.items():
        assert client.get(KIND, k) == v  # round-trips, distinct keys stay distinct
    reader = Client(
        Config.from_env(
            {},
            tiers=f"file://{store}",
            local_dir=tmp_path / "r",
            prefetch=False,
            stats_file=tmp_path / "stats.json",
        )
    )
    for k, v in values.items():
        assert reader.get(KIND, k) == v  # from the file:// store
    close(client, reader)
    outside = {p for p in tmp_path.rglob("*")} - {
        p for root in (store, local, tmp_path / "r") for p in [root, *root.rglob("*")]
    }
    assert outside == {tmp_path / "stats.json"}, outside
    for root in (store, local):
        env_dir = next((root / "v1").iterdir())
        for path in env_dir.rglob("*"):
            rel = path.relative_to(env_dir).parts
            # every entry is <kind>/<shard>/<one segment>: nothing climbed or nested
            assert len(rel) <= 3, rel
            assert not path.is_symlink()


def test_oversized_keys_are_misses_that_do_not_take_the_tier_down(tmp_path: Path) -> None:
    client = Client(
        Config.from_env(
            {},
            tiers=f"file://{tmp_path / 'store'}",
            local_dir=tmp_path / "local",
            prefetch=False,
            timeout_ms=5000,
            breaker_failures=3,
            stats_file=tmp_path / "stats.json",
        )
    )
    for i in range(6):  # more than the breaker threshold
        key = f"{i}" + "k" * 5000
        client.put(KIND, key, b"x")
        assert client.get(KIND, key) is None
    assert client.flush(10) == 0
    client.put(KIND, "normal", b"n")
    assert client.flush(10) == 0
    tiers = client.stats()["tiers"]
    assert [t["breaker"] for t in tiers] == ["closed", "closed"], tiers
    assert tiers[1]["puts"] >= 1  # the normal key still reached the remote tier
    assert client.get(KIND, "normal") == b"n"
    close(client)


# --- secrets ---------------------------------------------------------------------------

REDIS_PASSWORD = "redisPW-planted-7f3a9c"
AWS_KEY_ID = "AKIAPLANTEDSECRET1234"
AWS_SECRET = "awsSecret/planted+9c2e7d1b4a"
SIGNING_SECRET = "signingKey-planted-51d0e8"
SECRETS = (REDIS_PASSWORD, AWS_KEY_ID, AWS_SECRET, SIGNING_SECRET)


def assert_no_secret(text: str, where: str) -> None:
    leaked = [s for s in SECRETS if s in text]
    assert not leaked, f"{where} leaks {leaked}:\n{text[-3000:]}"


@pytest.fixture
def secret_env(
    tmp_path: Path,
    redis_server: RedisServer,
    seaweed_s3: SeaweedS3,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, str]:
    """Tiers whose calls all fail, each with a planted secret: a redis URL with a password
    the server does not accept, S3 with planted keys from the environment (the server
    rejects them), plus a signing key."""
    s3 = s3_url(seaweed_s3, "secrets", profile="")
    env = {
        "OBJCACHE_TIERS": f"redis://:{REDIS_PASSWORD}@127.0.0.1:{redis_server.port}/0,{s3}",
        "OBJCACHE_LOCAL_DIR": str(tmp_path / "local"),
        "OBJCACHE_STATS_FILE": str(tmp_path / "stats.json"),
        "OBJCACHE_SIGNING_KEY": SIGNING_SECRET,
        "OBJCACHE_PREFETCH": "0",
        "OBJCACHE_TIMEOUT_MS": "3000",
        "OBJCACHE_JOB": "secrets",
        "AWS_ACCESS_KEY_ID": AWS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
        "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def test_secrets_never_reach_logs_errors_or_stats(
    secret_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="objcache")
    client = Client(Config.from_env())
    assert client.config.signing_keys == (SIGNING_SECRET.encode(),)
    client.put(KIND, "k", b"v" * 1000)
    assert client.get(KIND, "absent") is None
    client.flush(10)
    stats = client.stats()
    remote = stats["tiers"][1:]
    assert all(sum(t["put_errors"].values()) + sum(t["misses"].values()) for t in remote), remote
    close(client)
    text = caplog.text + "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert "failed" in text  # the failures were logged, with their errors
    assert_no_secret(text, "the objcache log (DEBUG, with tracebacks)")
    assert_no_secret(json.dumps(stats), "Client.stats()")
    assert_no_secret(repr(client.config), "repr(Config)")
    assert_no_secret(Path(secret_env["OBJCACHE_STATS_FILE"]).read_text(), "the stats file")


@pytest.mark.parametrize("args", [["doctor"], ["stats", "--json"], ["stats"]])
def test_secrets_never_reach_cli_output(secret_env: dict[str, str], args: list[str]) -> None:
    # leave a stats file from a failing session, for `stats` to print
    Client(Config.from_env()).close()
    done = subprocess.run(
        [sys.executable, "-m", "objcache.cli", *args],
        env={
            **os.environ,
            **secret_env,
            "PYTHONPATH": str(ROOT),
            "OBJCACHE_LOG_LEVEL": "DEBUG",
            "COLUMNS": "250",  # a wide table: nothing truncated away before the grep
        },
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    out = done.stdout + done.stderr
    assert out.strip(), "no output"
    if args == ["doctor"]:
        assert done.returncode != 0  # both tiers fail their checks
        assert "redis://:***@127.0.0.1" in out  # named, with the password redacted
        # OBJCACHE_LOG_LEVEL=DEBUG really logs: the failures' tracebacks are in what we grep
        assert " objcache DEBUG probe of " in done.stderr and "Traceback" in done.stderr, out
    assert_no_secret(out, f"`objcache {' '.join(args)}`")
