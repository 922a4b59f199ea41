"""Precompile entries never run another function's code or another program's choices
(docs/torch.md, "Precompile entries: what a served entry still checks").

One writer process and a few readers, each on its own simulated machine, share a
``file://`` store; every compiled call is compared with eager in the same process. The
program runs every case at once (small functions, one compile each):

* **cell**: a notebook cell defining ``f`` run twice with another body (same qualname and
  first line: torch's own key is the same);
* **act**: ``ACT = getattr(torch, os.environ["ACT"])``, a global chosen at start-up;
* **cfg**: a module-level config dict whose value is read in the function;
* **attr**: a module's ``self.act`` rebound after its compile;
* **reload**: a module file edited (same first line) and ``importlib.reload``-ed;
* **cls**: ``@torch.compile`` on a class (torch's caching precompile crashed on it);
* **autocast**: a function compiled inside ``torch.autocast`` on one machine and outside it
  on another (the result's dtype differs);
* **backend**: the ``torch.compile`` backend chosen at start-up (a normal compile with a
  custom backend runs that backend);
* **settings**: ``torch._inductor.config.fallback_random`` chosen at start-up (with it a
  normal compile draws eager's random numbers);
* **tree**: a pytree flattened in the function (Dynamo names ``torch`` by an import source
  there, which torch 2.13 could not unpickle outside a trace: every such entry, a library
  model's outputs among them, was refused at install);
* **ty**: ``type(x)`` of a tensor (Dynamo installs the ``torch`` module as a global of its
  own, named by its id in the writer, and guards on it: every reader failed that guard and
  traced the frame again);
* **unportable**: a global function run with globals of its own (``exec``) that the
  function calls: no portable identity, so never saved, and the compile goes on (torch 2.13
  and 2.14 failed it when a frame's package could not be saved).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import torch_runs as ts

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
]

KEY = "precompile-safety-signing-key-of-at-least-32-bytes"

PROGRAM = """\
import importlib, json, os, sys
import torch
import objcache

objcache.install()
from torch import nn
from objcache.integrations.torch.precompile import precompile_entry

ACT = getattr(torch, os.environ["ACT"])
CFG = {"act": os.environ["ACT"]}
x = torch.randn(16, generator=torch.Generator().manual_seed(0))
results = {}


def same(out, ref):
    tol = 1e-2 if ref.dtype == torch.bfloat16 else 1e-5
    return out.dtype == ref.dtype and bool(torch.allclose(out, ref, rtol=tol, atol=tol))


def check(name, fn, *args):
    ref = fn(*args)
    out = compiled[name](*args) if name in compiled else None
    if out is None:
        compiled[name] = torch.compile(fn)
        out = compiled[name](*args)
    results.setdefault(name, []).append(same(out, ref))


compiled = {}


def g(x):
    return ACT(x) + 1.5


def h(x):
    return getattr(torch, CFG["act"])(x) - 0.5


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = torch.relu

    def forward(self, x):
        return self.act(x) * 2.5


for body in os.environ["CELLS"].split(","):
    exec(compile("def f(x):\\n    return torch.%s(x) * 3.5\\n" % body, "<cell>", "exec"))
    compiled.pop("f", None)
    check("f", f, x)
check("act", g, x)
check("cfg", h, x)
m = M()
check("attr", m, x)
m.act = torch.sigmoid
check("attr", m, x)
sys.path.insert(0, os.getcwd())
for n, body in enumerate(os.environ["RELOAD"].split(",")):
    with open("edited.py", "w") as f:
        f.write("import torch\\ndef r(x):\\n    return torch.%s(x) * 4.5\\n" % body)
    importlib.invalidate_caches()
    edited = importlib.reload(edited) if n else importlib.import_module("edited")
    compiled.pop("reload", None)
    check("reload", edited.r, x)


@torch.compile
class Scaled:
    def __call__(self, x):
        return torch.tanh(x) * 0.75


results["cls"] = [same(Scaled()(x), torch.tanh(x) * 0.75)]


def mm(a, b):
    return torch.mm(a, b) + 1.0


xm = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
if os.environ["AUTOCAST"] == "1":
    with torch.autocast("cpu", dtype=torch.bfloat16):
        check("autocast", mm, xm, xm)
else:
    check("autocast", mm, xm, xm)


def brk(x):
    y = torch.relu(x) * 2.0
    torch._dynamo.graph_break()
    y = torch.cos(y) - 1.0
    torch._dynamo.graph_break()
    return torch.sin(y) + 1.0


import torch._C._dynamo.eval_frame as ef

loaded = []
if os.environ.get("BREAK_INSTALL") == "1":
    real_load = ef._load_precompile_entry

    def failing_load(code, *args):
        if len(loaded) == 2:
            raise RuntimeError("install broken on purpose")
        real_load(code, *args)
        loaded.append(code)

    ef._load_precompile_entry = failing_load
before = {k for k in globals() if k.startswith("__")}
compiled["brk"] = torch.compile(brk)
if os.environ.get("BREAK_INSTALL") == "1":
    ef._load_precompile_entry = real_load  # only brk's install breaks
left = {
    "globals": sorted(k for k in globals() if k.startswith("__") and k not in before),
    "entries": sum(len(ef._debug_get_precompile_entries(c)) for c in loaded),
}
check("brk", brk, x)

calls = []


def counting(gm, example_inputs):
    calls.append(1)
    return gm.forward


custom = os.environ.get("BACKEND") == "counting"


def bk(x):
    return torch.cos(x) * 5.5


out = torch.compile(bk, backend=counting if custom else "inductor")(x)
results["backend"] = [same(out, bk(x)) and (bool(calls) or not custom)]


def noisy(x):
    return x * 2.0 + torch.rand_like(x)


fallback = os.environ.get("FALLBACK_RANDOM") == "1"
with torch._inductor.config.patch(fallback_random=fallback):
    torch.manual_seed(0)
    ref = noisy(x)
    compiled_noisy = torch.compile(noisy)
    torch.manual_seed(0)
    out = compiled_noisy(x)
# with fallback_random a normal compile draws eager's numbers; without, its own
results["settings"] = [bool(torch.equal(out, ref)) or not fallback]


def tree(x):
    leaves, _ = torch.utils._pytree.tree_flatten({"a": x, "b": (x, x * 2.0)})
    return leaves[0] * 1.25 + leaves[2]


check("tree", tree, x)


def ty(x):
    return x * 3.0 if type(x) is torch.Tensor else x


check("ty", ty, x)


own_globals = {"__builtins__": __builtins__}
exec("def helper(x):\\n    return x * 6.5\\n", own_globals)
HELPER = own_globals["helper"]


def unportable(x):
    return HELPER(x) + 0.25


check("unportable", unportable, x)
from torch._dynamo.utils import counters

print("RESULT " + json.dumps({
    "results": results,
    "graphs": int(counters["stats"]["unique_graphs"]),
    "precompile": dict(precompile_entry.counters),
    "left": left,
}), flush=True)
"""


def run(
    base: Path,
    machine: str,
    *,
    act: str,
    cells: str,
    how: str = "file",
    reload: str = "relu",
    autocast: str = "0",
    **env: str,
) -> dict[str, Any]:
    path = base / machine
    e = ts.compile_env(path, f"file://{base / 'store'}")
    e.update(
        OBJCACHE_PRECOMPILE="1",
        OBJCACHE_SIGNING_KEY=KEY,
        OBJCACHE_PREFETCH="0",
        OBJCACHE_TIMEOUT_MS=ts.FILE_STORE_TIMEOUT_MS,
        ACT=act,
        CELLS=cells,
        RELOAD=reload,
        AUTOCAST=autocast,
        PYTHONDONTWRITEBYTECODE="1",
        **env,
    )
    if how == "file":
        script = path / "program.py"
        script.write_text(PROGRAM)
        argv, stdin = [sys.executable, str(script)], None
    elif how == "-c":
        argv, stdin = [sys.executable, "-c", PROGRAM], None
    else:  # stdin
        argv, stdin = [sys.executable, "-"], PROGRAM
    out = subprocess.run(
        argv, env=e, input=stdin, capture_output=True, text=True, timeout=600, cwd=path
    )
    assert out.returncode == 0, out.stderr[-4000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result


def all_match(result: dict[str, Any]) -> bool:
    return all(all(v) for v in result["results"].values())


@pytest.fixture(scope="module")
def base(module_dir: Path) -> Path:
    return module_dir


@pytest.fixture(scope="module")
def writer(base: Path) -> dict[str, Any]:
    """relu chosen; the cell and the reloaded module run with relu, then again with sigmoid
    (same qualname and line); ``mm`` compiled inside autocast."""
    return run(
        base, "writer", act="relu", cells="relu,sigmoid", reload="relu,sigmoid", autocast="1"
    )


def test_the_writer_keeps_its_own_guards(base: Path, writer: dict[str, Any]) -> None:
    """Rebinding ``m.act`` after its compile recompiles, as without objcache; every
    function's entry is saved at exit, the two cell bodies each under its own key."""
    assert all_match(writer), writer
    assert writer["results"]["attr"] == [True, True]
    # f and r twice, g, h, M.forward once per binding, Scaled.__call__, mm, brk's 3 graphs,
    # bk, noisy, tree, ty, unportable (never saved)
    assert writer["graphs"] == 18
    entries = [p for p in (base / "store").glob("v1/*/precompile/*/*") if p.is_file()]
    assert len(entries) == 14, entries
    unsaved = [k for k in writer["precompile"] if k.startswith("unsaved:dropped_guard:")]
    assert unsaved, writer["precompile"]


def test_a_compiled_class_compiles_its_call(base: Path, writer: dict[str, Any]) -> None:
    """``@torch.compile`` on a class: torch's caching precompile raised reading the class's
    ``__code__``; the class is passed by (counted) and its ``__call__`` is the entry."""
    assert writer["results"]["cls"] == [True]
    # 2.13 and 2.14 read the class's __code__; 2.15 goes to its __call__ itself
    reads_class_code = torch.torch_version.TorchVersion(torch.__version__) < (2, 15)
    assert writer["precompile"].get("skipped:no_code", 0) == int(reads_class_code), writer


def test_a_reader_with_the_same_choices_is_served(base: Path, writer: dict[str, Any]) -> None:
    r = run(base, "same", act="relu", cells="relu,sigmoid", reload="relu,sigmoid", autocast="1")
    assert all_match(r), r
    assert r["precompile"].get("hits") == 14 and r["precompile"].get("installed") == 14
    # only the unsaved function is traced again
    assert r["graphs"] == 1 and r["results"]["unportable"] == [True], r


def test_the_second_cell_body_is_never_served_the_first(base: Path, writer: dict[str, Any]) -> None:
    """Only the edited cell and the edited module on a new machine: their own entries,
    never the first bodies'. ``mm`` called outside autocast: its float32 result, never the
    writer's bfloat16 one."""
    r = run(base, "cell", act="relu", cells="sigmoid", reload="sigmoid", autocast="0")
    assert r["results"]["f"] == [True] and r["results"]["reload"] == [True], r
    assert r["results"]["autocast"] == [True], r
    assert all_match(r), r
    assert not r["precompile"].get("rejected:code_mismatch"), r["precompile"]


def test_another_startup_choice_recompiles_where_it_matters(
    base: Path, writer: dict[str, Any]
) -> None:
    """ACT and CFG chosen as sigmoid: the entries load, their portable guards fail, Dynamo
    compiles those frames again; every result equals eager's. A custom backend chosen at
    start-up is another key: that backend runs (torch's own caching precompile served the
    writer's Inductor code to it). ``fallback_random`` set: the entry loads, its compiler
    settings guard fails, Dynamo compiles with the reader's settings and draws eager's
    random numbers, as a normal compile does (it was served the writer's draws)."""
    r = run(base, "other-act", act="sigmoid", cells="relu", BACKEND="counting", FALLBACK_RANDOM="1")
    assert r["results"]["backend"] == [True] and r["results"]["settings"] == [True], r
    assert all_match(r), r
    assert r["graphs"] >= 4  # act, cfg, bk and noisy traced again
    assert r["precompile"].get("guard_failed:settings") == 1, r["precompile"]
    failed = {k for k in r["precompile"] if k.startswith("guard_failed:")}
    assert failed - {"guard_failed:settings"}, r["precompile"]  # ACT's and CFG's guards


def test_programs_without_a_source_file(base: Path, writer: dict[str, Any]) -> None:
    """``python -c`` and stdin: no module source to hash, the guards still decide."""
    c_relu = run(base, "c-relu", act="relu", cells="relu", how="-c")
    assert all_match(c_relu), c_relu
    c_sig = run(base, "c-sigmoid", act="sigmoid", cells="sigmoid", how="-c")
    assert all_match(c_sig), c_sig
    stdin = run(base, "stdin-sigmoid", act="sigmoid", cells="relu", how="stdin")
    assert all_match(stdin), stdin


def test_a_store_poisoned_with_another_functions_package_is_refused(
    base: Path, writer: dict[str, Any]
) -> None:
    """The first cell body's package, signed, under the second body's key (what the old
    weak keying stored): refused before install, the compile goes on, eager's result."""
    import pickle

    from objcache.client import Client
    from objcache.config.settings import Config
    from objcache.entry.layout import decode_key

    store = base / "store-poisoned"
    shutil.copytree(base / "store", store)
    cfg = Config.from_env(
        {"OBJCACHE_SIGNING_KEY": KEY}, tiers=f"file://{store}", local_dir=base / "p-local"
    )
    client = Client(cfg)
    try:
        # other tests' programs (python -c, stdin) stored their own f entries: every
        # sigmoid body's key gets a relu body's package
        bodies: dict[str, list[tuple[Path, str, bytes]]] = {"relu": [], "sigmoid": []}
        for path in store.glob("v1/*/precompile/*/*"):
            key = decode_key(path.name)
            payload = client.get("precompile", key) or b""
            code = pickle.loads(payload)["entry"].dynamo.codes[0].python_code
            if code.co_name == "f":
                body = "relu" if "relu" in code.co_names else "sigmoid"
                bodies[body].append((path, key, payload))
        assert bodies["relu"] and bodies["sigmoid"], bodies.keys()
        relu_payload = bodies["relu"][0][2]
        for path, key, _ in bodies["sigmoid"]:
            path.unlink()
            client.put("precompile", key, relu_payload)
        assert client.flush() == 0
    finally:
        client.close()
    r = run(base, "poisoned", act="relu", cells="sigmoid", OBJCACHE_TIERS=f"file://{store}")
    assert r["results"]["f"] == [True], r
    assert r["precompile"].get("rejected:code_mismatch") == 1, r["precompile"]


def test_an_install_that_fails_half_way_leaves_nothing_installed(
    base: Path, writer: dict[str, Any]
) -> None:
    """torch's install fails at brk's third code (its second resume function): the entries
    already put on the first two codes and the globals torch installed are taken back (a
    resume entry left behind named a global torch's own uninstall removed: NameError in the
    user's call); the function compiles normally."""
    r = run(
        base, "broken-install", act="relu", cells="relu,sigmoid", reload="relu,sigmoid",
        autocast="1", BREAK_INSTALL="1",
    )  # fmt: skip
    assert all_match(r), r
    assert r["precompile"].get("rejected:install") == 1, r["precompile"]
    assert r["left"] == {"globals": [], "entries": 0}, r["left"]
    assert r["graphs"] == 4  # brk compiled normally, and the unsaved function
