"""Cache keys that embed something only one process has (docs/vllm.md, "Keys nobody else
can read").

Under AOT compile (``torch._dynamo.aot_compile``, vLLM's default) and caching precompile,
Dynamo names each compiled graph's backend ``__compiled_fn_<n>_<uuid4>`` and AOTAutograd's
cache key includes that name (``AOTConfig.precompile_backend_id``): every process computes a
key no other process, not even its own next start, will ever ask for. Stored as is, each
start publishes one unreadable entry and grows the job's prefetch list.

* The uuid part of the backend name is left out of the key (counted
  ``aot_backend_id_normalized``); whether a backend name is set at all, and its ordinal,
  stay in. This is sound because the name is not part of what AOTAutograd compiles: torch
  saves the entry with the name cleared and, on a hit, records the *current* process's name
  (``AOTAutogradCache`` load: "this new run that cache hit has a *new* backend id").
* A key torch could not compute and replaced by a nonce (``str(random.random())`` when
  ``bypass_autograd_cache_key`` is on) is recognised by its shape (a float's repr, where
  torch's keys are ``a`` + a hash) and kept on this machine: never published, never in the
  prefetch list (counted ``local_only:nonce_key``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from objcache.integrations.patching import is_marked, marked

counters: Counter[str] = Counter()

#: ``unique_id("__compiled_fn", with_uuid=True)``: the ordinal, then a uuid4 with underscores.
_BACKEND_ID = re.compile(
    r"^(?P<stem>__compiled_fn_\d+)_[0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12}$"
)
#: torch's fallback when it cannot key a graph: ``str(random.random())``.
_NONCE = re.compile(r"^\d\.\d+(e-\d+)?$")
_PER_PROCESS = "<per-process>"

_patched: list[tuple[Any, Any]] = []


def stable_backend_id(backend_id: Any) -> Any:
    """The backend name as it goes into a key: its uuid part replaced, anything else as is."""
    if isinstance(backend_id, str):
        m = _BACKEND_ID.match(backend_id)
        if m is not None:
            counters["aot_backend_id_normalized"] += 1
            return f"{m.group('stem')}_{_PER_PROCESS}"
    return backend_id


def is_nonce_key(kind: str, key: str) -> bool:
    """Whether ``key`` of ``kind`` is one only this process can have (kept local)."""
    return kind == "aot-autograd" and _NONCE.match(key) is not None


def apply(autograd_cache: Any) -> bool:
    """Leave the uuid out of AOTAutograd's key (False where this torch keys differently)."""
    pickler: Any = getattr(autograd_cache, "AOTAutogradCachePickler", None)
    original = getattr(pickler, "_reduce_aot_config", None)
    if pickler is None or original is None or is_marked(original):
        return original is not None
    # the key's config tuple ends with the backend name (torch 2.13 to 2.15)

    def _reduce_aot_config(self: Any, aot_config: Any) -> Any:
        reduced = original(self, aot_config)
        try:
            ident, fields = reduced
            if fields and fields[-1] == getattr(aot_config, "precompile_backend_id", None):
                return ident, (*fields[:-1], stable_backend_id(fields[-1]))
        except (TypeError, ValueError):
            pass
        return reduced

    marked(_reduce_aot_config, original)
    pickler._reduce_aot_config = _reduce_aot_config
    _patched.append((pickler, original))
    return True


def uninstall() -> None:
    for pickler, original in reversed(_patched):
        pickler._reduce_aot_config = original
    _patched.clear()


# --- what a key was computed under --------------------------------------------------------

#: The kinds whose entry may be saved after the program ran on since its key was computed:
#: AOTAutograd compiles a graph's backward at its first ``.backward()`` and saves the entry
#: then, under the key it read at the forward.
SAVED_LATER = frozenset({"aot-autograd"})
#: Keys remembered with the state they were looked up under, at most.
MAX_LOOKED_UP = 4096
_looked_up: dict[str, str] = {}
#: The state the thread's last graph compile ran under (torch's own config patches applied).
_compiled = threading.local()


def compile_state() -> str:
    """A digest of the process-wide settings a graph's compile reads that an AOTAutograd
    entry's key names: Inductor's config as torch hashes it, the switches and modes objcache
    adds to the keys, the default dtype, the program's kernels of torch's ops, table entries
    and edits of torch's data (read once per compile window), and the other process-wide
    values torch's graph key reads (:func:`_torch_key_globals`). Unreadable: a value never
    equal to another one."""
    parts: list[str] = []
    try:
        import torch

        from objcache.integrations.torch.precompile import compile_settings, op_overrides

        config = sys.modules["torch._inductor.config"]
        parts.append(repr(sorted(config.save_config_portable().items())))
        parts.append(repr(compile_settings.sdp_backends_off()))
        parts.append(repr(compile_settings.aten_switches_changed()))
        parts.append(repr(compile_settings.cpu_gemm_geometry()))
        parts.append(repr(torch.get_default_dtype()))
        parts.append(repr(op_overrides.torch_overrides()))
        parts.extend(map(repr, _torch_key_globals(torch)))
    except Exception:
        return f"unreadable:{os.urandom(8).hex()}"
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=16).hexdigest()


def _torch_key_globals(torch: Any) -> list[Any]:
    """The process-wide values torch's ``FxGraphHashDetails`` reads beside Inductor's config
    (each where this release has it): the deterministic-algorithms settings, the thread count
    C++ kernels are generated for (and the CPU count Inductor compares it with: a thread count
    equal to it makes a kernel's OpenMP region dynamic), the CUDA matmul settings, the
    communication config and the compiler's cache key tag."""
    deterministic = sys.modules.get("torch.utils.deterministic")
    matmul = torch.backends.cuda.matmul
    comms = sys.modules.get("torch._inductor.config_comms")
    compiler = sys.modules.get("torch.compiler.config")
    return [
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        getattr(deterministic, "fill_uninitialized_memory", None),
        torch.get_num_threads(),
        os.cpu_count(),
        getattr(matmul, "fp32_precision", None),
        getattr(matmul, "allow_fp16_reduced_precision_reduction", None),
        getattr(matmul, "allow_bf16_reduced_precision_reduction", None),
        sorted(comms.save_config_portable().items()) if comms is not None else None,
        getattr(compiler, "cache_key_tag", None),
    ]


def looked_up(kind: str, key: str) -> None:
    """torch looks ``key`` of ``kind`` up: remember the state it was computed under."""
    if kind not in SAVED_LATER:
        return
    _looked_up.pop(key, None)
    _looked_up[key] = compile_state()
    while len(_looked_up) > MAX_LOOKED_UP:
        del _looked_up[next(iter(_looked_up))]


def wrap_graph_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    """Inductor's ``_compile_fx_inner`` (each graph's compile, a lazy backward's too, under
    the config patches ``torch.compile``'s ``mode``/``options`` apply): the state it ran under
    is what an entry saved right after it was compiled with."""

    def compile_graph(*args: Any, **kwargs: Any) -> Any:
        _compiled.state = compile_state()
        return original(*args, **kwargs)

    return marked(functools.wraps(original)(compile_graph), original)


def changed_since_lookup(kind: str, key: str) -> bool:
    """Whether ``key``'s entry was compiled under other settings than torch looked the key
    up under (the program changed one between a forward and its lazy backward): such an
    entry is kept on this machine, as torch's own cache keeps it, never published (counted
    ``local_only:changed_since_key``). A key this process never looked up counts as
    changed."""
    if kind not in SAVED_LATER:
        return False
    then = _looked_up.get(key)
    now = getattr(_compiled, "state", None) or compile_state()
    _compiled.state = None  # consumed: a later save follows a compile of its own
    return then is None or then != now
