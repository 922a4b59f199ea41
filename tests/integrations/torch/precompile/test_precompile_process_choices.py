"""A served precompile entry follows what the reader's process chose outside torch's guards,
and a compiled module copies and pickles as without the part (docs/torch.md, "What a served
entry depends on").

Writers and readers are simulated machines on one ``file://`` store each, with
``OBJCACHE_PRECOMPILE=1``; every compiled call is compared with eager in the same process.
One compiled module and one compiled function, each a class of fact:

* **kernels of torch's ops**: a program's own ``CompositeImplicitAutograd`` kernel of
  ``aten::linear`` (what a kernel-patching library registers), on the reader only or on the
  writer only: AOTAutograd traces it with no guard;
* **debug overrides**: Dynamo's ``debug_backend_override`` (``TORCH_COMPILE_OVERRIDE_BACKENDS``)
  set around a function's first call: torch leaves it out of its config hash;
* **copies of a compiled module**: ``copy.deepcopy`` (torch's package of a served entry holds
  a dict keyed by modules) and ``pickle`` (the package holds code objects) of the compiled
  module, on a writer and on a served reader.
"""

from __future__ import annotations

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

PROGRAM = """\
import copy, json, os, pickle
import torch
import objcache

objcache.install()
from torch import nn
from objcache.integrations.torch.precompile import precompile_entry

torch.set_grad_enabled(False)  # an inference frame: saved without waiting for a backward
if os.environ.get("OVERRIDE") == "1":  # what a kernel-patching library does
    lib = torch.library.Library("aten", "IMPL")

    def linear(x, w, b=None):
        return torch.matmul(x, w.t()) * 0 + 7.0

    lib.impl("linear", linear, "CompositeImplicitAutograd")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        return self.lin(x).relu() + 0.5


results, errors = {}, {}
torch.manual_seed(0)
net = Net()
x = torch.randn(2, 8)
compiled = torch.compile(net)
results["kernels_of_torch_ops"] = bool(torch.allclose(compiled(x), net(x)))
for name, copy_of in (
    ("deepcopy", copy.deepcopy),
    ("pickle", lambda m: pickle.loads(pickle.dumps(m))),
):
    try:
        results[name] = bool(torch.allclose(copy_of(compiled)(x), net(x)))
    except Exception as exc:  # what the program would have died of
        results[name] = False
        errors[name] = repr(exc)[:300]


def noisy(x):
    return x * 2.0 + torch.rand_like(x)


compiled_noisy = torch.compile(noisy)
override = os.environ.get("DEBUG_BACKEND", "")
with torch._dynamo.config.patch(debug_backend_override=override):
    torch.manual_seed(5)
    out = compiled_noisy(x)
torch.manual_seed(5)
if override:  # eager's random numbers only with the eager backend
    results["debug_overrides"] = bool(torch.equal(out, noisy(x)))
print("RESULT " + json.dumps(
    {"results": results, "errors": errors, "precompile": dict(precompile_entry.counters)}
))
"""


def run(choices_root: Path, store: str, machine: str, **env: str) -> dict[str, Any]:
    path = choices_root / machine
    e = ts.precompile_machine_env(path, choices_root / store)
    e.update(env)
    return ts.run_script(path, PROGRAM, e)


@pytest.fixture(scope="module")
def choices_root(module_dir: Path) -> Path:
    return module_dir


@pytest.fixture(scope="module")
def plain_writer(choices_root: Path) -> dict[str, Any]:
    return run(choices_root, "plain", "plain-writer")


def test_a_compiled_module_copies_and_pickles_where_its_entry_is_saved(
    plain_writer: dict[str, Any],
) -> None:
    """torch's caching precompile (which the part turns on) left code objects in the
    compiled module's package: ``pickle.dumps`` raised ``cannot pickle code objects``."""
    results = plain_writer["results"]
    assert results["deepcopy"] and results["pickle"], plain_writer
    assert results["kernels_of_torch_ops"], plain_writer


def test_a_compiled_module_copies_and_pickles_where_its_entry_is_served(
    choices_root: Path, plain_writer: dict[str, Any]
) -> None:
    """The package of a served entry records the globals it installed by module:
    ``copy.deepcopy`` raised ``cannot pickle 'module' object``. The copies compute eager's
    results."""
    reader = run(choices_root, "plain", "plain-reader")
    assert reader["results"]["deepcopy"] and reader["results"]["pickle"], reader
    counts = reader["precompile"]
    assert counts.get("hits", 0) >= 2 and counts.get("installed", 0) >= 2, counts


def test_a_reader_with_its_own_kernel_of_a_torch_op_compiles(
    choices_root: Path, plain_writer: dict[str, Any]
) -> None:
    reader = run(choices_root, "plain", "override-reader", OVERRIDE="1")
    assert reader["results"]["kernels_of_torch_ops"], reader
    counts = reader["precompile"]
    assert counts.get("hits", 0) >= 1 and counts.get("guard_failed:settings", 0) >= 1, counts


def test_a_reader_with_a_debug_override_compiles_and_saves_nothing(
    choices_root: Path, plain_writer: dict[str, Any]
) -> None:
    """Set after ``torch.compile()`` served the entry: the settings record fails at the call,
    and the override's backend runs; the frame it compiled is not saved."""
    reader = run(choices_root, "plain", "debug-reader", DEBUG_BACKEND=">=0:eager")
    assert reader["results"]["debug_overrides"], reader
    counts = reader["precompile"]
    assert counts.get("guard_failed:settings", 0) >= 1, counts
    assert counts.get("unsaved:debug_override", 0) >= 1, counts


def test_a_reader_without_the_writers_kernel_of_a_torch_op_compiles(choices_root: Path) -> None:
    """The other direction: the writer ran with the kernel-patching library (and a debug
    override), the reader without. What the program's kernel computes for a graph is known
    only by tracing the graph where it runs (it may ask the machine: its CPUs, its memory),
    which a served entry skips: the writer saves no frame whose graph it keys
    (``unsaved:traced_code``), the reader compiles."""
    writer = run(choices_root, "patched", "patched-writer", OVERRIDE="1", DEBUG_BACKEND=">=0:eager")
    assert writer["results"]["kernels_of_torch_ops"], writer
    assert writer["precompile"].get("unsaved:traced_code", 0) >= 1, writer
    reader = run(choices_root, "patched", "patched-reader")
    assert reader["results"]["kernels_of_torch_ops"], reader
    counts = reader["precompile"]
    assert counts.get("installed", 0) == 0, counts
