"""The compile time this process's cache hits saved, in torch's own figures.

FX graph and AOTAutograd entries carry the time their compile took (``CompiledFxGraph``'s
``_time_taken_ns``; an AOTAutograd entry's forward and backward times), and on every hit
torch hands that figure to one function, ``add_ephemeral_timeout_increase_for_distributed``
in ``torch._inductor.codecache`` (called by the FX graph cache, the AOTAutograd cache and
the autotune cache). objcache wraps that function to add the figure up per kind, then calls
torch's own; it reads nothing torch did not already compute and unpickles nothing.

An AOTAutograd hit loads its FX graphs through the FX graph cache, so an FX hit inside one
is part of the AOTAutograd figure. :func:`total_s` therefore counts the AOTAutograd and
autotune figures, and the FX figures only of a run that had no AOTAutograd hit (a cache
configuration with AOTAutograd caching off): close to, and never above, what torch reports.

Run summaries carry the figures (:mod:`objcache.observe.run_summary`); ``objcache report``
shows them.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from typing import Any

from objcache.integrations.patching import is_marked, marked

FUNCTION = "add_ephemeral_timeout_increase_for_distributed"
#: The module whose code calls the function -> the kind it accounts for.
CALLERS = {
    "torch._inductor.codecache": "fx-graph",
    "torch._functorch._aot_autograd.autograd_cache": "aot-autograd",
    "torch._inductor.runtime.autotune_cache": "autotune",
}

_lock = threading.Lock()
_saved_ns: Counter[str] = Counter()
#: module -> the function objcache replaced there (restored by :func:`uninstall`).
_originals: dict[Any, Any] = {}


def record(kind: str, time_saved_ns: Any) -> None:
    try:
        ns = int(time_saved_ns)
    except (TypeError, ValueError):
        return
    if ns > 0:
        with _lock:
            _saved_ns[kind] += ns


def snapshot() -> dict[str, float]:
    """Seconds saved per kind so far in this process."""
    with _lock:
        return {kind: round(ns / 1e9, 6) for kind, ns in _saved_ns.items()}


def total_s(per_kind: dict[str, float]) -> float:
    """One figure for a run (see the module docstring on FX hits inside AOTAutograd hits)."""
    aot = per_kind.get("aot-autograd", 0.0)
    fx = 0.0 if aot else per_kind.get("fx-graph", 0.0)
    return aot + fx + per_kind.get("autotune", 0.0)


def _wrap(original: Any) -> Any:
    def counted(time_saved_ns: Any, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        record(CALLERS.get(caller, "other"), time_saved_ns)
        return original(time_saved_ns, *args, **kwargs)

    marked(counted, original)
    return counted


def apply(module: Any) -> bool:
    """Wrap the function where ``module`` looks it up (torch's codecache, and the AOTAutograd
    cache, which imported it by name). False when this torch has no such function."""
    current = getattr(module, FUNCTION, None)
    if current is None or not callable(current):
        return False
    if is_marked(current):
        return True
    with _lock:
        _originals[module] = current
    setattr(module, FUNCTION, _wrap(current))
    return True


def uninstall() -> None:
    with _lock:
        originals = list(_originals.items())
        _originals.clear()
    for module, original in originals:
        if is_marked(getattr(module, FUNCTION, None)):
            setattr(module, FUNCTION, original)


def reset() -> None:
    """Forget the figures (tests)."""
    with _lock:
        _saved_ns.clear()
