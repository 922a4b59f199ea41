"""Route torch's five remote caches through objcache, and put torch back exactly.

torch resolves its remote cache classes **by name at call time**
(``torch._inductor.remote_cache.create_cache`` does ``getattr(this_module, oss_cache_cls)``),
so replacing the module attributes ``RemoteFxGraphCache``, ``RemoteAOTAutogradCache``,
``RemoteAutotuneCache``, ``RemoteBundledAutotuneCache`` and ``RemoteDynamoPGOCache`` with
subclasses (:mod:`..torch.remote.remote_cache_classes`, at the value level) routes every cache
object torch creates from then on, each with its ``cache_id``. Everything this module
changes on torch is recorded in :mod:`objcache.integrations.patching` and put back from there.

Nothing here raises into torch: every failure is a counted miss, logged once. Gets are
bounded by the client's deadline; puts write the local objcache tier and go remote through
the write-behind queue.

The install is made of *parts*, one per torch module (:data:`.watched.WATCHED`), so that the
zero-code path (:mod:`.autoload`) can apply each part when its module is first imported,
without importing anything torch would not have imported anyway.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from objcache.integrations import cache_client, patching
from objcache.integrations.install import features, import_watch, watched
from objcache.integrations.install.watched import WATCHED, Part
from objcache.integrations.patching import is_marked, marked
from objcache.integrations.torch.precompile import torch_edits
from objcache.integrations.torch.remote import (
    custom_ops,
    keycard_capture,
    pgo_strict,
    process_keys,
    remote_cache_classes,
    unbuildable_hits,
    writethrough,
)
from objcache.integrations.torch.remote import guarded_candidates as candidates
from objcache.integrations.torch.remote.remote_cache_classes import CACHE_CLASSES, counters, failed
from objcache.integrations.torch.timing import (
    phase_times,  # noqa: F401  (imported: run summaries read its figures, run_observer._phases)
    time_saved,
)
from objcache.observe import keycards as cards
from objcache.observe.metrics import FailureLog

log = logging.getLogger("objcache.torch")

#: (config module, attribute, environment variable that, when present, wins).
FLAGS: tuple[tuple[str, str, str], ...] = (
    ("torch._inductor.config", "fx_graph_remote_cache", "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"),
    ("torch._inductor.config", "autotune_remote_cache", "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE"),
    (
        "torch._inductor.config",
        "bundled_autotune_remote_cache",
        "TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE",
    ),
    (
        "torch._functorch.config",
        "enable_remote_autograd_cache",
        "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
    ),
    (
        "torch._dynamo.config",
        "automatic_dynamic_remote_pgo",
        "TORCH_DYNAMO_AUTOMATIC_DYNAMIC_REMOTE_PGO",
    ),
    # only with OBJCACHE_PRECOMPILE=1 (:func:`_set_flags`)
    ("torch._dynamo.config", "caching_precompile", "TORCH_CACHING_PRECOMPILE"),
)
#: Environment variables that set torch.compiler.config.job_id (PGO needs a job id).
JOB_ID_ENV = ("TORCH_COMPILE_JOB_ID", "TORCH_COMPILE_STICKY_PGO_KEY")

_lock = threading.RLock()
_installed_parts: set[str] = set()
#: The module whose cache classes are swapped; the flags wait for it (:func:`_apply_flags`).
REMOTE_CACHES = "torch._inductor.remote_cache"
#: Config modules imported before the swap succeeded, their flags not yet set.
_flags_waiting: list[Any] = []
#: Environment variables install() set (for child processes), removed by uninstall().
_env_set: set[str] = set()
_swap_failed = FailureLog(
    log,
    "torch",
    counters,
    "errors:",
    "objcache: %s failed, put back; torch's remote-cache flags stay off: %r",
)


def _apply_remote_cache(module: Any) -> None:
    """Swap torch's cache classes, then turn on the remote-cache flags waiting for it.

    All or nothing (docs/security.md, threat model): with a flag on and a
    class left unswapped, torch would use its own ``RedisRemoteCache`` (no auth, no digest,
    no signature). On any failure, the classes swapped so far and the flags set are put
    back before the error goes on to :func:`apply_part`.
    """
    saved_before = set(patching.saved)
    # Only the classes of parts whose hooks are all there (docs/torch.md, "Feature detection").
    wanted = {
        name: kind
        for name, kind in CACHE_CLASSES.items()
        if features.off(features.PART_OF_KIND[kind]) is None
    }
    try:
        if wanted:
            backend_cls = remote_cache_classes.make_backend_class(module.RemoteCacheBackend)
            module.ObjcacheBackend = backend_cls
        for name, kind in wanted.items():
            current = getattr(module, name)
            if getattr(current, "objcache_kind", None):
                continue
            patching.save(module.__name__, name, current)
            cls = remote_cache_classes.make_cache_class(
                current, kind, backend_cls, module.RemoteCacheJsonSerde
            )
            setattr(module, name, cls)
        for config_module in _flags_waiting:
            _set_flags(config_module)
    except BaseException:
        patching.undo_since(saved_before)
        if hasattr(module, "ObjcacheBackend"):
            del module.ObjcacheBackend
        raise
    finally:
        _clear_cached_remote_caches()
    _flags_waiting.clear()


def _clear_cached_remote_caches() -> None:
    """``AOTAutogradCache.get_remote_cache`` is ``functools.cache``'d: forget its cache."""
    mod = sys.modules.get("torch._functorch._aot_autograd.autograd_cache")
    getter = getattr(getattr(mod, "AOTAutogradCache", None), "get_remote_cache", None)
    clear = getattr(getter, "cache_clear", None)
    if clear is not None:
        clear()


# --- flags -----------------------------------------------------------------------------------


def _apply_flags(module: Any) -> None:
    """Turn on ``module``'s remote-cache flags once torch's cache classes are swapped.

    Before that they wait in :data:`_flags_waiting`: :func:`_apply_remote_cache` sets them
    after the swap succeeded, never otherwise (torch reads the flags at compile time, after
    it imported ``torch._inductor.remote_cache``).
    """
    if REMOTE_CACHES in _installed_parts:
        _set_flags(module)
    elif module not in _flags_waiting:
        _flags_waiting.append(module)


def _set_flags(module: Any) -> None:
    for mod_name, attr, env in FLAGS:
        if mod_name != module.__name__ or env in os.environ:
            continue
        if features.off(features.PART_OF_FLAG[attr]) is not None:
            continue
        if attr == "caching_precompile":
            if features.opted_in("precompile") and getattr(module, attr, None) is False:
                patching.set_config(module, attr, True)
            continue
        if getattr(module, attr, None) is not None:  # set explicitly in code
            continue
        patching.set_config(module, attr, True)
    if module.__name__ == "torch._dynamo.config":
        _apply_job_id()


def _apply_job_id() -> None:
    """PGO needs ``torch.compiler.config.job_id``: take ``OBJCACHE_JOB`` when it is set."""
    job = os.environ.get("OBJCACHE_JOB", "").strip()
    if not job or any(v in os.environ for v in JOB_ID_ENV):
        return
    cconfig = sys.modules.get("torch.compiler.config")
    if cconfig is None or getattr(cconfig, "job_id", None) is not None:
        return
    patching.set_config(cconfig, "job_id", job)


# --- parts -----------------------------------------------------------------------------------


def _apply_autotune(module: Any) -> None:
    if features.off("autotune") is None:
        cls = module.AutotuneCache
        if not is_marked(cls._read):
            patching.save(module.__name__, "AutotuneCache._read", cls._read)
            cls._read = writethrough.wrap_autotune_read(cls._read)
    if features.off("bundled autotune") is not None:
        return
    bundler = module.AutotuneCacheBundler
    if is_marked(getattr(bundler.__dict__["begin_compile"], "__func__", None)):
        return
    patching.save(
        module.__name__, "AutotuneCacheBundler.begin_compile", bundler.__dict__["begin_compile"]
    )
    bundler.begin_compile = classmethod(_guarded_begin_compile(bundler.begin_compile))


def _guarded_begin_compile(original: Callable[..., None]) -> Callable[..., None]:
    """Skip the bundled autotune cache where torch cannot key it.

    With ``bundled_autotune_remote_cache`` on and no Triton backend (a CPU-only host),
    ``AutotuneCacheBundler.begin_compile`` asserts that ``backend_hash`` is a str
    (``_AutotuneCacheBundlerImpl._get_backend_hash``) and the compile fails. The bundle only
    holds Triton autotune results, so there is nothing to cache there anyway.
    """

    def begin_compile(cls: Any, inductor_meta: Any, *args: Any, **kwargs: Any) -> None:
        if inductor_meta.get("bundled_autotune_remote_cache") and not isinstance(
            inductor_meta.get("backend_hash"), str
        ):
            counters["bundled_autotune_skipped"] += 1
            return
        if getattr(cls, "_bundler", None) is not None:
            # a bundle an earlier compile began and never ended (seen on torch 2.11 CUDA after
            # a Mega-Cache load): torch asserts here and the compile would fail. Drop the
            # unsaved bundle: a bundle is only an optimisation, its entries stay per kernel
            counters["bundled_autotune_stale_dropped"] += 1
            cls._bundler = None
        try:
            original(inductor_meta, *args, **kwargs)
        except Exception as exc:  # never fail a compile for the bundle
            counters["bundled_autotune_skipped"] += 1
            log.debug("objcache: bundled autotune cache skipped: %r", exc)
            cls._bundler = None

    marked(begin_compile, original)
    return begin_compile


def _apply_kernels(module: Any) -> None:
    from objcache.integrations.torch.kernels import kernel_places, kernels

    if features.off("kernels") is not None:
        return
    kernels.apply(module)
    if kernel_places.note not in kernels.output_listeners:
        kernels.output_listeners.append(kernel_places.note)
    # beside the prefetch of whichever client is built, whenever: the zero-code path builds
    # it at its first lookup, never through start_client()
    kernel_places.enable()
    _installed_parts.add("kernels")


def _apply_codecache(module: Any) -> None:
    custom_ops.apply([module.FxGraphHashDetails])
    unbuildable_hits.apply(module.CompiledFxGraph)  # a hit that does not build here: a miss
    _apply_candidates(candidates.apply_fx, module)
    time_saved.apply(module)
    if features.off("key cards") is None:
        keycard_capture.apply_fx(module)


def _apply_autograd_cache(module: Any) -> None:
    custom_ops.apply([module.AOTAutogradCacheDetails])
    process_keys.apply(module)
    _apply_candidates(candidates.apply_aot, module)
    time_saved.apply(module)


def _apply_pgo(module: Any) -> None:
    """A frame that must be one graph starts static whatever profile was loaded, and one that
    fails to trace or compile holding its loaded entry is compiled again without it
    (:mod:`objcache.integrations.torch.remote.pgo_strict`): applied as the profile module or
    the frame compiler (``convert_frame``) is imported, whichever is last."""
    if features.off("PGO") is not None:
        return
    pgo = sys.modules.get("torch._dynamo.pgo")
    original = getattr(pgo, "update_automatic_dynamic", None)
    if pgo is not None and callable(original) and not is_marked(original):
        patching.save(pgo.__name__, "update_automatic_dynamic", original)
        wrapped = pgo_strict.wrap_update_automatic_dynamic(original)
        setattr(pgo, "update_automatic_dynamic", wrapped)  # noqa: B010
    frames = sys.modules.get("torch._dynamo.convert_frame")
    compile_frame = getattr(frames, "_compile", None)
    if frames is not None and callable(compile_frame) and not is_marked(compile_frame):
        patching.save(frames.__name__, "_compile", compile_frame)
        setattr(frames, "_compile", pgo_strict.wrap_compile(compile_frame))  # noqa: B010
    _apply_pgo_restart()


def _apply_pgo_restart() -> None:
    """The PGO part's hooks on Dynamo's tracer (``InstructionTranslator.run``) and on its graph
    compile (``OutputGraph.compile_and_call_fx_graph``), once the tracer module has defined
    them: applied with the PGO part, or as the tracer module's import ends
    (torch imports the profile module half-way through the tracer's)."""
    if features.off("PGO") is not None:
        return
    tracing = sys.modules.get("torch._dynamo.symbolic_convert")
    translator = getattr(tracing, "InstructionTranslator", None)
    run = getattr(translator, "run", None)
    if tracing is None or not callable(run) or is_marked(run):
        return
    # None: inherited, put back by deleting objcache's
    patching.save(tracing.__name__, "InstructionTranslator.run", translator.__dict__.get("run"))
    setattr(translator, "run", pgo_strict.wrap_run(run))  # noqa: B010
    output = getattr(sys.modules.get("torch._dynamo.output_graph"), "OutputGraph", None)
    compile_graph = getattr(output, "compile_and_call_fx_graph", None)
    if output is not None and callable(compile_graph) and not is_marked(compile_graph):
        own = output.__dict__.get("compile_and_call_fx_graph")
        patching.save("torch._dynamo.output_graph", "OutputGraph.compile_and_call_fx_graph", own)
        wrapped = pgo_strict.wrap_compile_graph(compile_graph)
        setattr(output, "compile_and_call_fx_graph", wrapped)  # noqa: B010


def _apply_precompile(module: Any) -> None:
    """Carry torch's precompile entries through objcache (only with OBJCACHE_PRECOMPILE=1).

    On any failure the ``caching_precompile`` flag objcache set is put back: torch's own
    store reads unverified pickles under a key naming only the function's qualname and
    line (docs/torch.md, "Precompile entries").
    """
    if getattr(module, "__name__", "") == "torch._dynamo.symbolic_convert":
        _apply_pgo_restart()  # the tracer module's other hook (a module applies one part)
    if not features.opted_in("precompile") or features.off("precompile") is not None:
        return
    # the feature's modules are imported only where it is on
    from objcache.integrations.torch.precompile import precompile

    # it patches three modules: applied once the last of them has run (torch 2.15's guards
    # module imports the package module half-way through its own body, and its tracer
    # imports both before it defines the translator whose resume functions are patched)
    package = sys.modules.get("torch._dynamo.package")
    guards = sys.modules.get("torch._dynamo.guards")
    tracer = sys.modules.get("torch._dynamo.symbolic_convert")
    if not hasattr(package, "DynamoCache") or not hasattr(guards, "CheckFunctionManager"):
        return
    if not hasattr(getattr(tracer, "InstructionTranslatorBase", None), "create_resume"):
        return
    try:
        precompile.apply(package)
    except BaseException:
        patching.undo_flag("torch._dynamo.config", "caching_precompile")
        raise


def _apply_vllm(module: Any) -> None:
    """vLLM's model-inspection cache through objcache (:mod:`objcache.integrations.vllm`)."""
    from objcache.integrations import vllm

    if features.off("vLLM model info") is None:
        vllm.apply(module)


def _apply_vllm_aot(module: Any) -> None:
    """vLLM's AOT-compiled model through objcache (:mod:`objcache.integrations.vllm_aot`)."""
    from objcache.integrations import vllm_aot

    if features.off("vLLM AOT artifact") is None:
        vllm_aot.apply(module)


def _apply_triton_host(module: Any) -> None:
    """Triton's host-side modules through objcache (:mod:`objcache.integrations.triton_host`)."""
    from objcache.integrations import triton_host

    if features.off("Triton host modules") is None:
        triton_host.apply(module)


def _apply_op_kernels(module: Any) -> None:
    custom_ops.apply([], module)  # ``Library.impl``: each kernel's function, as registered


def _apply_torch_edits(module: Any) -> None:
    torch_edits.remember(module.__name__)  # before the program's first line after the import
    # Dynamo's context around each frame compile and lazy backward compile: a compile window
    # (Inductor's scalars changed inside one are torch's, outside every one the program's)
    handler = getattr(sys.modules.get("torch._dynamo.callback"), "CompilationCallbackHandler", None)
    context = getattr(handler, "install_callbacks", None)
    if handler is not None and callable(context) and not is_marked(context):
        own = handler.__dict__.get("install_callbacks")
        patching.save("torch._dynamo.callback", "CompilationCallbackHandler.install_callbacks", own)
        setattr(handler, "install_callbacks", torch_edits.wrap_window_context(context))  # noqa: B010


def _apply_inductor_code(module: Any) -> None:
    torch_edits.remember_module(module)
    if getattr(module, "__name__", "") == "torch._inductor.compile_fx":
        graph_compile = getattr(module, "_compile_fx_inner", None)  # each graph's compile
        if callable(graph_compile) and not is_marked(graph_compile):
            patching.save(module.__name__, "_compile_fx_inner", graph_compile)
            wrapped = torch_edits.wrap_window(process_keys.wrap_graph_compile(graph_compile))
            setattr(module, "_compile_fx_inner", wrapped)  # noqa: B010
        # Inductor as a backend, whoever calls it (``aot_compile`` calls it outside Dynamo's
        # context, vLLM directly): its passes before each graph's compile set torch's state
        backend = getattr(module, "compile_fx", None)
        if callable(backend) and not is_marked(backend):
            patching.save(module.__name__, "compile_fx", backend)
            setattr(module, "compile_fx", torch_edits.wrap_window(backend))  # noqa: B010


#: Each part of the install -> the function applying it to its torch module.
APPLY: dict[Part, Callable[[Any], None]] = {
    "op_kernels": _apply_op_kernels,
    "flags": _apply_flags,
    "remote_caches": _apply_remote_cache,
    "autotune": _apply_autotune,
    "kernels": _apply_kernels,
    "fx_candidates": _apply_codecache,
    "aot_candidates": _apply_autograd_cache,
    "precompile": _apply_precompile,
    "pgo": _apply_pgo,
    "vllm": _apply_vllm,
    "vllm_aot": _apply_vllm_aot,
    "triton_host": _apply_triton_host,
    "torch_edits": _apply_torch_edits,
    "inductor_code": _apply_inductor_code,
}


def _apply_candidates(apply: Callable[[Any], None], module: Any) -> None:
    if features.off("guarded candidates") is None:
        apply(module)


def _undo_flags_of_parts_off() -> None:
    """Put back torch's remote-cache flag of every part found off since its flag was set.

    The zero-code path sets flags when torch's config modules are imported, before the
    modules holding the part's other hooks; a flag left on without objcache's class behind
    it would send torch to its own Redis cache (docs/torch.md, "Feature detection").
    """
    for mod_name, attr, _env in FLAGS:
        if features.missing(features.PART_OF_FLAG[attr]):
            patching.undo_flag(mod_name, attr)


_config_checked: list[bool] = []


def _config_ok() -> bool:
    """Whether ``OBJCACHE_*`` parses. A bad configuration (an empty or short signing key)
    keeps every part off, logged once: torch then runs without objcache, never unverified
    (docs/security.md)."""
    if not _config_checked:
        from objcache.config.settings import Config
        from objcache.errors import ConfigError

        try:
            Config.from_env()
            _config_checked.append(True)
        except ConfigError as exc:
            log.warning("objcache: %s; torch's caches stay off", exc)
            _config_checked.append(False)
    return _config_checked[0]


def apply_part(module_name: str, module: Any | None = None) -> None:
    """Apply the part for ``module_name`` (idempotent, never raises)."""
    if module_name not in WATCHED:
        _apply_package_part(module_name, module)
        return
    with _lock:
        if module_name in _installed_parts or not _config_ok():
            return
        try:
            mod = module if module is not None else sys.modules[module_name]
            features.executed(module_name)
            APPLY[WATCHED[module_name]](mod)
            _installed_parts.add(module_name)
        except Exception as exc:
            (_swap_failed if module_name == REMOTE_CACHES else failed)(
                f"install ({module_name})", exc
            )
        try:
            _undo_flags_of_parts_off()
        except Exception as exc:
            failed("install (flags of parts off)", exc)


def _apply_package_part(module_name: str, module: Any | None) -> None:
    """A module of a watched package (every Inductor module, as it is imported): its part
    only, which sets no flag (about 0.07 ms a module)."""
    part = watched.part_of(module_name)
    if part is None or not _config_ok():
        return
    try:
        APPLY[part](module if module is not None else sys.modules[module_name])
    except Exception as exc:
        failed(f"install ({module_name})", exc)


def install(config: Any | None = None) -> None:
    """Route torch's remote caches and C++ kernel builds through objcache (idempotent).

    Imports the torch modules involved. With ``config`` (an :class:`objcache.Config`), the
    process-wide client is rebuilt from it; otherwise it is built from ``OBJCACHE_*`` on
    first use.
    """
    with _lock:
        if config is not None:
            cache_client.get_client(config)
            _config_checked[:] = [True]
        elif not _config_ok():
            return
        if not import_watch.watching():
            # tables and Inductor's modules the program imported before objcache could copy
            # them: checked against the release's, read in a fresh interpreter (docs/torch.md)
            torch_edits.note_preloaded(list(sys.modules))
        # every hooked torch module, so each part is checked whole before it applies
        features.load(features.TORCH_PARTS)
        for name in WATCHED:
            if name in watched.NOT_IMPORTED and name not in sys.modules:
                continue  # another package's module: hooked when it is imported
            if name not in watched.IMPORTED_WHEN_NEEDED:
                _import_and_apply(name)
        if config is None:
            _enable_in_children()
    import_watch.watch()  # the rest as each is imported (the first compile's code generators)
    start_client()


def _import_and_apply(name: str) -> None:
    import importlib

    try:
        module = importlib.import_module(name)
    except Exception as exc:
        failed(f"import {name}", exc)
        return
    apply_part(name, module)


def _enable_in_children() -> None:
    """Let child processes (Inductor's compile workers) install objcache too.

    They are fresh interpreters: with ``OBJCACHE_ENABLE=1`` inherited, the ``.pth`` installs
    objcache there from the same ``OBJCACHE_*`` environment. Without it, a worker whose
    inductor config says ``autotune_remote_cache`` would try torch's Redis cache. Not done
    when the environment already decides (``OBJCACHE_ENABLE`` or ``OBJCACHE_TIERS`` set), nor
    for ``install(config)``, whose settings the environment does not carry.
    """
    if "OBJCACHE_ENABLE" in os.environ or os.environ.get("OBJCACHE_TIERS", "").strip():
        return
    os.environ["OBJCACHE_ENABLE"] = "1"
    _env_set.add("OBJCACHE_ENABLE")


def start_client() -> None:
    """Build the process-wide client now, so its prefetch overlaps tracing (never raises).

    Building it does no I/O on this thread: the client starts its event loop and submits the
    job's prefetch (:mod:`objcache.core.manifest`) in the background.
    """
    try:
        cache_client.get_client()  # kernel placement starts with it (kernel_places.enable)
    except Exception as exc:
        failed("client", exc)


def installed() -> bool:
    mod = sys.modules.get(REMOTE_CACHES)
    return mod is not None and any(
        getattr(getattr(mod, name, None), "objcache_kind", None) for name in CACHE_CLASSES
    )


def uninstall() -> None:
    """Undo :func:`install` (and stop the zero-code path from installing again)."""
    from objcache.integrations.torch.kernels import kernels

    with _lock:
        watched.stop_watching()
        patching.undo_all(failed)
        rc = sys.modules.get("torch._inductor.remote_cache")
        if rc is not None and hasattr(rc, "ObjcacheBackend"):
            del rc.ObjcacheBackend
        if "kernels" in _installed_parts:
            from objcache.integrations.torch.kernels import kernel_places

            kernel_places.disable()
            kernels.uninstall()
        candidates.uninstall()
        keycard_capture.uninstall()
        time_saved.uninstall()
        if "objcache.integrations.torch.precompile.precompile" in sys.modules:
            from objcache.integrations.torch.precompile import precompile

            precompile.uninstall()
        process_keys.uninstall()
        custom_ops.uninstall()
        unbuildable_hits.uninstall()
        _uninstall_vllm()
        _uninstall_triton_host()
        _installed_parts.clear()
        _flags_waiting.clear()
        _config_checked.clear()
        _clear_cached_remote_caches()
        for var in _env_set:
            os.environ.pop(var, None)
        _env_set.clear()


def _uninstall_vllm() -> None:
    if "objcache.integrations.vllm" in sys.modules:
        from objcache.integrations import vllm

        vllm.uninstall()
    if "objcache.integrations.vllm_aot" in sys.modules:
        from objcache.integrations import vllm_aot

        vllm_aot.uninstall()


def _uninstall_triton_host() -> None:
    if "objcache.integrations.triton_host" in sys.modules:
        from objcache.integrations import triton_host

        triton_host.uninstall()


def stats() -> dict[str, Any]:
    """This process's integration counters (hook calls, write-through, kernel layer)."""
    from objcache.integrations.torch.kernels import kernels

    vllm = sys.modules.get("objcache.integrations.vllm")
    entries = sys.modules.get("objcache.integrations.torch.precompile.precompile_entry")
    host = sys.modules.get("objcache.integrations.triton_host")
    return {
        **({"vllm": dict(vllm.counters)} if vllm is not None else {}),
        **({"triton_host": dict(host.counters)} if host is not None else {}),
        "hooks": dict(counters),
        "writethrough": dict(writethrough.counters),
        "time_saved_s": time_saved.snapshot(),
        "kernels": kernels.counters(),
        "candidates": dict(candidates.counters),
        "precompile": dict(entries.counters) if entries is not None else {},
        "process_keys": dict(process_keys.counters),
        "custom_ops": dict(custom_ops.counters),
        "key_cards": dict(cards.counters),
    }
