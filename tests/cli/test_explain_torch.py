"""``objcache explain`` on real torch compiles: one writer, four machines that miss.

Machines are directories, as in tests/integrations/torch/test_compile.py; only the
``file://`` store is shared. A compiles the tiny model and publishes its entries and their key
cards. Each B runs under its own job name, so ``objcache explain --job`` shows that machine's
misses only, and differs from A by exactly one thing:

* B1: an inductor config flag (``TORCHINDUCTOR_SIZE_ASSERTS=0``);
* B2: the input's batch size (static shapes: a job of its own has no PGO profile);
* B3: the CPU vector ISA recorded in the environment (``ATEN_CPU_CAPABILITY`` a level below
  this CPU's: the FX key is the same, the environment is not);
* B4: only the model's graph (another constant baked into it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

from tests.support import torch_runs as ts
from tests.support.isa import lower_isa

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
]


class World:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.store = base / "store"

    def run(self, machine: str, job: str, args: list[str], **env_extra: str) -> dict[str, Any]:
        env = ts.compile_env(self.base / machine, f"file://{self.store}")
        env["OBJCACHE_JOB"] = job
        env.update(env_extra)
        return ts.run_compile(env, args)

    def explain(self, job: str, *extra: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        env.update(
            OBJCACHE_TIERS=f"file://{self.store}",
            OBJCACHE_LOCAL_DIR=str(self.base / "cli-local"),
            PYTHONPATH=str(ts.ROOT),
            COLUMNS="200",
        )
        code = "from objcache.cli.main import main; main()"
        return subprocess.run(
            [sys.executable, "-c", code, "explain", "--job", job, *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    def explained(self, job: str) -> dict[str, Any]:
        out = self.explain(job, "--json")
        assert out.returncode == 0, out.stdout + out.stderr
        result: dict[str, Any] = json.loads(out.stdout)
        return result

    @cached_property
    def writer(self) -> dict[str, Any]:
        return self.run("a", "explain-a", [])

    @cached_property
    def config_flag(self) -> dict[str, Any]:
        _ = self.writer
        return self.run("b1", "explain-b1", [], TORCHINDUCTOR_SIZE_ASSERTS="0")

    @cached_property
    def input_shape(self) -> dict[str, Any]:
        _ = self.writer
        return self.run("b2", "explain-b2", ["--batches", "6"])

    @cached_property
    def cpu_isa(self) -> dict[str, Any]:
        _ = self.writer
        return self.run("b3", "explain-b3", [], ATEN_CPU_CAPABILITY=self.other_isa)

    @cached_property
    def graph_change(self) -> dict[str, Any]:
        _ = self.writer
        return self.run("b4", "explain-b4", ["--salt", "2.5"])

    @cached_property
    def other_isa(self) -> str:
        from objcache.config.fingerprint import fingerprint

        other = lower_isa(fingerprint()["cpu_isa"])
        if other is None:
            pytest.skip("this machine's ISA is ATen's lowest (default): no other level")
        return other


@pytest.fixture(scope="module")
def explain_world(module_dir: Path) -> World:
    return World(module_dir)


def differing(result: dict[str, Any]) -> set[str]:
    return {d["component"] for m in result["details"] for d in m["differences"]}


def test_the_writer_publishes_a_card_per_fx_entry(explain_world: World) -> None:
    a = explain_world.writer
    assert a["ok"]
    cards = list(explain_world.store.glob("v1/keycards/fx-card/*/*!/*"))
    entries = list(explain_world.store.glob("v1/*/fx-graph/*/*"))
    assert cards and len(cards) == len(entries), (cards, entries)


def test_an_inductor_flag_is_named(explain_world: World) -> None:
    assert explain_world.config_flag["ok"]
    result = explain_world.explained("explain-b1")
    assert result["misses"] >= 1
    assert differing(result) == {"inductor_config.size_asserts"}
    lines = [d["line"] for m in result["details"] for d in m["differences"]]
    assert set(lines) == {"inductor_config.size_asserts: True → False"}


def test_an_input_shape_is_named(explain_world: World) -> None:
    assert explain_world.input_shape["ok"]
    result = explain_world.explained("explain-b2")
    assert result["misses"] >= 1
    names = differing(result)
    assert names and all(n.startswith("example_inputs[") for n in names), names
    lines = {d["line"] for m in result["details"] for d in m["differences"]}
    assert any("shape [4, 8] → [6, 8]" in line for line in lines), lines
    assert [c["cause"] for c in result["causes"]] == ["example_inputs differs"]


def test_the_cpu_isa_of_the_environment_is_named(explain_world: World) -> None:
    other = explain_world.other_isa
    assert explain_world.cpu_isa["ok"]
    result = explain_world.explained("explain-b3")
    assert result["misses"] >= 1
    assert differing(result) == {"env:cpu_isa"}
    lines = {d["line"] for m in result["details"] for d in m["differences"]}
    assert all(line.endswith(f"→ {other}") for line in lines), lines


def test_a_graph_change_is_a_first_compile(explain_world: World) -> None:
    assert explain_world.graph_change["ok"]
    result = explain_world.explained("explain-b4")
    assert result["misses"] >= 1
    assert {c["cause"] for c in result["causes"]} == {"first compile of this graph in the store"}


def test_the_text_output_groups_misses_by_cause(explain_world: World) -> None:
    _ = explain_world.config_flag
    out = explain_world.explain("explain-b1")
    assert out.returncode == 0, out.stderr
    print(out.stdout)  # pasted into docs/troubleshooting.md
    assert "inductor_config.size_asserts differs" in out.stdout
    assert "inductor_config.size_asserts: True → False" in out.stdout
