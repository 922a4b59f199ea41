"""Mega-Cache bundles saved by torch's own recipe, without ``objcache.install()``.

A (cold, batch 4 then 6, objcache off) compiles and calls ``objcache.mega.save`` at the end;
B (a fresh machine: new inductor, Triton, temp and local dirs) calls ``objcache.mega.load``
and runs the same training, again without ``install()``. The bundle must carry the CPU
kernels A's graphs load, derived from the graphs themselves: B runs no kernel build (a
``g++`` shim counts them; torch's probes of the ISAs it does not pick are not kernels),
compiles no more graphs than it needs (the bundle's PGO profile
makes the first compile dynamic: no recompile at batch 6), and matches eager.
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

BUNDLE = "recipe"
BATCHES = "4,6"


def recipe_env(base: Path, machine: str, store: Path) -> tuple[dict[str, str], Path]:
    env = ts.compile_env(base / machine, f"file://{store}")
    env["OBJCACHE_ENABLE"] = "0"  # no zero-code install: torch's recipe alone
    env["OBJCACHE_PREFETCH"] = "0"
    env["TORCH_COMPILE_JOB_ID"] = "objcache-recipe-test"  # torch's PGO needs a job id
    shim_dir, log = ts.make_gxx_shim(base / machine / "shim")
    env["PATH"] = f"{shim_dir}{os.pathsep}{env.get('PATH', '')}"
    return env, log


@pytest.fixture(scope="module")
def recipe_runs(module_dir: Path) -> dict[str, dict[str, Any]]:
    base = module_dir
    store = base / "store"
    env_a, log_a = recipe_env(base, "a", store)
    a = ts.run_compile(env_a, ["--objcache", "off", "--batches", BATCHES, "--mega-save", BUNDLE])
    a["gxx"] = ts.gxx_builds(log_a)
    env_b, log_b = recipe_env(base, "b", store)
    b = ts.run_compile(env_b, ["--objcache", "off", "--batches", BATCHES, "--mega-load", BUNDLE])
    b["gxx"] = ts.gxx_builds(log_b)
    return {"a": a, "b": b}


def test_a_recipe_bundle_carries_the_kernels_its_graphs_load(
    recipe_runs: dict[str, dict[str, Any]],
) -> None:
    a = recipe_runs["a"]
    assert a["match"], a["max_abs_err"]
    assert a["gxx"], "A compiled cold: its kernels were built here"
    assert "integration" not in a, "A ran without objcache's hooks"
    saved = a["mega_save"]
    assert "incomplete" not in saved, saved
    assert " 0 kernels" not in saved and "kernels" in saved, saved
    assert "pgo" in saved, saved


def test_loading_a_recipe_bundle_builds_no_kernel_and_does_not_recompile(
    recipe_runs: dict[str, dict[str, Any]],
) -> None:
    a, b = recipe_runs["a"], recipe_runs["b"]
    assert b["match"], b["max_abs_err"]
    assert "skipped" not in b["mega_load"], b["mega_load"]
    # The bundle carries the probe of the ISA torch picks; on a CPU with several (AVX-512 with
    # VNNI, bf16), torch also probes the others on a fresh machine: small builds, no kernels.
    kernels = [build for build in b["gxx"] if not ts.is_isa_probe(build)]
    assert kernels == [], "\n".join(kernels)
    assert b["torch"].get("fxgraph_cache_hit", 0) >= 1
    assert "fxgraph_cache_miss" not in b["torch"], b["torch"]
    # A compiled batch 4 statically, then recompiled dynamically at 6; B starts dynamic.
    assert b["graphs"] < a["graphs"], (a["graphs"], b["graphs"])
