"""``objcache demo``: a cold compile, the same compile on a "new machine", then warm.

Three subprocesses compile and run one training step of a small model on the configured
tiers (``OBJCACHE_TIERS``) or the embedded default ``file://`` store, so it works on a laptop
without any cloud account:

1. **cold** — empty local dirs: every cache misses, everything is built and stored;
2. **new machine** — a fresh objcache local dir, a fresh ``TORCHINDUCTOR_CACHE_DIR`` and a
   fresh temp dir (where Inductor keeps precompiled headers): only the shared store is warm;
3. **warm** — the new machine again: torch's local caches are warm now.

Each run reports the wall time of its first step, hits per cache kind, bytes moved to and
from remote tiers, kernel g++ builds, and whether outputs and gradients match eager. The
model bakes a per-demo constant into its graph, so each demo's cold run really is cold.

Each run is a worker (:mod:`.demo_worker`) run as a simulated machine (:mod:`.demo_jobs`),
the workload of the tests and of ``bench/warm_start.py`` too:
``python -m objcache.demo.demo --worker ...`` runs one compile and prints one
JSON result line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from objcache.demo.demo_jobs import (
    Job,
    gxx_builds,
    machine_env,
    objcache_hits,
    remote_bytes,
    run_job,
)
from objcache.demo.demo_worker import model_name, worker_main

#: What ``objcache demo`` imports from here (``model_name`` is the worker's, for ``--model``).
__all__ = ["main", "model_name"]


def _fmt_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / 1024:.1f} KB"
    if n < 1 << 30:
        return f"{n / (1 << 20):.1f} MB"
    return f"{n / (1 << 30):.1f} GB"


def _hit_rows(results: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
    """(row label, one "hits/gets" cell per run): torch's own counts, then objcache's per kind."""
    rows = []
    for label, stem in (("torch fx-graph", "fxgraph"), ("torch aot-autograd", "autograd")):
        cells = []
        for r in results:
            counts = r.get("torch", {})
            hits = int(counts.get(f"{stem}_cache_hit", 0))
            total = hits + int(counts.get(f"{stem}_cache_miss", 0))
            cells.append(f"{hits}/{total}" if total else "-")
        rows.append((label, cells))
    per_run = [objcache_hits(r) for r in results]
    kinds = sorted({kind for hits in per_run for kind in hits} - {"manifest"})
    for kind in kinds:
        cells = [f"{hits[kind][0]}/{hits[kind][1]}" if kind in hits else "-" for hits in per_run]
        rows.append((f"objcache {kind}", cells))
    return rows


def render(console: Any, runs: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    """Print the demo's results: (run label, worker result) per run, the cold run first.

    Two narrow tables rather than one wide one, so that an 80-column terminal shows every
    value whole: the per-run figures, then hits per cache kind with the runs as columns (its
    width does not grow with the number of kinds).
    """
    from rich.table import Table

    results = [r for _, r in runs]
    table = Table(title="objcache demo: one training step, three machines' worth", show_edge=False)
    table.add_column("run", no_wrap=True)
    for header in ("first step", "from store", "to store", "g++ builds", "matches eager"):
        table.add_column(header, justify="right", no_wrap=True)
    for label, r in runs:
        down, up = remote_bytes(r)
        builds = gxx_builds(r)
        table.add_row(
            label,
            f"{r['first_step_s']:.1f} s",
            _fmt_bytes(down),
            _fmt_bytes(up),
            "-" if builds is None else str(builds),
            "[green]yes[/]" if r.get("match") else f"[red]no[/] ({r.get('max_abs_err'):.2g})",
        )
    console.print(table)
    hits = Table(title="cache hits/lookups per kind", show_edge=False)
    hits.add_column("cache", no_wrap=True)
    for label, _ in runs:
        hits.add_column(label, justify="right", no_wrap=True)
    for row_label, cells in _hit_rows(results):
        hits.add_row(row_label, *cells)
    console.print(hits)
    console.print("[dim]from/to store: bytes read from and written to the store's remote tiers[/]")
    console.print(
        "[dim]torch: lookups torch counted; objcache: lookups objcache served; -: none[/]"
    )
    cold, new = results[0], results[1]
    speedup = cold["first_step_s"] / max(new["first_step_s"], 1e-9)
    console.print(
        f"New machine: first step {new['first_step_s']:.1f}s instead of "
        f"{cold['first_step_s']:.1f}s ({speedup:.1f}x), {gxx_builds(new) or 0} kernel builds."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The demo (``objcache demo [--model M] [--keep]`` calls this) or, with --worker, a worker."""
    argv = list(argv or [])
    if "--worker" in argv:
        return worker_main(argv)
    parser = argparse.ArgumentParser(prog="objcache demo", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model",
        type=model_name,
        default="block",
        help="tiny, block, or a library model: torchvision:<name>, timm:<name>",
    )
    parser.add_argument("--keep", action="store_true", help="keep the demo's temp dirs")
    parser.add_argument("--timeout", type=float, default=900.0)
    opts = parser.parse_args(argv)
    return _demo(opts.model, opts.keep, opts.timeout)


def _run_with_progress(
    console: Any, what: str, args: Sequence[str], env: Mapping[str, str], timeout: float
) -> Job:
    """Run one worker under a spinner showing its current stage and elapsed time."""
    started = time.perf_counter()
    stage = ["starting"]
    done = threading.Event()
    with console.status(what) as status:

        def on_stage(name: str) -> None:
            stage[0] = name

        def tick() -> None:
            while not done.is_set():
                elapsed = time.perf_counter() - started
                status.update(f"{what} — {stage[0]} ({elapsed:.0f}s)")
                done.wait(0.5)

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            return run_job(args, env, on_stage=on_stage, timeout=timeout)
        finally:
            done.set()
            ticker.join()


def _demo(model: str, keep: bool, timeout: float) -> int:
    from rich.console import Console

    from objcache.config.settings import Config

    console = Console()
    config = Config.from_env()
    tiers = ", ".join(t.display for t in config.effective_tiers())
    console.print(f"[bold]objcache demo[/]: model [cyan]{model}[/], store {tiers}")
    if not config.tiers:
        console.print("(the embedded default: set OBJCACHE_TIERS to use yours)", highlight=False)
    root = tempfile.mkdtemp(prefix="objcache-demo-")
    run_id = os.urandom(4).hex()
    salt = 1.0 + int(run_id, 16) * 1e-12
    cold_env = machine_env(os.path.join(root, "machine-a"))
    new_env = machine_env(os.path.join(root, "machine-b"))
    for env in (cold_env, new_env):
        env["OBJCACHE_JOB"] = f"objcache-demo-{run_id}"
        env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    args = ["--model", model, "--salt", repr(salt), "--objcache", "install"]
    plan = [
        ("cold", cold_env, "compiling from scratch (g++ for every kernel)"),
        ("new machine", new_env, "fresh local dirs, shared store"),
        ("warm", new_env, "same machine again"),
    ]
    jobs: list[tuple[str, Job]] = []
    try:
        for label, env, what in plan:
            job = _run_with_progress(console, f"{label}: {what}", args, env, timeout)
            jobs.append((label, job))
            if not job.ok:
                console.print(f"[red]{label} run failed:[/] {job.result.get('error', '')}")
                for line in job.stderr_tail[-20:]:
                    console.print(f"  {line}", highlight=False, markup=False)
                return 1
            console.print(f"  {label}: first step {job.result['first_step_s']:.1f}s")
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)

    render(console, [(label, job.result) for label, job in jobs])
    ok = all(job.result.get("match") for _, job in jobs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
