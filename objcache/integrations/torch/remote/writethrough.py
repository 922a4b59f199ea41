"""Write remote hits into Inductor's own local cache (``TORCHINDUCTOR_CACHE_DIR``).

torch 2.13 does not do this itself (FX ``GuardedCache.iterate_over_candidates``,
AOTAutograd ``_lookup``, PGO ``get_remote_code_state``, autotune ``AutotuneCache._read``
only *read* the remote entry), although the caching recipe promises it. objcache keeps
that promise, reusing torch's own writers so the paths are torch's, not re-derived:

* ``fx-graph``: ``FxGraphCache._write_to_local_cache`` — what
  ``InductorCacheArtifact.populate_cache`` does minus ``_emit_triton_bundle``, which the
  lookup that is asking already does for the entry it returns
  (``FxGraphCache.cache_hit_post_compile``);
* ``aot-autograd``: ``AOTAutogradCacheArtifact.populate_cache``;
* ``pgo``: ``PGOCacheArtifact.populate_cache``;
* ``autotune``: the ``LocalAutotuneCache`` the reading ``AutotuneCache`` already holds (the
  remote key alone does not name the local file): see :func:`wrap_autotune_read`;
* ``bundled-autotune``: torch writes its hits locally itself (``autotune_cache.py``
  ``_load_cache``).

Each writer runs only when the matching local cache is enabled, and never raises.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

from objcache.integrations.patching import marked
from objcache.observe.metrics import FailureLog

log = logging.getLogger("objcache.torch")

#: ``writethrough:<kind>`` and ``writethrough_errors:<kind>`` counters.
counters: Counter[str] = Counter()
_failed = FailureLog(
    log, "torch.writethrough", counters, "writethrough_errors:",
    "objcache: could not write a %s hit to the local cache: %r",
)  # fmt: skip


def write_through(kind: str, key: str, raw: bytes) -> bool:
    """Write the raw pickle of a remote hit into torch's local layout; True if written."""
    writer = _WRITERS.get(kind)
    if writer is None:
        return False
    try:
        written = writer(key, raw)
    except Exception as exc:
        _failed(kind, exc)
        return False
    if written:
        counters[f"writethrough:{kind}"] += 1
    return written


def _fx_graph(key: str, raw: bytes) -> bool:
    from torch._inductor import config
    from torch._inductor.codecache import FxGraphCache

    if not config.fx_graph_cache:
        return False
    FxGraphCache._write_to_local_cache(key, raw)
    return True


def _aot_autograd(key: str, raw: bytes) -> bool:
    from torch._functorch import config
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCacheArtifact

    if not config.enable_autograd_cache:
        return False
    AOTAutogradCacheArtifact(key, raw).populate_cache()
    return True


def _pgo(key: str, raw: bytes) -> bool:
    from torch._dynamo import config
    from torch._dynamo.pgo import PGOCacheArtifact

    if not config.automatic_dynamic_local_pgo:
        return False
    PGOCacheArtifact(key, raw).populate_cache()
    return True


_WRITERS: dict[str, Callable[[str, bytes], bool]] = {
    "fx-graph": _fx_graph,
    "aot-autograd": _aot_autograd,
    "pgo": _pgo,
}


def wrap_autotune_read(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``AutotuneCache._read`` that writes a remote hit into the local autotune cache."""

    def _read(self: Any) -> Any:
        local: Any = getattr(self, "local_cache", None)
        remote: Any = getattr(self, "remote_cache", None)
        missing_locally = False
        if local and remote:
            try:
                missing_locally = not os.path.exists(local[1])
            except Exception:
                missing_locally = False
        best = original(self)
        if missing_locally and isinstance(best, dict) and best:
            try:
                cache, path = local
                # The caller pops fields from ``best``: write a copy.
                cache.put(path, dict(best))
                counters["writethrough:autotune"] += 1
            except Exception as exc:
                _failed("autotune", exc)
        return best

    marked(_read, original)
    return _read
