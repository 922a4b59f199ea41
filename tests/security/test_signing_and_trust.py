"""Trust configuration and the entry's binding to its name (docs/security.md).

Keys that are set but empty or short are configuration errors, never a silent switch-off
of verification.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from objcache.backends import create_backend
from objcache.backends import fs_store as _fs
from objcache.backends.base import PutMode
from objcache.client import Client
from objcache.config.settings import Config
from objcache.config.urls import parse_tier_url
from objcache.entry import codec as codec_module
from objcache.entry.codec import Codec
from objcache.entry.signing import Ed25519PrivateKey
from objcache.errors import BadSignature, ConfigError, UnsignedEntry
from tests.faults.conftest import port_of, raw
from tests.security.test_stores_and_keys import commandstats, redis_write_calls
from tests.support.cloud import gcs_url, s3_url
from tests.support.paths import ROOT
from tests.support.proxy import FaultProxy
from tests.support.servers import FakeGCS, RedisServer, SeaweedS3

GOOD_KEY = "k" * 32
KIND = "fx-graph"


# --- empty and short keys --------------------------------------------------------------


@pytest.mark.parametrize("raw", ["", " ", " , ", ",,"])
def test_set_but_empty_signing_key_is_a_config_error(raw: str) -> None:
    with pytest.raises(ConfigError, match="OBJCACHE_SIGNING_KEY is set but holds no key"):
        Config.from_env({"OBJCACHE_SIGNING_KEY": raw})


def test_short_signing_key_is_a_config_error_without_echoing_it() -> None:
    with pytest.raises(ConfigError, match=r"OBJCACHE_SIGNING_KEY: .*at least 32 bytes") as exc:
        Config.from_env({"OBJCACHE_SIGNING_KEY": f"{GOOD_KEY},shortsecret"})
    assert "shortsecret" not in str(exc.value)
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        Config(signing_keys=(b"x",))
    with pytest.raises(ValueError, match="at least 32 bytes"):
        Codec(signing_keys=(b"x",))


def test_key_file_set_but_empty_or_short(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="OBJCACHE_SIGNING_KEY_FILE is set but empty"):
        Config.from_env({"OBJCACHE_SIGNING_KEY_FILE": " "})
    blank = tmp_path / "blank"
    blank.write_text("\n \n")
    with pytest.raises(ConfigError, match="holds no key"):
        Config.from_env({"OBJCACHE_SIGNING_KEY_FILE": str(blank)})
    short = tmp_path / "short"
    short.write_text(f"{GOOD_KEY}\nshortsecret\n")
    with pytest.raises(ConfigError, match=r"OBJCACHE_SIGNING_KEY_FILE: .*at least 32") as exc:
        Config.from_env({"OBJCACHE_SIGNING_KEY_FILE": str(short)})
    assert "shortsecret" not in str(exc.value)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJCACHE_")}
    env.update(
        PYTHONPATH=str(ROOT),
        OBJCACHE_TIERS=f"file://{tmp_path}/store",
        OBJCACHE_LOCAL_DIR=str(tmp_path / "local"),
        OBJCACHE_STATS_FILE=str(tmp_path / "stats.json"),
        OBJCACHE_PREFETCH="0",
    )
    env.update(extra)
    return env


def test_doctor_reports_an_empty_key_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "objcache.cli", "doctor"],
        env=_env(tmp_path, OBJCACHE_SIGNING_KEY=" , "),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "OBJCACHE_SIGNING_KEY is set but holds no key" in lines[0]


TORCH_PROBE = """
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
import objcache
objcache.install()
import torch._inductor.config as c
from objcache.integrations.install import hooks
print(hooks.installed(), c.fx_graph_remote_cache)
"""


def test_torch_integration_stays_off_on_a_config_error(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, "-c", TORCH_PROBE],
        env=_env(tmp_path, OBJCACHE_SIGNING_KEY=""),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[0] == "False", proc.stdout
    assert proc.stdout.split()[1] != "True", proc.stdout
    notes = [line for line in proc.stderr.splitlines() if "OBJCACHE_SIGNING_KEY" in line]
    assert len(notes) == 1, proc.stderr[-2000:]
    assert "stay off" in notes[0]


# --- size caps -------------------------------------------------------------------------


def test_size_caps_parse_per_kind() -> None:
    caps = Config.from_env({"OBJCACHE_MAX_ENTRY_BYTES": "8M,pgo=64k"}).max_entry_bytes
    assert caps.for_kind("fx-graph") == 8 << 20 and caps.for_kind("pgo") == 64 << 10
    assert Config().max_entry_bytes.for_kind("manifest") < Config().max_entry_bytes.for_kind(
        "fx-graph"
    )
    with pytest.raises(ConfigError, match="OBJCACHE_MAX_ENTRY_BYTES"):
        Config.from_env({"OBJCACHE_MAX_ENTRY_BYTES": "big"})


def _capped_client(tmp_path: Path, tiers: str, cap: str) -> Client:
    return Client(
        Config.from_env(
            {},
            tiers=tiers,
            local_dir=tmp_path / "local",
            prefetch=False,
            stats_file=tmp_path / "stats.json",
            max_entry_bytes=cap,
        )
    )


def _refusals(caplog: pytest.LogCaptureFixture, what: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if what in r.getMessage()]


def test_oversized_file_object_is_refused_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    client = _capped_client(tmp_path, f"file://{tmp_path}/store", "1M")
    okey = client.cache.namespace.object_key(KIND, "big")
    store = create_backend(parse_tier_url(f"file://{tmp_path}/store"))
    raw(lambda: store.put(okey, Codec(level=1).encode(os.urandom(2 << 20), okey)))
    reads: list[int] = []
    real = _fs._read_all
    monkeypatch.setattr(_fs, "_read_all", lambda fd, n: reads.append(n) or real(fd, n))
    caplog.set_level(logging.WARNING, logger="objcache")
    try:
        assert [client.get(KIND, "big") for _ in range(2)] == [None, None]
        assert reads == []
        tiers = client.stats()["tiers"]
        assert tiers[1]["misses"].get("too_large") == 2
        assert len(_refusals(caplog, "too large")) == 1
    finally:
        close(client)
        raw(store.close)


def test_oversized_redis_value_is_never_transferred(
    tmp_path: Path, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/0?prefix=cap-{uuid.uuid4().hex[:8]}/"
    client = _capped_client(tmp_path, url, "1M")
    okey = client.cache.namespace.object_key(KIND, "big")
    store = create_backend(parse_tier_url(url))
    raw(lambda: store.put(okey, Codec(level=1).encode(os.urandom(2 << 20), okey)))
    r = redis.Redis(port=redis_server.port)
    before = r.info("stats")["total_net_output_bytes"]
    caplog.set_level(logging.WARNING, logger="objcache")
    try:
        assert client.get(KIND, "big") is None
        sent = r.info("stats")["total_net_output_bytes"] - before
        assert sent < (1 << 20) + 64 * 1024, sent
        assert client.stats()["tiers"][1]["misses"].get("too_large") == 1
        assert len(_refusals(caplog, "too large")) == 1
    finally:
        close(client)
        raw(store.close)
        r.close()


def test_zstd_bomb_is_refused_before_decompression(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    client = _capped_client(tmp_path, f"file://{tmp_path}/store", "1M")
    okey = client.cache.namespace.object_key(KIND, "bomb")
    bomb = Codec().encode(b"\0" * (64 << 20), okey)
    assert len(bomb) < 64 << 10  # a few KB on the wire, 64 MiB once inflated
    store = create_backend(parse_tier_url(f"file://{tmp_path}/store"))
    raw(lambda: store.put(okey, bomb))
    monkeypatch.setattr(codec_module, "_decompressor", _no_decompression)
    caplog.set_level(logging.WARNING, logger="objcache")
    try:
        assert client.get(KIND, "bomb") is None
        assert client.stats()["tiers"][1]["misses"].get("too_large") == 1
        assert len(_refusals(caplog, "refused entry")) == 1
    finally:
        close(client)
        raw(store.close)


def _no_decompression() -> None:
    raise AssertionError("a bomb reached the zstd decoder")


def close(*clients: Client) -> None:
    for c in clients:
        c.close()
        c.bridge.stop()


# --- binding: an entry copied under another key ----------------------------------------


@pytest.mark.parametrize("store", ["file", "redis"])
def test_substituted_entry_is_refused_and_counted(
    store: str, tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """A validly signed entry copied over another key's object (a kernel for the wrong
    graph) is refused, counted and logged once; its own key still serves it."""
    if store == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        url = f"redis://127.0.0.1:{server.port}/0?prefix=sub-{uuid.uuid4().hex[:8]}/"
    else:
        url = f"file://{tmp_path}/store"
    config = Config.from_env(
        {},
        tiers=url,
        local_dir=tmp_path / "local",
        prefetch=False,
        stats_file=tmp_path / "stats.json",
        signing_keys=(GOOD_KEY.encode(),),
    )
    writer = Client(config)
    writer.put("kernel", "good", b"the right kernel")
    writer.put("kernel", "evil", b"the wrong kernel")
    assert writer.flush(10) == 0
    close(writer)
    backend = create_backend(parse_tier_url(url))
    ns_key = writer.cache.namespace.object_key
    entry = raw(lambda: backend.get(ns_key("kernel", "evil")))
    assert entry is not None
    raw(lambda: backend.put(ns_key("kernel", "good"), entry, PutMode.OVERWRITE))
    reader = Client(dataclasses.replace(config, local_dir=tmp_path / "reader-local"))
    caplog.set_level(logging.WARNING, logger="objcache")
    try:
        assert [reader.get("kernel", "good") for _ in range(2)] == [None, None]
        assert reader.get("kernel", "evil") == b"the wrong kernel"
        remote = reader.stats()["tiers"][1]
        assert remote["misses"].get("corrupt") == 2, remote
        refusals = _refusals(caplog, "stored under another key")
        assert len(refusals) == 1, refusals
    finally:
        close(reader)
        raw(backend.close)


# --- Ed25519: CI signs, the fleet only verifies ----------------------------------------


def _keygen(path: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "objcache.cli", "keygen", str(path)],
        env=_env(path.parent),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ed25519:"), proc.stdout
    return lines[0]


def test_keygen_writes_a_private_key_0600_and_prints_the_public_key(tmp_path: Path) -> None:
    public = _keygen(tmp_path / "ci.pem")
    assert (tmp_path / "ci.pem").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "ci.pem").read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert public not in (tmp_path / "ci.pem").read_text()
    again = subprocess.run(
        [sys.executable, "-m", "objcache.cli", "keygen", str(tmp_path / "ci.pem")],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2 and "exists" in again.stderr  # never overwrites a key


def test_verify_keys_parse_and_errors(tmp_path: Path) -> None:
    public = _keygen(tmp_path / "k.pem")
    assert Config.from_env({"OBJCACHE_VERIFY_KEYS": f" {public} , {public}"}).read_only
    for bad in ("", " , ", "ed25519:AAAA", "not-a-key"):
        with pytest.raises(ConfigError, match="OBJCACHE_VERIFY_KEYS"):
            Config.from_env({"OBJCACHE_VERIFY_KEYS": bad})
    (tmp_path / "bad.pem").write_text("-----BEGIN PRIVATE KEY-----\nnope\n")
    with pytest.raises(ConfigError, match="OBJCACHE_SIGNING_KEY_FILE"):
        Config.from_env({"OBJCACHE_SIGNING_KEY_FILE": str(tmp_path / "bad.pem")})


CI_WRITER = """
import sys, objcache
c = objcache.get_client()
for i in range(5):
    c.put("fx-graph", f"k{i}", f"compiled {i}".encode() * 50)
assert c.flush(20) == 0
"""

FLEET_READER = """
import json, sys, objcache
c = objcache.get_client()
got = [c.get("fx-graph", f"k{i}") for i in range(5)]
assert got == [f"compiled {i}".encode() * 50 for i in range(5)], got
assert c.get("fx-graph", "planted") is None
c.put("fx-graph", "fleet-compiled", b"local only" * 50)
assert c.get("fx-graph", "fleet-compiled") == b"local only" * 50
c.flush(20)
print(json.dumps(c.stats()["tiers"][1]["misses"]))
"""


def test_ci_signs_with_a_private_key_and_the_fleet_verifies_writing_nothing(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    public = _keygen(tmp_path / "ci.pem")
    url = f"redis://127.0.0.1:{redis_server.port}/0?prefix=ed-{uuid.uuid4().hex[:8]}/"
    ci = _env(tmp_path, OBJCACHE_TIERS=url, OBJCACHE_SIGNING_KEY_FILE=str(tmp_path / "ci.pem"))
    ci["OBJCACHE_LOCAL_DIR"] = str(tmp_path / "ci-local")
    proc = subprocess.run([sys.executable, "-c", CI_WRITER], env=ci, capture_output=True)
    assert proc.returncode == 0, proc.stderr[-2000:]

    fleet_cfg = Config.from_env({}, tiers=url, local_dir=tmp_path / "x", prefetch=False)
    okey = Client(fleet_cfg).cache.namespace.object_key("fx-graph", "planted")
    backend = create_backend(parse_tier_url(url))
    raw(lambda: backend.put(okey, Codec().encode(b"unsigned pickle", okey)))
    raw(backend.close)

    r = redis.Redis(port=redis_server.port)
    before = commandstats(r)
    fleet = _env(tmp_path, OBJCACHE_TIERS=url, OBJCACHE_VERIFY_KEYS=public)
    fleet["OBJCACHE_LOCAL_DIR"] = str(tmp_path / "fleet-local")
    proc = subprocess.run(
        [sys.executable, "-c", FLEET_READER], env=fleet, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]).get("unsigned") == 1
    assert redis_write_calls(r, before) == {}, "the fleet wrote to the remote store"
    assert sum(commandstats(r).values()) > sum(before.values())  # it did read
    r.close()


def test_ed25519_codec_refusals() -> None:
    ci, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    okey = "v1/e/kernel/00/k"
    entry = Codec(signer=ci).encode(b"kernel" * 100, okey)
    rotating = Codec(verify_keys=(other.public_key(), ci.public_key()))
    assert rotating.decode(entry, okey) == b"kernel" * 100
    assert not rotating.signs
    with pytest.raises(BadSignature):
        Codec(verify_keys=(other.public_key(),)).decode(entry, okey)
    hmac_entry = Codec(signing_keys=(GOOD_KEY.encode(),)).encode(b"x" * 100, okey)
    with pytest.raises(BadSignature):  # a scheme no configured key can check
        rotating.decode(hmac_entry, okey)
    with pytest.raises(UnsignedEntry):
        rotating.decode(Codec().encode(b"x", okey), okey)
    forged = bytearray(entry)
    forged[-1] ^= 1
    forged[16:48] = codec_module._digest(okey, bytes(forged[48 + 64 :]))
    with pytest.raises(BadSignature):
        rotating.decode(bytes(forged), okey)


@pytest.mark.parametrize("store", ["s3", "gcs"])
def test_oversized_cloud_object_is_refused_after_one_ranged_read(
    store: str, tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """S3 and GCS GETs ask for the first cap+1 bytes only (no HEAD round trip): a planted
    4 MiB object under a 1 MiB cap moves about 1 MiB through the proxy, never 4."""
    prefix = f"cap-{uuid.uuid4().hex[:8]}"
    if store == "s3":
        s3: SeaweedS3 = request.getfixturevalue("seaweed_s3")
        proxy = FaultProxy("127.0.0.1", port_of(s3.endpoint_url))
        url = s3_url(s3, prefix, endpoint_url=proxy.url())
    else:
        gcs: FakeGCS = request.getfixturevalue("fake_gcs")
        proxy = FaultProxy("127.0.0.1", port_of(gcs.endpoint))
        url = gcs_url(gcs, prefix, endpoint=proxy.url())
    client = _capped_client(tmp_path, url, "1M")
    okey = client.cache.namespace.object_key(KIND, "big")
    small = client.cache.namespace.object_key(KIND, "small")
    backend = create_backend(parse_tier_url(url))
    caplog.set_level(logging.WARNING, logger="objcache")
    try:
        raw(lambda: backend.put(okey, Codec(level=1).encode(os.urandom(4 << 20), okey)))
        raw(lambda: backend.put(small, Codec().encode(b"fits", small)))
        before = proxy.bytes_to_client
        assert client.get(KIND, "big") is None
        moved = proxy.bytes_to_client - before
        assert moved < (1 << 20) + (256 << 10), moved
        assert client.get(KIND, "small") == b"fits"  # a ranged read of a small object
        assert client.stats()["tiers"][1]["misses"].get("too_large") == 1
        assert len(_refusals(caplog, "too large")) == 1
    finally:
        close(client)
        raw(backend.close)
        proxy.close()
