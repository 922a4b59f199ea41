"""Precompile entries across processes (docs/torch.md, "Precompile entries").

Every run is a subprocess on its own simulated machine (its own objcache local dir and
``TORCHINDUCTOR_CACHE_DIR``) with ``OBJCACHE_PRECOMPILE=1`` and a signing key; only the
``file://`` store is shared. The compiled script is written to each machine, so "another
script" is a file with other source text. One cold run (A) saves its entry at exit, without
calling ``save_cache_artifacts()``; the others read it, or a copy of the store changed on
purpose.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
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

KEY = "precompile-test-signing-key-of-at-least-32-bytes"

SCRIPT = """\
import json, sys
import torch
import objcache

objcache.install()
from torch import nn

SCALE = {scale}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.lin(x)) * SCALE


torch.manual_seed(0)
net = Net()
compiled = torch.compile(net)
match = True
for batch in sys.argv[1].split(","):  # one call per batch size, in order
    x = torch.randn(int(batch), 8)
    with torch.no_grad():
        match = match and bool(torch.allclose(compiled(x), net(x)))
from torch._dynamo.utils import counters
from objcache.integrations.torch.precompile import precompile_entry

print("RESULT " + json.dumps({{
    "graphs": int(counters["stats"]["unique_graphs"]),
    "match": match,
    "precompile": dict(precompile_entry.counters),
}}), flush=True)
"""


def run(machine: Path, store: Path, *, scale: str = "2.0", batch: int | str = 3, **env: str) -> Any:
    e = ts.compile_env(machine, f"file://{store}")
    e.update(OBJCACHE_PRECOMPILE="1", OBJCACHE_SIGNING_KEY=KEY, OBJCACHE_PREFETCH="0")
    e.update(OBJCACHE_TIMEOUT_MS=ts.FILE_STORE_TIMEOUT_MS, **env)
    script = machine / "net.py"
    script.write_text(SCRIPT.format(scale=scale))
    out = subprocess.run(
        [sys.executable, str(script), str(batch)],
        env=e,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def entry_files(store: Path) -> list[Path]:
    return sorted(p for p in store.glob("v1/*/precompile/*/*") if p.is_file())


class World:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.store = base / "store"
        self.entry = Path()  # A's entry, relative to the store

    @cached_property
    def cold(self) -> Any:
        result = run(self.base / "a", self.store)
        files = entry_files(self.store)
        assert len(files) == 1, f"A stored {len(files)} precompile entries at exit"
        self.entry = files[0].relative_to(self.store)
        return result

    def store_copy(self, name: str) -> Path:
        _ = self.cold
        copy = self.base / name
        shutil.copytree(self.store, copy)
        return copy


@pytest.fixture(scope="module")
def pc(module_dir: Path) -> World:
    return World(module_dir)


def test_an_entry_saved_at_exit_makes_a_new_machine_skip_dynamo(pc: World) -> None:
    a = pc.cold
    assert a["graphs"] == 1 and a["match"]
    assert a["precompile"].get("misses") == 1
    b = run(pc.base / "b", pc.store)
    assert b["match"]  # the same outputs as eager
    assert b["graphs"] == 0  # Dynamo traced nothing: torch's own counter
    assert b["precompile"].get("hits") == 1 and b["precompile"].get("installed") == 1


def test_another_script_source_is_not_served(pc: World) -> None:
    _ = pc.cold
    c = run(pc.base / "c", pc.store, scale="3.0")
    assert c["match"] and c["graphs"] == 1
    assert c["precompile"].get("misses") == 1 and not c["precompile"].get("hits")


def test_another_input_shape_is_guarded_and_recompiled(pc: World) -> None:
    _ = pc.cold
    d = run(pc.base / "d", pc.store, batch=5)
    assert d["precompile"].get("hits") == 1  # same source: served ...
    assert d["match"] and d["graphs"] == 1  # ... its guards fail, Dynamo compiles, correct


def test_a_tampered_entry_is_refused_and_the_compile_goes_on(pc: World) -> None:
    store = pc.store_copy("store-tampered")
    for path in entry_files(store):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    e = run(pc.base / "e", store)
    assert e["match"] and e["graphs"] == 1
    assert e["precompile"].get("misses") == 1 and not e["precompile"].get("hits")


def _client(store: Path, local: Path) -> Any:
    from objcache.client import Client
    from objcache.config.settings import Config

    cfg = Config.from_env(
        {"OBJCACHE_SIGNING_KEY": KEY}, tiers=f"file://{store}", local_dir=local, prefetch=False
    )
    return Client(cfg)


def test_an_entry_torch_rejects_is_a_counted_miss(pc: World) -> None:
    """Signed and keyed right, but built by another torch release (torch's own check)."""
    from objcache.entry.layout import decode_key

    store = pc.store_copy("store-foreign")
    path = store / pc.entry
    key = decode_key(path.name)
    client = _client(store, pc.base / "f-local")
    try:
        payload = pickle.loads(client.get("precompile", key) or b"")
        entry = payload["entry"]
        entry.dynamo.system_info = dataclasses.replace(
            entry.dynamo.system_info, torch_version="0.0.1"
        )
        shutil.rmtree(store)
        client.put("precompile", key, pickle.dumps(payload))
        assert client.flush() == 0
    finally:
        client.close()
    f = run(pc.base / "f", store)
    assert f["precompile"].get("hits") == 1
    assert f["precompile"].get("rejected:initialize") == 1
    assert f["match"] and f["graphs"] == 1


def test_a_dynamic_variant_covering_a_static_one_is_left_out_of_the_entry(tmp_path: Path) -> None:
    """A writer called at batch 2 then 4 compiles a static variant, then a dynamic one; the
    entry carries only the static one and its backend (its first call at batch 2 runs what a
    compile of that call makes: a dynamic variant's kernels reduce in another order), and a new
    machine at batch 2 then 4 is served the first and compiles the second: eager's outputs."""
    from objcache.entry.layout import decode_key

    store = tmp_path / "store"
    a = run(tmp_path / "a", store, batch="2,4")
    assert a["match"] and a["graphs"] == 2
    client = _client(store, tmp_path / "inspect")
    try:
        (path,) = entry_files(store)
        payload = pickle.loads(client.get("precompile", decode_key(path.name)) or b"")
    finally:
        client.close()
    (code,) = payload["entry"].dynamo.codes
    assert len(code.guarded_codes) == 1 and len(code.backend_ids) == 1
    assert code.backend_ids[0] in code.guarded_codes[0].dynamo_code.co_names
    b = run(tmp_path / "b", store, batch="2,4")
    assert b["match"] and b["graphs"] == 1  # batch 4: the static variant's guards refuse it
    assert b["precompile"].get("hits") == 1 and b["precompile"].get("installed") == 1


def test_an_entry_is_not_served_to_another_cpu_isa(pc: World) -> None:
    from objcache.config.fingerprint import fingerprint

    _ = pc.cold
    other = lower_isa(fingerprint()["cpu_isa"])
    if other is None:
        pytest.skip("this machine's ISA is ATen's lowest (default): no other level to force")
    g = run(pc.base / "g", pc.store, ATEN_CPU_CAPABILITY=other)
    assert g["match"] and g["graphs"] == 1
    assert g["precompile"].get("misses") == 1 and not g["precompile"].get("hits")


def test_the_entry_is_keyed_by_environment_and_source(pc: World) -> None:
    """A's one entry sits under this environment's namespace (torch release, ISA, ...)."""
    from objcache.config.fingerprint import env_id

    _ = pc.cold
    assert pc.entry.parts[1] == env_id()
    # torch's own store (``dynamo/<key>/entry``, read unverified) is not written
    assert not list((pc.base / "a" / "inductor" / "dynamo").glob("*/entry"))


TRAIN_SCRIPT = """\
import copy, json, sys
import torch
import objcache

objcache.install()
from torch import nn
from objcache.integrations.torch.precompile import precompile_entry, precompile_save


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2.0


torch.manual_seed(0)
net = Net()
x = torch.randn(3, 8)
ref_net = copy.deepcopy(net)
ref = ref_net(x).sum()
ref.backward()
loss = torch.compile(net)(x).sum()
if sys.argv[1] == "save-before-backward":
    # what the background saver does when compiles pause for 2 s before the first backward
    precompile_save.save()
loss.backward()  # the backward graph is compiled here (lazily), its backend recorded
from torch._dynamo.utils import counters

grads = [torch.allclose(p.grad, r.grad) for p, r in zip(net.parameters(), ref_net.parameters())]
print("RESULT " + json.dumps({
    "graphs": int(counters["stats"]["unique_graphs"]),
    "match": bool(torch.allclose(loss, ref)) and all(grads),
    "precompile": dict(precompile_entry.counters),
}), flush=True)
"""


def test_a_save_before_the_lazy_backward_still_carries_the_training_backend(
    tmp_path: Path,
) -> None:
    """A training step's backward is compiled at the first ``backward()``, after the frame's
    package is recorded; a save in between must not store (then or later) an entry whose
    code torch marked bypassed for the missing backend: B must skip Dynamo."""
    store = tmp_path / "store"

    def train(machine: str, mode: str) -> Any:
        path = tmp_path / machine
        e = ts.compile_env(path, f"file://{store}")
        e.update(OBJCACHE_PRECOMPILE="1", OBJCACHE_SIGNING_KEY=KEY, OBJCACHE_PREFETCH="0")
        e.update(OBJCACHE_TIMEOUT_MS=ts.FILE_STORE_TIMEOUT_MS)
        script = path / "train.py"
        script.write_text(TRAIN_SCRIPT)
        out = subprocess.run(
            [sys.executable, str(script), mode],
            env=e,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-4000:]
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
        return json.loads(line[len("RESULT ") :]), out.stderr

    a, a_err = train("a", "save-before-backward")
    assert a["match"] and a["graphs"] == 1
    assert len(entry_files(store)) == 1
    b, _ = train("b", "plain")
    assert b["match"]  # loss and gradients as eager's
    assert b["graphs"] == 0  # Dynamo traced nothing, backward included
    assert b["precompile"].get("hits") == 1 and b["precompile"].get("installed") == 1
    assert "Backend not found" not in a_err  # torch's log of a backend left out


AOT_SCRIPT = """\
import json, sys
import torch
import objcache

objcache.install()
from objcache.integrations.torch.precompile import precompile, precompile_entry


def f(x, w):
    return torch.relu(x @ w) * 2 + 1


x, w = torch.randn(4, 8), torch.randn(8, 8)
compiled = torch.compile(f, fullgraph=True).aot_compile(((x, w), {}))
compiled.save_compiled_function(sys.argv[1])
with open(sys.argv[1], "rb") as file:
    loaded = torch.compiler.load_compiled_function(file)
print("RESULT " + json.dumps({
    "on": precompile.installed(),
    "match": bool(torch.allclose(loaded(x, w), f(x, w))),
    "precompile": dict(precompile_entry.counters),
}), flush=True)
"""


def test_torchs_own_aot_compile_saves_and_loads_with_the_part_on(tmp_path: Path) -> None:
    """torch's ``aot_compile`` artifacts go through the guard functions the part wraps: they
    pass through untouched (a state of torch's own, not a package objcache served), so a
    program's own save and load work with ``OBJCACHE_PRECOMPILE=1`` as without it."""
    e = ts.compile_env(tmp_path / "m", f"file://{tmp_path / 'store'}")
    e.update(OBJCACHE_PRECOMPILE="1")
    out = subprocess.run(
        [sys.executable, "-c", AOT_SCRIPT, str(tmp_path / "fn.bin")],
        env=e, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads([x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1][7:])
    assert result["on"] and result["match"], result
    assert not any(k.startswith(("errors:", "rejected:")) for k in result["precompile"]), result
