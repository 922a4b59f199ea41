"""Serving a precompile entry (docs/torch.md, "Precompile entries"): the load path.

``DynamoCache.load(fn)``, called when ``torch.compile()`` wraps ``fn``, looks the entry up
as kind ``precompile`` through the client (local tier, then the remote tiers within the
client's deadline), under the key of :func:`.precompile_entry.entry_key` and the compiler
the wrapper names (:func:`wrap_context_call`). The codec verifies the signature and key
binding before the bytes are unpickled (docs/security.md); the entry must then be the
wrapped function's package, every guarded code with its portable guards. torch's own local
directory is never read.

``CompilePackage.initialize`` / ``install`` of a served entry are guarded: a rejection
(another torch release, a changed inlined source, anything torch raises) puts the package
back to a fresh one, counted, and the compile goes on as if there was no entry. torch itself
catches only ``RuntimeError`` there and then fails re-initializing.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import inspect
import itertools
import pickle
import re
import sys
import types
from collections.abc import Callable
from typing import Any

from objcache.integrations import cache_client
from objcache.integrations.patching import marked
from objcache.integrations.torch.precompile import (
    compile_settings,
    portable_guards,
    precompile_guards,
    torch_edits,
)
from objcache.integrations.torch.precompile.precompile_entry import (
    FORMAT,
    KIND,
    all_guards_portable,
    counters,
    entry_key,
    failed,
    lock,
    log,
    same_code,
    stored,
)

#: Dynamo entries handed to torch by :func:`load`, by id, until torch initializes them.
_served: dict[int, Any] = {}
_UNSET: Any = object()
#: The compiler identity of the ``torch.compile(...)`` wrapper now wrapping a function
#: (:func:`wrap_context_call`), read by :func:`load`.
current_compiler: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "objcache_precompile_compiler", default=_UNSET
)


def _code_of(fn: Any) -> types.CodeType | None:
    """The code object of the function ``torch.compile`` wraps, or None for a class or a
    callable object (torch's caching precompile reads ``__code__`` and would raise)."""
    from torch._dynamo.eval_frame import innermost_fn

    code = getattr(innermost_fn(fn), "__code__", None)
    return code if isinstance(code, types.CodeType) else None


def _no_code() -> None:
    """The package function of a compiled callable that has no code of its own (never
    saved: its package is marked unsaveable)."""


def load(fn: Any) -> Any | None:
    """``DynamoCache.load``: the verified entry of ``fn`` from objcache, or None (a miss)."""
    with torch_edits.torch_at_work():
        return _load(fn)


def _load(fn: Any) -> Any | None:
    if _code_of(fn) is None:
        counters["skipped:no_code"] += 1
        return None
    if compile_settings.debug_overrides():  # checked again at each call (settings record)
        counters["skipped:debug_override"] += 1
        return None
    compiler = current_compiler.get()
    if compiler is _UNSET or compiler is None:
        counters[
            "skipped:unknown_compiler" if compiler is _UNSET else "skipped:unportable_compiler"
        ] += 1
        return None
    counters["lookups"] += 1
    try:
        client = cache_client.get_client()
        torch_key, key = entry_key(fn, client.job, compiler)
        payload = client.get(KIND, key)
    except Exception as exc:
        failed("lookup", exc)
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
        failed("read", exc)
        return None
    if _over_the_recompile_limit(entry):
        # torch counts no served variant toward its limit: past it, the reader would compile
        # where torch alone runs eagerly (the thirty-fourth review, ``recompile_limit=1``)
        counters["skipped:recompile_limit"] += 1
        return None
    with lock:
        _served[id(entry.dynamo)] = entry.dynamo
        stored[key] = hashlib.sha256(payload).hexdigest()
    counters["hits"] += 1
    return entry


def _over_the_recompile_limit(entry: Any) -> bool:
    """Whether a code of ``entry`` holds more variants than this process's recompile limit."""
    limit = precompile_guards.recompile_limit()
    codes = getattr(getattr(entry, "dynamo", None), "codes", None) or ()
    return any(len(getattr(code, "guarded_codes", ())) > limit for code in codes)


class _Mismatch(Exception):
    """A verified entry that is not the wrapped function's package (counted ``rejected:``)."""

    def __init__(self, why: str, detail: str) -> None:
        super().__init__(f"{why}: {detail}")
        self.why = why


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
    if not all_guards_portable(entry.dynamo):
        raise _Mismatch("no_portable_guards", "a guarded code carries no portable guards")
    store = InMemoryDynamoStore()
    store.packages[torch_key] = entry
    return store.load_cache_entry(torch_key)


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


def _name_taken(package: Any) -> str | None:
    """``module.name`` of a resume function the entry would bind where this process already
    holds another function under that name, else None. Dynamo names a resume function
    by its offset and the first number free in the module *when it compiles*
    (``__resume_at_70_3``): a process that compiled another function of the module first
    holds that name for its own, and torch's ``install`` would re-bind it to the entry's,
    so the first function's next call ran the other's code (the thirteenth review: off by
    6, or a ``TypeError`` out of the program's call)."""
    for code, entry in list(package._codes.items()):
        if not getattr(entry, "install_to_global", False):
            continue
        module = sys.modules.get(getattr(entry, "python_module", ""))
        scope = getattr(module, "__dict__", None)
        if not isinstance(scope, dict):
            continue
        for name in getattr(entry, "function_names", ()):
            held = scope.get(name)
            if held is not None and not _runs(held, code):
                return f"{entry.python_module}.{name}"
    return None


#: A name Dynamo made with ``unique_id`` (``__resume_at_54_3``, ``__compiled_fn_7``): its
#: number, before the uuid some of them carry.
_NUMBERED = re.compile(r"__\w*?_(\d+)(?:_[0-9a-f]{8}(?:_[0-9a-f]{4}){3}_[0-9a-f]{12})?")


def _past_served_names(package: Any) -> None:
    """Move Dynamo's name counter past every number the served entry's bound names carry.

    Dynamo names a resume function by its offset and the next number of a process-wide
    counter (``unique_id``); the writer's names are bound into the module as the entry is
    installed, and a reader that compiles the function again (a guard the served code fails)
    counted as far and made the same name for its own function: torch's ``install_global``
    raised ``AssertionError: Name '__resume_at_54_3' already exists in scope`` out of the
    program's call (the thirty-ninth review). The counter only moves forward (never raises)."""
    with contextlib.suppress(Exception):
        from torch._dynamo import bytecode_transformation as names

        highest = -1
        for bound in list(getattr(package, "_installed_globals", {}).values()):
            for name in bound:
                match = _NUMBERED.fullmatch(name)
                if match:
                    highest = max(highest, int(match.group(1)))
        if highest < 0:
            return
        counter = names._unique_id_counter
        now = next(counter)  # spends one number: names need only be unique
        names._unique_id_counter = itertools.count(max(now + 1, highest + 1))


def _runs(held: Any, code: types.CodeType) -> bool:
    """Whether a bound resume function (or the factory Dynamo binds for one with free
    variables) runs ``code``, by what the code does."""
    found = [getattr(held, "__code__", None), *(getattr(held, "__defaults__", None) or ())[:1]]
    digest = portable_guards.code_digest(code)
    return any(
        isinstance(c, types.CodeType) and portable_guards.code_digest(c) == digest for c in found
    )


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


def wrap_initialize(original: Callable[..., None]) -> Callable[..., None]:
    def initialize(
        self: Any, fn: Any, dynamo: Any = None, ignore_inlined_sources: bool = False
    ) -> None:
        with lock:
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
            with torch_edits.torch_at_work():
                original(self, fn, dynamo, ignore_inlined_sources)
            self.__dict__["_objcache_served"] = fn
        except Exception as exc:
            _reset(self, fn, original, "initialize", exc)

    marked(initialize, original)
    return initialize


def wrap_install(original: Callable[..., None], initialize: Callable[..., None]) -> Any:
    def install(self: Any, backends: Any) -> None:
        if self.__dict__.pop("_objcache_fresh", False):
            return  # a rejected entry: the fresh package has nothing to install
        fn = self.__dict__.pop("_objcache_served", None)
        if fn is None:
            original(self, backends)
            return
        taken = _name_taken(self)
        if taken is not None:  # never re-bind a name this process's own compile bound
            _reset(self, fn, initialize, "name_taken", taken)
            self.__dict__.pop("_objcache_fresh", None)
            return
        scopes = _install_scopes(self)
        token = precompile_guards.installing_served.set(True)
        try:
            with torch_edits.torch_at_work():
                original(self, backends)
            counters["installed"] += 1
            _past_served_names(self)
        except Exception as exc:
            _undo_install(self, scopes)
            _reset(self, fn, initialize, getattr(exc, "objcache_why", "install"), exc)
            self.__dict__.pop("_objcache_fresh", None)
        finally:
            precompile_guards.installing_served.reset(token)

    marked(install, original)
    return install


def wrap_context_call(original: Callable[..., Any]) -> Any:
    """``_TorchDynamoContext.__call__`` (``torch.compile()`` wrapping a function, where torch
    loads its precompile entry): names the wrapper's compiler for :func:`load` and on its
    package for :func:`.precompile_save.wrap_record_package`."""

    def __call__(self: Any, fn: Any) -> Any:
        package = getattr(self, "_package", None)
        if package is None or package.is_initialized():
            return original(self, fn)
        try:
            compiler = compile_settings.compiler_identity(self)
        except Exception as exc:
            failed("compiler identity", exc)
            compiler = None
        package.__dict__["_objcache_compiler"] = compiler
        token = current_compiler.set(compiler)
        try:
            return original(self, fn)
        finally:
            current_compiler.reset(token)

    marked(__call__, original)
    return __call__


def package_deepcopy(self: Any, memo: dict[int, Any]) -> Any:
    """``CompilePackage.__deepcopy__``: the package itself. ``copy.deepcopy`` of a compiled
    module (an EMA copy, a trainer's ``deepcopy(model)``) copies the wrapper's Dynamo context
    and, in it, the package; torch's own copy of a package whose served entry was installed
    raised ``cannot pickle 'module' object`` (its record of the globals it installed is keyed
    by module). What the package describes is not the wrapper's to copy: the compiled code
    is installed on the function's code objects and in its module's globals, which every
    copy runs and shares (code objects are immutable), so both wrappers record their compiles
    in the one package, saved as the one entry of that function (docs/torch.md, "Precompile
    entries")."""
    return self


def package_reduce(self: Any) -> tuple[Any, tuple[()]]:
    """``CompilePackage.__reduce__``: pickled as None. ``pickle``/``torch.save`` of a
    compiled module raised ``cannot pickle code objects`` in every process with caching
    precompile on (the package holds the compiled bytecode). The unpickled wrapper has no
    package, as without the part: it compiles in its process, and nothing of the pickling
    process's compiles travels in the file (they are objcache's entries to serve). Built by
    ``NoneType()``, so a process without objcache unpickles it too."""
    return type(None), ()


marked(package_deepcopy)
marked(package_reduce)


def forget() -> None:
    """Drop the entries served and not initialized yet (the part's uninstall)."""
    _served.clear()
