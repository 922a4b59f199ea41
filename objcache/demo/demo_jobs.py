"""Running demo workers (:mod:`.demo_worker`) as simulated machines, and reading their results.

:func:`machine_env` is the environment of a machine whose local state (Inductor's and
Triton's caches, the temp dir, objcache's local tier) lives under one directory;
:func:`run_job` runs one worker there and parses its result line. The demo, the tests and
``bench/`` compare machines with these.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from objcache.demo.demo_worker import RESULT_TAG, STAGE_TAG


@dataclass
class Job:
    """One worker run: its result, wall time and the tail of its stderr."""

    result: dict[str, Any]
    wall_s: float
    returncode: int
    stderr_tail: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.result.get("ok"))


def run_job(
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    command: Sequence[str] | None = None,
    on_stage: Callable[[str], None] | None = None,
    timeout: float = 900.0,
) -> Job:
    """Run a worker in a subprocess and parse its result line."""
    cmd = [
        *(command or [sys.executable, "-m", "objcache.demo.demo"]),
        "--worker",
        *args,
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    tail: deque[str] = deque(maxlen=60)
    out: list[str] = []

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith(STAGE_TAG):
                if on_stage is not None:
                    on_stage(line[len(STAGE_TAG) :].strip())
            else:
                tail.append(line.rstrip())

    def read_stdout() -> None:
        assert proc.stdout is not None
        out.extend(proc.stdout)

    readers = [threading.Thread(target=f, daemon=True) for f in (read_stderr, read_stdout)]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        tail.append(f"worker timed out after {timeout:.0f}s")
    for reader in readers:
        reader.join(10)
    result: dict[str, Any] = {"ok": False, "error": "no result line"}
    for line in out:
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG) :])
    return Job(result, time.perf_counter() - started, proc.returncode, list(tail))


def machine_env(root: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a simulated machine whose local state lives under ``root``."""
    env = dict(os.environ if base is None else base)
    for sub in ("inductor", "triton", "tmp", "objcache-local"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    env.update(
        TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"),
        TRITON_CACHE_DIR=os.path.join(root, "triton"),
        TMPDIR=os.path.join(root, "tmp"),
        OBJCACHE_LOCAL_DIR=os.path.join(root, "objcache-local"),
    )
    env.pop("OBJCACHE_RUN_GROUP", None)  # another machine is another start
    return env


# --- a result's figures ------------------------------------------------------------------------


def remote_bytes(result: Mapping[str, Any]) -> tuple[int, int]:
    """(bytes read from, bytes written to) remote tiers."""
    tiers = result.get("stats", {}).get("tiers", [])
    remote = [t for t in tiers if not t.get("local")]
    return sum(t["bytes_read"] for t in remote), sum(t["bytes_written"] for t in remote)


def objcache_hits(result: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """kind -> (hits, gets) as objcache served them."""
    cache = result.get("stats", {}).get("cache", {})
    gets, hits = cache.get("gets", {}), cache.get("hits", {})
    return {kind: (int(hits.get(kind, 0)), int(n)) for kind, n in sorted(gets.items())}


def gxx_builds(result: Mapping[str, Any]) -> int | None:
    kernels = result.get("integration", {}).get("kernels")
    return None if kernels is None else int(kernels.get("builds", 0))
