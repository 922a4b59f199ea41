"""The check a served code runs at every call holds only where the code itself would run,
for the compiler it was served for (docs/torch.md, "Checked as often as torch checks").

One writer and one reader, each a simulated machine on one ``file://`` store, with
``OBJCACHE_PRECOMPILE=1``; every compiled call is compared with eager in the same process.
One function per class of fact:

* **the compiler a wrapper names**: a second ``torch.compile`` of a served function with
  another backend (torch's own ``eager``, a program's backend) in the same process: the
  served code sits on the shared code object, and torch's own match of the backend is one
  of the guards it drops; that wrapper's backend must run, the first wrapper stays served;
* **facts checked once** (the compiler settings, an inlined method's code, a module's empty
  hook dicts): the reader first calls with another dtype (torch's own guard of the served
  code fails, the code never runs), then changes the fact, then calls with the writer's
  input: a normal compile of that input happens only now and reads the changed fact.
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
import json, os
import torch
import objcache

objcache.install()
from torch import nn
from objcache.integrations.torch.precompile import precompile_entry

torch.set_grad_enabled(False)
READER = os.environ["ROLE"] == "reader"
results = {}
x = torch.linspace(-1.0, 1.0, 8)


def same(name, compiled, fn, *args):
    torch.manual_seed(5)
    out = compiled(*args)
    torch.manual_seed(5)
    ref = fn(*args)
    results[name] = bool(torch.allclose(out, ref))


def noisy(x):  # Inductor's random numbers are not eager's
    return x * 2 + torch.rand_like(x)


served = torch.compile(noisy)
backend_calls = []


def own_backend(gm, example_inputs):
    backend_calls.append(1)
    return gm.forward


if READER:
    same("another_backend", torch.compile(noisy, backend="eager"), noisy, x)
    same("a_programs_backend", torch.compile(noisy, backend=own_backend), noisy, x)
    results["own_backend_ran"] = bool(backend_calls)
torch.manual_seed(5)
first = served(x)
results["served_wrapper"] = first.tolist()


class Act(nn.Module):
    def act(self, x):
        return x * 2

    def forward(self, x):
        return self.act(x) + 1


class Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Tanh()

    def forward(self, x):
        return self.inner(x) * 2


def settings(x):
    return x * 3 + torch.rand_like(x)


act, hooked = Act(), Hooked()
compiled = {"inlined": torch.compile(act), "hooks": torch.compile(hooked)}
compiled["settings"] = torch.compile(settings)
if READER:  # another dtype first: the served code's own guard fails, it never runs
    for fn in compiled.values():
        fn(x.double())
    Act.act = lambda self, x: x * 5
    hooked.inner.register_forward_hook(lambda module, args, out: out * 10)
same("inlined", compiled["inlined"], act, x)
same("hooks", compiled["hooks"], hooked, x)
if READER:
    torch._inductor.config.fallback_random = True  # eager's random numbers
same("settings", compiled["settings"], settings, x)
print("RESULT " + json.dumps({"results": results, "precompile": dict(precompile_entry.counters)}))
"""


def run(check_root: Path, machine: str, **env: str) -> dict[str, Any]:
    path = check_root / machine
    e = ts.precompile_machine_env(path, check_root / "store")
    e.update(env)
    return ts.run_script(path, PROGRAM, e)


@pytest.fixture(scope="module")
def check_root(module_dir: Path) -> Path:
    return module_dir


@pytest.fixture(scope="module")
def check_writer(check_root: Path) -> dict[str, Any]:
    return run(check_root, "writer", ROLE="writer")


@pytest.fixture(scope="module")
def reader(check_root: Path, check_writer: dict[str, Any]) -> dict[str, Any]:
    return run(check_root, "reader", ROLE="reader")


def test_a_served_code_runs_only_for_the_compiler_it_was_served_for(
    check_writer: dict[str, Any], reader: dict[str, Any]
) -> None:
    """Another wrapper of the served function fails the served code's check and gets its
    own compile (its backend runs, eager's result); the served wrapper is still served."""
    results, counts = reader["results"], reader["precompile"]
    assert results["another_backend"] and results["a_programs_backend"], reader
    assert results["own_backend_ran"], reader
    assert counts.get("guard_failed:backend", 0) >= 1, counts
    writer = check_writer["results"]["served_wrapper"]
    assert results["served_wrapper"] == writer, (check_writer, reader)


@pytest.mark.parametrize(
    ("fact", "kinds"),
    [
        ("settings", {"settings"}),
        # a patched method: its class's layout, checked before the inlined code
        ("inlined", {"CLASS_LAYOUT", "INLINED_CODE"}),
        ("hooks", {"MODULE_HOOKS"}),
    ],
)
def test_facts_checked_once_stay_checked_until_the_served_code_runs(
    reader: dict[str, Any], fact: str, kinds: set[str]
) -> None:
    """A fact changed after a call the served code did not run for (another dtype) is seen
    at the call it would first run for: the check fails, Dynamo compiles, eager's result."""
    assert reader["results"][fact], reader
    counts = reader["precompile"]
    assert counts.get("hits", 0) >= 4, counts
    assert any(counts.get(f"guard_failed:{kind}", 0) >= 1 for kind in kinds), counts
