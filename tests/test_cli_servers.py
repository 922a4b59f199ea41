"""The CLI against real stores (SeaweedFS, moto, fake-gcs-server) and a black-holed
endpoint: what it closes, how it exits, and how long it may take."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from objcache.client import Client
from objcache.config import Config
from tests.cloud_support import s3_url
from tests.support.proxy import FaultProxy
from tests.support.servers import SeaweedS3

pytestmark = pytest.mark.servers

MakeProxy = Callable[[str, int], FaultProxy]


def uid() -> str:
    return uuid.uuid4().hex[:10]


def cli(
    *args: str, env: dict[str, str], timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "objcache.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done, time.monotonic() - started


def base_env(tmp_path: Path, tiers: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "OBJCACHE_TIERS": tiers,
        "OBJCACHE_LOCAL_DIR": str(tmp_path / "local"),
        "OBJCACHE_STATS_FILE": str(tmp_path / "stats.json"),
        "OBJCACHE_PREFETCH": "0",
        "OBJCACHE_JOB": "clijob",
        **extra,
    }


def test_gc_on_s3_closes_its_clients(seaweed_s3: SeaweedS3, tmp_path: Path) -> None:
    url = s3_url(seaweed_s3, f"gc-{uid()}")
    env = base_env(tmp_path, url)
    client = Client(Config.from_env(env))
    for i in range(3):
        client.put("fx-graph", f"k{i}", os.urandom(300))
    client.close()
    for args in (["gc", "--keep-env", "x", "--dry-run"], ["gc", "--keep-env", "x", "--yes"]):
        done, _ = cli(*args, "--tier", url, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Unclosed" not in done.stderr, done.stderr
    assert "deleted 4 entries" in done.stdout  # 3 entries and the run manifest
