"""Dynamic-shape profiles travel through the store: a fresh machine starts dynamic.

A (objcache installed, cold) trains at batch 4, then 6: torch compiles a static graph, then
recompiles with the batch dim dynamic, and stores its profile (a PGO record, joined with every
other writer's). W is A's machine again (warm-local: torch reads its local profile). B is a
fresh machine sharing only the store: it must compile exactly as many graphs as W (no
recompile at batch 6), build no kernel, and match eager.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support import torch_runs as ts

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
]

BATCHES = ["--batches", "4,6"]
#: The job every run of this module records its summary under (tests/support/torch_runs.py).
JOB = "objcache-torch-test"
KERNEL_KIND = "kernel"
#: How much longer each g++ build of the slow machine takes: enough that the builds stay the
#: largest difference on a loaded machine (at 0.3 s a busy CI machine's module loads grew by
#: 17.8 s beside 11 builds, and the loads ranked first)
GXX_DELAY_S = 1.0


def machine(
    base: Path, name: str, store: Path, gxx_delay_s: float = 0.0
) -> tuple[dict[str, str], Path]:
    env = {**ts.compile_env(base / name, f"file://{store}"), **ts.PLAIN_PATH}
    env["OBJCACHE_PREFETCH"] = "0"  # the profile must come from the PGO record itself
    shim_dir, log = ts.make_gxx_shim(
        base / name / f"shim-{len(os.listdir(base))}", delay_s=gxx_delay_s
    )
    env["PATH"] = f"{shim_dir}{os.pathsep}{env.get('PATH', '')}"
    return env, log


@pytest.fixture(scope="module")
def pgo_runs(module_dir: Path) -> dict[str, dict[str, Any]]:
    base = module_dir
    store = base / "store"
    out: dict[str, dict[str, Any]] = {}
    for label, name in (("a", "a"), ("warm_local", "a"), ("fresh", "b")):
        env, log = machine(base, name, store)
        result = ts.run_compile(env, BATCHES)
        result["gxx"] = ts.gxx_builds(log)
        out[label] = result
    # one phase slow on purpose: a new machine whose store lost its C++ kernels (a copy of
    # the store, the others' run summaries included), with a g++ that takes GXX_DELAY_S longer
    slow_store = base / "store-without-kernels"
    shutil.copytree(store, slow_store)
    removed = [d for d in slow_store.glob(f"v1/*/{KERNEL_KIND}") if d.is_dir()]
    assert removed, sorted(str(p.relative_to(slow_store)) for p in slow_store.glob("v1/*/*"))
    for d in removed:
        shutil.rmtree(d)
    env, log = machine(base, "c", slow_store, gxx_delay_s=GXX_DELAY_S)
    result = ts.run_compile(env, BATCHES)
    result["gxx"] = ts.gxx_builds(log)
    result["store"] = str(slow_store)
    out["slow_gxx"] = result
    return out


def test_the_cold_run_recompiles_once_and_stores_its_profile(
    pgo_runs: dict[str, dict[str, Any]],
) -> None:
    a = pgo_runs["a"]
    assert a["match"], a["max_abs_err"]
    assert a["graphs"] == 2, "batch 4 static, then a dynamic recompile at 6"
    assert pgo_runs["warm_local"]["graphs"] == 1, "the local profile: the first compile is dynamic"


def test_a_fresh_machine_compiles_as_many_graphs_as_warm_local(
    pgo_runs: dict[str, dict[str, Any]],
) -> None:
    fresh, warm = pgo_runs["fresh"], pgo_runs["warm_local"]
    assert fresh["match"], fresh["max_abs_err"]
    assert fresh["graphs"] == warm["graphs"] == 1
    assert fresh["gxx"] == [], "\n".join(fresh["gxx"])
    assert "fxgraph_cache_miss" not in fresh["torch"], fresh["torch"]
    asked = fresh["stats"]["cache"]["gets"]
    assert "pgo" in asked, asked


def test_hits_report_the_compile_time_they_saved(pgo_runs: dict[str, dict[str, Any]]) -> None:
    """torch's own figure for each hit (the entry's compile time) reaches the run summary."""
    cold, fresh = pgo_runs["a"]["integration"], pgo_runs["fresh"]["integration"]
    assert cold["time_saved_s"] == {}, "nothing was a hit in the cold run"
    saved = fresh["time_saved_s"]
    assert saved.get("aot-autograd", 0) > 0 and saved.get("fx-graph", 0) > 0, saved


def test_explain_time_names_the_phase_a_new_machine_spent_longer_in_and_why(
    pgo_runs: dict[str, dict[str, Any]],
) -> None:
    """``objcache explain --time`` puts the slow new machine next to the warm-local run
    (not the cold one, not the fast new machine) and names the phase made slow on purpose,
    g++ builds, first, with why the warm run skipped it: kernel lookups that missed."""
    import json

    from typer.testing import CliRunner

    from objcache.cli import main as cli

    slow, warm = pgo_runs["slow_gxx"], pgo_runs["warm_local"]
    assert slow["match"], slow["max_abs_err"]
    assert slow["gxx"], "the store had no kernels: this machine built them"
    tier = f"file://{slow['store']}"
    for which in (["--run", slow["run"]], []):  # named, and the newest not warm-local
        out = CliRunner().invoke(
            cli.app, ["explain", "--time", "--job", JOB, *which, "--tier", tier, "--json"]
        )
        assert out.exit_code == 0, out.output
        data = json.loads(out.output)
        assert data["run"]["run"] == slow["run"] and not data["run"]["warm_local"]
        assert data["warm"]["run"] == warm["run"], (data["warm"], warm["run"])
        ranked = [p for p in data["phases"] if not p["total"]]
        top = ranked[0]
        seen = [(p["phase"], p["difference_s"], p["total"]) for p in data["phases"]]
        assert top["phase"] == "torch:compile_file", seen
        assert top["difference_s"] > GXX_DELAY_S * len(slow["gxx"]) * 0.5, top
        assert "kernel" in top["why"] and "absent" in top["why"], top
    text = CliRunner().invoke(
        cli.app, ["explain", "--time", "--job", JOB, "--tier", tier], env={"COLUMNS": "200"}
    )
    assert "g++ builds" in text.output and "the warm run skipped it" in text.output, text.output
    print(text.output)  # the real output docs/troubleshooting.md shows
