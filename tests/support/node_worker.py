"""One rank of a node: the subprocess of the node single-flight tests and ``bench/fleet.py``.

``python -m tests.support.node_worker SPEC_JSON`` builds a :class:`~objcache.client.Client`
from the spec, waits for ``go_file`` to exist (so every rank starts at once), looks every key
up in order as torch does, checks each value, and prints one JSON line: hits, wrong values,
seconds from go to the last lookup, the wall-clock time it finished, and objcache's counters.

Spec keys: ``tiers``, ``local_dir``, ``job``, ``prefetch``, ``node_single_flight``,
``timeout_ms``, ``keys`` (list), ``size`` (bytes of each value), ``go_file``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KIND = "fx-graph"
MODULE = "tests.support.node_worker"
REPO = str(Path(__file__).resolve().parents[2])


def payload_for(key: str, size: int) -> bytes:
    """The value stored under ``key``: incompressible and derived from the key alone."""
    return random.Random(key).randbytes(size)


def start_ranks(specs: list[dict[str, Any]], go: Path) -> list[subprocess.Popen[str]]:
    """Start one worker per spec and wait until each is ready; touching ``go`` starts them."""
    env = {**os.environ, "PYTHONPATH": REPO}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.node_worker",
                json.dumps({**s, "go_file": str(go)}),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for s in specs
    ]
    deadline = time.monotonic() + 120
    while len(list(go.parent.glob(go.name + ".ready-*"))) < len(procs):
        if time.monotonic() > deadline:
            for p in procs:
                p.kill()
            raise RuntimeError("ranks did not start")
        time.sleep(0.01)
    return procs


def results(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    """Each worker's JSON line (a worker that failed raises)."""
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"rank {p.pid} exited with {p.returncode}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def main(argv: list[str]) -> int:
    spec: dict[str, Any] = json.loads(argv[0])
    from objcache.client import Client
    from objcache.config.settings import Config

    go = Path(spec["go_file"])
    Path(f"{go}.ready-{os.getpid()}").touch()
    while not go.exists():
        time.sleep(0.001)
    started = time.perf_counter()
    client = Client(
        Config(
            tiers=spec["tiers"],
            local_dir=Path(spec["local_dir"]),
            job=spec.get("job", "node"),
            prefetch=bool(spec.get("prefetch", False)),
            node_single_flight=bool(spec.get("node_single_flight", True)),
            timeout_ms=int(spec.get("timeout_ms", 3000)),
        )
    )
    hits = wrong = 0
    missed: list[str] = []
    for key in spec["keys"]:
        value = client.get(KIND, key)
        if value is None:
            missed.append(key)
            continue
        hits += 1
        wrong += value != payload_for(key, int(spec["size"]))
    seconds = time.perf_counter() - started
    done_at = time.time()
    prefetch = client.prefetch_result.result(60) if client.prefetch_result else None
    stats = client.stats()
    client.close()
    out = {
        "pid": os.getpid(),
        "hits": hits,
        "wrong": wrong,
        "missed": missed,
        "seconds": seconds,
        "done_at": done_at,
        "prefetch": prefetch,
        "cache": stats["cache"],
        "misses": [t["misses"] for t in stats["tiers"]],
        "sync_timeouts": client.timeouts,
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
