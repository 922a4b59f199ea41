"""Fleet benchmarks on a real S3 server (SeaweedFS on 127.0.0.1):

(b) ``objcache push`` / ``objcache pull`` of N entries of 50-500 KB vs ``aws s3 sync`` of the
    very same files (the local tier's directory) on the same server, both as a user runs them
    (a fresh CLI process each; wall time includes start-up).
(a) warm start at 50 ms added RTT, with and without the start-up prefetch: at the cache level
    (a fresh Client replays the key set of a compile, 200 entries of realistic sizes looked up
    one after another as torch does) and at the torch level (``objcache.demo``'s worker: a
    real torch.compile and training step in fresh subprocess "machines").

    .venv/bin/python bench/fleet.py [--entries 2000] [--out docs/benchmarks.md]

awscli: ``$OBJCACHE_BENCH_AWS``, else an ``aws`` that runs (venv, then PATH), else it is
installed into its own venv under /tmp (awscli pins botocore exactly; the project venv's
botocore belongs to aioboto3). Not a test: prints a markdown section.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._report import write_section
from objcache.backends.base import PutMode, TierSpec
from objcache.client import Client
from objcache.codec import Codec
from objcache.config import Config
from objcache.fingerprint import env_id
from objcache.layout import Namespace
from objcache.registry import create_backend
from objcache.testing.proxy import FaultProxy
from objcache.testing.servers import SeaweedS3
from tests.cloud_support import s3_url, server_profile

AWSCLI_VENV = Path(tempfile.gettempdir()) / "objcache-bench-awscli"
KB = 1024


# --- awscli ------------------------------------------------------------------------------


def _runs(cmd: str) -> bool:
    try:
        return subprocess.run([cmd, "--version"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def find_aws() -> str:
    """A working ``aws`` binary, installing awscli into its own venv if there is none."""
    candidates = [
        os.environ.get("OBJCACHE_BENCH_AWS", ""),
        str(Path(sys.executable).with_name("aws")),
        shutil.which("aws") or "",
        str(AWSCLI_VENV / "bin" / "aws"),
    ]
    for cmd in candidates:
        if cmd and _runs(cmd):
            return cmd
    print(f"installing awscli into {AWSCLI_VENV}", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(AWSCLI_VENV)], check=True)
    pip = [str(AWSCLI_VENV / "bin" / "pip"), "install", "-q", "awscli"]
    subprocess.run(pip, check=True, timeout=600)
    return str(AWSCLI_VENV / "bin" / "aws")


def aws_version(aws: str) -> str:
    out = subprocess.run([aws, "--version"], capture_output=True, text=True, timeout=60)
    return (out.stdout or out.stderr).split()[0]


# --- data ----------------------------------------------------------------------------------


def payload(rng: random.Random, size: int) -> bytes:
    """Incompressible bytes: the stored entry is as big as asked (50-500 KB)."""
    return rng.randbytes(size)


async def fill_local(local_dir: Path, n: int, seed: int = 0) -> int:
    """Write n entries of 50-500 KB into an objcache local tier; returns total bytes."""
    spec = TierSpec(f"disk://{local_dir}", "disk", "", str(local_dir), {})
    backend = create_backend(spec)
    codec, ns, rng = Codec(), Namespace(env_id()), random.Random(seed)
    items = [
        (ns.object_key("fx-graph", f"f{rng.getrandbits(128):032x}"), rng.randint(50, 500) * KB)
        for _ in range(n)
    ]
    total = 0
    limit = asyncio.Semaphore(16)

    async def one(okey: str, size: int) -> None:
        nonlocal total
        entry = codec.encode(payload(random.Random(okey), size))
        total += len(entry)
        async with limit:
            await backend.put(okey, entry, PutMode.OVERWRITE)

    await asyncio.gather(*(one(k, s) for k, s in items))
    await backend.close()
    return total


def count_files(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


# --- (b) push/pull vs aws s3 sync ------------------------------------------------------------


#: CPU seconds (user + system) of the last command run by :func:`timed`.
last_cpu_s = 0.0


def timed(cmd: list[str], env: dict[str, str]) -> float:
    """Wall seconds of ``cmd``; its CPU seconds land in ``last_cpu_s``."""
    global last_cpu_s
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    last_cpu_s = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed ({r.returncode}): {r.stdout}{r.stderr}")
    return wall


def prepare_sync(server: SeaweedS3, n: int, work: Path) -> dict[str, Any]:
    """The source local tier, the bucket, and credentials the aws CLI reads too."""
    profile = server_profile(server)  # a shared-credentials file; sets AWS_* in os.environ
    Path(os.environ["AWS_CONFIG_FILE"]).write_text(
        f"[profile {profile}]\nregion = {server.region}\ns3 =\n  addressing_style = path\n"
    )
    server.create_bucket("bench-fleet")
    src = work / "src"
    total = asyncio.run(fill_local(src, n))
    return {"profile": profile, "src": src, "bytes": total, "entries": n}


def bench_sync(
    server: SeaweedS3, aws: str, data: dict[str, Any], work: Path, rtt_ms: float
) -> dict[str, Any]:
    """push and pull with objcache and with ``aws s3 sync``, through a proxy adding rtt_ms."""
    bucket, n, src = "bench-fleet", data["entries"], data["src"]
    proxy = FaultProxy("127.0.0.1", int(server.endpoint_url.rsplit(":", 1)[1]))
    proxy.set_rtt_ms(rtt_ms)
    endpoint = proxy.url()
    tag = f"rtt{rtt_ms:.0f}"
    objcache_url = s3_url(server, f"objcache-{tag}", bucket=bucket, endpoint_url=endpoint)
    base = {**os.environ, "OBJCACHE_PREFETCH": "0", "OBJCACHE_STATS_FILE": str(work / "st")}
    base["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    aws_env = {**base, "AWS_PROFILE": data["profile"]}
    aws_s3 = [aws, "s3", "sync", "--only-show-errors", "--endpoint-url", endpoint]
    cli = [sys.executable, "-m", "objcache.cli"]
    result: dict[str, Any] = {"rtt_ms": rtt_ms}
    try:
        result["objcache_push"] = timed(
            [*cli, "push", "--tier", objcache_url], {**base, "OBJCACHE_LOCAL_DIR": str(src)}
        )
        result["objcache_push_cpu"] = last_cpu_s
        result["aws_push"] = timed([*aws_s3, str(src), f"s3://{bucket}/aws-{tag}"], aws_env)
        result["aws_push_cpu"] = last_cpu_s
        dst_o, dst_a = work / f"pull-objcache-{tag}", work / f"pull-aws-{tag}"
        result["objcache_pull"] = timed(
            [*cli, "pull", "--tier", objcache_url], {**base, "OBJCACHE_LOCAL_DIR": str(dst_o)}
        )
        result["objcache_pull_cpu"] = last_cpu_s
        result["aws_pull"] = timed([*aws_s3, f"s3://{bucket}/aws-{tag}", str(dst_a)], aws_env)
        result["aws_pull_cpu"] = last_cpu_s
    finally:
        proxy.close()
    pulled_o, pulled_a = count_files(dst_o / "v1"), count_files(dst_a / "v1")
    if pulled_o < n or pulled_a < n:
        raise SystemExit(f"pull incomplete: objcache {pulled_o}, aws {pulled_a} of {n}")
    shutil.rmtree(dst_o)
    shutil.rmtree(dst_a)
    return result


def startup_costs(aws: str) -> dict[str, float]:
    """What every CLI run pays before copying: objcache's env fingerprint (imports torch)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    fp = "from objcache.fingerprint import env_id; env_id()"
    return {
        "objcache_fingerprint": timed([sys.executable, "-c", fp], env),
        "objcache_help": timed([sys.executable, "-m", "objcache.cli", "--help"], env),
        "aws_version": timed([aws, "--version"], env),
    }


# --- (a) warm start, cache level -------------------------------------------------------------


def compile_key_set(rng: random.Random, n: int = 200) -> list[tuple[str, str, int]]:
    """(kind, key, size) of a compile: mostly FX graphs, AOTAutograd entries, a PGO state
    and autotune records; sizes log-uniform within what Inductor writes."""
    out: list[tuple[str, str, int]] = []
    for i in range(n):
        r = rng.random()
        if r < 0.55:
            kind, lo, hi = "fx-graph", 8 * KB, 400 * KB
        elif r < 0.9:
            kind, lo, hi = "aot-autograd", 2 * KB, 60 * KB
        else:
            kind, lo, hi = "autotune", 200, 2 * KB
        size = int(lo * (hi / lo) ** rng.random())
        out.append((kind, f"{kind[0]}{rng.getrandbits(96):024x}-{i}", size))
    return out


def bench_warm(server: SeaweedS3, rtt_ms: float, work: Path) -> dict[str, Any]:
    bucket, job = "bench-warm", "warmbench"
    server.create_bucket(bucket)
    rng = random.Random(1)
    keys = compile_key_set(rng)
    values = {key: rng.randbytes(size // 2) * 2 for _, key, size in keys}  # ~2x compressible
    seeder = Client(
        Config(
            tiers=s3_url(server, "c", bucket=bucket),
            local_dir=work / "ci",
            prefetch=False,
            job=job,
        )
    )
    for kind, key, _ in keys:
        seeder.put(kind, key, values[key])
    seeder.close()  # flushes and writes the job's run manifest

    proxy = FaultProxy("127.0.0.1", int(server.endpoint_url.rsplit(":", 1)[1]))
    proxy.set_rtt_ms(rtt_ms)
    url = s3_url(server, "c", bucket=bucket, endpoint_url=proxy.url())
    result: dict[str, Any] = {"entries": len(keys), "bytes": sum(s for *_, s in keys)}
    try:
        for label, prefetch in (("no_prefetch", False), ("prefetch", True)):
            proxy.reset_counters()
            started = time.perf_counter()
            client = Client(Config(tiers=url, local_dir=work / label, prefetch=prefetch, job=job))
            hits = sum(client.get(kind, key) == values[key] for kind, key, _ in keys)
            wall = time.perf_counter() - started
            pre = client.prefetch_result.result(60) if client.prefetch_result else None
            shared = client.stats()["cache"]["single_flight_shared"]
            client.close()
            gets = sum(
                1
                for r in proxy.http_requests
                if r.method == "GET"
                and r.path.startswith(f"/{bucket}/c/v1/")
                and "/manifest/" not in r.path
            )
            result[label] = {
                "wall": wall,
                "hits": hits,
                "object_gets": gets,
                "shared": shared,
                "prefetch_s": pre["seconds"] if pre else None,
            }
    finally:
        proxy.close()
    return result


def bench_torch_warm(server: SeaweedS3, rtt_ms: float, work: Path) -> dict[str, Any] | None:
    """(a) at the torch level: a real compile (``objcache.demo``'s worker, model ``tiny``)
    seeds the store, then two fresh machines (fresh objcache, Inductor and temp dirs) compile
    the same model through a proxy adding ``rtt_ms``: without and with prefetch."""
    try:
        from objcache import demo
    except ImportError:
        return None
    bucket, job = "bench-torch", f"torchwarm-{random.randrange(1 << 30):08x}"
    server.create_bucket(bucket)
    proxy = FaultProxy("127.0.0.1", int(server.endpoint_url.rsplit(":", 1)[1]))
    proxy.set_rtt_ms(rtt_ms)
    salt = 1.0 + random.randrange(1 << 30) * 1e-12  # a graph no earlier run has compiled
    args = ["--model", "tiny", "--salt", repr(salt), "--objcache", "install"]
    repo = str(Path(__file__).resolve().parents[1])

    def machine(name: str, endpoint: str | None, prefetch: bool) -> dict[str, str]:
        tiers = s3_url(server, "c", bucket=bucket, endpoint_url=endpoint)  # sets AWS_* first
        env = demo.machine_env(str(work / name))
        env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
        env.update(
            OBJCACHE_TIERS=tiers,
            OBJCACHE_JOB=job,
            OBJCACHE_PREFETCH="1" if prefetch else "0",
            PYTHONPATH=repo,
        )
        return env

    out: dict[str, Any] = {"model": "tiny"}
    try:
        runs = [("cold", None, False), ("no_prefetch", proxy.url(), False)]
        runs.append(("prefetch", proxy.url(), True))
        for label, endpoint, prefetch in runs:
            proxy.reset_counters()
            j = demo.run_job(args, machine(label, endpoint, prefetch), timeout=900)
            if not j.ok:
                tail = "\n".join(j.stderr_tail[-15:])
                raise SystemExit(f"torch {label} run failed: {j.result.get('error')}\n{tail}")
            down, _ = demo.remote_bytes(j.result)
            out[label] = {
                "wall": j.wall_s,
                "first_step": j.result["first_step_s"],
                "hits": demo.objcache_hits(j.result),
                "gets": proxy.count_requests("GET", f"/{bucket}/c/v1/"),
                "down": down,
                "match": j.result.get("match"),
                "gxx": demo.gxx_builds(j.result),
                "misses": [
                    dict(t["misses"])
                    for t in j.result.get("stats", {}).get("tiers", [])
                    if not t.get("local")
                ],
                "sync_timeouts": j.result.get("stats", {}).get("sync_timeouts"),
            }
            print(label, out[label], file=sys.stderr, flush=True)
            if label == "cold" and any(m for m in out[label]["misses"] if set(m) - {"absent"}):
                raise SystemExit(f"the seeding run could not use the store: {out[label]}")
    finally:
        proxy.close()
    return out


# --- report --------------------------------------------------------------------------------


def report(
    data: dict[str, Any] | None,
    syncs: list[dict[str, Any]],
    costs: dict[str, float] | None,
    warm: dict[str, Any] | None,
    torch_warm: dict[str, Any] | None,
    rtt_ms: float,
    aws: str,
) -> str:
    lines: list[str] = []
    if data is not None and costs is not None:
        lines += [
            f"**(b) Seeding and pulling a bucket.** {data['entries']} entries of 50-500 KB "
            f"({data['bytes'] / 1e6:.0f} MB, incompressible) in a local tier, one SeaweedFS "
            "server on 127.0.0.1, reached through a FaultProxy adding the RTT shown (0: "
            "loopback; 50 ms: a bucket a region away). `objcache push`/`pull` (64 in flight, "
            f"every entry verified) vs `{aws_version(aws)} s3 sync` (its default 10 in "
            "flight) of the same files, same server, same proxy. Wall time of the whole "
            "command as a user runs it, start-up included, one run each:",
            "",
            "| added RTT | direction | objcache s (CPU s) | aws s3 sync s (CPU s) "
            "| objcache faster by |",
            "|---|---|---|---|---|",
        ]
        for r in syncs:
            for what, label in (("push", "push (local → S3)"), ("pull", "pull (S3 → fresh dir)")):
                o, a = r[f"objcache_{what}"], r[f"aws_{what}"]
                lines.append(
                    f"| {r['rtt_ms']:.0f} ms | {label} | {o:.1f} ({r[f'objcache_{what}_cpu']:.1f}) "
                    f"| {a:.1f} ({r[f'aws_{what}_cpu']:.1f}) | "
                    f"**{a / o:.2f}x** (target ≥ 2x) |"
                )
        ratios = [r[f"aws_{w}"] / r[f"objcache_{w}"] for r in syncs for w in ("push", "pull")]
        lines += [
            "",
            f"Target ≥ 2x both ways: **{'met' if min(ratios) >= 2 else 'not met'}** in this run. "
            "The CPU seconds of the two clients are close: on this shared 2-vCPU machine both "
            "are bound by the CPU they share with SeaweedFS and the proxy (and with other "
            "jobs: repeated runs moved single cells by 2x), not by round trips, so objcache's "
            "deeper concurrency (64 vs 10 in flight) cannot show here.",
            "",
            f"Start-up inside those times: the objcache CLI computes the environment "
            f"fingerprint, which imports torch: {costs['objcache_fingerprint']:.1f} s "
            f"(`objcache --help` alone: {costs['objcache_help']:.1f} s; "
            f"`aws --version`: {costs['aws_version']:.1f} s).",
            "",
        ]
    if warm is not None:
        n, p = warm["no_prefetch"], warm["prefetch"]
        lines += [
            f"**(a) Warm start in a fresh local dir at {warm['rtt_ms']:.0f} ms added RTT, cache "
            f"level.** The key set of a compile ({warm['entries']} entries, "
            f"{warm['bytes'] / 1e6:.1f} MB: FX graphs 8-400 KB, AOTAutograd 2-60 KB, autotune "
            "records) looked up one after another through a fresh `Client`, as torch does, "
            "with no compile work in between (the worst case for prefetch). Time from client "
            "construction to the last hit:",
            "",
            "| run | wall s | hits | object GETs at the server | lookups that joined "
            "a prefetch fetch |",
            "|---|---|---|---|---|",
            f"| no prefetch | {n['wall']:.2f} | {n['hits']} | {n['object_gets']} | - |",
            f"| prefetch (manifest of the CI run) | {p['wall']:.2f} | {p['hits']} | "
            f"{p['object_gets']} | {p['shared']} |",
            "",
            f"Prefetch: **{n['wall'] / p['wall']:.1f}x** faster; the prefetch itself "
            f"took {p['prefetch_s']} s.",
            "",
        ]
    if torch_warm is not None:
        lines += [
            f"**(a) Warm start at the torch level, {rtt_ms:.0f} ms added RTT.** `objcache.demo`'s "
            "worker (model `tiny`, one training step, `objcache.install()`) in subprocesses: a "
            "cold run seeds the bucket (no proxy), then two fresh machines (fresh objcache "
            "local dir, `TORCHINDUCTOR_CACHE_DIR` and temp dir) through the proxy:",
            "",
            "| run | process wall s | first step s | objcache hits/gets | GETs at the server "
            "| kernel g++ builds | matches eager |",
            "|---|---|---|---|---|---|---|",
        ]
        for label in ("cold", "no_prefetch", "prefetch"):
            r = torch_warm[label]
            hits = ", ".join(f"{k} {h}/{g}" for k, (h, g) in r["hits"].items()) or "-"
            lines.append(
                f"| {label.replace('_', ' ')} | {r['wall']:.1f} | {r['first_step']:.2f} | {hits} "
                f"| {r['gets']} | {r['gxx']} | {r['match']} |"
            )
        lines.append("")
    else:
        lines.append(
            "The torch-level warm start (a real `torch.compile` with `objcache.install()`) "
            "needs the torch branch (`objcache.demo`), which this tree does not have."
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--rtt-ms", type=float, default=50, help="added RTT for (a) and (b)")
    ap.add_argument("--skip-sync", action="store_true")
    ap.add_argument("--skip-warm", action="store_true")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    aws = find_aws()
    data = costs = warm = torch_warm = None
    syncs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="objcache-bench-fleet-") as tmp, SeaweedS3() as server:
        work = Path(tmp)
        if not args.skip_warm:
            warm = {**bench_warm(server, args.rtt_ms, work / "warm"), "rtt_ms": args.rtt_ms}
        if not args.skip_torch:
            torch_warm = bench_torch_warm(server, args.rtt_ms, work / "torch")
        if not args.skip_sync:
            data = prepare_sync(server, args.entries, work / "sync")
            costs = startup_costs(aws)
            for rtt in (0.0, args.rtt_ms):
                syncs.append(bench_sync(server, aws, data, work / "sync", rtt))
                print(syncs[-1], file=sys.stderr, flush=True)
    text = report(data, syncs, costs, warm, torch_warm, args.rtt_ms, aws)
    print(text)
    if args.out:
        write_section(args.out, "fleet", "python bench/fleet.py --out docs/benchmarks.md", text)


if __name__ == "__main__":
    main()
