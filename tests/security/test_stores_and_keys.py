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

import hashlib
import hmac
import json
import logging
import os
import pickle
import shutil
import struct
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from objcache.backends import create_backend
from objcache.backends.base import Backend, PutMode
from objcache.client import Client
from objcache.config.settings import Config
from objcache.config.urls import parse_tier_url
from objcache.entry.codec import Codec
from objcache.entry.signing import Ed25519PrivateKey, public_line
from objcache.errors import ConfigError, InvalidKey
from tests.faults.conftest import port_of, raw
from tests.faults.evil import foreign_signed_entry, malicious_pickle, unsigned_entry
from tests.support.cloud import gcs_url, s3_url
from tests.support.paths import ROOT
from tests.support.proxy import FaultProxy
from tests.support.servers import FakeGCS, RedisServer, SeaweedS3

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
# The local disk tier is not in this list: signatures are checked where an entry enters the
# machine, and a local hit checks the digest and its binding to the key (docs/security.md,
# "What each read checks"); the local directory is private to the user, like torch's own.
@pytest.mark.parametrize("kind", ["file", "redis", "s3", "gcs"])
def test_planted_malicious_pickle_is_refused(
    kind: str,
    forgery: str,
    tmp_path: Path,
    remote_url: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    marker = tmp_path / "PWNED"
    evil = malicious_pickle(marker)
    remote = remote_url(kind)
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
    entry = (
        unsigned_entry(evil, okey) if forgery == "unsigned" else foreign_signed_entry(evil, okey)
    )
    target = make_backend(remote)
    other = make_backend(f"disk://{tmp_path / 'local'}")
    try:
        raw(lambda: target.put(okey, entry, PutMode.OVERWRITE))
        # a genuine entry signed with the victim's key under another key: the control
        good_okey = client.cache.namespace.object_key(KIND, "good")
        raw(lambda: target.put(good_okey, genuine_entry(b"genuine", good_okey)))

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
        refused_in = tiers[1]
        assert refused_in["misses"].get(forgery, 0) >= 1
        assert sum(t["misses"].get(forgery, 0) for t in tiers) == 3, tiers
        refusals = [r for r in caplog.records if "refused entry" in r.getMessage()]
        assert len(refusals) == 1, [r.getMessage() for r in refusals]
        assert refusals[0].levelno == logging.WARNING
        # nothing written through or back-filled anywhere
        assert raw(lambda: other.get(okey)) is None
        # only the genuine entry was copied (from a remote store into the local tier)
        assert client.cache.stats.write_through == 1
        assert client.cache.stats.backfills == 0
        assert raw(lambda: target.get(okey)) == entry  # left alone
    finally:
        close(client)
        raw(target.close)
        raw(other.close)
    assert not marker.exists()


def genuine_entry(payload: bytes, okey: str) -> bytes:
    return Codec(signing_keys=(KEY,)).encode(payload, okey)


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


def test_long_keys_are_stored_on_every_local_store_and_served_by_name(tmp_path: Path) -> None:
    """A key of any length (ASCII or CJK, past the 255-byte component and 1,024-byte name
    limits) is stored under a bounded name on disk and file://, a machine with a cold local
    tier gets it back, and the breaker stays closed."""

    def client(local: str) -> Client:
        return Client(
            Config.from_env(
                {},
                tiers=f"file://{tmp_path / 'store'}",
                local_dir=tmp_path / local,
                prefetch=False,
                timeout_ms=5000,
                breaker_failures=3,
                stats_file=tmp_path / f"{local}.json",
            )
        )

    keys = ["\u9375" * 30, *(f"{i}" + "k" * 5000 for i in range(4)), "\u9375" * 1400]
    writer = client("writer")
    for key in keys:
        writer.put(KIND, key, key.encode())
    assert writer.flush(10) == 0
    tiers = writer.stats()["tiers"]
    assert [t["breaker"] for t in tiers] == ["closed", "closed"], tiers
    assert [t["put_errors"] for t in tiers] == [{}, {}], tiers
    assert all(writer.get(KIND, key) == key.encode() for key in keys)
    close(writer)
    reader = client("reader")  # another machine: every key comes from the remote tier
    assert [reader.get(KIND, key) for key in keys] == [key.encode() for key in keys]
    assert reader.stats()["tiers"][1]["hits"] == len(keys)
    close(reader)


def test_an_entry_under_another_long_keys_name_is_refused(tmp_path: Path) -> None:
    """Long keys sharing their readable head get names of their own, and each entry stays
    bound to its name: one copied over another's is a ``corrupt`` miss, never served."""
    config = Config.from_env(
        {},
        tiers=f"file://{tmp_path / 'store'}",
        local_dir=tmp_path / "local",
        prefetch=False,
        stats_file=tmp_path / "stats.json",
    )
    first, second = "k" * 4000 + "1", "k" * 4000 + "2"
    writer = Client(config)
    writer.put(KIND, first, b"first")
    writer.put(KIND, second, b"second")
    assert writer.flush(10) == 0
    name = {k: writer.cache.namespace.object_key(KIND, k) for k in (first, second)}
    close(writer)
    assert name[first] != name[second]
    heads = {n.rsplit("/", 1)[1].split("~")[0] for n in name.values()}
    assert heads == {"k" * 120}  # the same readable head, told apart by the digest
    store = tmp_path / "store"
    (store / name[second]).write_bytes((store / name[first]).read_bytes())
    shutil.rmtree(tmp_path / "local")
    reader = Client(config)
    assert reader.get(KIND, second) is None
    assert reader.get(KIND, first) == b"first"
    assert reader.stats()["tiers"][1]["misses"].get("corrupt") == 1
    close(reader)


# --- secrets ---------------------------------------------------------------------------

REDIS_PASSWORD = "redisPW-planted-7f3a9c"
AWS_KEY_ID = "AKIAPLANTEDSECRET1234"
AWS_SECRET = "awsSecret/planted+9c2e7d1b4a"
SIGNING_SECRET = "signingKey-planted-51d0e8-0123456789abcdef"
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


# --- red team: write access to every remote store, no key ------------------------------
#
# The fleet holds only the CI's Ed25519 public key (docs/security.md, "Signing entries").
# The attacker can write any object in the remote stores and plants, under the key the
# fleet looks up, each object below; the payloads are pickles that would create a marker
# file if anything unpickled them. Each lookup that returns a value is unpickled, as torch
# would. Result: no marker, every refusal counted under its reason and logged once, and
# nothing written to any store.

RED_CAP = "1M"


def _v1_hmac_entry(payload: bytes, key: bytes) -> bytes:
    """An entry in the old (v1) format, validly HMAC-signed: what an old writer left."""
    head = struct.Struct(">4sBBBBQ32s")
    digest = hashlib.blake2b(payload, digest_size=32).digest()
    header = head.pack(b"OBJC", 1, 0, 1, 0, len(payload), digest)
    mac = hmac.new(key, header + payload, hashlib.sha256).digest()
    return header + mac + payload


def _attacks(
    evil: bytes, okey: str, ci: Ed25519PrivateKey
) -> dict[str, tuple[Callable[[Callable[[str], str]], bytes], str]]:
    """attack -> (entry builder given ``object_key(name)``, the refusal reason)."""
    attacker = Ed25519PrivateKey.generate()
    retired = Ed25519PrivateKey.generate()  # a CI key rotated out of OBJCACHE_VERIFY_KEYS
    return {
        "planted unsigned pickle": (lambda _: Codec().encode(evil, okey), "unsigned"),
        "pickle signed with the attacker's key": (
            lambda _: Codec(signer=attacker).encode(evil, okey),
            "bad_signature",
        ),
        "pickle signed with a retired key": (
            lambda _: Codec(signer=retired).encode(evil, okey),
            "bad_signature",
        ),
        "genuine entry substituted under another key": (
            lambda key_of: Codec(signer=ci).encode(evil, key_of("other-graph")),
            "corrupt",
        ),
        "old (v1) signed entry replayed": (
            lambda _: _v1_hmac_entry(evil, KEY),
            "version",
        ),
        "oversized object": (
            lambda _: Codec(signer=ci, level=1).encode(evil + os.urandom(2 << 20), okey),
            "too_large",
        ),
        "zstd bomb": (
            lambda _: Codec(signer=ci).encode(evil + b"\0" * (64 << 20), okey),
            "too_large",
        ),
    }


ATTACKS = list(_attacks(b"", "", Ed25519PrivateKey.generate()))


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("kind", ["file", "redis"])
def test_red_team_no_code_runs_and_every_refusal_is_counted_once(
    kind: str,
    attack: str,
    tmp_path: Path,
    remote_url: Callable[..., str],
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    marker = tmp_path / "PWNED"
    evil = malicious_pickle(marker)
    ci = Ed25519PrivateKey.generate()
    url = remote_url(kind)
    config = Config.from_env(
        {},
        tiers=url,
        local_dir=tmp_path / "local",
        verify_keys=(public_line(ci.public_key()),),
        max_entry_bytes=RED_CAP,
        prefetch=False,
        stats_file=tmp_path / "stats.json",
    )
    assert config.read_only  # public keys only: the fleet writes nothing remote
    client = Client(config)
    ns = client.cache.namespace
    okey = ns.object_key(KIND, "victim")
    build, reason = _attacks(evil, okey, ci)[attack]
    store = make_backend(url)
    r = redis.Redis(port=redis_server.port)
    try:
        raw(lambda: store.put(okey, build(lambda name: ns.object_key(KIND, name))))
        genuine = ns.object_key(KIND, "genuine")
        raw(lambda: store.put(genuine, Codec(signer=ci).encode(b"ok", genuine)))
        writes_before = commandstats(r)
        caplog.set_level(logging.WARNING, logger="objcache")
        got = [client.get(KIND, "victim") for _ in range(3)]
        for value in got:
            if value is not None:
                pickle.loads(value)  # what torch does with a hit
        assert got == [None, None, None]
        assert client.get(KIND, "genuine") == b"ok"  # the control: CI's entries are served
        client.flush(10)
        remote = client.stats()["tiers"][1]
        assert remote["misses"].get(reason) == 3, remote["misses"]
        refusals = [m.getMessage() for m in caplog.records if "refused" in m.getMessage()]
        assert len(refusals) == 1, refusals
        assert redis_write_calls(r, writes_before) == {}
        assert (tmp_path / "local" / genuine).exists()  # verified hits are written through
        assert not (tmp_path / "local" / okey).exists()  # refused ones never are
    finally:
        close(client)
        raw(store.close)
        r.close()
    assert not marker.exists(), "attacker code ran"


@pytest.mark.parametrize(
    "env",
    [
        {"OBJCACHE_SIGNING_KEY": ""},
        {"OBJCACHE_SIGNING_KEY": " , "},
        {"OBJCACHE_SIGNING_KEY": "short-secret-9f3"},
        {"OBJCACHE_SIGNING_KEY_FILE": ""},
        {"OBJCACHE_VERIFY_KEYS": " , "},
        {"OBJCACHE_VERIFY_KEYS": "ed25519:c2hvcnQ="},
    ],
)
def test_red_team_empty_or_short_keys_are_errors_not_silent_off(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as exc:
        Config.from_env(env)
    message = str(exc.value)
    assert "\n" not in message and next(iter(env)) in message
    assert "short-secret-9f3" not in message and "c2hvcnQ" not in message


def test_red_team_a_failed_class_swap_leaves_torchs_remote_caches_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A torch release changed one of the cache classes so that the swap fails half-way (a
    class that is simply gone is feature detection's case: that part alone stays off,
    tests/integrations/install/test_features.py). torch's remote-cache flags must stay off and
    the classes swapped so far must be put back, so torch never falls back to its own
    unauthenticated ``RedisRemoteCache``."""
    pytest.importorskip("torch")
    import torch._dynamo.config as dconf
    import torch._dynamo.pgo as pgo
    import torch._functorch.config as fconf
    import torch._inductor.config as iconf
    from torch._functorch._aot_autograd import autograd_cache
    from torch._inductor import remote_cache
    from torch._inductor import utils as iutils

    import objcache
    from objcache.integrations.install import hooks
    from objcache.integrations.torch.remote import remote_cache_classes

    for _, _, env in hooks.FLAGS:
        monkeypatch.delenv(env, raising=False)
    monkeypatch.delenv("OBJCACHE_ENABLE", raising=False)
    monkeypatch.delenv("OBJCACHE_TIERS", raising=False)
    real_make = remote_cache_classes.make_cache_class

    def make(original: Any, kind: str, *args: Any) -> Any:
        if kind == "pgo":  # the last class to be swapped
            raise TypeError("RemoteDynamoPGOCache changed shape")
        return real_make(original, kind, *args)

    monkeypatch.setattr(remote_cache_classes, "make_cache_class", make)
    redis_used: list[str] = []

    def spy(self: object, cache_id: str) -> None:
        redis_used.append(cache_id)
        raise RuntimeError("torch's own Redis cache must not be used")

    monkeypatch.setattr(remote_cache.RedisRemoteCacheBackend, "__init__", spy)
    flags = [(iconf, "fx_graph_remote_cache"), (iconf, "autotune_remote_cache"),
             (iconf, "bundled_autotune_remote_cache"), (fconf, "enable_remote_autograd_cache"),
             (dconf, "automatic_dynamic_remote_pgo")]  # fmt: skip
    before = [mod._config[attr].user_override.get() for mod, attr in flags]
    fx_class = remote_cache.RemoteFxGraphCache
    caplog.set_level(logging.INFO, logger="objcache")
    try:
        objcache.install()
        assert [mod._config[attr].user_override.get() for mod, attr in flags] == before
        assert remote_cache.RemoteFxGraphCache is fx_class  # the half-done swap was undone
        assert not hooks.installed()
        assert not iutils.should_use_remote_fx_graph_cache()
        assert not autograd_cache.should_use_remote_autograd_cache()
        assert not pgo.should_use_remote_dynamo_pgo_cache()
        for _ in range(2):  # the zero-code path retries on later imports: still one line
            hooks.apply_part("torch._inductor.remote_cache", remote_cache)
        lines = [r.getMessage() for r in caplog.records if "remote_cache" in r.getMessage()]
        assert len(lines) == 1 and "\n" not in lines[0], lines
        assert "flags stay off" in lines[0]
    finally:
        objcache.uninstall()
    assert redis_used == []


def test_red_team_files_planted_in_a_shared_triton_cache_dir_are_never_served_or_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A shared ``TRITON_CACHE_DIR`` holds a planted kernel (a group file and its children,
    a ``.so`` among them). objcache misses, so the backend looks into the directory: the
    planted files are neither handed to Triton nor published to the stores."""
    pytest.importorskip("triton")
    from objcache.integrations import triton as ot

    tc = tmp_path / "shared-triton"
    monkeypatch.setenv(ot.ENV_CACHE_DIR, str(tc))
    ot._verdicts.clear()
    ot.reset_stats()
    key = "PLANTEDKERNELKEY0000000000000000000000000000000000000"
    planted = {"k.so": b"\x7fELF planted", "k.json": b"{}", "k.cubin": b"\x7fELF planted"}
    group = "__grp__k.json"
    (tc / key).mkdir(parents=True)
    listing = json.dumps({"child_paths": sorted(planted)}).encode()
    for name, data in {**planted, group: listing}.items():
        (tc / key / name).write_bytes(data)
    store = tmp_path / "store"
    client = Client(Config(tiers=f"file://{store}", local_dir=tmp_path / "local", prefetch=False))  # type: ignore[arg-type]
    caplog.set_level(logging.WARNING, logger="objcache")
    try:
        backend = ot.backend_class()(key, client=client)
        for _ in range(2):
            assert backend.get([group]) == {}
            assert backend.get(sorted(planted)) == {}
        assert client.flush(10) == 0
        assert "republished" not in ot.stats() and "cache_dir_hits" not in ot.stats()
        assert ot.stats()["cache_dir_refused"] >= 1
        lines = [r.getMessage() for r in caplog.records if "TRITON_CACHE_DIR" in r.getMessage()]
        assert len(lines) == 1, lines
    finally:
        client.close()
        client.bridge.stop()
    assert not [p for p in store.rglob("*") if p.is_file() and "triton" in p.parts]
    assert not [p for p in (tmp_path / "local").rglob("*") if p.is_file() and "triton" in p.parts]


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "walk"])
@pytest.mark.parametrize("swapped", ["v1/env/fx-graph/ab", "v1/env"])
@pytest.mark.parametrize("mode", [PutMode.CREATE, PutMode.OVERWRITE])
def test_red_team_a_folder_of_a_shared_file_store_swapped_for_a_symlink(
    tmp_path: Path, swapped: str, mode: PutMode, openat2: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer of a shared ``file://`` store replaces a folder this process already
    wrote into with a symlink to a place of their choosing: later writes, reads, deletes and
    listings must stay inside the store (every level is walked with ``O_NOFOLLOW``; reads
    use one ``openat2`` where the kernel has it, and the walk where it does not)."""
    from objcache.backends import fs_store as _fs

    if not openat2:
        monkeypatch.setattr(_fs._openat2, "usable", False)
    root, outside = tmp_path / "store", tmp_path / "outside"
    outside.mkdir()
    (outside / "ab").mkdir()
    (outside / "fx-graph").mkdir()
    backend = make_backend(f"file://{root}")
    folder = "v1/env/fx-graph/ab"
    try:
        assert raw(lambda: backend.put(f"{folder}/first", b"v", mode)) is True
        assert raw(lambda: backend.get(f"{folder}/first")) == b"v"
        os.rename(root / swapped, tmp_path / "moved-away")
        os.symlink(outside, root / swapped)
        for call in (
            lambda: backend.put(f"{folder}/second", b"planted by us", mode),
            lambda: backend.get(f"{folder}/first"),
            lambda: backend.delete(f"{folder}/first"),
        ):
            with pytest.raises(InvalidKey):
                raw(call)  # type: ignore[arg-type]
        assert raw(lambda: _keys(backend)) == []
    finally:
        raw(backend.close)
    assert sorted(str(p.relative_to(outside)) for p in outside.rglob("*")) == ["ab", "fx-graph"]


async def _keys(backend: Backend) -> list[str]:
    return [info.key async for info in backend.list()]


def test_the_stats_temp_file_never_follows_a_symlink(tmp_path: Path) -> None:
    """Whoever can write the stats file's folder plants symlinks where the temp file goes:
    the file they point at is never written."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    stats = tmp_path / "shared" / "stats.json"
    stats.parent.mkdir()
    os.symlink(victim, stats.parent / f".stats.json.{os.getpid()}")
    client = Client(
        Config.from_env(
            {}, tiers="", local_dir=tmp_path / "local", stats_file=stats, prefetch=False
        )
    )
    client.get(KIND, "missing")
    close(client)
    assert victim.read_text() == "precious"
    assert json.loads(stats.read_text())["cache"]["gets"]
    assert stats.stat().st_mode & 0o077 == 0


# --- hostile URLs: a secret in every place a URL can hide one -----------------------------

LEFT, RIGHT = "hunter2Left", "Right7hunter"  # each half of a planted secret must stay hidden


def _hostile_urls(port: int) -> list[str]:
    host = f"127.0.0.1:{port}"
    return [
        f"s3://AKIA{LEFT}:{RIGHT}@bucket/prefix",  # credentials pasted where the bucket goes
        f"gs://{LEFT}:{RIGHT}@bucket/prefix",
        f"redis://:{LEFT}/{RIGHT}@{host}/0",  # a password with an unencoded /
        f"redis://:{LEFT}?{RIGHT}@{host}/0",  # ... with an unencoded ?
        f"redis://:{LEFT}#{RIGHT}@{host}/0",  # ... with an unencoded #
        f"redis://user:{LEFT}@{RIGHT}@{host}/0",  # ... with an unencoded @
        f"rediss://:{LEFT}%2F{RIGHT}@{host}/0",  # percent-encoded, as it should be
        f"redis://{host}/0?password={LEFT}{RIGHT}",
        f"s3://bucket/prefix?endpoint_url=http://{LEFT}:{RIGHT}@127.0.0.1:1",
        f"redis://:{LEFT}{RIGHT}@[::1",  # unparseable
    ]


def assert_hidden(text: str, where: str) -> None:
    leaked = [s for s in (LEFT, RIGHT) if s.lower() in text.lower()]
    assert not leaked, f"{where} leaks {leaked}: {text[-2000:]}"


def test_hostile_urls_never_leak_into_errors_reprs_or_logs(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from objcache.config.urls import redact

    caplog.set_level(logging.DEBUG, logger="objcache")
    for url in _hostile_urls(redis_server.port):
        assert_hidden(redact(url), f"redact({url!r})")
        try:
            spec = parse_tier_url(url, "OBJCACHE_TIERS[0]")
        except ConfigError as exc:
            assert "\n" not in str(exc)
            assert_hidden(str(exc), f"the error for {url!r}")
            continue
        assert_hidden(repr(spec) + spec.display, f"the TierSpec of {url!r}")
        try:
            config = Config.from_env(
                {}, tiers=url, local_dir=tmp_path / "local", prefetch=False, timeout_ms=1000
            )
        except ConfigError as exc:
            assert_hidden(str(exc), f"Config of {url!r}")
            continue
        assert_hidden(repr(config), f"repr(Config) of {url!r}")
        try:
            client = Client(config)
        except Exception as exc:
            assert_hidden(f"{exc!r} {exc}", f"the client error of {url!r}")
            continue
        try:
            client.put(KIND, "k", b"v" * 100)
            client.get(KIND, "absent")
            client.flush(5)
            assert_hidden(json.dumps(client.stats()), f"stats() of {url!r}")
        finally:
            close(client)
    text = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert_hidden(text, "the objcache log (DEBUG, with tracebacks)")


@pytest.mark.parametrize("index", range(len(_hostile_urls(0))))
def test_hostile_urls_never_leak_into_doctor(index: int, redis_server: RedisServer) -> None:
    url = _hostile_urls(redis_server.port)[index]
    done = subprocess.run(
        [sys.executable, "-m", "objcache.cli", "doctor"],
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "OBJCACHE_TIERS": url,
            "OBJCACHE_LOG_LEVEL": "DEBUG",
            "OBJCACHE_TIMEOUT_MS": "1000",
            "COLUMNS": "250",
        },
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    out = done.stdout + done.stderr
    assert out.strip()
    assert_hidden(out, f"`objcache doctor` with {url!r}")
