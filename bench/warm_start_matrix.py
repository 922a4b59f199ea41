"""Warm start on models nobody here wrote: a matrix of models, one torch release per run.

    python bench/warm_start_matrix.py --runs 2 --section warm_start_matrix_2_14_1
    python bench/warm_start_matrix.py --runs 2 --remote s3 --rtt-ms 50 --section ...
    python bench/warm_start_matrix.py --runs 2 --precompile --section ...

Each case is a model from a library (transformers configs of their own type, torch's stock
``nn`` modules), training or inference, at one or two input sizes (two: dynamic shapes and
PGO). Per case, the rows of ``bench/warm_start.py`` that the promise is about: torch alone on
its own warm local cache (the baseline, objcache off) and objcache's new machine (fresh local
dirs, served by a store one cold run filled, the job's prefetch manifest on), interleaved
round by round. Time = the ``torch.compile()`` call + the first step at each size (where every
compile happens), outputs compared with eager's in every run. The ratio is the paired median
(each round's new machine over the same round's warm-local run); the table gives each case's
ratio, the median and the worst, and for each case the torch phases (``dynamo_timed``, the
figures run summaries carry) that differ most between the two: where a slower start went.

The models need ``transformers`` installed beside torch (not an objcache dependency).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _chart  # noqa: E402
from bench._installed import compile_bytecode  # noqa: E402
from bench.warm_start import (  # noqa: E402
    BASELINE,
    Bench,
    Scenario,
    _cpu,
    new_machine_label,
    open_remotes,
    precompile_label,
    prepare_and_define,
    run_rounds,
    stop_servers,
    write_section,
)

#: model, step, sizes: six models or more, two families, training and inference, one and
#: two input sizes.
CASES = (
    "transformers:llama train 2,4",
    "transformers:gpt2 infer 1,3",
    "transformers:bert train 2",
    "transformers:qwen2 infer 2",
    "transformers:mistral train 2,4",
    "torch:transformer train 2,4",
    "torch:convnet infer 2",
)
TARGET_MEDIAN = 1.00
TARGET_WORST = 1.05
TARGET_WORST_FAR = 1.20
#: With precompile entries (``--precompile``): every case, near and a region away.
TARGET_PRECOMPILE = 0.60
TARGET_PRECOMPILE_FAR = 0.70
#: Phases shown per case, the biggest differences.
SHOWN_PHASES = 3
SECTION = "warm_start_matrix"


@dataclass
class Case:
    model: str
    step: str
    sizes: str
    rows: list[Scenario] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.model} {self.step} {self.sizes}"

    def row(self, label: str) -> Scenario:
        return next(sc for sc in self.rows if sc.name == label)


def parse_case(text: str) -> Case:
    model, step, sizes = text.split()
    if step not in ("train", "infer"):
        raise argparse.ArgumentTypeError(f"{text!r}: the step is train or infer")
    return Case(model, step, sizes)


def phase_medians(rows: Scenario) -> dict[str, float]:
    names = {n for j in rows.jobs for n in j.result.get("phases", {})}
    return {
        n: statistics.median(float(j.result.get("phases", {}).get(n, [0, 0])[0]) for j in rows.jobs)
        for n in names
    }


#: Phases that hold others (bench/../objcache/cli/timing.py's totals): never a cause.
def _totals() -> set[str]:
    from objcache.cli.timing import TOTALS

    return {name.split(":", 1)[1] for name in TOTALS}


def phase_differences(new: Scenario, base: Scenario) -> list[tuple[str, float, float]]:
    """(phase, new machine s, warm-local s), the biggest difference first, totals left out."""
    totals = _totals()
    mine, theirs = phase_medians(new), phase_medians(base)
    rows = [
        (name.split(":", 1)[1], mine.get(name, 0.0), theirs.get(name, 0.0))
        for name in mine.keys() | theirs.keys()
        if name.split(":", 1)[1] not in totals
    ]
    rows.sort(key=lambda r: -abs(r[1] - r[2]))
    return rows


def run_case(case: Case, opts: argparse.Namespace, root: Path, started: float) -> None:
    remotes = open_remotes(opts.remote, root)
    bench = Bench(
        root, case.model, remotes, opts.rtt_ms, case.sizes, inference=case.step == "infer"
    )
    if not opts.gc_as_found:
        # every row starts its timed step after a full collection: where the collector's
        # next full pass lands otherwise depends on how many objects each row's imports
        # left (docs/benchmarks.md, "Where a full collection lands")
        bench.worker_flags.append("--collect-first")
    if opts.precompile:
        # an entry loads inside torch.compile(): count from after the compiler's own import,
        # which every start pays alike (docs/benchmarks.md, "Precompile entries")
        bench.worker_flags.append("--compiler-imported")
    labels = {BASELINE}
    label = precompile_label if opts.precompile else new_machine_label
    for name in remotes:
        labels.add(label(name, opts.rtt_ms if opts.rtt_ms > 0 else 0))

    def wanted(label: str) -> bool:
        return label in labels

    case.rows = [sc for sc in prepare_and_define(bench, wanted) if wanted(sc.name)]
    run_rounds(bench, case.rows, opts.runs, started, f"{case.name}: ")


def _targets(opts: argparse.Namespace) -> tuple[float, float]:
    """(worst case's target, median's target) of this run."""
    far = opts.rtt_ms > 0 and any(n != "file" for n in (opts.remote or ["file"]))
    if opts.precompile:
        target = TARGET_PRECOMPILE_FAR if far else TARGET_PRECOMPILE
        return target, target
    return (TARGET_WORST_FAR if far else TARGET_WORST), TARGET_MEDIAN


def _gc(rows: Scenario) -> str:
    """The collector's median time in the timed step, with its full collections if any."""
    seconds = statistics.median(float(j.result.get("gc_s", 0.0)) for j in rows.jobs)
    full = statistics.median(int(j.result.get("gc_full", 0)) for j in rows.jobs)
    return f"{seconds:.2f}" + (f" ({full:g} full)" if full else "")


def render(cases: list[Case], opts: argparse.Namespace, command: str) -> tuple[str, list[float]]:
    import torch

    label = next(sc.name for sc in cases[0].rows if sc.name != BASELINE)
    lines = [
        f"<!-- bench:{opts.section} -->",
        f"_Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} vCPU "
        f"({_cpu()}), torch {torch.__version__}. Reproduce: `{command}`_",
        "",
        f"Row: *{label}* against *{BASELINE}*, {opts.runs} interleaved rounds per case; time "
        "= the `torch.compile()` call + the first step at each size"
        + (
            ", counted after the import of Inductor's compiler (`torch._inductor.compile_fx`, "
            "which the first `torch.compile()` call imports; paid alike by both rows)"
            if opts.precompile
            else ""
        )
        + (
            "; each timed step starts after a full garbage collection"
            if not opts.gc_as_found
            else "; the collector as each process found it"
        )
        + "; outputs equal eager's in every run. *ratio* is the paired median; *process* the "
        "ratio of the medians of the whole process (interpreter start to exit). *phases* are "
        "torch's own figures (`dynamo_timed`), medians, new machine / warm-local, the biggest "
        "differences.",
        "",
        "| case | warm-local (s) | new machine (s) | ratio | process | graphs "
        "| collector in the step (s) | phases that differ most |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    ratios = []
    for case in cases:
        base, new = case.row(BASELINE), case.row(label)
        ratio = new.paired_ratio(base)
        ratios.append(ratio)
        diffs = phase_differences(new, base)[:SHOWN_PHASES]
        phases = "; ".join(f"{n} {a:.2f}/{b:.2f}" for n, a, b in diffs)
        lines.append(
            f"| {case.name} | {base.median('first_step_s'):.2f} | {new.median('first_step_s'):.2f} "
            f"| {ratio:.2f}x | {new.median_wall() / base.median_wall():.2f}x "
            f"| {new.median_graphs()} | {_gc(new)}/{_gc(base)} | {phases} |"
        )
    worst = max(range(len(cases)), key=lambda i: ratios[i])
    far = opts.rtt_ms > 0 and any(n != "file" for n in (opts.remote or ["file"]))
    target, median_target = _targets(opts)
    lines += [
        "",
        f"Median {statistics.median(ratios):.2f}x (target ≤ {median_target:.2f}x"
        + (", near only" if far and not opts.precompile else "")
        + f"), worst {ratios[worst]:.2f}x ({cases[worst].name}; target ≤ {target:.2f}x).",
        f"<!-- /bench:{opts.section} -->",
    ]
    return "\n".join(lines), ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="interleaved rounds per case")
    parser.add_argument(
        "--case",
        action="append",
        type=parse_case,
        default=None,
        help="'MODEL train|infer SIZES' (repeatable; default: the matrix in CASES)",
    )
    parser.add_argument("--remote", action="append", default=None, help="file, s3 or NAME=URL")
    parser.add_argument("--rtt-ms", type=float, default=0, help="added round trip (0: none)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--section", default=SECTION)
    parser.add_argument(
        "--precompile",
        action="store_true",
        help="the new machine also gets precompile entries (OBJCACHE_PRECOMPILE=1)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep each case's temp dirs (printed) to read after"
    )
    parser.add_argument(
        "--gc-as-found",
        action="store_true",
        help="no full collection before the timed step (where the next one lands is left to "
        "each row's imports)",
    )
    opts = parser.parse_args()
    compile_bytecode()  # as an installed objcache runs (bench/_installed.py)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cases = opts.case or [parse_case(c) for c in CASES]
    started = time.time()
    try:
        for case in cases:
            root = Path(tempfile.mkdtemp(prefix="objcache-matrix-"))
            try:
                run_case(case, opts, root, started)
            finally:
                stop_servers()
                if opts.keep:
                    print(f"{case.name}: kept {root}", flush=True)
                else:
                    shutil.rmtree(root, ignore_errors=True)
    except KeyboardInterrupt:
        return 130
    argv = sys.argv[1:]
    shown = [
        a for i, a in enumerate(argv) if not a.startswith("--out") and argv[i - 1 : i] != ["--out"]
    ]
    command = "python bench/warm_start_matrix.py " + shlex.join(shown)
    table, ratios = render(cases, opts, command.strip())
    write_section(opts.out, table, opts.section)
    spec: dict[str, Any] = {
        "chart": "bars",
        "title": f"new machine / torch warm-local, per model ({opts.section})",
        "xlabel": "paired ratio (compile() + first steps)",
        "source": f"bench/warm_start_matrix.py, docs/benchmarks.md section {opts.section}",
        "rows": [[c.name, round(r, 3)] for c, r in zip(cases, ratios, strict=True)],
        "target": _targets(opts)[0],
        "highlight": "",
    }
    chart = _chart.write_beside(opts.out, opts.section, spec)
    print(table)
    if chart is not None:
        print(f"chart: {chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
