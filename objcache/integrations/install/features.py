"""Which parts of the torch integration this torch (and Triton) can carry: checked by feature.

Every part of the integration hooks named torch internals (docs/torch.md, "How torch is
hooked") that move between releases. Instead of trusting a version string, each part lists
the hooks it needs (a class, a method, a config flag) and is switched on only when every one
of them is there. A part whose hook is missing stays off, logged once in one line, and
:mod:`.hooks` never leaves torch's own remote-cache flag of that part on; the other parts are
unaffected. ``objcache doctor`` prints :func:`report`.

Checks read modules already imported only (:func:`missing`), so the zero-code path, which
applies a part when its module is imported (:mod:`.autoload`), never imports a torch module
torch would not have imported; a hook in a module not imported yet is checked again when a
later part runs. :func:`load` imports them all, for :func:`.hooks.install` and the doctor.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Literal

from objcache.integrations.install.zero_code_switch import enabled

log = logging.getLogger("objcache.torch")

HookKind = Literal["module", "class", "method", "function", "flag"]


@dataclass(frozen=True)
class Hook:
    """One torch (or Triton) attribute a part relies on: ``module`` then a dotted ``attr``."""

    module: str
    attr: str
    kind: HookKind

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attr}" if self.attr else self.module


def _hooks(kind: HookKind, module: str, *attrs: str) -> tuple[Hook, ...]:
    return tuple(Hook(module, attr, kind) for attr in attrs)


_RC = "torch._inductor.remote_cache"
_ICONF = "torch._inductor.config"
_CODECACHE = "torch._inductor.codecache"
_AOT = "torch._functorch._aot_autograd.autograd_cache"
_AUTOTUNE = "torch._inductor.runtime.autotune_cache"

#: What every remote-cache part subclasses (``remote_cache_classes.make_cache_class``).
_REMOTE_BASE = _hooks("class", _RC, "RemoteCache", "RemoteCacheBackend", "RemoteCacheJsonSerde")

#: Part -> the hooks it needs, in the order ``objcache doctor`` prints them.
PARTS: dict[str, tuple[Hook, ...]] = {
    "FX": (
        *_REMOTE_BASE,
        *_hooks("class", _RC, "RemoteFxGraphCache"),
        *_hooks("flag", _ICONF, "fx_graph_remote_cache"),
        *_hooks("method", _CODECACHE, "FxGraphCache._write_to_local_cache"),
        *_hooks("method", "torch._inductor.output_code", "CompiledFxGraph.after_deserialization"),
    ),
    "AOTAutograd": (
        *_REMOTE_BASE,
        *_hooks("class", _RC, "RemoteAOTAutogradCache"),
        *_hooks("flag", "torch._functorch.config", "enable_remote_autograd_cache"),
        *_hooks("method", _AOT, "AOTAutogradCacheArtifact.populate_cache"),
    ),
    "PGO": (
        *_REMOTE_BASE,
        *_hooks("class", _RC, "RemoteDynamoPGOCache"),
        *_hooks("flag", "torch._dynamo.config", "automatic_dynamic_remote_pgo"),
        *_hooks("method", "torch._dynamo.pgo", "PGOCacheArtifact.populate_cache"),
        *_hooks("function", "torch._dynamo.pgo", "update_automatic_dynamic"),
    ),
    "autotune": (
        *_REMOTE_BASE,
        *_hooks("class", _RC, "RemoteAutotuneCache"),
        *_hooks("flag", _ICONF, "autotune_remote_cache"),
        *_hooks("method", _AUTOTUNE, "AutotuneCache._read"),
    ),
    "bundled autotune": (
        *_REMOTE_BASE,
        *_hooks("class", _RC, "RemoteBundledAutotuneCache"),
        *_hooks("flag", _ICONF, "bundled_autotune_remote_cache"),
        *_hooks("method", _AUTOTUNE, "AutotuneCacheBundler.begin_compile"),
    ),
    "kernels": _hooks(
        "method",
        "torch._inductor.cpp_builder",
        "CppBuilder.build",
        "CppBuilder.get_target_file_path",
    ),
    "Mega-Cache": _hooks(
        "function", "torch.compiler", "save_cache_artifacts", "load_cache_artifacts"
    ),
    "precompile": (
        *_hooks("flag", "torch._dynamo.config", "caching_precompile"),
        *_hooks(
            "method",
            "torch._dynamo.package",
            "DynamoCache.load",
            "DynamoCache.record_package",
            "CompilePackage.initialize",
            "CompilePackage.install",
            "CompilePackage.source_id_from_fn",
            "InMemoryDynamoStore.load_cache_entry",
        ),
        *_hooks("class", "torch._dynamo.package", "PrecompileCacheEntry", "_DynamoCacheEntry"),
        *_hooks("method", "torch._dynamo.package", "PrecompileCacheEntry.from_cache_entry"),
        *_hooks("method", "torch._dynamo.precompile_context", "PrecompileContext.record_artifact"),
        *_hooks("method", "torch._dynamo.guards", "CheckFunctionManager.serialize_guards"),
        *_hooks("method", "torch._dynamo.eval_frame", "_TorchDynamoContext.__call__"),
        *_hooks("function", "torch._dynamo.eval_frame", "innermost_backend"),
    ),
    "guarded candidates": (
        *_hooks(
            "method",
            _CODECACHE,
            "FxGraphCache.iterate_over_candidates",
            "FxGraphCache.find_guarded_entry",
        ),
        *_hooks(
            "method",
            _AOT,
            "AOTAutogradCache.iterate_over_candidates",
            "AOTAutogradCache.find_guarded_entry",
        ),
    ),
    "key cards": _hooks("method", _CODECACHE, "FxGraphCache.load_with_key"),
    "vLLM model info": (
        *_hooks("class", "vllm.model_executor.models.registry", "_ModelInfo"),
        *_hooks(
            "method",
            "vllm.model_executor.models.registry",
            "_LazyRegisteredModel._load_modelinfo_from_cache",
            "_LazyRegisteredModel._save_modelinfo_to_cache",
        ),
    ),
    "vLLM AOT artifact": _hooks(
        "function", "vllm.compilation.decorators", "_try_load_aot_compiled_fn"
    ),
    "Triton host modules": _hooks(
        "function", "triton.runtime.build", "get_cache_manager", "compile_module_from_src"
    ),
    "Triton": (
        Hook("triton", "", "module"),
        *_hooks("class", "triton.runtime.cache", "RemoteCacheManager"),
    ),
}

#: Parts of other packages, imported only where that package is (never by ``install()``).
OTHER_PARTS: tuple[str, ...] = (
    "vLLM model info",
    "vLLM AOT artifact",
    "Triton host modules",
    "Triton",
)
#: The parts torch itself carries.
TORCH_PARTS: tuple[str, ...] = tuple(part for part in PARTS if part not in OTHER_PARTS)

#: objcache kind of a remote cache class -> its part.
PART_OF_KIND: dict[str, str] = {
    "fx-graph": "FX",
    "aot-autograd": "AOTAutograd",
    "pgo": "PGO",
    "autotune": "autotune",
    "bundled-autotune": "bundled autotune",
}

#: torch config flag -> its part (the flags ``hooks.FLAGS`` turns on).
PART_OF_FLAG: dict[str, str] = {
    hook.attr: part for part, hooks in PARTS.items() for hook in hooks if hook.kind == "flag"
}

_logged: set[str] = set()


def _present(hook: Hook, module: Any) -> bool:
    if hook.kind == "module":
        return True
    if hook.kind == "flag":
        config = getattr(module, "_config", None)
        return hook.attr in config if isinstance(config, dict) else hasattr(module, hook.attr)
    value: Any = module
    for part in hook.attr.split("."):
        try:
            value = getattr(value, part)
        except Exception:
            return False
    if hook.kind == "class":
        return isinstance(value, type)
    return callable(value)


#: Modules whose body has run, though importlib still marks them initializing: the zero-code
#: path applies a part right after its module's body, inside the import (:mod:`.autoload`).
_executed: set[str] = set()


def executed(name: str) -> None:
    """Note that ``name``'s body has run (its hooks can be checked during its import)."""
    _executed.add(name)


def _loaded(name: str) -> Any | None:
    """``name`` when imported and done; None while not imported or still running its body
    (a module half-way through its import lacks hooks it defines further down)."""
    module = sys.modules.get(name)
    if module is None:
        return None
    if getattr(getattr(module, "__spec__", None), "_initializing", False):
        return module if name in _executed else None
    return module


def missing(part: str) -> list[str]:
    """The hooks ``part`` needs that imported modules lack (modules not imported, or still
    being imported, are unknown)."""
    gone: list[str] = []
    for hook in PARTS[part]:
        module = _loaded(hook.module)
        if module is not None and not _present(hook, module):
            gone.append(hook.name)
    return gone


def off(part: str) -> str | None:
    """Why ``part`` must stay off (logged once per part), or None while every hook is there."""
    gone = missing(part)
    if not gone:
        return None
    reason = f"missing {', '.join(gone)}"
    if part not in _logged:
        _logged.add(part)
        log.warning("objcache: torch part %s stays off: %s", part, reason)
    return reason


def load(parts: tuple[str, ...] | None = None) -> dict[str, str]:
    """Import every module the hooks of ``parts`` live in; returns module -> import error."""
    failed: dict[str, str] = {}
    for part in parts if parts is not None else tuple(PARTS):
        for hook in PARTS[part]:
            if hook.module in sys.modules or hook.module in failed:
                continue
            try:
                importlib.import_module(hook.module)
            except Exception as exc:
                failed[hook.module] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return failed


@dataclass(frozen=True)
class PartState:
    part: str
    active: bool
    why: str


#: Environment variables that turn a part off for this process, whatever torch offers.
_ENV_OFF: dict[str, tuple[str, ...]] = {
    "FX": ("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE",),
    "AOTAutograd": ("TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",),
    "PGO": ("TORCH_DYNAMO_AUTOMATIC_DYNAMIC_REMOTE_PGO",),
    "autotune": ("TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE",),
    "bundled autotune": ("TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE",),
    "precompile": ("TORCH_CACHING_PRECOMPILE",),
    "guarded candidates": ("OBJCACHE_GUARDED_CANDIDATES",),
    "key cards": ("OBJCACHE_KEY_CARDS",),
    "Triton host modules": ("OBJCACHE_TRITON_HOST",),
}

#: Parts that stay off unless this environment variable is true (docs/torch.md).
_OPT_IN: dict[str, str] = {"precompile": "OBJCACHE_PRECOMPILE"}


def report(environ: dict[str, str] | None = None) -> list[PartState]:
    """Every part with whether it is active here and, when not, why (imports torch)."""
    env = dict(os.environ) if environ is None else environ
    failed = load()
    states: list[PartState] = []
    for part, hooks in PARTS.items():
        unimportable = sorted({h.module for h in hooks if h.module in failed})
        if unimportable:
            first = unimportable[0]
            why = f"cannot import {first} ({failed[first]})"
            if part == "Triton" and first == "triton":
                why = "triton is not installed"
            if part.startswith("vLLM") and "No module named 'vllm'" in failed[first]:
                why = "vllm is not installed"
            states.append(PartState(part, False, why))
            continue
        gone = missing(part)
        if gone:
            states.append(PartState(part, False, f"missing {', '.join(gone)}"))
            continue
        opt_in = _OPT_IN.get(part)
        if opt_in is not None and not opted_in(part, env):
            if _falsy(env.get(opt_in)):
                states.append(PartState(part, False, f"{opt_in}={env[opt_in]}"))
            else:
                states.append(PartState(part, False, _opt_in_why(part, opt_in)))
            continue
        off_by = [v for v in _ENV_OFF.get(part, ()) if _falsy(env.get(v))]
        if off_by:
            states.append(PartState(part, False, f"{off_by[0]}={env[off_by[0]]}"))
            continue
        states.append(PartState(part, True, ""))
    return states


def opted_in(part: str, environ: Any = None) -> bool:
    """Whether an opt-in part (``precompile``) is turned on: where its variable says so."""
    env = os.environ if environ is None else environ
    return _truthy(env.get(_OPT_IN[part]))


def _opt_in_why(part: str, variable: str) -> str:
    """What ``doctor`` says of an opt-in part left off: how to turn it on, and why it is off."""
    if part == "precompile":
        from objcache.integrations.torch.precompile import precompile

        return precompile.OFF_BY_DEFAULT
    return f"opt-in: {variable}=1 turns it on"


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


def _falsy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("0", "false", "no", "off")


def in_force(environ: dict[str, str] | None = None) -> list[PartState]:
    """:func:`report` with objcache's own switches applied: with the zero-code path off
    (``OBJCACHE_ENABLE=0``, or neither it nor ``OBJCACHE_TIERS`` set) no part is on in a new
    process, and Triton's part needs ``OBJCACHE_TRITON`` (imports torch)."""
    env = dict(os.environ) if environ is None else environ
    states = report(env)
    if not enabled(env):
        flag = env.get("OBJCACHE_ENABLE")
        why = (
            f"OBJCACHE_ENABLE={flag}"
            if _falsy(flag)
            else "neither OBJCACHE_TIERS nor OBJCACHE_ENABLE is set (only objcache.install() "
            "in code turns it on)"
        )
        return [PartState(s.part, False, why) if s.active else s for s in states]
    if not _truthy(env.get("OBJCACHE_TRITON")):
        states = [
            PartState(s.part, False, "OBJCACHE_TRITON is not set")
            if s.part == "Triton" and s.active
            else s
            for s in states
        ]
    return states
