"""Route torch's five remote caches through objcache, and put torch back exactly.

torch resolves its remote cache classes **by name at call time**
(``torch._inductor.remote_cache.create_cache`` does ``getattr(this_module, oss_cache_cls)``),
so replacing the module attributes ``RemoteFxGraphCache``, ``RemoteAOTAutogradCache``,
``RemoteAutotuneCache``, ``RemoteBundledAutotuneCache`` and ``RemoteDynamoPGOCache`` with
subclasses routes every cache object torch creates from then on, each with its ``cache_id``.
The subclasses work at the *value* level (``RedisRemoteCache._get`` / ``_put``): torch's
JSON/base64 envelope is never built on a put, the raw pickle is stored (:mod:`.serde`), and
a hit is written through to Inductor's local cache (:mod:`.writethrough`). Their
``backend`` is an :class:`ObjcacheBackend` (a real ``RemoteCacheBackend[bytes]``) for code
that talks to the backend directly, and a ``backend_override_cls`` set on them (torch's own
test mocks) still wins.

Nothing here raises into torch: a raising ``_put`` breaks AOTAutograd (the error escapes
``loss.backward()``: the ``remote_cache.put`` in ``AOTAutogradCache.save`` is outside any
try) and PGO. Every failure is a counted miss, logged once. Gets are bounded by the
client's deadline; puts write the local objcache tier and go remote through the
write-behind queue.

The install is made of *parts*, one per torch module (:data:`.watched.WATCHED`), so that the
zero-code path (:mod:`.autoload`) can apply each part when its module is first imported,
without importing anything torch would not have imported anyway.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import objcache
from objcache.integrations.torch import (
    candidates,
    features,
    keycards,
    pgo_join,
    phase_times,  # noqa: F401  (imported: run summaries read its figures, outputs._phases)
    precompile,
    process_keys,
    serde,
    time_saved,
    watched,
    writethrough,
)
from objcache.integrations.torch.watched import WATCHED, Part
from objcache.observe import keycards as cards
from objcache.observe.metrics import FailureLog

log = logging.getLogger("objcache.torch")

#: torch class name -> objcache kind.
CACHE_CLASSES: dict[str, str] = {
    "RemoteFxGraphCache": "fx-graph",
    "RemoteAOTAutogradCache": "aot-autograd",
    "RemoteAutotuneCache": "autotune",
    "RemoteBundledAutotuneCache": "bundled-autotune",
    "RemoteDynamoPGOCache": "pgo",
}

#: objcache kind -> torch's cache_id, for the kinds with a fixed one (the autotune cache id
#: is a per-kernel hash). Sources: ``FxGraphCache.get_remote_cache``,
#: ``AOTAutogradCache.get_remote_cache``, ``torch._dynamo.pgo.get_remote_cache``,
#: ``AutotuneCacheBundler.begin_compile``.
CACHE_IDS: dict[str, str] = {
    "fx-graph": "fx-graph-v1",
    "aot-autograd": "autograd-experimental",
    "pgo": "dynamo-pgo",
    "bundled-autotune": "bundled-autotune-v1",
}

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
#: What install() changed: (module name, attribute) -> previous value.
_saved: dict[tuple[str, str], Any] = {}
_installed_parts: set[str] = set()
#: The module whose cache classes are swapped; the flags wait for it (:func:`_apply_flags`).
REMOTE_CACHES = "torch._inductor.remote_cache"
#: Config modules imported before the swap succeeded, their flags not yet set.
_flags_waiting: list[Any] = []
#: Environment variables install() set (for child processes), removed by uninstall().
_env_set: set[str] = set()
#: Hook counters: ``errors:<where>``, ``gets:<kind>``, ``hits:<kind>``, ``puts:<kind>``...
counters: Counter[str] = Counter()
_failed = FailureLog(
    log,
    "torch",
    counters,
    "errors:",
    "objcache: %s failed; torch goes on without objcache there: %r",
)
_swap_failed = FailureLog(
    log,
    "torch",
    counters,
    "errors:",
    "objcache: %s failed, put back; torch's remote-cache flags stay off: %r",
)


# --- the value-level cache classes -----------------------------------------------------------


def _make_backend_class(base: type) -> type:
    class ObjcacheBackend(base):  # type: ignore[misc]
        """``RemoteCacheBackend[bytes]`` speaking torch's JSON envelope on top of objcache."""

        def __init__(self, kind: str = "blob") -> None:
            super().__init__()
            self.kind = kind

        def _get(self, key: str) -> bytes | None:
            try:
                payload = objcache.get_client().get(self.kind, key)
                return None if payload is None else serde.envelope_bytes(self.kind, payload)
            except Exception as exc:
                _failed(f"backend get ({self.kind})", exc)
                return None

        def _put(self, key: str, data: bytes) -> None:
            try:
                objcache.get_client().put(
                    self.kind, key, serde.pack_envelope_bytes(self.kind, data)
                )
            except Exception as exc:
                _failed(f"backend put ({self.kind})", exc)

    return ObjcacheBackend


def _make_cache_class(original: type, kind: str, backend_cls: type, json_serde: type) -> type:
    from torch._inductor.remote_cache import RemoteCache

    class ObjcacheRemoteCache(original):  # type: ignore[misc]
        objcache_kind = kind

        def __init__(self, cache_id: str) -> None:
            # RedisRemoteCache.__init__ would insist on the redis package; objcache does not
            # need it. Same key format as RedisRemoteCache.__init__.
            RemoteCache.__init__(self, backend_cls(kind), json_serde())
            self._key_fmt = f"pt2:{cache_id}::{{key}}:c1"

        def _get(self, key: str, sample: Any) -> Any:
            if type(self).backend_override_cls is not None:
                return super()._get(key, sample)
            counters[f"gets:{kind}"] += 1
            try:
                if kind in pgo_join.RECORD_KINDS:
                    payload = objcache.get_client().get_record(kind, self._get_key(key))
                else:
                    payload = objcache.get_client().get(kind, self._get_key(key))
                if payload is None:
                    return None
                value, raw = serde.unpack(kind, payload)
            except Exception as exc:
                _failed(f"get ({kind})", exc)
                return None
            counters[f"hits:{kind}"] += 1
            if raw is not None:
                writethrough.write_through(kind, key, raw)
            return value

        def _put(self, key: str, value: Any, sample: Any) -> None:
            if type(self).backend_override_cls is not None:
                super()._put(key, value, sample)
                return
            try:
                client = objcache.get_client()
                payload = serde.pack(kind, value)
                if kind in pgo_join.RECORD_KINDS:
                    # a join with every other writer's profile, never last-writer-wins
                    client.update_record(kind, self._get_key(key), pgo_join.change_for(payload))
                elif process_keys.is_nonce_key(kind, key):
                    client.put_local(kind, self._get_key(key), payload)
                    process_keys.counters["local_only:nonce_key"] += 1
                elif kind in candidates.GUARDED_KINDS and client.config.guarded_candidates:
                    client.put_candidate(kind, self._get_key(key), payload)
                else:
                    client.put(kind, self._get_key(key), payload)
                counters[f"puts:{kind}"] += 1
                if kind in cards.CARD_KIND:
                    keycards.published(client, kind, key)
            except Exception as exc:
                _failed(f"put ({kind})", exc)

    # torch reports cache stats under type(self).__name__: keep torch's names there.
    ObjcacheRemoteCache.__name__ = original.__name__
    ObjcacheRemoteCache.__qualname__ = original.__qualname__
    ObjcacheRemoteCache.__module__ = __name__
    ObjcacheRemoteCache.__doc__ = f"torch's {original.__name__}, stored in objcache ({kind})."
    return ObjcacheRemoteCache


def _apply_remote_cache(module: Any) -> None:
    """Swap torch's cache classes, then turn on the remote-cache flags waiting for it.

    All or nothing (docs/security.md, threat model): with a flag on and a
    class left unswapped, torch would use its own ``RedisRemoteCache`` (no auth, no digest,
    no signature). On any failure, the classes swapped so far and the flags set are put
    back before the error goes on to :func:`apply_part`.
    """
    saved_before = set(_saved)
    # Only the classes of parts whose hooks are all there (docs/torch.md, "Feature detection").
    wanted = {
        name: kind
        for name, kind in CACHE_CLASSES.items()
        if features.off(features.PART_OF_KIND[kind]) is None
    }
    try:
        if wanted:
            backend_cls = _make_backend_class(module.RemoteCacheBackend)
            module.ObjcacheBackend = backend_cls
        for name, kind in wanted.items():
            current = getattr(module, name)
            if getattr(current, "objcache_kind", None):
                continue
            _save(module.__name__, name, current)
            cls = _make_cache_class(current, kind, backend_cls, module.RemoteCacheJsonSerde)
            setattr(module, name, cls)
        for config_module in _flags_waiting:
            _set_flags(config_module)
    except BaseException:
        for key in reversed([k for k in _saved if k not in saved_before]):
            mod = sys.modules.get(key[0])
            value = _saved.pop(key)
            if mod is not None:
                _restore(mod, key[1], value)
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
            if precompile.wanted() and getattr(module, attr, None) is False:
                _set_config(module, attr, True)
            continue
        if getattr(module, attr, None) is not None:  # set explicitly in code
            continue
        _set_config(module, attr, True)
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
    _set_config(cconfig, "job_id", job)


def _set_config(module: Any, attr: str, value: Any) -> None:
    """Set a torch config value, remembering the raw override so uninstall restores it.

    torch config modules keep a user override per entry (``ConfigModule.__setattr__``);
    restoring "unset" is not the same as setting the default value back, so the raw
    override is saved and put back as it was.
    """
    entry = getattr(module, "_config", {}).get(attr)
    override: Any = getattr(entry, "user_override", None)
    # torch >= 2.13 keeps the override in a context-variable-like holder (``get``/``set``);
    # older releases keep the value itself, or a bare sentinel object when unset: those are
    # restored by setting the attribute back
    holder = getattr(override, "get", None), getattr(override, "set", None)
    if callable(holder[0]) and callable(holder[1]):
        _save(module.__name__, f"config:{attr}", holder[0]())
    else:
        _save(module.__name__, attr, getattr(module, attr))
    setattr(module, attr, value)


def _restore(mod: Any, attr: str, value: Any) -> None:
    if attr.startswith("config:"):
        mod._config[attr[len("config:") :]].user_override.set(value)
        dirty = getattr(mod, "_hash_dirty_var", None)
        if dirty is not None:
            dirty.set(True)
        mark = getattr(mod, "_mark_get_dict_dirty", None)
        if mark is not None:
            mark(attr[len("config:") :])
    elif attr == "AutotuneCache._read":
        mod.AutotuneCache._read = value
    elif attr == "AutotuneCacheBundler.begin_compile":
        mod.AutotuneCacheBundler.begin_compile = value
    else:
        setattr(mod, attr, value)


# --- parts -----------------------------------------------------------------------------------


def _apply_autotune(module: Any) -> None:
    if features.off("autotune") is None:
        cls = module.AutotuneCache
        if not getattr(cls._read, "__objcache__", False):
            _save(module.__name__, "AutotuneCache._read", cls._read)
            cls._read = writethrough.wrap_autotune_read(cls._read)
    if features.off("bundled autotune") is not None:
        return
    bundler = module.AutotuneCacheBundler
    if getattr(getattr(bundler.__dict__["begin_compile"], "__func__", None), "__objcache__", False):
        return
    _save(module.__name__, "AutotuneCacheBundler.begin_compile", bundler.__dict__["begin_compile"])
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

    begin_compile.__wrapped__ = original  # type: ignore[attr-defined]
    begin_compile.__objcache__ = True  # type: ignore[attr-defined]
    return begin_compile


def _apply_kernels(module: Any) -> None:
    from objcache.integrations.torch import kernels

    if features.off("kernels") is not None:
        return
    kernels.apply(module)
    _installed_parts.add("kernels")


def _apply_codecache(module: Any) -> None:
    _apply_candidates(candidates.apply_fx, module)
    time_saved.apply(module)
    if features.off("key cards") is None:
        keycards.apply_fx(module)


def _apply_autograd_cache(module: Any) -> None:
    process_keys.apply(module)
    _apply_candidates(candidates.apply_aot, module)
    time_saved.apply(module)


def _apply_precompile(module: Any) -> None:
    """Carry torch's precompile entries through objcache (only with OBJCACHE_PRECOMPILE=1).

    On any failure the ``caching_precompile`` flag objcache set is put back: torch's own
    store reads unverified pickles under a key naming only the function's qualname and
    line (docs/torch.md, "Precompile entries").
    """
    if not precompile.wanted() or features.off("precompile") is not None:
        return
    # it patches both modules: applied once the later of the two has run (torch 2.15's
    # guards module imports the package module half-way through its own body)
    package = sys.modules.get("torch._dynamo.package")
    guards = sys.modules.get("torch._dynamo.guards")
    if not hasattr(package, "DynamoCache") or not hasattr(guards, "CheckFunctionManager"):
        return
    try:
        precompile.apply(package)
    except BaseException:
        _undo_flag("torch._dynamo.config", "caching_precompile")
        raise


def _undo_flag(mod_name: str, attr: str) -> None:
    for saved in ((mod_name, f"config:{attr}"), (mod_name, attr)):
        if saved in _saved and (mod := sys.modules.get(mod_name)) is not None:
            _restore(mod, saved[1], _saved.pop(saved))


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


#: Each part of the install -> the function applying it to its torch module.
APPLY: dict[Part, Callable[[Any], None]] = {
    "flags": _apply_flags,
    "remote_caches": _apply_remote_cache,
    "autotune": _apply_autotune,
    "kernels": _apply_kernels,
    "fx_candidates": _apply_codecache,
    "aot_candidates": _apply_autograd_cache,
    "precompile": _apply_precompile,
    "vllm": _apply_vllm,
    "vllm_aot": _apply_vllm_aot,
    "triton_host": _apply_triton_host,
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
            _undo_flag(mod_name, attr)


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
    with _lock:
        if module_name in _installed_parts or not _config_ok():
            return
        try:
            mod = module if module is not None else sys.modules[module_name]
            features.executed(module_name)
            APPLY[WATCHED[module_name]](mod)
            _installed_parts.add(module_name)
        except Exception as exc:
            (_swap_failed if module_name == REMOTE_CACHES else _failed)(
                f"install ({module_name})", exc
            )
        try:
            _undo_flags_of_parts_off()
        except Exception as exc:
            _failed("install (flags of parts off)", exc)


def install(config: Any | None = None) -> None:
    """Route torch's remote caches and C++ kernel builds through objcache (idempotent).

    Imports the torch modules involved. With ``config`` (an :class:`objcache.Config`), the
    process-wide client is rebuilt from it; otherwise it is built from ``OBJCACHE_*`` on
    first use.
    """
    import importlib

    with _lock:
        if config is not None:
            objcache.get_client(config)
            _config_checked[:] = [True]
        elif not _config_ok():
            return
        # every hooked torch module, so each part is checked whole before it applies
        features.load(features.TORCH_PARTS)
        for name in WATCHED:
            if name in watched.NOT_IMPORTED and name not in sys.modules:
                continue  # another package's module: hooked when it is imported
            try:
                module = importlib.import_module(name)
            except Exception as exc:
                _failed(f"import {name}", exc)
                continue
            apply_part(name, module)
        if config is None:
            _enable_in_children()
    start_client()


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
        objcache.get_client()
    except Exception as exc:
        _failed("client", exc)


def installed() -> bool:
    mod = sys.modules.get(REMOTE_CACHES)
    return mod is not None and any(
        getattr(getattr(mod, name, None), "objcache_kind", None) for name in CACHE_CLASSES
    )


def uninstall() -> None:
    """Undo :func:`install` (and stop the zero-code path from installing again)."""
    from objcache.integrations.torch import kernels

    with _lock:
        watched.stop_watching()
        for (mod_name, attr), value in reversed(list(_saved.items())):
            mod = sys.modules.get(mod_name)
            if mod is None:
                continue
            try:
                _restore(mod, attr, value)
            except Exception as exc:
                _failed(f"uninstall ({mod_name}.{attr})", exc)
        _saved.clear()
        rc = sys.modules.get("torch._inductor.remote_cache")
        if rc is not None and hasattr(rc, "ObjcacheBackend"):
            del rc.ObjcacheBackend
        if "kernels" in _installed_parts:
            kernels.uninstall()
        candidates.uninstall()
        keycards.uninstall()
        time_saved.uninstall()
        precompile.uninstall()
        process_keys.uninstall()
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


def _save(mod_name: str, attr: str, value: Any) -> None:
    _saved.setdefault((mod_name, attr), value)


def stats() -> dict[str, Any]:
    """This process's integration counters (hook calls, write-through, kernel layer)."""
    from objcache.integrations.torch import kernels

    vllm = sys.modules.get("objcache.integrations.vllm")
    host = sys.modules.get("objcache.integrations.triton_host")
    return {
        **({"vllm": dict(vllm.counters)} if vllm is not None else {}),
        **({"triton_host": dict(host.counters)} if host is not None else {}),
        "hooks": dict(counters),
        "writethrough": dict(writethrough.counters),
        "time_saved_s": time_saved.snapshot(),
        "kernels": kernels.counters(),
        "candidates": dict(candidates.counters),
        "precompile": dict(precompile.counters),
        "process_keys": dict(process_keys.counters),
        "key_cards": dict(cards.counters),
    }
