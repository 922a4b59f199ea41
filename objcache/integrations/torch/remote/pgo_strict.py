"""A frame compiled with ``fullgraph=True`` starts static, whatever profile the process loaded.

A dynamic-shape profile (PGO) read at start makes a frame's first compile take the dims its
writers saw change as dynamic (docs/torch.md, "Dynamic-shape profiles (PGO) are a join").
A dynamic trace graph-breaks where a static one folds a size into a constant (``math.gcd``,
``math.factorial``, ``int(str(n))``, an f-string of a size): for a frame that must be one graph
(``fullgraph=True``, or ``error_on_graph_break``) that break is an error the program never
raises on a machine without the profile. So the first time such a frame reads its profile
entry in a process, the entry loaded at start is dropped: the frame compiles as on a fresh
machine, and what this process then learns (a size that changes: torch's automatic dynamic)
is kept and joined into the store as usual. Frames that may break keep the loaded profile.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from objcache.integrations.patching import marked
from objcache.integrations.torch.remote.remote_cache_classes import counters

#: ``counters``: the torch hooks' own (``stats()["hooks"]``): ``strict_frames_started_static``,
#: loaded profile entries a strict frame did not take.
__all__ = ["counters", "wrap_update_automatic_dynamic"]
#: The frames (torch's ``CodeId``) whose loaded entry was decided on, and the profile they
#: were decided in: ``torch._dynamo.reset()`` drops torch's profile, the next compile reads
#: it again, and each strict frame is decided again in the new one.
_decided: set[Any] = set()
_decided_in: list[Any] = [None]


def _strict(tx: Any) -> bool:
    return bool(getattr(tx, "one_graph", False) or getattr(tx, "error_on_graph_break", False))


def _start_static(tx: Any) -> None:
    """Drop the profile entry loaded at start for ``tx``'s frame, the first time only."""
    pgo = sys.modules["torch._dynamo.pgo"]
    state = pgo.get_code_state()  # the first call reads the profile (local file or store)
    if state is not _decided_in[0]:
        _decided.clear()
        _decided_in[0] = state
    code_id = pgo.CodeId.make(tx.f_code, tx.closure)
    if code_id in _decided:
        return
    _decided.add(code_id)
    loaded = pgo._INIT_CODE_STATE  # what that read found
    if loaded is not None and code_id in loaded and code_id in state:
        state[code_id] = pgo.CodeState()
        counters["strict_frames_started_static"] += 1


def wrap_update_automatic_dynamic(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch's ``pgo.update_automatic_dynamic`` (each input's profile entry, as a frame is
    traced), with a strict frame's loaded entry dropped before torch reads it."""

    def update_automatic_dynamic(tx: Any, name: str, entry: Any, **kwargs: Any) -> Any:
        if _strict(tx):
            try:
                _start_static(tx)
            except Exception:  # torch's own profile as it stands: never fail a compile
                counters["errors:pgo_strict"] += 1
        return original(tx, name, entry, **kwargs)

    return marked(update_automatic_dynamic, original)
