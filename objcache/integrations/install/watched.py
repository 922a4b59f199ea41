"""The torch modules objcache hooks: the one list of them.

The install is made of *parts*, one per torch module. :mod:`.hooks` applies a part when its
module is imported, either from :func:`.hooks.install` or from the import watcher of the
zero-code path (:mod:`.autoload`), which must know the names without importing
:mod:`.hooks` (and with it ``logging``) at interpreter start-up. So the names live here,
in a module that imports nothing but ``typing``.

:func:`stop_watching` is how :func:`.hooks.uninstall` tells the watcher to stop, without
:mod:`.hooks` and :mod:`.autoload` importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

#: What a part of the install does (:mod:`.hooks` maps each to the function applying it).
Part = Literal[
    "op_kernels",
    "flags",
    "remote_caches",
    "autotune",
    "kernels",
    "fx_candidates",
    "aot_candidates",
    "precompile",
    "vllm",
    "vllm_aot",
    "triton_host",
    "torch_edits",
    "inductor_code",
    "pgo",
]

#: torch module -> the part of the install applied once it is imported, in install order.
WATCHED: dict[str, Part] = {
    # first: the kernels a library registers for an op as it is imported, before any compile
    # (docs/torch.md, "Custom ops in the keys")
    "torch.library": "op_kernels",
    # what torch's own data and Inductor's tables held as imported, before the program runs
    # (docs/torch.md, "Custom ops in the keys"); the lowering module is the first compile's
    "torch": "torch_edits",
    "torch._inductor.lowering": "torch_edits",
    "torch._dynamo.callback": "torch_edits",
    "torch._inductor.config": "flags",
    "torch._functorch.config": "flags",
    "torch._dynamo.config": "flags",
    "torch._dynamo.pgo": "pgo",
    "torch._dynamo.convert_frame": "pgo",
    "torch._inductor.remote_cache": "remote_caches",
    "torch._inductor.runtime.autotune_cache": "autotune",
    "torch._inductor.cpp_builder": "kernels",
    "torch._inductor.codecache": "fx_candidates",
    "torch._functorch._aot_autograd.autograd_cache": "aot_candidates",
    "torch._dynamo.package": "precompile",
    "torch._dynamo.guards": "precompile",
    "torch._dynamo.symbolic_convert": "precompile",
    # vLLM's own caches (:mod:`objcache.integrations.vllm`): applied only where vLLM imports
    # it, never imported by ``install()``
    "vllm.model_executor.models.registry": "vllm",
    "vllm.compilation.decorators": "vllm_aot",
    # Triton's host-side modules (:mod:`objcache.integrations.triton_host`): applied where
    # Triton is imported, never imported by ``install()``
    "triton.runtime.build": "triton_host",
}

#: Packages each module of which is hooked as it is imported (the zero-code path, and an
#: explicit ``install()`` for those imported after it):
#: what Inductor's classes and functions are as torch defines them, before the program can
#: re-point one (docs/torch.md, "Custom ops in the keys").
WATCHED_PACKAGES: dict[str, Part] = {"torch._inductor": "inductor_code"}


def part_of(name: str) -> Part | None:
    """The part applied once ``name`` is imported, if any."""
    part = WATCHED.get(name)
    if part is None:
        for package, package_part in WATCHED_PACKAGES.items():
            if name.startswith(package + "."):
                return package_part
    return part


#: Watched modules of other packages than torch: hooked when imported, never imported.
NOT_IMPORTED: frozenset[str] = frozenset(
    {"vllm.model_executor.models.registry", "vllm.compilation.decorators", "triton.runtime.build"}
)

#: Watched modules of torch's that ``install()`` leaves to the program's first compile (0.65 s
#: on a 2-vCPU machine that a process which never compiles would pay): hooked, and their
#: namespaces copied, as their import ends.
IMPORTED_WHEN_NEEDED: frozenset[str] = frozenset({"torch._inductor.lowering"})

_stop_listeners: list[Callable[[], None]] = []


def on_stop_watching(listener: Callable[[], None]) -> None:
    """Call ``listener`` whenever :func:`stop_watching` runs (registered once per listener)."""
    if listener not in _stop_listeners:
        _stop_listeners.append(listener)


def stop_watching() -> None:
    """Stop applying parts on later imports (``uninstall()`` calls this)."""
    for listener in list(_stop_listeners):
        listener()
