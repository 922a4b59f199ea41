"""What objcache's key readings cost a compile: the reads of what the program put into torch.

    python bench/key_readings.py --repeats 7 --out docs/benchmarks.md

Every graph's key names what the program registered in or replaced of torch outside the
graph (docs/torch.md, "Custom ops in the keys"): Inductor's and AOTAutograd's namespaces, the
program's entries in the decomposition and lowering tables, the edits of torch's own data,
the tokens saying whether any of it changed. These readings run in the compiling thread, at
the first compile window of a process (everything found once) and again at each later window
(only the tokens, and what changed). This script measures both in a fresh interpreter set up
as a compile leaves it: ``objcache.install()`` (no store), then Inductor's lowering, code
generators, passes and AOTAutograd's partitioner imported. Per part: the median and the
fastest of ``--repeats`` readings, a first reading with every memo of the part cleared, a
later one with only the window changed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _chart  # noqa: E402
from bench._installed import compile_bytecode  # noqa: E402
from bench.warm_start import write_section  # noqa: E402

SECTION = "key_readings"

CHILD = r"""
import importlib, json, statistics, sys, time
import objcache

objcache.install()
import torch

for name in (
    "torch._inductor.lowering", "torch._inductor.codegen.cpp",
    "torch._inductor.codegen.cpp_wrapper_cpu", "torch._inductor.fx_passes.joint_graph",
    "torch._inductor.fx_passes.post_grad", "torch._inductor.compile_fx",
    "torch._inductor.codegen.simd", "torch._functorch.partitioners",
):
    importlib.import_module(name)
from objcache.integrations.torch.precompile import (
    inductor_namespace as ns, op_overrides as ops, program_registrations as regs, torch_edits,
)


def forget():
    for memo in (ns._read_memo, ns._scanned_held, ns._scanned_hash, ns._scanned_programs,
                 regs._entries_memo, regs._entry_seen, regs._entry_found,
                 ops._overrides_memo, ops._named_memo):
        memo.clear()


def next_window():
    # the same reading, asked for by another compile window
    ns._read_memo[:] = [(object(), ns._read_memo[0][1])] if ns._read_memo else []
    ops._named_memo.clear()


def timed(read, before, repeats):
    seconds = []
    for _ in range(repeats):
        before()
        started = time.perf_counter()
        read()
        seconds.append(time.perf_counter() - started)
    return [statistics.median(seconds) * 1e3, min(seconds) * 1e3]


repeats = int(sys.argv[1])
parts = {
    "all (op_overrides.torch_overrides)": ops._torch_overrides,
    "Inductor's namespaces": ns._read,
    "tables' program entries": regs._program_entries,
    "torch's data and tables (edits)": torch_edits.changes,
    "tokens (tables, torch's data)": ops.token,
}
rows = []
for label, read in parts.items():
    first = timed(read, forget, repeats)
    read()
    later = timed(read, next_window, repeats)
    rows.append([label, *first, *later])
namespaces, registries, _ = ns._loaded()
print(json.dumps({"rows": rows, "torch": torch.__version__, "namespaces": len(namespaces),
                  "names": sum(len(held) for _, held in namespaces),
                  "registries": len(registries)}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, help="write the table into this Markdown file")
    opts = parser.parse_args()
    compile_bytecode()  # as an installed objcache runs (bench/_installed.py)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(opts.repeats)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "OBJCACHE_TIERS": ""},
    )
    if done.returncode:
        sys.exit(done.stderr[-3000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    command = f"python bench/key_readings.py --repeats {opts.repeats}"
    lines = [
        f"<!-- bench:{SECTION} -->",
        f"_torch {result['torch']}; {result['namespaces']:,} namespaces holding "
        f"{result['names']:,} names, {result['registries']} registries. Reproduce: "
        f"`{command}`_",
        "",
        "| reading | first window: median ms | fastest | later window: median ms | fastest |",
        "|---|---|---|---|---|",
        *(
            f"| {label} | {a:.1f} | {b:.1f} | {c:.1f} | {d:.1f} |"
            for label, a, b, c, d in result["rows"]
        ),
        f"<!-- /bench:{SECTION} -->",
    ]
    table = "\n".join(lines)
    print(table)
    if opts.out is not None:
        write_section(opts.out, table, SECTION)
        spec = {
            "chart": "bars",
            "title": "objcache's key readings in the compiling thread, first window (ms)",
            "xlabel": "median ms of one reading",
            "source": f"bench/key_readings.py, docs/benchmarks.md section {SECTION}",
            "rows": [[row[0], round(row[1], 2)] for row in result["rows"]],
            "highlight": "",
        }
        chart = _chart.write_beside(opts.out, SECTION, spec)
        if chart is not None:
            print(f"chart: {chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
