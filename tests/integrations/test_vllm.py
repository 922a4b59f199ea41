"""vLLM's start-up caches through objcache (docs/vllm.md), without vLLM installed.

* The model-inspection part runs against a registry shaped like vLLM 0.32's
  (``_LazyRegisteredModel`` with its ``modelinfos/<module>-<class>.json`` reader and writer,
  and a ``_ModelInfo`` dataclass), on a real ``file://`` store shared by two simulated
  machines: what one stores, a new machine is served and writes through to vLLM's own file;
  whatever a hostile writer plants is a counted miss.
* The zero-code path applies it when the registry module is imported (a subprocess with a
  stand-in ``vllm`` package), and ``install()`` never imports vLLM.
* AOTAutograd keys that embed a per-process backend name are the same in every process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import objcache
from objcache.backends import fs_store as _fs
from objcache.client import reset_client
from objcache.config.settings import Config
from objcache.integrations import vllm as ov

MODULE_HASH = "d032877f6530a7c93770de9f798c8d45"

REGISTRY_SOURCE = """
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

CACHE_ROOT = [os.environ.get("VLLM_CACHE_ROOT", "")]


@dataclass(frozen=True)
class _ModelInfo:
    architecture: str
    is_text_generation_model: bool
    supports_pp: bool
    attn_type: str
    supported_video_pruning_methods: tuple[str, ...]


@dataclass(frozen=True)
class _LazyRegisteredModel:
    module_name: str
    class_name: str

    def _path(self) -> Path:
        name = f"{self.module_name}-{self.class_name}".replace(".", "-")
        return Path(CACHE_ROOT[0]) / "modelinfos" / f"{name}.json"

    def _load_modelinfo_from_cache(self, module_hash):
        try:
            data = json.loads(self._path().read_text())
        except FileNotFoundError:
            return None
        if data["hash"] != module_hash:
            return None
        return _ModelInfo(**data["modelinfo"])

    def _save_modelinfo_to_cache(self, mi, module_hash):
        self._path().parent.mkdir(parents=True, exist_ok=True)
        self._path().write_text(json.dumps({"hash": module_hash, "modelinfo": asdict(mi)}))
"""


def _registry() -> types.ModuleType:
    module = types.ModuleType("fake_vllm_registry")
    sys.modules[module.__name__] = module  # dataclasses resolve string annotations there
    exec(compile(REGISTRY_SOURCE, "<registry>", "exec"), module.__dict__)
    return module


INFO = {
    "architecture": "LlamaForCausalLM",
    "is_text_generation_model": True,
    "supports_pp": True,
    "attn_type": "decoder",
    "supported_video_pruning_methods": [],
}


@pytest.fixture()
def machines(tmp_path: Path) -> Iterator[Any]:
    """``use(name)``: make ``name`` the current machine (its own objcache local dir and vLLM
    cache root; the ``file://`` store is shared). Yields (use, registry)."""
    registry = _registry()
    ov.counters.clear()
    assert ov.apply(registry)

    def use(name: str) -> Path:
        root = tmp_path / name
        cfg = Config.from_env({}, tiers=f"file://{tmp_path / 'store'}", local_dir=root / "local")
        objcache.get_client(cfg)
        registry.CACHE_ROOT[0] = str(root / "vllm")
        return root / "vllm"

    yield use, registry
    ov.uninstall()
    reset_client()


def _model(registry: types.ModuleType) -> Any:
    return registry._LazyRegisteredModel("vllm.model_executor.models.llama", "LlamaForCausalLM")


def test_a_new_machine_is_served_vllms_model_inspection(machines: Any) -> None:
    use, registry = machines
    use("writer")
    model = _model(registry)
    assert model._load_modelinfo_from_cache(MODULE_HASH) is None  # nothing anywhere yet
    model._save_modelinfo_to_cache(registry._ModelInfo(**INFO), MODULE_HASH)
    assert objcache.get_client().flush() == 0
    assert ov.counters["modelinfo_stored"] == 1

    cache_root = use("new")
    info = model._load_modelinfo_from_cache(MODULE_HASH)
    assert info == registry._ModelInfo(**INFO)
    assert ov.counters["modelinfo_hits"] == 1
    written = json.loads(next((cache_root / "modelinfos").iterdir()).read_text())
    assert written == {"hash": MODULE_HASH, "modelinfo": INFO}  # vLLM's own file, next time
    assert model._load_modelinfo_from_cache(MODULE_HASH) == info
    assert ov.counters["modelinfo_local"] == 1 and ov.counters["modelinfo_hits"] == 1


def test_another_module_source_is_another_key(machines: Any) -> None:
    use, registry = machines
    use("writer")
    _model(registry)._save_modelinfo_to_cache(registry._ModelInfo(**INFO), MODULE_HASH)
    assert objcache.get_client().flush() == 0
    use("edited")
    assert _model(registry)._load_modelinfo_from_cache("0" * 32) is None
    assert ov.counters["modelinfo_misses"] == 1


HOSTILE: dict[str, tuple[bytes, str]] = {
    "not json": (b"\x80\x04K\x01.", "unreadable"),
    "deeply nested": (b"[" * 30_000 + b"]" * 30_000, "unreadable"),
    "a list": (b"[1, 2]", "foreign"),
    "another module's hash": (
        json.dumps({"hash": "f" * 32, "modelinfo": INFO}).encode(),
        "foreign",
    ),
    "an extra field": (
        json.dumps({"hash": MODULE_HASH, "modelinfo": {**INFO, "evil": 1}}).encode(),
        "fields",
    ),
    "a missing field": (
        json.dumps(
            {
                "hash": MODULE_HASH,
                "modelinfo": {k: v for k, v in INFO.items() if k != "supports_pp"},
            }
        ).encode(),
        "fields",
    ),
    "a string for a boolean": (
        json.dumps({"hash": MODULE_HASH, "modelinfo": {**INFO, "supports_pp": "yes"}}).encode(),
        "types",
    ),
    "an object for a string": (
        json.dumps(
            {"hash": MODULE_HASH, "modelinfo": {**INFO, "attn_type": {"__class__": "x"}}}
        ).encode(),
        "types",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_planted_entry_is_a_counted_miss(machines: Any, case: str) -> None:
    """Whatever a fleet writer plants under the right key: vLLM inspects the model itself."""
    payload, why = HOSTILE[case]
    use, registry = machines
    use("planter")
    key = ov.modelinfo_key("vllm.model_executor.models.llama", "LlamaForCausalLM", MODULE_HASH)
    objcache.get_client().put(ov.KIND_MODELINFO, key, payload)
    assert objcache.get_client().flush() == 0
    cache_root = use("victim")
    assert _model(registry)._load_modelinfo_from_cache(MODULE_HASH) is None
    assert ov.counters[f"rejected:modelinfo_{why}"] == 1, dict(ov.counters)
    assert not (cache_root / "modelinfos").exists()  # nothing written for vLLM to read


def test_an_oversized_entry_is_refused_at_the_read_without_being_fetched(
    machines: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planted 8 MiB model-inspection entry is over the kind's 64 KiB cap: the ``file://``
    store sees its size before reading it (docs/security.md, "Size caps in detail"), so it is
    never read whole, let alone parsed; a counted miss, vLLM inspects the model itself."""
    use, registry = machines
    use("planter")
    key = ov.modelinfo_key("vllm.model_executor.models.llama", "LlamaForCausalLM", MODULE_HASH)
    objcache.get_client().put(ov.KIND_MODELINFO, key, os.urandom(8 << 20))
    assert objcache.get_client().flush() == 0
    cache_root = use("victim")
    reads: list[int] = []
    real = _fs._read_all
    monkeypatch.setattr(_fs, "_read_all", lambda fd, n: reads.append(n) or real(fd, n))
    assert _model(registry)._load_modelinfo_from_cache(MODULE_HASH) is None
    # the store's object was never read (a small read elsewhere, the environment
    # fingerprint's cache on a first start, is not the entry)
    assert not [n for n in reads if n > 64 << 10], reads
    # every miss of the store is "too large" (the lookup's, and the prefetch's where it
    # reached the entry first)
    misses = objcache.get_client().stats()["tiers"][1]["misses"]
    assert set(misses) == {"too_large"} and misses["too_large"] >= 1, misses
    assert ov.counters["modelinfo_misses"] == 1 and not any(
        c.startswith("rejected:") for c in ov.counters
    ), dict(ov.counters)
    assert not (cache_root / "modelinfos").exists()
    with pytest.raises(ov.Rejected, match="oversized"):  # where a user raised the cap
        ov.parse_modelinfo(b" " * (ov.MAX_BYTES + 1), MODULE_HASH, registry._ModelInfo)


def test_a_vllm_without_the_hooks_is_left_alone() -> None:
    registry = types.ModuleType("old_vllm_registry")
    registry._LazyRegisteredModel = type("_LazyRegisteredModel", (), {})  # type: ignore[attr-defined]
    assert ov.apply(registry) is False
    assert not ov.installed()


def test_the_zero_code_path_hooks_vllm_when_vllm_imports_it(tmp_path: Path) -> None:
    """A stand-in ``vllm`` package: the ``.pth`` watcher hooks the registry on import;
    ``objcache.install()`` in a process without vLLM imports no ``vllm`` module."""
    pkg = tmp_path / "site" / "vllm" / "model_executor" / "models"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    (pkg / "registry.py").write_text(REGISTRY_SOURCE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.getcwd()]),
        "OBJCACHE_TIERS": f"file://{tmp_path / 'store'}",
        "OBJCACHE_LOCAL_DIR": str(tmp_path / "local"),
    }
    program = (
        "import vllm.model_executor.models.registry as r\n"
        "print(getattr(r._LazyRegisteredModel._load_modelinfo_from_cache, '__objcache__', False))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True"]

    env.pop("OBJCACHE_TIERS")
    program = (
        "import sys, objcache\n"
        "objcache.install(objcache.Config.from_env(tiers=sys.argv[1]))\n"
        "print(sorted(m for m in sys.modules if m.startswith('vllm')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", program, f"file://{tmp_path / 'store'}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[]"]


# --- AOTAutograd keys with a per-process backend name ------------------------------------------


def _backend_id() -> str:
    return f"__compiled_fn_1_{uuid.uuid4()}".replace("-", "_")


def test_a_per_process_backend_name_leaves_the_aot_key() -> None:
    """Two processes' backend names (uuid4) give one AOTAutograd key; whether a name is set
    still counts; put back, the keys differ again (what torch alone does)."""
    torch = pytest.importorskip("torch")
    fx = pytest.importorskip("torch.fx")
    from torch._functorch._aot_autograd import autograd_cache as ac
    from torch._functorch._aot_autograd.schemas import AOTConfig

    from objcache.integrations.torch.remote import process_keys

    gm = fx.symbolic_trace(lambda x: torch.relu(x) + 1)

    def key(backend_id: str | None) -> str:
        config = AOTConfig(
            fw_compiler=None, bw_compiler=None, partition_fn=None, decompositions={},
            num_params_buffers=0, aot_id=0, keep_inference_input_mutations=False,
            precompile_backend_id=backend_id,
        )  # fmt: skip
        return str(ac.AOTAutogradCachePickler(gm).get_hash(config))

    assert key(_backend_id()) != key(_backend_id())
    assert process_keys.apply(ac)
    try:
        assert key(_backend_id()) == key(_backend_id())
        assert key(None) != key(_backend_id())
        assert key("__compiled_fn_2_" + _backend_id()[16:]) != key(_backend_id())
    finally:
        process_keys.uninstall()
    assert key(_backend_id()) != key(_backend_id())


@pytest.mark.parametrize(
    ("kind", "key", "nonce"),
    [
        ("aot-autograd", "a" + "b3" * 26, False),
        ("aot-autograd", "akey456", False),
        ("aot-autograd", "0.8444218515250481", True),
        ("aot-autograd", "8.63e-05", True),
        ("fx-graph", "0.8444218515250481", False),
    ],
)
def test_a_nonce_key_is_recognised(kind: str, key: str, nonce: bool) -> None:
    from objcache.integrations.torch.remote import process_keys

    assert process_keys.is_nonce_key(kind, key) is nonce


def test_a_backend_name_without_a_uuid_is_kept() -> None:
    from objcache.integrations.torch.remote import process_keys

    assert process_keys.stable_backend_id("__compiled_fn_3") == "__compiled_fn_3"
    assert process_keys.stable_backend_id(None) is None
    assert process_keys.stable_backend_id(_backend_id()) == "__compiled_fn_1_<per-process>"


_AOT_SCRIPT = """
import json
import objcache
objcache.install()
import torch
from torch._dynamo.utils import counters
from objcache.integrations.torch.remote import process_keys

def f(x, w):
    return torch.relu(x @ w) * 2 + 1

torch.manual_seed(0)
x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
compiled = torch.compile(f, fullgraph=True).aot_compile(((x, w), {}))
out = compiled(x, w)
out.sum().backward()
ref_w = w.detach().clone().requires_grad_(True)
ref = f(x, ref_w)
ref.sum().backward()
print(json.dumps({
    "match": bool(torch.allclose(out, ref) and torch.allclose(w.grad, ref_w.grad)),
    "aot": dict(counters["aot_autograd"]),
    "normalized": process_keys.counters["aot_backend_id_normalized"],
    "hits": objcache.get_client().stats()["cache"]["hits"],
}))
"""


def test_an_aot_compiled_function_is_served_its_autograd_entry_on_a_new_machine(
    tmp_path: Path,
) -> None:
    """torch's own ``aot_compile`` (what vLLM compiles with): a new machine computes the same
    AOTAutograd key as the machine that stored it (the per-process backend name left out),
    is served the entry through objcache, and computes eager's output and gradient."""
    pytest.importorskip("torch")
    from tests.support.torch_runs import compile_env

    store = f"file://{tmp_path / 'store'}"
    seen = []
    for machine in ("a", "b"):
        env = compile_env(tmp_path / machine, store)
        proc = subprocess.run(
            [sys.executable, "-c", _AOT_SCRIPT], env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        seen.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = seen
    assert first["match"] and second["match"], seen
    assert first["normalized"] and second["normalized"], seen
    assert first["aot"].get("autograd_cache_miss") == 1, first
    assert second["aot"].get("autograd_cache_hit") == 1, second  # torch alone: a miss
    assert second["hits"].get("aot-autograd") == 1, second


@pytest.mark.parametrize(
    ("call", "fails"),
    [
        ("loaded_fn._artifacts.compiled_fn.finalize_loading(model.vllm_config)", True),
        (
            "getattr(loaded_fn._artifacts.compiled_fn, 'finalize_loading', None) and "
            "loaded_fn._artifacts.compiled_fn.finalize_loading(model.vllm_config)",
            False,
        ),
    ],
)
def test_doctor_says_when_vllms_own_aot_load_fails_on_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, fails: bool
) -> None:
    """Read from vLLM's files (a stand-in package here), never by importing it."""
    pkg = tmp_path / "vllm"
    (pkg / "compilation").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('never imported')\n")
    (pkg / "compilation" / "decorators.py").write_text(f"def load():\n    {call}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    state = ov.doctor_state()
    assert state["installed"] and state["aot_load_fails_on_cpu"] is fails
    assert ("its own AOT load fails on CPU" in ov.doctor_line(state)) is fails
    assert ov.doctor_line({"installed": False}) == "vLLM: not installed"
