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

* **load** (:mod:`.precompile_serve`; ``DynamoCache.load(fn)``, called when
  ``torch.compile()`` wraps ``fn``): the entry is looked up as kind ``precompile`` through
  the client (local tier, then the remote tiers within the client's deadline). Its key
  (:mod:`.precompile_entry`) binds torch's key to the job, the function's module name, a
  digest of its code object and of its module's source; the namespace adds the environment
  (torch release, CPU ISA; docs/architecture.md, "Environments"). The codec verifies the
  signature and key binding before the bytes are unpickled (docs/security.md). torch's own
  local directory is never read.
* **install** (:mod:`.precompile_serve`): ``CompilePackage.initialize`` / ``install`` of a
  served entry are guarded: a rejection (another torch release, a changed inlined source,
  anything torch raises) puts the package back to a fresh one, counted, and the compile
  goes on as if there was no entry. torch itself catches only ``RuntimeError`` there and
  then fails re-initializing.
* **save** (:mod:`.precompile_save`): ``DynamoCache.record_package`` (after each frame
  compile) and ``PrecompileContext.record_artifact`` (a backend, the backward included)
  mark entries to save; a background thread saves them once compiles have settled for
  :data:`.precompile_save.SETTLE_S`, and again at exit, before the client flushes.
  Unchanged entries are not put again. Nobody needs to call
  ``torch.compiler.save_cache_artifacts()``.
* **guards** (:mod:`.precompile_guards`): ``serialize_guards`` never raises: a frame whose
  guards cannot be saved (a dropped guard without a portable replacement, a setting without
  a portable rendering, a class defined in a local scope, on which torch itself raises a
  ``TypeError``) marks its package unsaveable and hands torch an empty state. Raising
  torch's ``PackageError`` there made 2.13 and 2.14 fail the user's compile (an assertion
  on the missing state after their own package bypass).

This module is the part itself: the switch (:func:`wanted`), and :func:`apply` /
:func:`uninstall` of every patch on torch. Every failure is a counted miss, logged once;
nothing raised here reaches torch or the user's code.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from objcache.integrations.patching import marked
from objcache.integrations.torch.precompile import (
    precompile_guards,
    precompile_save,
    precompile_serve,
    program_registrations,
    superseded_codes,
)
from objcache.integrations.torch.precompile.precompile_entry import (
    counters,
    failed,
    lock,
    log,
    unsaveable,
)
from objcache.integrations.torch.precompile.unguarded import (
    abc_membership,
    absent_names,
    hash_order,
)

#: torch modules this part patches (besides the flag in ``torch._dynamo.config``).
PACKAGE = "torch._dynamo.package"
CONTEXT = "torch._dynamo.precompile_context"
GUARDS = "torch._dynamo.guards"

_TRUE = ("1", "true", "yes", "on")

#: What :func:`apply` patched: (object, attribute, previous value found in its __dict__).
_patched: list[tuple[Any, str, Any]] = []


#: Why the part is off unless asked for, as ``objcache doctor`` says it (docs/torch.md,
#: "Precompile entries", "Why it is opt-in").
OFF_BY_DEFAULT = (
    "opt-in: OBJCACHE_PRECOMPILE=1 turns it on (off by default: a served entry can compute "
    "another result where the reader differs in what torch does not guard; docs/torch.md)"
)


def wanted(environ: Any = None) -> bool:
    """Whether the part is on: only where ``OBJCACHE_PRECOMPILE`` says so (``1``), on every
    torch release: an entry is checked against what torch guards and what objcache adds,
    and neither covers everything a traced frame read (docs/torch.md, "Why it is opt-in")."""
    env = os.environ if environ is None else environ
    return str(env.get("OBJCACHE_PRECOMPILE", "")).strip().lower() in _TRUE


# --- what the part patches besides the two paths ------------------------------------------------


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

    marked(add_inlined_source, original)
    return add_inlined_source


#: torch's per-frame package bookkeeping, called from inside Dynamo's compile of the user's
#: frame: anything one raises (torch's ``PackageError`` for a code it cannot name: a
#: module-level lambda, an ``exec``'d function, a class-based decorator) would end the
#: user's call, so each is guarded (:func:`_wrap_bookkeeping`).
BOOKKEEPING = (
    "_add_user_function",
    "add_resume_function",
    "add_guarded_code",
    "add_import_source",
    "add_backend_id",
    "update_device_type",
    "bypass_current_entry",
)


def _wrap_bookkeeping(original: Callable[..., Any], name: str) -> Any:
    """``original`` that never raises: a failure makes the package unsaveable (counted
    ``unsaved:package_error`` when torch records it) and the compile goes on, as it does
    without objcache. For a frame's code torch cannot name, the package still gets an entry
    for it (never saved), since Dynamo's later bookkeeping of that frame expects one."""

    def bookkeeping(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except Exception as exc:
            if not self.__dict__.get("_objcache_unsaveable"):
                log.info("objcache: precompile entry not saved for this function: %r", exc)
            self.__dict__.setdefault("_objcache_unsaveable", "package_error")
            counters["package_error"] += 1
            if name == "_add_user_function" and args:
                _stand_in(self, args[0])
            return None

    marked(bookkeeping, original)
    bookkeeping.__name__ = name
    return bookkeeping


def _stand_in(package: Any, code: Any) -> None:
    """The entry ``code_context`` expects for a code torch could not name."""
    codes = getattr(package, "_codes", None)
    if isinstance(codes, dict) and code not in codes:
        with contextlib.suppress(Exception):
            package._add_function(code, getattr(code, "co_filename", "") or "<unknown>")


def _wrap_create_resume(original: Callable[..., Any]) -> Any:
    """Dynamo names a resume function's module by ``f_globals["__name__"]`` for the package
    before it calls the package: a function whose globals have no ``__name__`` (an
    ``exec``'d one) raises ``KeyError`` out of the user's call. Such a frame's package is
    unsaveable and the resume function is made without it."""

    def create_resume(self: Any, *args: Any, **kwargs: Any) -> Any:
        package = getattr(self, "package", None)
        if package is None or "__name__" in getattr(self, "f_globals", {"__name__": ""}):
            return original(self, *args, **kwargs)
        package.__dict__.setdefault("_objcache_unsaveable", "package_error")
        counters["package_error"] += 1
        self.package = None
        try:
            return original(self, *args, **kwargs)
        finally:
            self.package = package

    marked(create_resume, original)
    return create_resume


def _wrap_should_save_cache(original: Callable[..., bool], bundled: Callable[[], bool]) -> Any:
    """Under caching precompile torch bundles every AOTAutograd result with its compiled
    code and asserts each is Inductor's ``OutputCode``; a graph Inductor never compiles (one
    that reduces to its inputs, ``x * 1.0``) hands back a plain method, and torch 2.14 and
    2.15 raise ``AssertionError: expected OutputCode`` out of the user's call (plain torch
    with ``TORCH_CACHING_PRECOMPILE=1`` too; 2.13.0 ran ``x * 1.0`` without it). Such a
    graph gets no cache entry, its frame's package is never saved
    (``unsaved:no_output_code``), and the compile goes on."""

    def should_save(*compiled: Any) -> bool:
        if not original(*compiled):
            return False
        if not bundled() or all(_is_output_code(fn) for fn in compiled if fn is not None):
            return True
        counters["no_output_code"] += 1
        with contextlib.suppress(Exception):
            from torch._guards import TracingContext

            context = TracingContext.try_get()
            if context is not None:  # read where the frame's guards are serialized
                context.__dict__.setdefault("_objcache_unsaveable", "no_output_code")
        return False

    marked(should_save, original)
    return should_save


def _on_first_wrap(original: Callable[..., Any]) -> Any:
    """``torch.compile``'s wrapping of a function (:func:`precompile_serve.wrap_context_call`),
    which first patches AOTAutograd's cache decision (:func:`_patch_graph_compile`): torch is
    whole by then, while importing AOTAutograd from inside the install, itself run as a
    torch module imports, is a circular import on 2.13-2.15."""
    call = precompile_serve.wrap_context_call(original)

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _graph_compile_patched:
            _patch_graph_compile()
        # the backend a served entry installed now runs for (precompile_guards.backend_matcher)
        token = precompile_guards.wrapping_backend.set(precompile_guards.backend_of(self))
        try:
            return call(self, *args, **kwargs)
        finally:
            precompile_guards.wrapping_backend.reset(token)

    marked(__call__, original)
    return __call__


_graph_compile_patched: list[bool] = []


def _patch_graph_compile() -> None:
    """Patch ``graph_compile._should_save_cache`` (:func:`_wrap_should_save_cache`) and
    Dynamo's ``invoke_and_store_as_constant`` (:func:`_wrap_assumed_constant`) once, while
    the part is on; a torch without them is left as it is."""
    with lock:
        if _graph_compile_patched or not _patched:
            return
        _graph_compile_patched.append(True)
        try:
            import torch._functorch._aot_autograd.graph_compile as graph_compile
        except Exception:
            return
        should_save = getattr(graph_compile, "_should_save_cache", None)
        bundled = getattr(graph_compile, "should_bundle_autograd_cache", None)
        if callable(should_save) and callable(bundled):
            wrapped = _wrap_should_save_cache(should_save, bundled)
            _patch(graph_compile, "_should_save_cache", wrapped)
        try:
            import torch._dynamo.variables.functions as functions
            import torch._dynamo.variables.nn_module as nn_module
        except Exception:
            return
        invoke = getattr(functions, "invoke_and_store_as_constant", None)
        if callable(invoke):
            assumed = _wrap_assumed_constant(invoke)
            for module in (functions, nn_module):  # nn_module binds the name at its import
                if module.__dict__.get("invoke_and_store_as_constant") is invoke:
                    _patch(module, "invoke_and_store_as_constant", assumed)
        polyfilled = getattr(functions, "PolyfilledFunctionVariable", None)
        call = getattr(polyfilled, "__dict__", {}).get("call_function")
        if callable(call) and callable(getattr(polyfilled, "can_constant_fold_through", None)):
            _patch(polyfilled, "call_function", _wrap_constant_folded(call))


def _patch_absent_names(translator: Any) -> None:
    """Collect what a trace looked up and did not find (:mod:`.absent_names`); raises where
    torch lacks a piece, so that the part is not half applied."""
    import importlib

    load_builtin = translator.load_builtin_from_argval
    _patch(translator, "load_builtin_from_argval", absent_names.wrap_load_builtin(load_builtin))
    base = importlib.import_module("torch._dynamo.variables.base").VariableTracker
    for cls in absent_names.hasattr_classes(base):
        _patch(cls, "call_obj_hasattr", absent_names.wrap_hasattr(cls.__dict__["call_obj_hasattr"]))
    exc = importlib.import_module("torch._dynamo.exc")
    error = exc.ObservedAttributeError
    _patch(error, "__init__", absent_names.wrap_observed_attribute_error(error.__init__))
    missing = exc.ObservedKeyError  # its own __init__ (inherited: put back by removing it)
    _patch(missing, "__init__", absent_names.wrap_observed_key_error(missing.__init__))
    dicts = importlib.import_module("torch._dynamo.variables.dicts").ConstDictVariable
    lookup = "getitem_const_raise_exception_if_absent"  # D[k], on every release supported
    _patch(dicts, lookup, absent_names.wrap_dict_getitem(dicts.__dict__[lookup]))
    instance = importlib.import_module("torch._dynamo.variables.dicts").DunderDictVariable
    for name, wrap in (  # obj.__dict__: both are no-ops in torch
        ("install_dict_contains_guard", absent_names.wrap_instance_dict_contains),
        ("install_dict_keys_match_guard", absent_names.wrap_instance_dict_keys),
    ):
        _patch(instance, name, wrap(instance.__dict__[name]))
    functions = importlib.import_module("torch._dynamo.variables.functions")
    fallback = getattr(functions, "BaseUserFunctionVariable", object).__dict__.get(
        "call_getattr_fallback"
    )
    if callable(fallback):  # where torch has none, a caught error stays unsaveable
        _patch(
            functions.BaseUserFunctionVariable,
            "call_getattr_fallback",
            absent_names.wrap_function_getattr_fallback(fallback),
        )


def _wrap_assumed_constant(original: Callable[..., Any]) -> Any:
    """Dynamo calls a function marked ``torch.compiler.assume_constant_result`` while it
    traces and bakes its result into the code with no guard: the user's promise that it is
    constant holds within a process, not across machines (a core count, a world size read
    from the environment). A frame that called one of the program's is not saved
    (``unsaved:assumed_constant``); torch's own (``is_compile_supported``) are left alone."""

    def invoke(tx: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if not _torchs_code(fn):  # by its code's file: ``functools.wraps`` copies __module__
            unsaveable(tx, "assumed_constant")
        return original(tx, fn, *args, **kwargs)

    marked(invoke, original)
    return invoke


def _wrap_constant_folded(original: Callable[..., Any]) -> Any:
    """The other public route to an unguarded constant: a function the program registered
    with ``torch.compiler.substitute_in_graph(fn, can_constant_fold_through=True)`` (a C
    function such as ``os.cpu_count``), which Dynamo calls while it traces, with constant
    arguments, and bakes in as :func:`_wrap_assumed_constant`'s. A frame whose trace may fold
    one of the program's is not saved; torch's own polyfills are left alone."""

    def call_function(self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):
            if self.can_constant_fold_through() and not _torchs_code(self.traceable_fn):
                unsaveable(tx, "assumed_constant")
        return original(self, tx, *args, **kwargs)

    marked(call_function, original)
    return call_function


def _torchs_code(fn: Any) -> bool:
    """Whether ``fn`` is a Python function whose code lies in torch's own folder."""
    code = getattr(fn, "__code__", None)
    filename = getattr(code, "co_filename", None)
    return isinstance(filename, str) and program_registrations.in_torch(filename)


def _is_output_code(fn: Any) -> bool:
    """Whether ``fn``, under the wrappers AOTAutograd adds, is Inductor's ``OutputCode``
    (how torch's ``unwrap_output_code`` looks)."""
    from torch._inductor.output_code import OutputCode

    for _ in range(64):  # a chain of wrappers, never a cycle
        inner = getattr(fn, "__wrapped__", None)
        if inner is None:
            break
        fn = inner
    return isinstance(fn, OutputCode)


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

    marked(create)
    return staticmethod(create)


# --- the part ------------------------------------------------------------------------------------


def _patch(obj: Any, attr: str, value: Any) -> None:
    _patched.append((obj, attr, obj.__dict__.get(attr, _ABSENT)))
    setattr(obj, attr, value)


_ABSENT = object()


def apply(package_module: Any) -> None:
    """Route torch's ``DynamoCache`` through objcache (idempotent; raises on a failure, after
    putting back what it changed)."""
    import importlib

    with lock:
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
            _patch(context_cls, "__call__", _on_first_wrap(context_cls.__call__))
            # the callback of the call a served code's guard runs in
            set_eval_frame = eval_frame.set_eval_frame
            mirrored = precompile_guards.wrap_set_eval_frame(set_eval_frame)
            for name in ("set_eval_frame", "_maybe_set_eval_frame"):
                if eval_frame.__dict__.get(name) is set_eval_frame:  # an alias bound at import
                    _patch(eval_frame, name, mirrored)
            _patch(cache, "load", precompile_serve.load)
            _patch(
                cache, "record_package", precompile_save.wrap_record_package(cache.record_package)
            )
            initialize = package_cls.initialize
            _patch(package_cls, "initialize", precompile_serve.wrap_initialize(initialize))
            _patch(
                package_cls,
                "install",
                precompile_serve.wrap_install(package_cls.install, initialize),
            )
            # a compiled module deep-copies and pickles as without the part
            _patch(package_cls, "__deepcopy__", precompile_serve.package_deepcopy)
            _patch(package_cls, "__reduce__", precompile_serve.package_reduce)
            _patch(
                package_cls,
                "add_inlined_source",
                _wrap_add_inlined_source(package_cls.add_inlined_source),
            )
            for name in BOOKKEEPING:
                if callable(getattr(package_cls, name, None)):
                    _patch(package_cls, name, _wrap_bookkeeping(getattr(package_cls, name), name))
            _patch(
                context.PrecompileContext,
                "record_artifact",
                precompile_save.wrap_record_artifact(context.PrecompileContext.record_artifact),
            )
            checker = guards.CheckFunctionManager
            _patch(
                checker,
                "serialize_guards",
                precompile_guards.wrap_serialize_guards(checker.serialize_guards, counters, failed),
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
            tracer = importlib.import_module("torch._dynamo.symbolic_convert")
            base = getattr(tracer, "InstructionTranslatorBase", None)
            create_resume = getattr(base, "create_resume", None)
            if callable(create_resume):
                _patch(base, "create_resume", _wrap_create_resume(create_resume))
            _patch_absent_names(base)
            comparisons = dict(tracer.compare_op_handlers)  # IS_OP reads it at every a is b
            for op in ("is", "is not"):
                comparisons[op] = hash_order.wrap_is_op(comparisons[op])
            _patch(tracer, "compare_op_handlers", comparisons)
            protocol = importlib.import_module("torch._dynamo.variables.object_protocol")
            hashing = hash_order.wrap_generic_hash(protocol.generic_hash)
            _patch(protocol, "generic_hash", hashing)
            builtin = importlib.import_module("torch._dynamo.variables.builtin")
            if "generic_hash" in builtin.__dict__:  # bound at import on 2.14 and later
                _patch(builtin, "generic_hash", hashing)
            variable = builtin.BuiltinVariable
            # read by name when Dynamo first builds a handler for id() (``call_{fn.__name__}``)
            _patch(variable, "call_id", hash_order.wrap_call_id(variable.call_id))
            for name, of_value in (("call_isinstance", True), ("call_issubclass", False)):
                method = variable.__dict__[name]
                _patch(variable, name, abc_membership.wrap_membership(method, of_value))
            handlers = getattr(variable, "call_function_handler_cache", None)
            if isinstance(handlers, dict):  # a handler built before the patch holds torch's
                patched = (id, isinstance, issubclass)
                for key in [
                    k for k in list(handlers) if isinstance(k, tuple) and k[:1] and k[0] in patched
                ]:
                    handlers.pop(key, None)
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
        precompile_save.start()


def uninstall() -> None:
    """Put back everything :func:`apply` patched."""
    with lock:
        for obj, attr, value in reversed(_patched):
            with contextlib.suppress(Exception):
                if value is _ABSENT:
                    delattr(obj, attr)
                else:
                    setattr(obj, attr, value)
        _patched.clear()
        _graph_compile_patched.clear()
        precompile_serve.forget()
        precompile_guards.forget()
        superseded_codes.forget()
        precompile_save.forget()


def installed() -> bool:
    return bool(_patched)
