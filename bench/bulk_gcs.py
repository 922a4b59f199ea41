"""Pre-seeding on GCS: ``objcache push`` and ``objcache pull --job`` against a bulk copy with
``gcloud storage``'s parallelism (``bench/gcs_parallel.py``: processes x threads of
google-cloud-storage, gcloud's defaults for this machine's cores) of the very same objects,
on one fake-gcs-server on 127.0.0.1, reached directly and through the project's FaultProxy
adding ``--rtt-ms`` (docs/benchmarks.md, "Pre-seeding on GCS").

The shapes, the source local tier (encoded entries and a run manifest of job ``bench``, as a
CI machine leaves them) and the measurement of each command (a fresh process; wall, CPU and
peak RSS from ``wait4``) are ``bench/bulk.py``'s; the two clients alternate which goes first.

    python bench/bulk_gcs.py [--rounds 2] [--scale 1] [--shapes compile,small,large]
                             [--networks direct,rtt] [--out docs/benchmarks.md]

fake-gcs-server keeps objects in memory and answers from one process: its figures say how
the two clients compare on the same server, not what GCS itself sustains. Not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._installed import compile_bytecode
from bench.bulk import (
    SHAPES,
    bench_env,
    fill_local,
    medians,
    objcache_runs,
    ratio_chart,
    run_round,
    shape_arguments,
    table_rows,
    write_out,
)
from bench.gcs_parallel import gcloud_defaults
from tests.support.cloud import gcs_url
from tests.support.proxy import FaultProxy
from tests.support.servers import FakeGCS

BUCKET = "bench-bulk-gcs"
CLIENTS = ("objcache", "parallel")


def bench_network(
    server: FakeGCS, data: dict[str, Any], work: Path, rtt_ms: float, rounds: int
) -> dict[str, Any]:
    """Push then pull with each client, ``rounds`` times: straight to the server when
    ``rtt_ms`` is 0, else through a FaultProxy adding ``rtt_ms``."""
    proxy: FaultProxy | None = None
    endpoint = server.endpoint
    if rtt_ms > 0:
        proxy = FaultProxy("127.0.0.1", server.port)
        proxy.set_rtt_ms(rtt_ms)
        endpoint = proxy.url()
    base = bench_env(work)
    mover = [sys.executable, str(Path(__file__).with_name("gcs_parallel.py"))]
    at = ["--endpoint", endpoint]
    src, shape = data["src"], data["shape"]
    samples: dict[str, list[dict[str, float]]] = {}
    server_cpu: dict[str, list[float]] = {}
    try:
        for i in range(rounds):
            tag = f"{shape}-rtt{rtt_ms:.0f}-r{i}"
            url = gcs_url(server, f"o-{tag}", bucket=BUCKET, endpoint=endpoint)
            dst = {c: work / f"pull-{c}-{tag}" for c in CLIENTS}
            runs = {
                **objcache_runs(url, src, dst["objcache"], base),
                "parallel_push": ([*mover, "upload", str(src), BUCKET, f"p-{tag}", *at], base),
                "parallel_pull": (
                    [*mover, "download", BUCKET, f"p-{tag}", str(dst["parallel"]), *at],
                    base,
                ),
            }
            run_round(i, tag, runs, list(CLIENTS), server.pid, data, dst, samples, server_cpu)
    finally:
        if proxy is not None:
            proxy.close()
    return medians(shape, rtt_ms, rounds, samples, server_cpu)


def report(datas: dict[str, dict[str, Any]], results: list[dict[str, Any]]) -> str:
    processes, threads = gcloud_defaults(os.cpu_count() or 1)
    lines = [
        "Clients: objcache (this tree) and `bench/gcs_parallel.py` (google-cloud-storage, "
        f"{processes} processes x {threads} threads: `gcloud storage`'s defaults for "
        "multi-object copies on this many cores); one fake-gcs-server on 127.0.0.1, reached "
        "directly or through the FaultProxy adding the RTT shown. Each figure is the median "
        f"of {results[0]['rounds']} rounds of a fresh process (start-up included), the two "
        "alternating which goes first; fresh prefixes and folders each round.",
        "",
        "| shape | network | direction | client | wall s | objects/s | MB/s | CPU s "
        "| peak RSS MiB | server CPU s | objcache / parallel wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += table_rows(datas, results, CLIENTS, "parallel")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    shape_arguments(ap)
    args = ap.parse_args()
    compile_bytecode()  # as an installed objcache runs (bench/_installed.py)
    rtts = [0.0] if "direct" in args.networks else []
    rtts += [args.rtt_ms] if "rtt" in args.networks else []
    datas: dict[str, dict[str, Any]] = {}
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="objcache-bench-gcs-") as tmp, FakeGCS() as server:
        work = Path(tmp)
        server.create_bucket(BUCKET)
        for name in args.shapes.split(","):
            src = work / f"src-{name}"
            data = {**fill_local(src, SHAPES[name], args.scale), "src": src, "shape": name}
            datas[name] = data
            print(name, {k: data[k] for k in ("entries", "bytes")}, file=sys.stderr)
            for rtt in rtts:
                results.append(bench_network(server, data, work, rtt, args.rounds))
            shutil.rmtree(src)
    text = report(datas, results)
    print(text)
    title = "objcache push / pull --job wall time on GCS over a gcloud-style parallel copy"
    write_out(args, "bulk_gcs", text, ratio_chart(results, "parallel", title, "bulk_gcs"))


if __name__ == "__main__":
    main()
