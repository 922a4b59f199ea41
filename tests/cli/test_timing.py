"""``objcache explain --time``: phase times in run summaries, compared with a warm run.

The real-compile case (a new machine made slow on purpose, named by its phase) is
``tests/integrations/torch/remote/test_pgo.py::test_explain_time_names_the_phase_a_new_machine_spent_longer_in_and_why``.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from objcache.backends import create_backend
from objcache.backends.base import PutMode
from objcache.cli import main as cli
from objcache.cli import prefetch_view, report, timing
from objcache.config.urls import parse_tier_list
from objcache.entry.codec import Codec
from objcache.entry.layout import Namespace
from objcache.observe import run_summary as summary

ENV = "0123456789abcdef"
JOB = "train"


def stats(local_hits: int, remote_hits: int, absent: int) -> dict[str, Any]:
    lookups = local_hits + remote_hits + absent
    return {
        "cache": {
            "gets": {"kernel": lookups},
            "hits": {"kernel": local_hits + remote_hits},
            "lookup_ms_total": 10.0 * (remote_hits + absent),
            "lookup": {"count": lookups},
            "phase_ms": {"node lease": (50.0, 2)} if remote_hits else {},
        },
        "tiers": [
            {
                "name": "disk:///l",
                "local": True,
                "kinds": {"kernel": {"hit": local_hits, "absent": remote_hits + absent}},
                "get_latency": {"count": lookups, "mean_ms": 0.1},
            },
            {
                "name": "s3://b/p",
                "local": False,
                "kinds": {"kernel": {"hit": remote_hits, "absent": absent}},
                "get_latency": {"count": remote_hits + absent, "mean_ms": 40.0},
            },
        ],
    }


def body(
    run: str,
    started: float,
    st: dict[str, Any],
    phases: dict[str, float],
    duration: float = 10.0,
    recompiles: list[tuple[str, str, float]] | None = None,
    prefetch: dict[str, Any] | None = None,
) -> bytes:
    built = summary.build(
        st,
        job=JOB,
        run=run,
        started=started,
        ended=started + duration,
        host="node",
        phases={k: (v, 1) for k, v in phases.items()},
        recompiles=recompiles,
        prefetch=prefetch,
    )
    return summary.encode(built)


def plant(tmp_path: Path, items: list[tuple[str, bytes]]) -> str:
    url = f"file://{tmp_path / 'store'}"
    backend, codec = create_backend(parse_tier_list(url, "t")[0]), Codec()

    async def put() -> None:
        for run, data in items:
            okey = Namespace(ENV).object_key(summary.KIND, f"{JOB}/{run}")
            await backend.put(okey, codec.encode(data, okey), PutMode.CREATE)
        await backend.close()

    asyncio.run(put())
    return url


WARM = {
    "torch:_compile.compile_inner": 2.0,
    "torch:bytecode_tracing": 0.2,
    "torch:PyCodeCache.load_by_key_path": 1.0,
    "torch:compile_file": 0.1,
}
NEW = {
    "torch:_compile.compile_inner": 5.0,
    "torch:bytecode_tracing": 0.2,
    "torch:PyCodeCache.load_by_key_path": 1.1,
    "torch:GraphLowering.run": 2.5,
    "torch:compile_file": 0.9,
}


SHARED = ("forward (model.py:10)", "tensor 'x' size mismatch at index 0. expected 4, actual 6", 0.5)
NEW_R = ("forward (model.py:10)", "L['self'].act == 'relu'", 0.7)


def test_a_new_machine_is_put_next_to_the_nearest_warm_run(tmp_path: Path) -> None:
    now = int(time.time())
    url = plant(
        tmp_path,
        [
            (
                f"run-{now - 300}-1-aa",
                body(f"run-{now - 300}-1-aa", now - 300, stats(0, 0, 8), NEW),
            ),
            (
                f"run-{now - 200}-2-bb",
                body(f"run-{now - 200}-2-bb", now - 200, stats(8, 0, 0), WARM, 4.0, [SHARED]),
            ),
            (
                f"run-{now - 100}-3-cc",
                body(f"run-{now - 100}-3-cc", now - 100, stats(0, 2, 6), NEW, 8.0, [SHARED, NEW_R]),
            ),
        ],
    )
    out = CliRunner().invoke(cli.app, ["explain", "--time", "--job", JOB, "--tier", url, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["run"]["run"] == f"run-{now - 100}-3-cc"  # the newest not warm-local
    assert data["warm"]["run"] == f"run-{now - 200}-2-bb"  # not the cold run
    ranked = [p for p in data["phases"] if not p["total"]]
    assert ranked[0]["phase"] == "torch:GraphLowering.run"
    assert "asked objcache for none of it (fx-graph" in ranked[0]["why"], ranked[0]
    node_lease = next(p for p in ranked if p["phase"] == "objcache:node lease")
    assert node_lease["this_run_s"] == 0.05 and node_lease["why"]
    gxx = next(p for p in ranked if p["phase"] == "torch:compile_file")
    assert "kernel 2/8" in gxx["why"] and "absent=6" in gxx["why"], gxx
    totals = [p["phase"] for p in data["phases"] if p["total"]]
    assert totals == ["torch:_compile.compile_inner"]
    remote = next(p for p in ranked if p["phase"].startswith("objcache:get remote"))
    assert "local tier answered 8 of its 8" in remote["why"]
    text = CliRunner().invoke(
        cli.app, ["explain", "--time", "--job", JOB, "--tier", url], env={"COLUMNS": "200"}
    )
    assert text.exit_code == 0, text.output
    first = text.output.index("lowering the graph (a miss)")
    assert first < text.output.index("Dynamo tracing the bytecode")
    assert "the warm run skipped it" in text.output
    # the time outside compiles: duration less the frame compiles (8 - 5 here, 4 - 2 warm)
    outside = next(p for p in ranked if p["phase"] == timing.OUTSIDE)
    assert (outside["this_run_s"], outside["warm_run_s"]) == (3.0, 2.0)
    # recompiles: both counted, only the reason the warm run did not have is printed
    assert len(data["run"]["recompiles"]) == 2 and len(data["warm"]["recompiles"]) == 1
    assert "recompiles: 2 in this run, 1 in the warm run" in text.output
    assert "L['self'].act == 'relu'" in text.output and "size mismatch" not in text.output


def test_summaries_without_phase_times_or_broken_are_skipped_and_counted(tmp_path: Path) -> None:
    now = int(time.time())
    old = json.loads(body(f"run-{now - 50}-4-dd", now - 50, stats(8, 0, 0), {}))
    del old["phases"]  # an older objcache's summary
    good = body(f"run-{now - 10}-6-ff", now - 10, stats(0, 2, 6), NEW)
    url = plant(
        tmp_path,
        [
            (f"run-{now - 50}-4-dd", summary.encode(old)),
            (f"run-{now - 40}-5-ee", good[: len(good) // 2]),  # half-written
            (f"run-{now - 30}-7-ab", b" " * (summary.MAX_BYTES + 1)),  # over its cap
            (f"run-{now - 10}-6-ff", good),
        ],
    )
    out = CliRunner().invoke(cli.app, ["explain", "--time", "--job", JOB, "--tier", url, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["warm"] is None and "no warm run" in data["note"]
    assert data["skipped"] == {
        "no phase times (an older objcache)": 1,
        "summary invalid": 1,
        "summary too_large": 1,
    }, data["skipped"]
    only_old = plant(tmp_path / "old", [(f"run-{now - 50}-4-dd", summary.encode(old))])
    none = CliRunner().invoke(cli.app, ["explain", "--time", "--job", JOB, "--tier", only_old])
    assert none.exit_code == 1
    assert none.output.count("\n") == 1 and "no run summary with phase times" in none.output


@pytest.mark.parametrize(
    "phases",
    [
        {"x": {"s": -1, "n": 1}},
        {"x": {"s": 1.0}},
        {"x": [1, 2]},
        {f"p{i}": {"s": 1.0, "n": 1} for i in range(summary.MAX_PHASES + 1)},
        [1],
    ],
)
def test_a_summary_with_hostile_phases_is_invalid(phases: Any) -> None:
    good = json.loads(body("run-1-1-aa", 1.0, stats(1, 0, 0), WARM))
    good["phases"] = phases
    with pytest.raises(summary.SummaryError):
        summary.parse(json.dumps(good).encode())


@pytest.mark.parametrize(
    "recompiles",
    [
        [["f", "r", 1.0]],
        [{"frame": "f", "reason": "", "s": 1.0}],
        [{"frame": "f", "reason": "r", "s": -1}],
        [{"frame": "f", "reason": "x" * (summary.MAX_STR + 1), "s": 1.0}],
        [{"frame": "f", "reason": "r", "s": 1.0}] * (summary.MAX_RECOMPILES + 1),
        {"frame": "f"},
    ],
)
def test_a_summary_with_hostile_recompiles_is_invalid(recompiles: Any) -> None:
    good = json.loads(body("run-1-1-aa", 1.0, stats(1, 0, 0), WARM))
    good["recompiles"] = recompiles
    with pytest.raises(summary.SummaryError):
        summary.parse(json.dumps(good).encode())


def test_recompiles_are_read_from_torch_with_their_reasons() -> None:
    """torch's own recompile reasons (a real Dynamo recompile); how they are redacted:
    tests/observe/test_recompile_reasons.py."""
    torch = pytest.importorskip("torch")
    from objcache.integrations.torch.timing import phase_times

    torch._dynamo.reset()
    torch._dynamo.utils.clear_compilation_metrics()

    def step(x: Any) -> Any:
        return x.sin() + 1

    compiled = torch.compile(step, backend="eager", dynamic=False)
    compiled(torch.ones(3))
    compiled(torch.ones(3, dtype=torch.float64))
    seen = phase_times.recompiles()
    assert len(seen) == 1, seen
    frame, reason, took = seen[0]
    assert frame.startswith("step (test_timing.py:") and "dtype mismatch" in reason, seen
    assert took > 0
    assert phase_times.snapshot()["torch:_compile.compile_inner"][1] == 2


def test_a_warm_local_run_asked_nothing_or_its_local_tier() -> None:
    def row(local: int, remote: int, absent: int) -> report.Row:
        data = summary.parse(body("run-1-1-aa", 1.0, stats(local, remote, absent), WARM))
        return report.Row.from_summary(data)

    assert row(0, 0, 0).warm_local  # torch's own caches answered before objcache was asked
    assert row(8, 0, 0).warm_local
    assert not row(0, 8, 0).warm_local  # a new machine served by the store
    assert not row(0, 0, 8).warm_local  # cold
    assert timing.label("torch:some_phase_torch_adds_later") == "some_phase_torch_adds_later"


def test_store_strings_reach_the_terminal_escaped(tmp_path: Path) -> None:
    """A summary's recompile reason, frame and phase name are any writer's strings: printed
    escaped, never as terminal control sequences."""
    now = int(time.time())
    evil = "\x1b]0;owned\x07\x1b[2J"
    warm = body(f"run-{now - 20}-1-aa", now - 20, stats(8, 0, 0), WARM, 4.0)
    slow = body(
        f"run-{now - 10}-2-bb", now - 10, stats(0, 2, 6), {**NEW, f"torch:{evil}": 1.0},
        8.0, [(f"f{evil}", f"guard {evil}", 0.5)],
    )  # fmt: skip
    url = plant(tmp_path, [(f"run-{now - 20}-1-aa", warm), (f"run-{now - 10}-2-bb", slow)])
    out = CliRunner().invoke(
        cli.app, ["explain", "--time", "--job", JOB, "--tier", url], env={"COLUMNS": "200"}
    )
    assert out.exit_code == 0, out.output
    assert "guard" in out.output and "recompiles: 1 in this run" in out.output
    assert "\x1b" not in out.output and "\x07" not in out.output


# --- the prefetch's section ------------------------------------------------------------------

FAR = "s3://ml-cache/objcache"


def recorded_prefetch(**changes: Any) -> dict[str, Any]:
    """A prefetch time line as a run records it (objcache/observe/prefetch_timeline.py): a
    new machine whose far store sent 406 MiB in 2.03 s while the compiles waited on it."""
    waits = [
        {"kind": kind, "key": key, "s": s, "at_s": at, "tier": FAR}
        for kind, key, s, at in (
            ("aot-autograd", "a1b2c3d4e5f60718", 0.12, 0.95),
            ("fx-graph", "f00dfeed00112233", 0.09, 1.02),
            ("kernel", "c0ffee0123456789", 0.05, 1.30),
            ("kernel", "badc0de987654321", 0.03, 1.41),
        )
    ]
    body = {
        "since": "process start", "started_s": 0.21, "manifest_s": 0.35, "ended_s": 2.4,
        "first_lookup_s": 0.8, "last_arrival_s": 2.38, "manifests": 2, "keys": 200,
        "already_local": 20, "requested": 180, "fetched": 180, "bytes": 406 << 20,
        "not_found": 0, "elsewhere": 0, "by_tier": {FAR: {"n": 180, "bytes": 406 << 20}},
        "entries": [
            {"kind": "aot-autograd", "key": "a1b2c3d4e5f60718", "requested_s": 0.36,
             "arrived_s": 1.07, "bytes": 5 << 20, "tier": FAR},
        ],
        "entries_left_out": 0,
        "lookups": {"served": 40, "waited": 12, "missed": 3, "local": 5, "absent": 0},
        "wait_s": 0.42, "missed_reasons": {"not requested yet": 3}, "waits": waits,
        "errors": 0,
    }  # fmt: skip
    body.update(changes)
    return body


def explain_time(tmp_path: Path, prefetch: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """``objcache explain --time`` of a new machine's run whose summary carries ``prefetch``,
    next to a warm run: its text and its --json."""
    now = int(time.time())
    warm = body(f"run-{now - 20}-1-aa", now - 20, stats(8, 0, 0), WARM, 4.0)
    slow = body(f"run-{now - 10}-2-bb", now - 10, stats(0, 8, 0), NEW, 8.0, prefetch=prefetch)
    url = plant(tmp_path, [(f"run-{now - 20}-1-aa", warm), (f"run-{now - 10}-2-bb", slow)])
    args = ["explain", "--time", "--job", JOB, "--tier", url]
    text = CliRunner().invoke(cli.app, args, env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    data = CliRunner().invoke(cli.app, [*args, "--json"])
    assert data.exit_code == 0, data.output
    return text.output, json.loads(data.output)


def section(output: str) -> list[str]:
    lines = output.splitlines()
    return lines[lines.index("prefetch (times since process start):") :]


def test_explain_time_shows_the_prefetch_and_names_the_store_when_lookups_waited(
    tmp_path: Path,
) -> None:
    text, data = explain_time(tmp_path, recorded_prefetch())
    assert section(text) == [
        "prefetch (times since process start):",
        "  started 0.21 s, manifest 0.35 s, ended 2.40 s; first lookup 0.80 s",
        f"  fetched 180 of 200 entries (20 already local), 406.0 MiB in 2.03 s: "
        f"200.0 MiB/s ({FAR} 180)",
        "  lookups: 40 served by the prefetch, 12 waited (0.42 s in all), 3 missed it "
        "(not requested yet 3), 5 local already, 0 in no tier",
        f"    waited 0.120 s  aot-autograd a1b2c3d4e5f60718 at 0.95 s from {FAR}",
        f"    waited 0.090 s  fx-graph f00dfeed00112233 at 1.02 s from {FAR}",
        f"    waited 0.050 s  kernel c0ffee0123456789 at 1.30 s from {FAR}",
        "  verdict: the store was the bottleneck: lookups waited 0.42 s for entries still "
        "in flight (it fetched at 200.0 MiB/s)",
    ]
    p = data["prefetch"]
    assert p["cause"] == "store" and p["verdict"].startswith("the store was the bottleneck")
    assert p["throughput_bytes_s"] == round((406 << 20) / 2.03, 1)
    assert p["lookups"] == {"served": 40, "waited": 12, "missed": 3, "local": 5, "absent": 0}
    assert p["wait_s"] == 0.42 and len(p["waits"]) == 4  # --json has every wait recorded
    assert (p["started_s"], p["manifest_s"], p["ended_s"]) == (0.21, 0.35, 2.4)
    assert p["entries"][0]["tier"] == FAR and p["by_tier"][FAR]["n"] == 180


def test_a_prefetch_done_before_the_first_lookup_is_not_the_cause(tmp_path: Path) -> None:
    done = recorded_prefetch(
        ended_s=0.9, last_arrival_s=0.88, first_lookup_s=2.0, wait_s=0.0, waits=[],
        missed_reasons={}, lookups={"served": 55, "waited": 0, "missed": 0, "local": 5,
                                    "absent": 0},
    )  # fmt: skip
    text, data = explain_time(tmp_path, done)
    assert section(text)[-1] == (
        "  verdict: the prefetch finished 1.10 s before the first lookup: not the cause"
    )
    assert "waited 0." not in text  # no wait lines
    assert data["prefetch"]["cause"] == "not the cause"


@pytest.mark.parametrize(
    ("changes", "cause", "sentence"),
    [
        (
            {"manifest_s": 1.5, "first_lookup_s": 0.6, "wait_s": 0.0,
             "missed_reasons": {"before the manifest arrived": 30, "not requested yet": 1},
             "lookups": {"served": 2, "waited": 0, "missed": 31, "local": 0, "absent": 0}},
            "manifest",
            "the manifest arrived 0.90 s after the first lookup: 31 lookups fetched on their "
            "own (listing the store was slow)",
        ),
        (
            {"wait_s": 0.0, "missed_reasons": {"not in the manifest": 9},
             "lookups": {"served": 1, "waited": 0, "missed": 9, "local": 0, "absent": 2}},
            "missed",
            "9 of 10 lookups the store answered missed the prefetch (not in the manifest): "
            "the load path fetched them",
        ),
        (
            {"wait_s": 0.004, "lookups": {"served": 40, "waited": 2, "missed": 1, "local": 0,
                                          "absent": 0}},
            "not the cause",
            "the prefetch served 40 lookups without a wait: not the cause; the machine's "
            "phases above are",
        ),
        (
            {"first_lookup_s": None, "wait_s": 0.0, "lookups": dict.fromkeys(
                ("served", "waited", "missed", "local", "absent"), 0)},
            "not the cause",
            "no lookup while the prefetch ran: not the cause",
        ),
    ],
)  # fmt: skip
def test_the_verdict_names_what_held_the_lookups_back(
    changes: dict[str, Any], cause: str, sentence: str
) -> None:
    assert prefetch_view.verdict(recorded_prefetch(**changes)) == (cause, sentence)


def test_a_run_without_a_prefetch_has_no_prefetch_section(tmp_path: Path) -> None:
    text, data = explain_time(tmp_path, None)
    assert "prefetch (times since" not in text and "verdict" not in text
    assert data["prefetch"] is None
