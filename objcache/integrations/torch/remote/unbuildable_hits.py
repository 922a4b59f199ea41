"""A cache hit whose kernels do not build on this machine is a miss, not the user's error.

torch materialises an FX cache hit's module in ``CompiledFxGraph.after_deserialization``
(the output code and its C++ kernels, built where their binaries are absent) and treats an
``OSError`` there as a miss: it compiles the graph as on a cold machine
(``FxGraphCache.cache_hit_post_compile``; an AOTAutograd hit then misses too). A kernel this
machine's compiler refuses (``CppCompileError``: source written for a CPU feature or a
compiler flag this machine lacks) raised out of the user's first call instead. The
environment and the keys name what is known to change the source (docs/architecture.md,
"Environments"); this is the floor under what they miss: the refusal becomes that
``OSError``, counted (``unbuildable_hits``) and logged once, and the graph is compiled here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from objcache.integrations.patching import Patches, is_marked, marked
from objcache.integrations.torch.remote.remote_cache_classes import counters
from objcache.observe.plaintext import plain

log = logging.getLogger("objcache.torch")
_patched = Patches()


def apply(graph: type) -> None:
    """Wrap ``graph.after_deserialization`` (torch's ``CompiledFxGraph``) once."""
    original = graph.__dict__["after_deserialization"]
    if is_marked(original):
        return
    from torch._inductor.exc import CppCompileError

    _patched.set(
        graph, "after_deserialization", wrap_after_deserialization(original, CppCompileError)
    )


def uninstall() -> None:
    _patched.undo()


def wrap_after_deserialization(
    original: Callable[..., Any], refused: type[BaseException]
) -> Callable[..., Any]:
    """``CompiledFxGraph.after_deserialization`` with ``refused`` (torch's
    ``CppCompileError``) turned into the ``OSError`` torch reads as a miss."""

    def after_deserialization(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except refused as exc:
            counters["unbuildable_hits"] += 1
            if counters["unbuildable_hits"] == 1:
                first = str(exc).strip().splitlines()[:1]
                log.warning(
                    "objcache: a cached graph's kernels do not build on this machine; "
                    "compiling it here instead (%s)",
                    plain(first[0][:200] if first else type(exc).__name__),
                )
            raise OSError("a cached graph's kernels do not build on this machine") from exc

    return marked(after_deserialization, original)
