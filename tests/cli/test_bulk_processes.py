"""``objcache pull --job``, ``pull`` and ``push`` over a process per core
(objcache/cli/bulk_processes.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from objcache.client import Client
from objcache.config.settings import Config
from objcache.core.manifest import shard_of
from tests.cli.test_cli_servers import base_env, start_cli
from tests.support.proxy import FaultProxy
from tests.support.servers import RedisServer


def _env(tmp_path: Path, tiers: str, **extra: str) -> dict[str, str]:
    return base_env(tmp_path, tiers, **{"OBJCACHE_LOCAL_DIR": str(tmp_path / "ci"), **extra})


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "objcache.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _seed(env: dict[str, str], n: int, size: int = 300) -> None:
    client = Client(Config.from_env(env))  # its close writes the run's manifest of the job
    for i in range(n):
        client.put("fx-graph", f"key-{i}", os.urandom(size))
    client.close()


def test_shards_split_the_keys_the_same_way_in_every_process() -> None:
    keys = [f"v1/env/fx-graph/{i:04d}" for i in range(500)]
    for count in (1, 2, 3, 4):
        shards = [{k for k in keys if shard_of(k, count) == i} for i in range(count)]
        assert sum(len(s) for s in shards) == len(keys) and set().union(*shards) == set(keys)
        assert count == 1 or min(len(s) for s in shards) > len(keys) / count / 2
    # not Python's hash of a str, which differs from process to process
    probe = "from objcache.core.manifest import shard_of; print(shard_of('v1/e/k/abc', 7))"
    seen = {
        subprocess.run(
            [sys.executable, "-c", probe],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2", "3")
    }
    assert seen == {str(shard_of("v1/e/k/abc", 7))}


@pytest.mark.parametrize(("asked", "forks"), [(2, True), (1, False)])
def test_the_tiers_backends_are_imported_before_the_fork_only_where_it_forks(
    asked: int, forks: bool
) -> None:
    """Every process of a copy inherits the backends imported before the fork, instead of
    importing them again (S3's SDK: 0.2-0.3 s of CPU a process); one process imports nothing
    early."""
    probe = (
        "import sys, threading\n"
        "from objcache.cli import bulk_processes\n"
        f"count = bulk_processes.process_count({asked}, ['s3', 'gs'])\n"
        "print(count, 'objcache.backends.s3.store' in sys.modules, threading.active_count())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [str(asked), str(forks), "1"]


def test_a_pull_over_three_processes_fetches_each_entry_once_and_counts_them_all(
    tmp_path: Path,
) -> None:
    env = _env(tmp_path, f"file://{tmp_path}/store")
    _seed(env, 60)
    fresh = tmp_path / "fresh"
    pulled = _cli(
        "pull",
        "--job",
        "clijob",
        "--json",
        env={
            **env,
            "OBJCACHE_LOCAL_DIR": str(fresh),
            "OBJCACHE_BULK_PROCESSES": "3",
            "OBJCACHE_PROGRESS": "1",
        },
    )
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    report = json.loads(pulled.stdout)
    assert report["processes"] == 3
    assert report["fetched"] == report["objects"] == report["keys"] == 60
    assert report["fetched_by_another_process"] == 0 and report["already_local"] == 0
    # one bar for the three processes: every child's entries reached it
    bar = [line for line in pulled.stderr.splitlines() if line.startswith("pull")][-1]
    assert re.search(r"\b60/60 ", bar), pulled.stderr
    verified = _cli(
        "verify", "--json", env={**env, "OBJCACHE_TIERS": "", "OBJCACHE_LOCAL_DIR": str(fresh)}
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    result = json.loads(verified.stdout)
    assert result["bad"] == [] and result["checked"] >= 60
    again = _cli(
        "pull",
        "--job",
        "clijob",
        "--json",
        env={**env, "OBJCACHE_LOCAL_DIR": str(fresh), "OBJCACHE_BULK_PROCESSES": "2"},
    )
    report = json.loads(again.stdout)
    assert report["fetched"] == 0 and report["already_local"] == 60, again.stdout


def test_a_push_and_a_pull_over_processes_copy_each_entry_once(tmp_path: Path) -> None:
    env = _env(tmp_path, f"file://{tmp_path}/store")
    _seed(env, 40)  # into the store and the CI machine's local tier
    pushed = _cli(
        "push",
        "--tier",
        f"file://{tmp_path}/seeded",
        "--json",
        env={**env, "OBJCACHE_BULK_PROCESSES": "3"},
    )
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    report = json.loads(pushed.stdout)
    assert report["processes"] == 3 and report["failed"] == report["refused"] == 0
    listed = report["copied"]
    assert listed >= 41, report  # the entries, the environment's ENV.json, the manifest
    again = json.loads(
        _cli("push", "--tier", f"file://{tmp_path}/seeded", "--json", env=env).stdout
    )
    assert again["copied"] == 0 and again["existed"] == listed, again
    fresh = tmp_path / "fresh"
    pulled = _cli(
        "pull",
        "--tier",
        f"file://{tmp_path}/seeded",
        "--json",
        env={**env, "OBJCACHE_LOCAL_DIR": str(fresh), "OBJCACHE_BULK_PROCESSES": "2"},
    )
    report = json.loads(pulled.stdout)
    assert report["processes"] == 2 and report["copied"] == listed, pulled.stdout
    verified = _cli(
        "verify", "--json", env={**env, "OBJCACHE_TIERS": "", "OBJCACHE_LOCAL_DIR": str(fresh)}
    )
    assert json.loads(verified.stdout)["bad"] == [], verified.stdout


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat")
    return state.exists() and state.read_text().rsplit(")", 1)[-1].split()[0] != "Z"


@pytest.mark.servers
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
def test_ctrl_c_ends_every_process_of_a_pull_and_leaves_only_whole_entries(
    redis_server: RedisServer, fault_proxy: Callable[[str, int], FaultProxy], tmp_path: Path
) -> None:
    prefix = f"shard{uuid.uuid4().hex[:10]}"
    _seed(_env(tmp_path, f"{redis_server.url}?prefix={prefix}"), 120, size=2000)
    proxy = fault_proxy(redis_server.host, redis_server.port)
    proxied = f"redis://{proxy.address[0]}:{proxy.address[1]}/0?prefix={prefix}"
    fresh = tmp_path / "fresh"
    env = _env(
        tmp_path,
        proxied,
        OBJCACHE_LOCAL_DIR=str(fresh),
        OBJCACHE_TIMEOUT_MS="600000",
        OBJCACHE_BULK_PROCESSES="2",
    )
    proxy.bandwidth_bps = 20_000  # the pull is still under way when the test stops it
    pull = start_cli("pull", "--job", "clijob", env=env)
    try:
        deadline = time.monotonic() + 60
        while not (children := _children(pull.pid)) or not any(fresh.rglob("*/fx-graph/*")):
            assert pull.poll() is None and time.monotonic() < deadline, "pull ended first"
            time.sleep(0.01)
        proxy.blackhole()  # nothing more arrives: only Ctrl-C ends the pull
        pull.send_signal(signal.SIGINT)  # to the parent alone, as a supervisor sends it
        stdout, stderr = pull.communicate(timeout=60)
    finally:
        if pull.poll() is None:
            pull.kill()
    assert pull.returncode == 130, stdout + stderr
    assert not [pid for pid in children if _running(pid)], "a pull process outlived Ctrl-C"
    assert "Traceback" not in stderr, stderr
    proxy.passthrough()
    verified = _cli("verify", "--json", env={**env, "OBJCACHE_TIERS": ""})
    assert verified.returncode == 0 and json.loads(verified.stdout)["bad"] == [], verified.stdout
