"""Process-level faults: a writer killed with SIGKILL mid-put, eight processes contending
for the same keys, and write-behind at normal and abnormal exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from objcache.backends import create_backend
from objcache.backends.base import Backend
from objcache.backends.fs_store import TMP_PREFIX
from objcache.client import Client
from objcache.config.fingerprint import fingerprint
from objcache.config.settings import Config
from objcache.config.urls import parse_tier_url
from objcache.entry.codec import Codec
from tests.faults._worker import KIND, check_value, make_value
from tests.faults.conftest import Store, raw
from tests.support.paths import ROOT
from tests.support.waiting import wait_until


def spawn(params: dict[str, Any], **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    params = {**params, "env_fields": fingerprint()}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.faults._worker", json.dumps(params, default=str)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def writing_a_file(*roots: Path) -> bool:
    """Whether a put is writing under ``roots`` now (its temporary file exists)."""
    walked = (names for root in roots for _, _, names in os.walk(root))
    return any(name.startswith(TMP_PREFIX) for names in walked for name in names)


def listed_entries(backend: Backend) -> dict[str, bytes]:
    async def collect() -> dict[str, bytes]:
        out = {}
        async for info in backend.list(""):
            data = await backend.get(info.key)
            assert data is not None
            out[info.key] = data
        return out

    return raw(collect, 60)


def assert_all_complete(entries: dict[str, bytes]) -> None:
    codec = Codec()
    for key, data in entries.items():
        if key.endswith("ENV.json"):
            continue
        payload = codec.decode(data, key)  # raises on anything partial or torn
        if "/blob/" in key:
            assert check_value(key.rsplit("/", 1)[-1], payload), key


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_kill_9_writer_mid_put(
    kind: str, tmp_path: Path, make_store: Callable[[str], Store]
) -> None:
    size = 12 << 20
    if kind == "file":
        url = f"file://{tmp_path / 'store'}"
        proxy = None
    else:
        store = make_store("s3")
        store.proxy.bandwidth_bps = 8 << 20  # a 12 MiB upload takes ~1.5 s: kill lands in it
        url = store.url()
        proxy = store.proxy
    config = {
        "tiers": url,
        "local_dir": str(tmp_path / "writer-local"),
        "prefetch": False,
        "timeout_ms": 20_000,
        "stats_file": str(tmp_path / "stats.json"),
    }
    proc = spawn({"mode": "big_writer", "config": config, "size": size})
    assert proc.stdout is not None
    keys = [proc.stdout.readline().strip()]  # big-0 is being put
    if kind == "s3":
        assert proxy is not None
        wait_until(lambda: proxy.bytes_to_server >= size // 3, what="a third of big-0 uploaded")
    else:
        keys.append(proc.stdout.readline().strip())  # big-1 started: kill during a put
        roots = (tmp_path / "store", tmp_path / "writer-local")
        wait_until(lambda: writing_a_file(*roots), what="the writer mid-put")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    if proxy is not None:
        assert proxy.bytes_to_server > 0  # the upload had started

    direct = url if kind == "file" else store.url(proxied=False)
    backend = create_backend(parse_tier_url(direct))
    try:
        assert_all_complete(listed_entries(backend))
    finally:
        raw(backend.close)
    local = create_backend(parse_tier_url(f"disk://{tmp_path / 'writer-local'}"))
    assert_all_complete(listed_entries(local))

    reader = Client(Config.from_env({}, **{**config, "local_dir": tmp_path / "reader"}))
    for key in keys:
        got = reader.get(KIND, key)
        assert got is None or got == make_value(0, key, size)
    if kind == "file":  # big-0 was flushed before big-1 began: it must be there, whole
        assert reader.get(KIND, "big-0") == make_value(0, "big-0", size)
    assert reader.flush(10) == 0
    reader.close()
    reader.bridge.stop()


def test_eight_processes_same_keys(tmp_path: Path, redis_fault_server: Any) -> None:
    """8 writers/readers, same keys, shared local dir, file:// + redis tiers: every value
    read is complete and verified, none is mixed, and the stores hold only whole entries."""
    keys = [f"shared-{i}" for i in range(6)]
    prefix = f"p8-{os.getpid()}-{time.time_ns()}"
    config: dict[str, Any] = {
        "tiers": f"file://{tmp_path / 'store'},"
        f"redis://127.0.0.1:{redis_fault_server.port}/0?prefix={prefix}/",
        "local_dir": str(tmp_path / "shared-local"),
        "prefetch": False,
        "timeout_ms": 5000,
        "stats_file": str(tmp_path / "stats.json"),
    }
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        spawn(
            {
                "mode": "contender",
                "config": config,
                "id": i,
                "keys": keys,
                "rounds": 2,
                "size": 64 << 10,
                "barrier": str(barrier),
            }
        )
        for i in range(8)
    ]
    # start together: once every contender is ready (imports done, client built)
    wait_until(lambda: len(list(barrier.glob("ready-*"))) == 8, what="8 contenders ready")
    (barrier / "go").touch()
    totals = {"hit": 0, "miss": 0, "bad": 0}
    for p in procs:
        out, err = p.communicate(timeout=90)
        assert p.returncode == 0, err[-2000:]
        for k, v in json.loads(out.strip().splitlines()[-1]).items():
            totals[k] += v
    print(f"8 processes: {totals}")
    assert totals["bad"] == 0
    assert totals["hit"] == 8 * 2 * len(keys)  # each put is followed by a hit of some value
    for url in config["tiers"].split(","):
        backend = create_backend(parse_tier_url(url))
        try:
            entries = listed_entries(backend)
            assert sum(1 for k in entries if "shared-" in k) == len(keys)
            assert_all_complete(entries)
        finally:
            raw(backend.close)
    local = create_backend(parse_tier_url(f"disk://{tmp_path / 'shared-local'}"))
    assert_all_complete(listed_entries(local))


def test_write_behind_flushes_everything_on_normal_exit(
    tmp_path: Path, make_store: Callable[[str], Store]
) -> None:
    store = make_store("s3")
    store.proxy.set_rtt_ms(60)  # remote writes are still pending when the script ends
    n, size = 20, 20 << 10
    config = {
        "tiers": store.url(),
        "local_dir": str(tmp_path / "local"),
        "prefetch": False,
        "timeout_ms": 5000,
        "flush_timeout_s": 30,
        "stats_file": str(tmp_path / "stats.json"),
    }
    proc = spawn({"mode": "exit_writer", "config": config, "n": n, "size": size})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert int(out.split()[1]) > 0  # writes were still queued at the end of the script
    assert "not flushed" not in err
    # the probe's own stats file: its close would replace the writer's stats
    probe_config = {**config, "local_dir": tmp_path / "probe", "stats_file": tmp_path / "p.json"}
    probe = Client(Config.from_env({}, **probe_config))
    ns = probe.cache.namespace
    for i in range(n):
        entry = store.raw_get(ns.object_key(KIND, f"wb-{i}"))
        assert entry is not None, f"wb-{i} lost"
        assert Codec().decode(entry, ns.object_key(KIND, f"wb-{i}")) == make_value(
            0, f"wb-{i}", size
        )
    probe.close()
    probe.bridge.stop()
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["cache"]["write_behind_dropped"] == 0
    # and ENV.json, the run's manifest and the run's summary
    assert stats["tiers"][1]["puts"] == n + 3


def test_write_behind_reports_drops_when_the_tier_hangs_at_exit(
    tmp_path: Path, make_store: Callable[[str], Store]
) -> None:
    store = make_store("s3")
    store.proxy.blackhole()
    n = 12
    config = {
        "tiers": store.url(),
        "local_dir": str(tmp_path / "local"),
        "prefetch": False,
        "timeout_ms": 30_000,  # the writes hang longer than the flush allows
        "flush_timeout_s": 1.0,
        "stats_file": str(tmp_path / "stats.json"),
    }
    proc = spawn({"mode": "exit_writer", "config": config, "n": n, "size": 4096})
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("queued")  # the script is done: exit begins
    started = time.monotonic()
    _, err = proc.communicate(timeout=60)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, err
    # bounded by the 1 s flush timeout (and a busy machine), not by the 30 s deadline
    assert elapsed < 10, elapsed
    queued = n + 2  # entries + ENV.json + the run's manifest
    assert f"{queued} remote writes were not flushed at exit" in err
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["cache"]["write_behind_dropped"] == queued
    print(f"hung tier at exit: process ended after {elapsed:.1f}s, reported {queued} dropped")
