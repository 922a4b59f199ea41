"""Where a GPU new machine's start-up time goes next to torch's own warm-local start
(docs/benchmarks.md, "GPU"): torch alone cold then warm on one machine, objcache cold into a
file:// store then new machines, interleaved; the phases (torch's ``dynamo_timed`` figures,
which every worker records) by median difference; one cProfile of each side; then the
autotune remote cache with objcache's Triton store on (does a new machine still compile
Triton kernels under max-autotune?) and precompile entries (served or why not).

    usage: python scripts/gpu_phases.py [rounds] [steps]   (writes under $OUT, else ./gpu-out)
    steps: comma-separated of phases,explain,profile,precompile,autotune (default: all)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.warm_start import Bench  # noqa: E402

OUT = Path(os.environ.get("OUT") or ROOT / "gpu-out")
OUT.mkdir(parents=True, exist_ok=True)
STARTED = time.time()
LOG = open(OUT / "phases.txt", "a", buffering=1)  # noqa: SIM115


def say(*parts: Any) -> None:
    line = f"[{time.time() - STARTED:5.0f}s] " + " ".join(str(p) for p in parts)
    print(line, flush=True)
    LOG.write(line + "\n")


def brief(r: dict[str, Any]) -> str:
    cache = r.get("stats", {}).get("cache", {})
    return (
        f"first step {r.get('first_step_s')}, triton {r.get('triton_compiles')}, "
        f"graphs {r.get('graphs')}, match {r.get('match')}, hits {cache.get('hits')}, "
        f"gets {cache.get('gets')}"
    )


def phase_table(warm: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    names = {n for r in warm + new for n in r.get("phases", {})}

    def med(rs: list[dict[str, Any]], n: str) -> float:
        return statistics.median(float(r.get("phases", {}).get(n, [0, 0])[0]) for r in rs)

    rows = sorted((med(new, n) - med(warm, n), med(warm, n), med(new, n), n) for n in names)
    rows.reverse()
    out = [f"{'phase':70s} {'warm':>8s} {'new':>8s} {'diff':>8s}"]
    for d, w, nw, n in rows:
        if abs(d) >= 0.005 or max(w, nw) >= 0.05:
            out.append(f"{n[:70]:70s} {w:8.3f} {nw:8.3f} {d:+8.3f}")
    return out


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    steps = set(
        (sys.argv[2] if len(sys.argv) > 2 else "phases,explain,profile,precompile,autotune").split(
            ","
        )
    )
    root = Path(tempfile.mkdtemp(prefix="gpu-phases-"))
    store = f"file://{root}/store"
    bench = Bench(root, "block", {}, 0, "", "cuda", "")
    results: dict[str, list[dict[str, Any]]] = {"torch_warm": [], "new": []}
    torch_machine = bench.fresh("torch")
    say("torch cold:", brief(bench.run(torch_machine, ["--objcache", "off"], {}).result))
    writer = bench.fresh("writer")
    say("objcache cold:", brief(bench.run(writer, ["--objcache", "install"], {}, store).result))
    for i in range(rounds):
        order = ["torch_warm", "new"] if i % 2 == 0 else ["new", "torch_warm"]
        for what in order:
            if what == "torch_warm":
                job = bench.run(torch_machine, ["--objcache", "off"], {})
            else:
                job = bench.run(bench.fresh("new"), ["--objcache", "install"], {}, store)
            results[what].append(job.result)
            say(f"round {i + 1} {what}: process {job.wall_s:.2f}s,", brief(job.result))
            host = job.result.get("integration", {}).get("triton_host")
            if host is not None:
                say("  Triton host modules:", host)
    ws = [r["first_step_s"] for r in results["torch_warm"]]
    ns = [r["first_step_s"] for r in results["new"]]
    say(
        f"median first step: torch warm {statistics.median(ws):.3f}s, new "
        f"{statistics.median(ns):.3f}s, ratio {statistics.median(ns) / statistics.median(ws):.3f}"
    )
    for line in phase_table(results["torch_warm"], results["new"]):
        say(line)
    (OUT / "phases.json").write_text(json.dumps(results, indent=1, default=str))

    if "explain" not in steps:
        return 0
    # objcache's own view of the last new machine against the writer's warm rerun
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, OBJCACHE_TIERS=store, PYTHONPATH=path)
    bench.run(writer, ["--objcache", "install"], {}, store)  # a warm-local objcache run
    bench.run(bench.fresh("new"), ["--objcache", "install"], {}, store)
    explain = subprocess.run(
        [sys.executable, "-m", "objcache.cli", "explain", "--time", "--job", "bench-warm-start"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    say("explain --time exit", explain.returncode)
    LOG.write(explain.stdout[-6000:] + explain.stderr[-2000:] + "\n")

    if "profile" not in steps:
        return 0
    # one cProfile of each side (the profiler's cost is in both)
    import objcache.demo.demo_jobs as demo_jobs

    original = demo_jobs.run_job
    for label, machine, args, tiers in (
        ("warm", torch_machine, ["--objcache", "off"], ""),
        ("new", bench.fresh("new"), ["--objcache", "install"], store),
    ):
        prof = OUT / f"prof-{label}.prof"

        def profiled(a: Any, e: Any, *, p: Path = prof, **kw: Any) -> Any:
            cmd = [
                sys.executable,
                "-m",
                "cProfile",
                "-o",
                str(p),
                "-m",
                "objcache.demo.demo",
            ]
            return original(a, e, command=cmd, **kw)

        import bench.warm_start as ws_mod

        ws_mod.run_job = profiled  # type: ignore[assignment]
        try:
            say(f"profiled {label}:", brief(bench.run(machine, args, {}, tiers).result))
        finally:
            ws_mod.run_job = original  # type: ignore[assignment]

    # precompile entries on CUDA: served, or why not
    pstore = f"file://{root}/pstore"
    pre = {"OBJCACHE_PRECOMPILE": "1"}
    for label in ("writer", "new"):
        r = bench.run(bench.fresh("pre"), ["--objcache", "install"], dict(pre), pstore).result
        say(
            f"precompile {label}:",
            brief(r),
            "precompile:",
            json.dumps(r.get("stats", {}).get("precompile", r.get("integration", {})))[:1500],
        )

    # max-autotune with objcache's Triton store: a new machine should compile 0 kernels
    astore = f"file://{root}/astore"
    bench.mode = "max-autotune-no-cudagraphs"
    tri = {"OBJCACHE_TRITON": "1"}
    for label in ("cold", "new"):
        r = bench.run(bench.fresh("at"), ["--objcache", "install"], dict(tri), astore).result
        say(f"autotune+triton {label}:", brief(r))
        (OUT / f"autotune-{label}.json").write_text(
            json.dumps(r, indent=1, default=str)[:4_000_000]
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
