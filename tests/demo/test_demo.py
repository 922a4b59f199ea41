"""``objcache demo``'s report, rendered from worker results without compiling anything: it
fits an 80-column terminal with every value whole, and stays the same when wider; and the
demo's three runs (cold, then a new machine twice) with the worker's runs faked."""

from __future__ import annotations

import io
import os
from typing import Any

import pytest
from rich.console import Console

from objcache.demo import demo


def result(
    first_step_s: float,
    *,
    gets: dict[str, int],
    hits: dict[str, int],
    torch: dict[str, int],
    read: int,
    written: int,
    builds: int,
    err: float | None = None,
) -> dict[str, Any]:
    """A worker's result line, as ``demo_worker`` prints it, with the fields the report reads."""
    return {
        "ok": True,
        "match": err is None,
        "max_abs_err": err or 0.0,
        "first_step_s": first_step_s,
        "torch": torch,
        "stats": {
            "cache": {"gets": gets, "hits": hits},
            "tiers": [
                {"local": True, "bytes_read": 999, "bytes_written": 999},
                {"local": False, "bytes_read": read, "bytes_written": written},
            ],
        },
        "integration": {"kernels": {"builds": builds}},
    }


KINDS = {"aot-autograd": 1, "fx-graph": 2, "kernel": 12, "pgo": 1, "manifest": 1}
SERVED = {**KINDS, "kernel": 11}
#: A demo of model ``block`` on the embedded default store (figures as docs/benchmarks.md's).
TYPICAL = [
    (
        "cold",
        result(
            25.64,
            gets=KINDS,
            hits={},
            torch={"fxgraph_cache_miss": 2, "autograd_cache_miss": 1},
            read=0,
            written=2_345_678,
            builds=12,
        ),
    ),
    (
        "new machine",
        result(
            3.88,
            gets=SERVED,
            hits=SERVED,
            torch={"fxgraph_cache_hit": 2, "autograd_cache_hit": 1},
            read=1_234_567,
            written=0,
            builds=0,
        ),
    ),
    (
        "warm",
        result(
            2.66,
            gets={},
            hits={},
            torch={"fxgraph_cache_hit": 2, "autograd_cache_hit": 1},
            read=0,
            written=0,
            builds=0,
        ),
    ),
]
TYPICAL_ROWS = {
    "cold": ["25.6 s", "0 B", "2.2 MB", "12", "yes"],
    "new machine": ["3.9 s", "1.2 MB", "0 B", "0", "yes"],
    "warm": ["2.7 s", "0 B", "0 B", "0", "yes"],
    "torch fx-graph": ["0/2", "2/2", "2/2"],
    "torch aot-autograd": ["0/1", "1/1", "1/1"],
    "objcache aot-autograd": ["0/1", "1/1", "-"],
    "objcache fx-graph": ["0/2", "2/2", "-"],
    "objcache kernel": ["0/12", "11/11", "-"],
    "objcache pgo": ["0/1", "1/1", "-"],
}

#: The widest values each column can hold: three-digit seconds, bytes just under the next
#: unit, four-digit builds, outputs that differ from eager, and more cache kinds.
MANY = {"autotune": 40, "bundled-autotune": 3, "fx-graph": 120, "kernel": 1500, "precompile": 2}
WIDE = [
    (
        "cold",
        result(
            123.45,
            gets=MANY,
            hits={},
            torch={"fxgraph_cache_miss": 120, "autograd_cache_miss": 60},
            read=1023 * 1024 + 900,
            written=(1 << 30) - 1,
            builds=1500,
            err=1.2e-05,
        ),
    ),
    (
        "new machine",
        result(
            100.0,
            gets=MANY,
            hits=MANY,
            torch={"fxgraph_cache_hit": 120, "autograd_cache_hit": 60},
            read=5 << 30,
            written=0,
            builds=0,
        ),
    ),
    ("warm", result(99.9, gets={}, hits={}, torch={}, read=0, written=0, builds=0)),
]
WIDE_ROWS = {
    "cold": ["123.5 s", "1023.9 KB", "1024.0 MB", "1500", "no (1.2e-05)"],
    "new machine": ["100.0 s", "5.0 GB", "0 B", "0", "yes"],
    "warm": ["99.9 s", "0 B", "0 B", "0", "yes"],
    "torch fx-graph": ["0/120", "120/120", "-"],
    "torch aot-autograd": ["0/60", "60/60", "-"],
    "objcache autotune": ["0/40", "40/40", "-"],
    "objcache bundled-autotune": ["0/3", "3/3", "-"],
    "objcache fx-graph": ["0/120", "120/120", "-"],
    "objcache kernel": ["0/1500", "1500/1500", "-"],
    "objcache precompile": ["0/2", "2/2", "-"],
}


def rendered(runs: list[tuple[str, dict[str, Any]]], width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    demo.render(console, runs)
    return console.export_text()


def cells(text: str, sep: str) -> dict[str, list[str]]:
    """Each line of a table with ``sep`` between its cells: first cell -> the other cells."""
    rows = {}
    for line in text.splitlines():
        if sep in line:
            first, *rest = (cell.strip() for cell in line.split(sep))
            rows[first] = rest
    return rows


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize(("runs", "rows"), [(TYPICAL, TYPICAL_ROWS), (WIDE, WIDE_ROWS)])
def test_the_report_fits_80_columns_with_every_value_whole_on_its_row(
    runs: list[tuple[str, dict[str, Any]]], rows: dict[str, list[str]], width: int
) -> None:
    text = rendered(runs, width)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "…" not in text, text
    # one line per row, each value whole in its cell (a wrapped cell leaves a row whose
    # first cell is empty)
    assert cells(text, "│") == rows, text
    headers = cells(text, "┃")
    assert headers["run"] == ["first step", "from store", "to store", "g++ builds", "matches eager"]
    assert headers["cache"] == ["cold", "new machine", "warm"]
    # what the short headers stand for, under the tables
    assert "from/to store: bytes read from and written to the store's remote tiers" in text
    assert "torch: lookups torch counted; objcache: lookups objcache served; -: none" in text


def test_the_report_ends_with_the_new_machine_against_the_cold_one() -> None:
    text = rendered(TYPICAL, 80)
    summary = "New machine: first step 3.9s instead of 25.6s (6.6x), 0 kernel builds."
    assert text.splitlines()[-1] == summary


def test_demo_runs_cold_then_a_new_machine_twice_and_prints_the_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from objcache.demo import demo, demo_jobs

    machines: list[str] = []

    def fake_run_job(args: Any, env: Any, **kw: Any) -> demo_jobs.Job:
        machines.append(env["TORCHINDUCTOR_CACHE_DIR"])
        assert env["TMPDIR"].startswith(os.path.dirname(env["TORCHINDUCTOR_CACHE_DIR"]))
        kw["on_stage"]("compile")
        n = len(machines) - 1
        result = {
            "ok": True,
            "match": True,
            "first_step_s": (40.0, 5.0, 4.0)[n],
            "torch": {"fxgraph_cache_miss": 2} if n == 0 else {"fxgraph_cache_hit": 2},
            "stats": {
                "cache": {"gets": {"fx-graph": 2}, "hits": {"fx-graph": 2 if n == 1 else 0}},
                "tiers": [{"local": False, "bytes_read": 2048 * n, "bytes_written": 0}],
            },
            "integration": {"kernels": {"builds": (10, 0, 0)[n]}},
        }
        return demo_jobs.Job(result, 1.0, 0)

    monkeypatch.setattr(demo, "run_job", fake_run_job)
    monkeypatch.setenv("COLUMNS", "200")
    assert demo.main() == 0  # what `objcache demo` calls: no arguments
    out = capsys.readouterr().out
    assert machines[0] != machines[1] == machines[2]
    for text in ("cold", "new machine", "warm", "objcache fx-graph", "8.0x", "0 kernel builds"):
        assert text in out, text
