"""bench/warm_start_matrix.py: cases parsed, each case's paired ratio, the median and the
worst, and the phases that differ most (totals, which hold other phases, never named)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from bench import warm_start_matrix as matrix
from bench.warm_start import BASELINE, Scenario, new_machine_label
from objcache.demo.demo_jobs import Job

NEW = new_machine_label("file")


def job(step: float, phases: dict[str, float], gc_s: float = 0.0, full: int = 0) -> Job:
    result: dict[str, Any] = {
        "first_step_s": step,
        "gc_s": gc_s,
        "gc_full": full,
        "graphs": 1,
        "phases": {f"torch:{k}": [v, 1] for k, v in phases.items()},
    }
    return Job(result, step + 4, 0)


def case(text: str, warm: list[float], new: list[float], slow_phase: str) -> matrix.Case:
    c = matrix.parse_case(text)
    base, row = (
        Scenario(BASELINE, lambda i: NotImplemented),
        Scenario(NEW, lambda i: NotImplemented),
    )
    for w, n in zip(warm, new, strict=True):
        base.jobs.append(
            job(w, {"_compile.compile_inner": w, slow_phase: 0.1, "build_guards": 0.05})
        )
        row.jobs.append(job(n, {"_compile.compile_inner": n, slow_phase: 0.1 + n - w}))
    c.rows = [base, row]
    return c


def test_cases_are_model_step_and_sizes() -> None:
    c = matrix.parse_case("transformers:llama train 2,4")
    assert (c.model, c.step, c.sizes) == ("transformers:llama", "train", "2,4")
    with pytest.raises(argparse.ArgumentTypeError, match="train or infer"):
        matrix.parse_case("transformers:llama serve 2")
    assert len(matrix.CASES) >= 6
    assert len({matrix.parse_case(c).model.split(":")[0] for c in matrix.CASES}) >= 2


def test_the_table_gives_each_ratio_the_median_and_the_worst_with_its_phases() -> None:
    cases = [
        case("a:x train 2", [2.0, 2.0, 2.0], [2.0, 2.2, 2.0], "PyCodeCache.load_by_key_path"),
        case("a:y infer 2", [2.0, 2.0, 2.0], [1.8, 1.8, 1.8], "compile_file"),
        case("b:z train 2,4", [2.0, 2.0, 2.0], [2.4, 2.4, 2.4], "async_compile.wait"),
    ]
    opts = argparse.Namespace(
        runs=3, section="s", rtt_ms=0, remote=None, precompile=False, gc_as_found=False
    )
    table, ratios = matrix.render(cases, opts, "python bench/warm_start_matrix.py")
    assert ratios == pytest.approx([1.0, 0.9, 1.2])
    assert "Median 1.00x" in table and "worst 1.20x (b:z train 2,4; target ≤ 1.05x)" in table
    row = next(line for line in table.splitlines() if line.startswith("| b:z"))
    assert "| 1.20x | 1.07x |" in row  # the whole process: (2.4 + 4) / (2.0 + 4)
    assert row.index("async_compile.wait") < row.index("build_guards")
    assert "compile_fx" not in table
    assert "_compile.compile_inner" not in table  # a total: it holds the others


def test_with_precompile_entries_every_case_has_the_precompile_target() -> None:
    cases = [case("a:x train 2", [2.0], [1.0], "compile_file")]
    near = argparse.Namespace(
        runs=1, section="s", rtt_ms=0, remote=None, precompile=True, gc_as_found=False
    )
    table = matrix.render(cases, near, "c")[0]
    assert "worst 0.50x (a:x train 2; target ≤ 0.60x)" in table
    assert "counted after the import of Inductor's compiler" in table
    far = argparse.Namespace(
        runs=1, section="s", rtt_ms=50, remote=["s3"], precompile=True, gc_as_found=False
    )
    assert "target ≤ 0.70x)" in matrix.render(cases, far, "c")[0]


def test_the_collector_s_time_in_each_row_s_step_is_shown() -> None:
    """A full collection in one row's timed step and not the other's moves a ratio by tenths
    of a second: the table says what the collector took in each row."""
    c = case("a:x train 2", [2.0, 2.0, 2.0], [2.0, 2.0, 2.0], "compile_file")
    base, new = c.rows
    base.jobs = [job(2.0, {}, 0.40, 1), job(2.0, {}, 0.35, 1), job(2.0, {}, 0.05)]
    new.jobs = [job(2.0, {}, 0.04), job(2.0, {}, 0.06), job(2.0, {}, 0.05)]
    opts = argparse.Namespace(
        runs=3, section="s", rtt_ms=0, remote=None, precompile=False, gc_as_found=False
    )
    table = matrix.render([c], opts, "c")[0]
    row = next(line for line in table.splitlines() if line.startswith("| a:x"))
    assert "| 0.05/0.35 (1 full) |" in row
    assert "after a full garbage collection" in table
    opts.gc_as_found = True
    assert "the collector as each process found it" in matrix.render([c], opts, "c")[0]
