"""Precompile entries: Dynamo's own work, carried through objcache (docs/torch.md,
"Precompile entries").

torch's caching precompile (``torch._dynamo.config.caching_precompile``) saves, per
``torch.compile``'d function, a package of Dynamo's output: the transformed bytecode, its
serialized guards and the compiled backends. A process that loads it skips Dynamo's tracing,
fake-tensor propagation and the FX/AOT lookups. torch keeps it in
``<TORCHINDUCTOR_CACHE_DIR>/dynamo/<sha256(qualname, first line)>/entry``, a pickle read
unverified, keyed so that another script's ``Net.forward`` on the same line is served.

With ``OBJCACHE_PRECOMPILE=1`` this part turns caching precompile on and replaces that
store, on torch's ``DynamoCache`` object, by objcache:

* **load** (``DynamoCache.load(fn)``, called when ``torch.compile()`` wraps ``fn``): the
  entry is looked up as kind ``precompile`` through the client (local tier, then the remote
  tiers within the client's deadline). Its key binds torch's key to the job, the function's
  module name, a digest of its code object and of its module's source; the namespace adds
  the environment (torch release, CPU ISA; docs/architecture.md, "Environments"). The codec
  verifies the signature and key binding before the bytes are unpickled
  (docs/security.md). torch's own local directory is never read.
* **install**: ``CompilePackage.initialize`` / ``install`` of a served entry are guarded: a
  rejection (another torch release, a changed inlined source, anything torch raises) puts
  the package back to a fresh one, counted, and the compile goes on as if there was no
  entry. torch itself catches only ``RuntimeError`` there and then fails re-initializing.
* **save**: ``DynamoCache.record_package`` (after each frame compile) and
  ``PrecompileContext.record_artifact`` (a backend, the backward included) mark entries to
  save; a background thread saves them once compiles have settled for :data:`SETTLE_S`, and
  again at exit, before the client flushes. Unchanged entries are not put again. Nobody
  needs to call ``torch.compiler.save_cache_artifacts()``.
* **guards** (:mod:`precompile_guards`): ``serialize_guards`` never raises: a frame whose
  guards cannot be saved (a dropped guard without a portable replacement, a setting without
  a portable rendering, a class defined in a local scope, on which torch itself raises a
  ``TypeError``) marks its package unsaveable and hands torch an empty state. Raising
  torch's ``PackageError`` there made 2.13 and 2.14 fail the user's compile (an assertion
  on the missing state after their own package bypass).

Every failure is a counted miss, logged once; nothing raised here reaches torch or the
user's code.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import inspect
import logging
import os
import pickle
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Callable
from typing import Any

from objcache.integrations.torch import (
    compile_settings,
    portable_guards,
    precompile_guards,
    superseded_codes,
)
from objcache.observe.metrics import FailureLog

log = logging.getLogger("objcache.torch")

#: objcache kind of a precompile entry.
KIND = "precompile"
#: The payload's format (and the key's first part): a dict naming the wrapped function's
#: code digest and holding torch's ``PrecompileCacheEntry``, every guards state of which
#: carries its portable guards (:func:`portable_guards.attach`).
FORMAT = "objcache-precompile-v3"
#: Seconds without a new frame compile or backend before the entries are saved.
SETTLE_S = 2.0
#: torch modules this part patches (besides the flag in ``torch._dynamo.config``).
PACKAGE = "torch._dynamo.package"
CONTEXT = "torch._dynamo.precompile_context"
GUARDS = "torch._dynamo.guards"

counters: Counter[str] = Counter()
_failed = FailureLog(
    log,
    "torch",
    counters,
    "errors:",
    "objcache: precompile %s failed; torch goes on without a precompile entry there: %r",
)

_TRUE = ("1", "true", "yes", "on")

_lock = threading.RLock()
#: What :func:`apply` patched: (object, attribute, previous value found in its __dict__).
_patched: list[tuple[Any, str, Any]] = []
#: Dynamo entries handed to torch by :func:`_load`, by id, until torch initializes them.
_served: dict[int, Any] = {}
#: objcache key -> (the wrapped function, its package's latest Dynamo entry): tracked per
#: package, never through torch's weak ``sha256(qualname, first line)`` key.
_entries: dict[str, tuple[Any, Any]] = {}
#: objcache keys whose entry changed since it was last saved.
_dirty: set[str] = set()
#: objcache keys saved before their backend was recorded: saved at exit if nothing marks them.
_waiting: set[str] = set()
#: objcache key -> digest of the bytes last stored or loaded (no put of the same bytes).
_stored: dict[str, str] = {}
_changed = threading.Condition(_lock)
_last_change = 0.0
_saver: threading.Thread | None = None
_pid = 0
_UNSET: Any = object()
#: The compiler identity of the ``torch.compile(...)`` wrapper now wrapping a function
#: (:func:`_wrap_context_call`), read by :func:`_load`.
_compiler: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "objcache_precompile_compiler", default=_UNSET
)


#: torch releases on which the part is on unless ``OBJCACHE_PRECOMPILE=0`` (docs/torch.md,
#: "Precompile entries": every safety case holds, the suite's compiling tests ran with it on,
#: and block and every library model of the bench reach the target); elsewhere
#: ``OBJCACHE_PRECOMPILE=1`` opts in.
DEFAULT_ON: frozenset[str] = frozenset({"2.14.1", "2.15.0"})


def default_on() -> bool:
    """Whether the torch release in this process has the part on by default (never
    imports torch: without it there is nothing to carry)."""
    torch = sys.modules.get("torch")
    version = str(getattr(torch, "__version__", "")).split("+", 1)[0]
    return version in DEFAULT_ON


def wanted(environ: Any = None) -> bool:
    """Whether the part is on: ``OBJCACHE_PRECOMPILE`` when set (``1`` on, ``0`` off), else
    the release's default (:data:`DEFAULT_ON`)."""
    env = os.environ if environ is None else environ
    value = str(env.get("OBJCACHE_PRECOMPILE", "")).strip().lower()
    if value:
        return value in _TRUE
    return default_on()


# --- keys --------------------------------------------------------------------------------------


def _module_source(name: str) -> bytes:
    module = sys.modules.get(name)
    if module is None:
        return b""
    try:
        return inspect.getsource(module).encode()
    except (OSError, TypeError):
        return b""  # no source file (exec'd code): the code digest alone


def entry_key(fn: Any, job: str, compiler: str) -> tuple[str, str]:
    """``(torch's key, objcache key)`` of the function ``torch.compile`` wraps.

    torch's key is ``sha256(qualname, first line)``; the objcache key adds the job, the
    module name (torch installs the entry's globals into ``sys.modules[that name]``), the
    code object (bytecode, names, constants, nested code), the module's source text, so
    an edit anywhere in the file, or another script, is another key, and the compiler the
    wrapper names (backend, mode, options: :func:`compile_settings.compiler_identity`).
    """
    from torch._dynamo.eval_frame import innermost_fn
    from torch._dynamo.package import CompilePackage

    inner = innermost_fn(fn)
    torch_key = str(CompilePackage.source_id_from_fn(fn))
    h = hashlib.sha256(FORMAT.encode() + b"\0")
    for part in (torch_key, job, inner.__module__, inner.__qualname__, compiler):
        h.update(f"{part}\0".encode())
    portable_guards.code_into(inner.__code__, h)
    h.update(hashlib.sha256(_module_source(inner.__module__)).digest())
    return torch_key, h.hexdigest()


def _client() -> Any:
    import objcache

    return objcache.get_client()


# --- load ----------------------------------------------------------------------------------------


def _code_of(fn: Any) -> types.CodeType | None:
    """The code object of the function ``torch.compile`` wraps, or None for a class or a
    callable object (torch's caching precompile reads ``__code__`` and would raise)."""
    from torch._dynamo.eval_frame import innermost_fn

    code = getattr(innermost_fn(fn), "__code__", None)
    return code if isinstance(code, types.CodeType) else None


def _no_code() -> None:
    """The package function of a compiled callable that has no code of its own (never
    saved: its package is marked unsaveable)."""


def _load(fn: Any) -> Any | None:
    """``DynamoCache.load``: the verified entry of ``fn`` from objcache, or None (a miss)."""
    if _code_of(fn) is None:
        counters["skipped:no_code"] += 1
        return None
    compiler = _compiler.get()
    if compiler is _UNSET or compiler is None:
        counters[
            "skipped:unknown_compiler" if compiler is _UNSET else "skipped:unportable_compiler"
        ] += 1
        return None
    counters["lookups"] += 1
    try:
        client = _client()
        torch_key, key = entry_key(fn, client.job, compiler)
        payload = client.get(KIND, key)
    except Exception as exc:
        _failed("lookup", exc)
        return None
    if payload is None:
        counters["misses"] += 1
        return None
    try:
        entry = _unpack(payload, torch_key, fn)
    except _Mismatch as exc:
        counters[f"rejected:{exc.why}"] += 1
        log.info("objcache: precompile entry refused (compiling normally): %s", exc)
        return None
    except Exception as exc:
        counters["rejected:unreadable"] += 1
        _failed("read", exc)
        return None
    with _lock:
        _served[id(entry.dynamo)] = entry.dynamo
        _stored[key] = hashlib.sha256(payload).hexdigest()
    counters["hits"] += 1
    return entry


class _Mismatch(Exception):
    """A verified entry that is not the wrapped function's package (counted ``rejected:``)."""

    def __init__(self, why: str, detail: str) -> None:
        super().__init__(f"{why}: {detail}")
        self.why = why


def same_code(serialized: Any, code: types.CodeType) -> bool:
    """Whether torch's ``SerializedCode`` of an entry is ``code`` (paths and line tables
    aside, which differ by machine)."""
    fields = (
        "co_code", "co_name", "co_firstlineno", "co_names", "co_varnames", "co_freevars",
        "co_cellvars", "co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_flags",
    )  # fmt: skip
    if any(getattr(serialized, f, None) != getattr(code, f) for f in fields):
        return False
    consts = getattr(serialized, "co_consts", ())
    if len(consts) != len(code.co_consts):
        return False
    for mine, real in zip(consts, code.co_consts, strict=True):
        if isinstance(real, types.CodeType):
            if not same_code(mine, real):
                return False
        elif type(mine) is not type(real) or (mine != real and mine == mine):  # NaN aside
            return False
    return True


def _unpack(payload: bytes, torch_key: str, fn: Any) -> Any:
    """Unpickle a verified entry, check that it is ``fn``'s package and that every guarded
    code carries its portable guards, and record its backends through torch's own store
    API."""
    from torch._dynamo.eval_frame import innermost_fn
    from torch._dynamo.package import InMemoryDynamoStore, PrecompileCacheEntry, _DynamoCacheEntry

    data = pickle.loads(payload)  # verified by the codec first (docs/security.md)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _Mismatch("format", f"not an {FORMAT} payload")
    entry = data.get("entry")
    if not isinstance(entry, PrecompileCacheEntry) or not isinstance(
        entry.dynamo, _DynamoCacheEntry
    ):
        raise TypeError(f"not a precompile entry: {type(entry).__name__}")
    code = innermost_fn(fn).__code__
    codes = entry.dynamo.codes
    if (
        data.get("code") != portable_guards.code_digest(code)
        or not codes
        or not same_code(codes[0].python_code, code)
        or str(entry.dynamo.fn_first_lineno) != str(code.co_firstlineno)
    ):
        raise _Mismatch("code_mismatch", f"the entry is not the package of {code.co_name}")
    if not _all_guards_portable(entry.dynamo):
        raise _Mismatch("no_portable_guards", "a guarded code carries no portable guards")
    store = InMemoryDynamoStore()
    store.packages[torch_key] = entry
    return store.load_cache_entry(torch_key)


def _all_guards_portable(dynamo: Any) -> bool:
    """Whether every guarded code carries its portable guards and exactly one compiler
    settings record."""
    for c in dynamo.codes:
        for guarded in c.guarded_codes:
            detached = portable_guards.detach(guarded.guards_state)
            if detached is None or not portable_guards.has_one_settings_record(detached[1]):
                return False
    return True


def _reset(package: Any, fn: Any, initialize: Callable[..., None], why: str, exc: Any) -> None:
    """Put a package whose served entry torch rejected back to a fresh one (counted)."""
    counters[f"rejected:{why}"] += 1
    log.info("objcache: precompile entry rejected at %s (compiling normally): %r", why, exc)
    with contextlib.suppress(Exception):
        package.uninstall()
    type(package).__init__(package, None)
    initialize(package, fn, None, ignore_inlined_sources=False)
    package.__dict__["_objcache_fresh"] = True


def _install_scopes(package: Any) -> dict[int, tuple[dict[str, Any], frozenset[str]]]:
    """The module globals torch's ``install`` may write, with the names each holds now."""
    scopes: dict[int, tuple[dict[str, Any], frozenset[str]]] = {}
    for entry in package._codes.values():
        module = sys.modules.get(entry.python_module)
        if module is not None:
            scopes[id(module.__dict__)] = (module.__dict__, frozenset(module.__dict__))
    return scopes


def _undo_install(package: Any, scopes: dict[int, tuple[dict[str, Any], frozenset[str]]]) -> None:
    """Take back whatever a failed ``install`` put in place (all or nothing): its globals,
    the precompiled entries on every code (torch's ``uninstall`` resets only the main
    function's), the skip marks of empty codes, and Dynamo's builtins dict."""
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            _reset_precompile_entries,
            set_code_exec_strategy,
        )
        from torch._dynamo.package import _lookup_code
    except ImportError:  # a release without these: torch's own uninstall only
        with contextlib.suppress(Exception):
            package.uninstall()
        return
    with contextlib.suppress(Exception):
        package.uninstall()
    for code, entry in list(package._codes.items()):
        targets = [code]
        if entry.code_source:
            with contextlib.suppress(Exception):
                targets.append(_lookup_code(entry))
        for target in targets:
            with contextlib.suppress(Exception):
                _reset_precompile_entries(target)
            if not entry.guarded_codes:
                with contextlib.suppress(Exception):
                    set_code_exec_strategy(
                        target, _FrameExecStrategy(_FrameAction.DEFAULT, _FrameAction.DEFAULT)
                    )
    for scope, before in scopes.values():
        for name in [n for n in scope if n not in before and n.startswith("__")]:
            scope.pop(name, None)  # names torch generates ("__builtins_dict__…")


def _wrap_initialize(original: Callable[..., None]) -> Callable[..., None]:
    def initialize(
        self: Any, fn: Any, dynamo: Any = None, ignore_inlined_sources: bool = False
    ) -> None:
        with _lock:
            ours = dynamo is not None and _served.pop(id(dynamo), None) is dynamo
        if dynamo is None and _code_of(fn) is None:
            from torch._dynamo.eval_frame import innermost_fn

            if inspect.isclass(innermost_fn(fn)):
                return  # torch compiles the class's __call__ next, with this package
            original(self, _no_code, None, ignore_inlined_sources)
            self.__dict__["_objcache_unsaveable"] = "no_code"
            return
        if not ours:
            original(self, fn, dynamo, ignore_inlined_sources)
            return
        try:
            original(self, fn, dynamo, ignore_inlined_sources)
            self.__dict__["_objcache_served"] = fn
        except Exception as exc:
            _reset(self, fn, original, "initialize", exc)

    initialize.__objcache__ = True  # type: ignore[attr-defined]
    initialize.__wrapped__ = original  # type: ignore[attr-defined]
    return initialize


def _wrap_install(original: Callable[..., None], initialize: Callable[..., None]) -> Any:
    def install(self: Any, backends: Any) -> None:
        if self.__dict__.pop("_objcache_fresh", False):
            return  # a rejected entry: the fresh package has nothing to install
        fn = self.__dict__.pop("_objcache_served", None)
        if fn is None:
            original(self, backends)
            return
        scopes = _install_scopes(self)
        token = precompile_guards.installing_served.set(True)
        try:
            original(self, backends)
            counters["installed"] += 1
        except Exception as exc:
            _undo_install(self, scopes)
            _reset(self, fn, initialize, "install", exc)
            self.__dict__.pop("_objcache_fresh", None)
        finally:
            precompile_guards.installing_served.reset(token)

    install.__objcache__ = True  # type: ignore[attr-defined]
    install.__wrapped__ = original  # type: ignore[attr-defined]
    return install


def _wrap_add_inlined_source(original: Callable[..., None]) -> Any:
    """torch reads the source of every inlined function into the package; a program read
    from stdin (or any code without a source file) makes that raise out of the user's
    compile. The package is marked unsaveable instead (counted ``unsaved:no_source``) and
    the compile goes on."""

    def add_inlined_source(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            original(self, *args, **kwargs)
        except Exception as exc:
            self.__dict__.setdefault("_objcache_unsaveable", "no_source")
            log.debug("objcache: precompile package not saveable: %r", exc)

    add_inlined_source.__objcache__ = True  # type: ignore[attr-defined]
    add_inlined_source.__wrapped__ = original  # type: ignore[attr-defined]
    return add_inlined_source


def _wrap_context_call(original: Callable[..., Any]) -> Any:
    """``_TorchDynamoContext.__call__`` (``torch.compile()`` wrapping a function, where torch
    loads its precompile entry): names the wrapper's compiler for :func:`_load` and on its
    package for :func:`_wrap_record_package`."""

    def __call__(self: Any, fn: Any) -> Any:
        package = getattr(self, "_package", None)
        if package is None or package.is_initialized():
            return original(self, fn)
        try:
            compiler = compile_settings.compiler_identity(self)
        except Exception as exc:
            _failed("compiler identity", exc)
            compiler = None
        package.__dict__["_objcache_compiler"] = compiler
        token = _compiler.set(compiler)
        try:
            return original(self, fn)
        finally:
            _compiler.reset(token)

    __call__.__objcache__ = True  # type: ignore[attr-defined]
    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    return __call__


def _refuse_torch_store_write(*args: Any, **kwargs: Any) -> None:
    """torch's own Dynamo store (``<cache>/dynamo/<sha(qualname, line)>/entry``, read
    unverified) is never written while this part is on: Mega-Cache loads and torch's own
    ``save`` go through here."""
    counters["torch_store_write_refused"] += 1


def _wrap_cleanup_create(original: Callable[..., Any], hook_cls: type, manager: Any) -> Any:
    """torch 2.13 and 2.14: a recompile of a function whose served entry installed Dynamo's
    builtins dict into the module's globals asserts that the name "already exists in scope"
    and the error reaches the user's code. The very same object already bound is accepted,
    with a hook bound to a throwaway scope, so it never deletes the shared binding (2.14's
    hooks also take an owner token: a fresh one, which no scope is registered under)."""
    takes_token = hasattr(hook_cls, "disown")

    def create(scope: dict[str, Any], name: str, val: Any) -> Any:
        if name in scope and scope[name] is val:
            counters["shared_globals"] += 1
            manager.count += 1
            if takes_token:
                return hook_cls({name: val}, name, object())
            return hook_cls({name: val}, name)
        return original(scope, name, val)

    create.__objcache__ = True  # type: ignore[attr-defined]
    return staticmethod(create)


# --- save ----------------------------------------------------------------------------------------


def _mark(key: str | None = None) -> None:
    global _last_change, _saver
    with _lock:
        if key is not None:
            _dirty.add(key)
        else:
            _dirty.update(_entries)
        _last_change = time.monotonic()
        if _saver is None or not _saver.is_alive() or _pid != os.getpid():
            _saver = threading.Thread(target=_settle, name="objcache-precompile", daemon=True)
            _saver.start()
        _changed.notify_all()


def _settle() -> None:
    while True:
        with _lock:
            while not _dirty:
                _changed.wait()
            left = _last_change + SETTLE_S - time.monotonic()
            if left > 0:
                _changed.wait(left)
                continue
        save(final=False)


def _wrap_record_package(original: Callable[[Any], None]) -> Callable[[Any], None]:
    def record_package(package: Any) -> None:
        why = package.__dict__.get("_objcache_unsaveable")
        if why:
            counters[f"unsaved:{why}"] += 1  # torch's own record would fail the same way
            return
        compiler = package.__dict__.get("_objcache_compiler")
        if compiler is None:
            counters["unsaved:unportable_compiler"] += 1
            return
        try:
            original(package)
            fn = package._innermost_fn
            entry = package.cache_entry()  # this package's, whatever torch's key maps to
            _, key = entry_key(fn, _client().job, compiler)
            with _lock:
                _entries[key] = (fn, entry)
            _mark(key)
        except Exception as exc:
            _failed("record", exc)

    record_package.__objcache__ = True  # type: ignore[attr-defined]
    return record_package


def _wrap_record_artifact(original: Callable[..., None]) -> Any:
    def record_artifact(cls: Any, artifact: Any) -> None:
        original(artifact)
        try:
            if _entries:
                _mark()
        except Exception as exc:
            _failed("record", exc)

    record_artifact.__objcache__ = True  # type: ignore[attr-defined]
    return classmethod(record_artifact)


def save(final: bool = True) -> int:
    """Store every changed entry now (never raises); returns how many were put.

    Only the background saver passes ``final=False``: an entry whose backend is not recorded
    yet then waits for it (:func:`_complete_entry`).
    """
    try:
        return _save(final)
    except Exception as exc:
        _failed("save", exc)
        return 0


_save_lock = threading.Lock()


def _save(final: bool) -> int:
    with _save_lock:
        return _save_locked(final)


def _complete_entry(key: str, final: bool) -> tuple[int, dict[str, Any]] | None:
    """torch's ``PrecompileCacheEntry`` of one function in objcache's payload, with how many
    variants it leaves out (:mod:`superseded_codes`); None while a backend is missing.

    A training step compiles its backward lazily, at the first ``backward()``: its backend is
    recorded (``record_artifact``) seconds after the frame's package. torch's
    ``PrecompileCacheEntry.from_cache_entry`` marks a code whose backend is missing
    ``bypassed`` *in place*, on the very objects the live package and ``PrecompileContext``
    hold, so a save in between would store, then and on every later save, an entry a new
    machine traces and compiles again. Such an entry waits (counted) for its backend, which
    marks it again; at exit (``final``) it is saved as torch would save it (the incomplete
    codes bypassed, on copies), unless no code at all is complete (nothing would be served).
    """
    from torch._dynamo.package import PrecompileCacheEntry
    from torch._dynamo.precompile_context import PrecompileContext

    with _lock:
        fn, dynamo = _entries.get(key, (None, None))
    if dynamo is None:
        return None
    backends = PrecompileContext._backend_artifacts_by_key
    waiting = [c for c in dynamo.codes if any(b not in backends for b in c.backend_ids)]
    if waiting and (not final or len(waiting) == len(dynamo.codes)):
        counters["waiting_for_backend" if not final else "unsaved:no_backend"] += 1
        if not final:
            with _lock:
                _waiting.add(key)
        return None
    from torch._dynamo.eval_frame import innermost_fn

    code = innermost_fn(fn).__code__
    if not dynamo.codes or not same_code(dynamo.codes[0].python_code, code):
        counters["unsaved:code_mismatch"] += 1  # never another function's package
        return None
    if not _all_guards_portable(dynamo):  # serialized without the portable split
        counters["unsaved:no_portable_guards"] += 1
        return None
    # torch marks the copies, never the live package's codes; a static variant a later
    # dynamic one covers is left out (superseded_codes)
    codes, left_out = [], 0
    for c in dynamo.codes:
        kept, dropped = superseded_codes.without_superseded(c)
        left_out += dropped
        codes.append(kept)
    copy = dataclasses.replace(dynamo, codes=codes)
    return left_out, {
        "format": FORMAT,
        "code": portable_guards.code_digest(code),
        "entry": PrecompileCacheEntry.from_cache_entry(copy, backends),
    }


def _save_locked(final: bool) -> int:
    with _lock:
        if final:
            _dirty.update(_waiting)
        _waiting.difference_update(_dirty)
        dirty = {k for k in _dirty if k in _entries}
        _dirty.clear()
    if not dirty:
        return 0
    from torch._dynamo import convert_frame

    blobs: dict[str, tuple[int, bytes]] = {}
    with getattr(convert_frame, "compile_lock", contextlib.nullcontext()):
        for key in dirty:
            entry = _complete_entry(key, final)
            if entry is not None:
                blobs[key] = entry[0], pickle.dumps(entry[1])
    client = _client()
    cap = client.cache.caps.for_kind(KIND)
    put = 0
    for key, (left_out, blob) in blobs.items():
        digest = hashlib.sha256(blob).hexdigest()
        if _stored.get(key) == digest:
            continue
        if len(blob) > cap:
            counters["too_large"] += 1
            continue
        client.put(KIND, key, blob)
        _stored[key] = digest
        counters["puts"] += 1
        counters["superseded_variants_left_out"] += left_out
        put += 1
    return put


def _save_at_exit() -> None:
    if _pid == os.getpid():
        save()


# --- the part ------------------------------------------------------------------------------------


def _patch(obj: Any, attr: str, value: Any) -> None:
    _patched.append((obj, attr, obj.__dict__.get(attr, _ABSENT)))
    setattr(obj, attr, value)


_ABSENT = object()


def apply(package_module: Any) -> None:
    """Route torch's ``DynamoCache`` through objcache (idempotent; raises on a failure, after
    putting back what it changed)."""
    global _pid
    import importlib

    with _lock:
        if _patched:
            return
        context = importlib.import_module(CONTEXT)
        guards = importlib.import_module(GUARDS)
        cache = package_module.DynamoCache
        package_cls = package_module.CompilePackage
        for attr in ("_dynamo_cache_entries", "_backend_artifacts_by_key"):  # read by save()
            if not isinstance(getattr(context.PrecompileContext, attr, None), dict):
                raise AttributeError(f"torch has no dict PrecompileContext.{attr}")
        eval_frame = importlib.import_module("torch._dynamo.eval_frame")
        context_cls = eval_frame._TorchDynamoContext
        if not callable(getattr(eval_frame, "innermost_backend", None)):
            raise AttributeError("torch has no eval_frame.innermost_backend")
        try:
            _patch(context_cls, "__call__", _wrap_context_call(context_cls.__call__))
            _patch(cache, "load", _load)
            _patch(cache, "record_package", _wrap_record_package(cache.record_package))
            initialize = package_cls.initialize
            _patch(package_cls, "initialize", _wrap_initialize(initialize))
            _patch(package_cls, "install", _wrap_install(package_cls.install, initialize))
            _patch(
                package_cls,
                "add_inlined_source",
                _wrap_add_inlined_source(package_cls.add_inlined_source),
            )
            _patch(
                context.PrecompileContext,
                "record_artifact",
                _wrap_record_artifact(context.PrecompileContext.record_artifact),
            )
            checker = guards.CheckFunctionManager
            _patch(
                checker,
                "serialize_guards",
                precompile_guards.wrap_serialize_guards(
                    checker.serialize_guards, counters, _failed
                ),
            )
            dynamo_config = importlib.import_module("torch._dynamo.config")
            _patch(
                checker,
                "__init__",
                precompile_guards.wrap_check_init(checker.__init__, dynamo_config),
            )
            _patch(
                package_module,
                "load_guards_state",
                precompile_guards.wrap_load_guards_state(package_module.load_guards_state),
            )
            _patch(
                package_module,
                "load_guard_manager",
                precompile_guards.wrap_load_guard_manager(
                    package_module.load_guard_manager, counters
                ),
            )
            for name in ("write", "_write_to_local_cache"):
                if callable(getattr(cache, name, None)):
                    _patch(cache, name, _refuse_torch_store_write)
            utils = importlib.import_module("torch._dynamo.utils")
            hook_cls = getattr(utils, "CleanupHook", None)
            if hook_cls is not None:
                _patch(
                    hook_cls,
                    "create",
                    _wrap_cleanup_create(hook_cls.create, hook_cls, utils.CleanupManager),
                )
        except BaseException:
            uninstall()
            raise
        _pid = os.getpid()
        _register_exit_save()


def _register_exit_save() -> None:
    """Save at exit before the client closes: ``objcache.client`` registered its close
    first, and ``threading._register_atexit`` hooks run in reverse order."""
    import atexit

    import objcache.client  # noqa: F401 - its exit hook first, so it runs after this one

    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        with contextlib.suppress(RuntimeError):
            register(_save_at_exit)
            return
    atexit.register(_save_at_exit)


def uninstall() -> None:
    """Put back everything :func:`apply` patched."""
    with _lock:
        for obj, attr, value in reversed(_patched):
            with contextlib.suppress(Exception):
                if value is _ABSENT:
                    delattr(obj, attr)
                else:
                    setattr(obj, attr, value)
        _patched.clear()
        _served.clear()
        precompile_guards.forget()
        superseded_codes.forget()
        _dirty.clear()
        _waiting.clear()


def installed() -> bool:
    return bool(_patched)
