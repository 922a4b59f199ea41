"""The implementations of the custom ops a graph calls are in its FX and AOTAutograd keys
(docs/torch.md, "Custom ops in the keys"): a machine with another version of a kernel
library misses, and never runs the writer's decomposition."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support import torch_runs as ts

torch = pytest.importorskip("torch")

KERNELS = """\
import torch

lib = torch.library.Library("objcache_test_ops", "DEF")
lib.define("scale(Tensor x) -> Tensor")


def scale(x):
    return x * {factor}


lib.impl("scale", scale, "CompositeImplicitAutograd")
"""

PROGRAM = """\
import json
import torch
import objcache

objcache.install()
import kernels


def f(x):
    return torch.ops.objcache_test_ops.scale(x.sin()) + 1.0


x = torch.linspace(-1.0, 1.0, 8)
out = torch.compile(f)(x)
from objcache.integrations.install import hooks

print("RESULT " + json.dumps({
    "same": bool(torch.allclose(out, f(x))),
    "custom_ops": hooks.stats()["custom_ops"],
    "fx_hits": torch._dynamo.utils.counters["inductor"]["fxgraph_cache_hit"],
    "aot_hits": torch._dynamo.utils.counters["aot_autograd"]["autograd_cache_hit"],
}))
"""


def run(base: Path, machine: str, factor: str) -> dict[str, Any]:
    path = base / machine
    path.mkdir(parents=True)
    (path / "kernels.py").write_text(KERNELS.format(factor=factor))
    env = ts.compile_env(path, f"file://{base / 'store'}")
    env.update(OBJCACHE_PREFETCH="0", PYTHONDONTWRITEBYTECODE="1")
    return ts.run_script(path, PROGRAM, env)


@pytest.mark.compile
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_another_implementation_of_a_custom_op_is_a_miss_not_the_writers_result(
    tmp_path: Path,
) -> None:
    writer = run(tmp_path, "writer", "2.0")
    assert writer["same"] and writer["custom_ops"].get("keyed_graphs", 0) >= 1, writer
    same = run(tmp_path, "same", "2.0")  # the same library: served as before
    assert same["same"] and same["aot_hits"] >= 1, same
    other = run(tmp_path, "other", "3.0")  # the library at another version
    assert other["same"], other
    assert other["aot_hits"] == 0 and other["fx_hits"] == 0, other


def test_a_graph_without_custom_ops_keeps_torchs_key() -> None:
    """Only graphs that call an op outside torch's namespaces get the field."""
    from objcache.integrations.torch.remote import custom_ops

    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.sin(x) + 1)
    assert custom_ops.graph_identity(gm) == ()
