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

import re
from collections import Counter
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
