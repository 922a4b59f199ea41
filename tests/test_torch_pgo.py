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

from tests import torch_support as ts

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
]

BATCHES = ["--batches", "4,6"]


def machine(base: Path, name: str, store: Path) -> tuple[dict[str, str], Path]:
    env = ts.compile_env(base / name, f"file://{store}")
    env["OBJCACHE_PREFETCH"] = "0"  # the profile must come from the PGO record itself
    shim_dir, log = ts.make_gxx_shim(base / name / f"shim-{len(os.listdir(base))}")
    env["PATH"] = f"{shim_dir}{os.pathsep}{env.get('PATH', '')}"
    return env, log


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    base = tmp_path_factory.mktemp("pgo")
    store = base / "store"
    out: dict[str, dict[str, Any]] = {}
    for label, name in (("a", "a"), ("warm_local", "a"), ("fresh", "b")):
        env, log = machine(base, name, store)
        result = ts.run_compile(env, BATCHES)
        result["gxx"] = ts.gxx_builds(log)
        out[label] = result
    return out


def test_the_cold_run_recompiles_once_and_stores_its_profile(
    runs: dict[str, dict[str, Any]],
) -> None:
    a = runs["a"]
    assert a["match"], a["max_abs_err"]
    assert a["graphs"] == 2, "batch 4 static, then a dynamic recompile at 6"
    assert runs["warm_local"]["graphs"] == 1, "the local profile: the first compile is dynamic"


def test_a_fresh_machine_compiles_as_many_graphs_as_warm_local(
    runs: dict[str, dict[str, Any]],
) -> None:
    fresh, warm = runs["fresh"], runs["warm_local"]
    assert fresh["match"], fresh["max_abs_err"]
    assert fresh["graphs"] == warm["graphs"] == 1
    assert fresh["gxx"] == [], "\n".join(fresh["gxx"])
    assert "fxgraph_cache_miss" not in fresh["torch"], fresh["torch"]
    asked = fresh["stats"]["cache"]["gets"]
    assert "pgo" in asked, asked
