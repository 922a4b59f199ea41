"""``objcache report`` over many runs against a local SeaweedFS.

Seeds N run summaries of one job (a bounded concurrent loop, 64 PUTs in flight), then times
``objcache report --job`` (a subprocess: CLI start-up included) with its progress bar on,
and writes the result into docs/benchmarks.md.

    PYTHONPATH=$PWD python -m bench.report_scale --runs 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench._report import write_section
from objcache.backends import create_backend
from objcache.backends.base import PutMode
from objcache.config.urls import parse_tier_list
from objcache.entry.codec import Codec
from objcache.entry.layout import Namespace
from objcache.observe import run_summary as summary
from tests.support.cloud import s3_url
from tests.support.servers import SeaweedS3

ROOT = Path(__file__).resolve().parents[1]
ENV = "benchreport000000"
JOB = "scale"


def one_summary(i: int, started: float) -> tuple[str, bytes]:
    run = f"run-{int(started)}-{i}-{i:08x}"
    stats = {
        "cache": {"gets": {"fx-graph": 40, "aot-autograd": 20}, "hits": {"fx-graph": 40 - i % 7}},
        "tiers": [{"name": "s3://b/p", "local": False, "kinds": {"fx-graph": {"hit": 33}}}],
    }
    body = summary.build(
        stats, job=JOB, run=run, started=started, ended=started + 60,
        environ={"RANK": str(i % 8)}, host=f"node-{i // 8:05d}",
    )  # fmt: skip
    return run, summary.encode(body)


async def seed(url: str, runs: int) -> float:
    backend = create_backend(parse_tier_list(url, "url")[0])
    codec, ns, limit = Codec(), Namespace(ENV), asyncio.Semaphore(64)
    started = time.perf_counter()

    async def put(i: int) -> None:
        run, body = one_summary(i, time.time() - i)
        async with limit:
            okey = ns.object_key(summary.KIND, f"{JOB}/{run}")
            await backend.put(okey, codec.encode(body, okey), PutMode.CREATE)

    try:
        await asyncio.gather(*(put(i) for i in range(runs)))
    finally:
        await backend.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    with SeaweedS3() as server:
        url = s3_url(server, f"report-scale-{os.getpid()}")
        seeded_s = asyncio.run(seed(url, args.runs))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OBJCACHE_PROGRESS": "1", "COLUMNS": "120"}
        cmd = [sys.executable, "-m", "objcache.cli", "report", "--job", JOB, "--env", ENV]
        started = time.perf_counter()
        done = subprocess.run(
            [*cmd, "--tier", url, "--json"], env=env, capture_output=True, text=True, check=True
        )
        report_s = time.perf_counter() - started
    total = json.loads(done.stdout)["total"]
    progress = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    print(f"seeded {args.runs} summaries in {seeded_s:.1f} s; report {report_s:.1f} s")
    print(f"runs {total['runs']}, skipped {total['skipped']}; progress: {progress}")
    assert total["runs"] == args.runs and total["skipped"] == 0
    if not args.no_docs:
        body = (
            "| runs | seed (64 PUTs in flight) | `objcache report --job` (process, CLI start "
            "included) |\n|---|---|---|\n"
            f"| {args.runs:,} | {seeded_s:.1f} s | {report_s:.1f} s |\n\n"
            f"The report printed its progress bar on stderr (last line: `{progress}`)."
        )
        write_section(
            ROOT / "docs" / "benchmarks.md",
            "report-scale",
            f"PYTHONPATH=$PWD python -m bench.report_scale --runs {args.runs}",
            "### `objcache report` over many runs (local SeaweedFS)\n\n" + body,
        )


if __name__ == "__main__":
    main()
