"""The guards of a precompile entry (docs/torch.md, "What a served entry still checks").

* **Written** (``CheckFunctionManager.serialize_guards``): the guards torch drops under
  caching precompile are replaced by portable records (:mod:`portable_guards`) and the
  compiler settings of the frame's compile appended (:mod:`compile_settings`); the shapes of
  the frame's inputs are noted for :mod:`superseded_codes`. It never raises: a frame that
  cannot be saved that way is compiled and run as usual, its package never saved.
* **Live**: the writing process keeps every guard a normal compile has
  (``CheckFunctionManager.__init__`` with torch's filter off).
* **Read back** (``load_guards_state``, then ``load_guard_manager``), only while torch
  installs an entry objcache served (:data:`installing_served`): the records travel from
  the first step to the second and become one more guard checked at every call, after all
  of torch's (an epilogue guard: it holds only where the whole guard holds, so the facts it
  checks once are checked at a call that runs the code), together with the backend the
  entry was served for (:func:`backend_matcher`). torch's own ``aot_compile`` load goes
  through the same functions and is passed through untouched.
"""

from __future__ import annotations

import contextvars
import logging
import re
import sys
import threading
import types
from collections import Counter
from collections.abc import Callable
from typing import Any

from objcache.integrations.patching import marked
from objcache.integrations.torch.precompile import (
    compile_settings,
    portable_guards,
    superseded_codes,
)
from objcache.integrations.torch.precompile.unguarded import (
    abc_membership,
    absent_names,
    guards_unpickling,
    hash_order,
)
from objcache.observe.metrics import FailureLog

log = logging.getLogger("objcache.torch")

#: True while torch installs a package objcache served: only then do the guard loaders
#: expect objcache's portable guards. torch's ``aot_compile`` load goes through the same
#: functions with a state of its own, which they pass through untouched.
installing_served: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "objcache_precompile_installing_served", default=False
)

#: The backend of the ``torch.compile(...)`` wrapper now wrapping a function (where torch
#: installs its served entry): the one its served code runs for (:func:`backend_matcher`).
wrapping_backend: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "objcache_precompile_wrapping_backend", default=None
)

_lock = threading.Lock()
#: id(unpickled guards state) -> the portable guards that trailed its bytes, between
#: torch's two load steps (``load_guards_state``, then ``load_guard_manager``).
_state_records: dict[int, tuple[portable_guards.Portable, ...]] = {}


def wrap_check_init(original: Callable[..., None], dynamo_config: Any) -> Any:
    """``CheckFunctionManager.__init__`` with torch's caching-precompile guard filter off:
    the live process keeps every guard a normal compile has (the saved copy leaves them out
    in :func:`wrap_serialize_guards`, each replaced by a portable one)."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        with dynamo_config.patch(caching_precompile=False):
            original(self, *args, **kwargs)

    marked(__init__, original)
    return __init__


def _not_saved(output_graph: Any, why: str, detail: Any) -> bytes:
    """A frame whose guards cannot be saved with their portable replacements: its package is
    never saved (counted ``unsaved:<why>`` when it is recorded), the compile goes on. torch
    2.13 and 2.14 assert on a ``None`` guards state even after their own package bypass, so
    torch gets an empty state, which no save ever carries (:func:`_all_guards_portable`)."""
    log.info("objcache: precompile entry not saved for this function: %s", detail)
    output_graph.package.__dict__.setdefault("_objcache_unsaveable", why)
    return b""


def wrap_serialize_guards(
    original: Callable[..., Any], counters: Counter[str], failed: FailureLog
) -> Any:
    """torch's guards serialization with the dropped guards replaced by portable records and
    the compiler settings appended (:mod:`portable_guards`, :mod:`compile_settings`). It
    never raises: a frame it cannot save that way is compiled and run as usual, unsaved."""

    def serialize_guards(
        self: Any, builder: Any, sorted_guards: Any, *args: Any, **kwargs: Any
    ) -> Any:
        output_graph = args[0] if args else kwargs.get("output_graph")
        if getattr(output_graph, "package", None) is None:
            # not a frame of a precompile package (torch's aot_compile saves its own way)
            return original(self, builder, sorted_guards, *args, **kwargs)
        context = getattr(output_graph, "tracing_context", None)
        refused = getattr(context, "__dict__", {}).get("_objcache_unsaveable")
        if refused:  # found while the frame's graph compiled (precompile._wrap_should_save_cache)
            return _not_saved(output_graph, str(refused), refused)
        try:
            kept, records = portable_guards.split(sorted_guards, builder.get)
            traced = _traced_code(output_graph)
            if hash_order.per_process() and hash_order.iterated_constant_sets(traced):
                return _not_saved(output_graph, hash_order.UNSAVED, "a set's order was traced")
            fact = portable_guards.unguarded_tensor_read(traced)
            if fact is not None:
                return _not_saved(
                    output_graph,
                    portable_guards.UNGUARDED_TENSOR_UNSAVED,
                    f"the trace read tensor.{fact}, which torch does not guard",
                )
            uncarried = _uncarried_globals(output_graph)
            if uncarried:
                return _not_saved(
                    output_graph,
                    UNCARRIED_UNSAVED,
                    f"the code reads a global Dynamo bound in this process only: {uncarried[0]}",
                )
            if _caller_may_alias(output_graph):
                return _not_saved(
                    output_graph,
                    ALIASING_UNSAVED,
                    "the graph mutates a tensor its caller passes, which may share storage",
                )
            records = portable_guards.bounded(
                (
                    *records,
                    *portable_guards.inlined_code_records(traced),
                    *portable_guards.unguarded_value_records(traced, _frame_locals(builder)),
                    *portable_guards.global_hook_records(),
                    *portable_guards.absent_records(
                        absent_names.collected(output_graph),
                        absent_names.collected_keys(output_graph),
                        absent_names.collected_present_keys(output_graph),
                    ),
                    *portable_guards.membership_records(abc_membership.collected(output_graph)),
                )
            )
        except portable_guards.Unportable as exc:
            return _not_saved(output_graph, f"dropped_guard:{exc.kind}", exc)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the program's code it read (an __eq__) may raise anything
            return _not_saved(output_graph, "guards_unsaveable", repr(exc))
        try:
            settings = compile_settings.settings_digest()
        except Exception as exc:
            settings = None
            failed("compiler settings", exc)
        if settings is None:
            return _not_saved(output_graph, "unportable_settings", "a compiler setting")
        try:
            state = original(self, builder, kept, *args, **kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # torch's own refusal (a class defined in a function),
            # or what the program's pickling code raised (a __reduce__ that exits)
            return _not_saved(output_graph, "guards_unsaveable", repr(exc))
        found = (
            guards_unpickling.program_code(state)
            if isinstance(state, bytes)
            else "a guards state that is not bytes"
        )
        if found:
            return _not_saved(
                output_graph,
                guards_unpickling.UNSAVED,
                f"rebuilding its guards on a reader would run the program's code: {found}",
            )
        _carry_module_globals(output_graph, counters, failed)
        state = portable_guards.attach(state, (*records, portable_guards.settings_record(settings)))
        superseded_codes.record(state, superseded_codes.shapes_of(output_graph))
        return state

    marked(serialize_guards, original)
    return serialize_guards


#: Why a frame is not saved whose code reads a global Dynamo bound while tracing that the
#: saved entry does not carry: the reader has no such global (``NameError`` out of the
#: user's call), or one bound under the same name by another compile of its own.
UNCARRIED_UNSAVED = "unnamed_global"
#: The globals Dynamo binds that torch's package puts back on the reader (its install): the
#: compiled graphs, the resume functions, the builtins dict (its counter re-read at load) and
#: the import aliases; besides these, the modules :func:`_carry_module_globals` names.
_CARRIED_PREFIXES = ("__compiled_fn", "__resume_at", "__builtins_dict__", "__import_")


def _uncarried_globals(output_graph: Any) -> list[str]:
    """The globals Dynamo bound while tracing this frame that its entry would not carry (a
    ``random.Random`` object's replay, ``__gen_rand_values_<n>``; a builtin class bound by
    its address, ``___module_range_<id>_c<n>``, ``___module_deque_...``, where the code
    builds a ``range``, ``bytearray``, ``deque``, ``zip`` or iterator it returns or stores;
    anything Dynamo binds that is not a known carried kind). Fails closed: where torch's
    bookkeeping cannot be read, a marker name."""
    try:
        names = getattr(output_graph, "installed_globals", ())
        scope = getattr(output_graph, "global_scope", None)
        uncarried = []
        for name in sorted(names):
            if not isinstance(name, str):
                return ["<a global not named by a string>"]
            if name.startswith(_CARRIED_PREFIXES):
                continue
            if _BY_ID.match(name) and isinstance(scope, dict) and _named_module(scope.get(name)):
                continue
            uncarried.append(name)
        return uncarried
    except Exception:
        return ["<torch's installed globals unreadable>"]


def _named_module(value: Any) -> str | None:
    """The name a module its own name reaches (``sys.modules``) has, else None."""
    name = getattr(value, "__name__", None)
    if isinstance(value, types.ModuleType) and isinstance(name, str):
        return name if sys.modules.get(name) is value else None
    return None


#: Why a frame is not saved where another caller could pass tensors sharing storage.
ALIASING_UNSAVED = "input_aliasing"


def _caller_may_alias(output_graph: Any) -> bool:
    """Whether the frame's graph mutates a tensor the caller passes (an argument, or an item
    of one, reached through no attribute) and takes another tensor. Which inputs share
    storage decides such a graph's code (AOTAutograd's synthetic bases), and torch guards it
    only where the writer's inputs overlapped: a reader passing two views of one buffer
    (``f(buf[:8], buf[:8])``) would run code made for separate tensors. A module's
    parameters and buffers and an optimizer's state are reached through attributes: their
    sharing is the program's own (BatchNorm's running statistics, an optimizer step). Fails
    closed (True) where torch's bookkeeping cannot be read."""
    try:
        import torch

        mutation = output_graph.root_tracer.has_input_mutation()
        if not mutation.has_mutation:
            return False
        mutated = set(mutation.mutated_input_indices)
        # Dynamo's OutputGraph.cleanup() deletes each placeholder's "grapharg" once the trace
        # is done, before the guards are built: the sources are read from the tracked fakes
        # (never pruned), by the fake tensor that is the placeholder's example value
        tracked: dict[int, list[Any]] = {}
        for fake in getattr(output_graph, "tracked_fakes", ()):
            tracked.setdefault(id(fake.fake), []).append(fake.source)
        tensors, passed_and_mutated = 0, False
        for index, node in enumerate(output_graph.graph.nodes):
            if node.op != "placeholder":
                break
            example = node.meta.get("example_value")
            if not isinstance(example, torch.Tensor):
                continue
            tensors += 1
            source = getattr(node.meta.get("grapharg"), "source", None)
            sources = [source] if source is not None else tracked.get(id(example), [None])
            passed = any(_passed_by_caller(s) for s in sources)
            passed_and_mutated = passed_and_mutated or (passed and index in mutated)
        return tensors >= 2 and passed_and_mutated
    except Exception:
        return True


def _passed_by_caller(source: Any) -> bool:
    """Whether ``source`` is a local or an item of one reached through no attribute (True
    where it cannot be read: fails closed)."""
    name = getattr(source, "name", None)
    name = name() if callable(name) else name
    path = portable_guards.parse_source(name) if isinstance(name, str) else None
    return path is None or (path[0] == "L" and all(how != "attr" for how, _ in path[1]))


def _traced_code(output_graph: Any) -> list[Any]:
    """The code objects Dynamo traced for this frame (its own first, then each function it
    inlined); raises :class:`~portable_guards.Unportable` where torch keeps no such list."""
    context = getattr(output_graph, "tracing_context", None)
    codes = getattr(context, "traced_code", None)
    if codes is None:
        codes = getattr(output_graph, "traced_code", None)
    if not isinstance(codes, list):
        raise portable_guards.Unportable(
            portable_guards.INLINED_KIND, "<frame>", "torch keeps no list of the inlined code"
        )
    return codes


def _frame_locals(builder: Any) -> Any:
    """The traced frame's locals, as the guard builder reads ``L[...]`` (its scope)."""
    scope = getattr(builder, "scope", None)
    return scope.get("L") if isinstance(scope, dict) else None


#: Names Dynamo gives the globals it installs for one object (``install_global_by_id``).
_BY_ID = re.compile(r"^(___module_\w+)?_\d+_c\d+$")


def _carry_module_globals(output_graph: Any, counters: Counter[str], failed: FailureLog) -> None:
    """Name, as import sources of the frame's entry, the modules Dynamo installed as globals
    of its own while tracing (``type(x)`` of a tensor guards ``G['_<id>_c<n>'].Tensor``, the
    ``torch`` module installed by id; a module a resume reconstructs). torch's install puts
    its import sources back into the reader's globals; globals installed by id it does not,
    so every such guard failed on the reader (``guard_failed:CLASS_MATCH``) and the frame was
    traced again. Only a module its own name reaches (``sys.modules``) is named, the same
    module in any process; a frame with any other such global is not saved
    (:func:`_uncarried_globals`). Never raises."""
    try:
        package = getattr(output_graph, "package", None)
        scope = getattr(output_graph, "global_scope", None)
        names = getattr(output_graph, "installed_globals", ())
        if package is None or not isinstance(scope, dict):
            return
        for name in sorted(n for n in names if isinstance(n, str) and _BY_ID.match(n)):
            module = _named_module(scope.get(name))
            if module is not None:
                package.add_import_source(name, module)
                counters["module_globals_carried"] += 1
    except Exception as exc:
        failed("module globals", exc)


def _in_a_scratch_trace(load: Callable[[bytes], Any], data: bytes) -> Any:
    """``load(data)`` inside a tracing context of its own when none is on.

    torch's guards state holds Dynamo's sources, and one of them (``ImportSource``, how Dynamo
    names ``torch`` when it reaches the pytree registry, ``collections`` for a namedtuple)
    installs a guard when it is built. Built by unpickling at ``torch.compile()``, outside
    any trace, torch 2.13 raised ``TracingContext.get() must be called within an ongoing
    trace`` and every frame that flattens a pytree (a library model's outputs) was refused.
    The guard it installs is Dynamo's bookkeeping while tracing, an ``ID_MATCH`` on the
    module, which caching precompile drops and objcache carries as a portable record
    (``__import__('torch')``): here it lands in a scratch context that is thrown away. The
    served code's guards are the saved guard tree plus the portable records, as before."""
    try:
        from torch._guards import TracingContext, tracing

        if TracingContext.try_get() is not None:
            return load(data)
        scratch = tracing(TracingContext(None))
    except Exception:  # a torch without these: as torch loads it
        return load(data)
    with scratch:
        return load(data)


class ProgramUnpickling(RuntimeError):
    """A served entry whose guards state would run the program's code when rebuilt
    (counted ``rejected:program_unpickling``)."""

    objcache_why = guards_unpickling.UNSAVED


def wrap_load_guards_state(original: Callable[[bytes], Any]) -> Any:
    def load_guards_state(guards_state: bytes) -> Any:
        if not installing_served.get():
            return original(guards_state)  # not an entry objcache served (aot_compile's load)
        detached = portable_guards.detach(guards_state)
        if detached is None:  # never served by us: checked in _unpack, refused here too
            raise RuntimeError("objcache: a served guarded code carries no portable guards")
        torch_state, records = detached
        found = guards_unpickling.program_code(torch_state)
        if found:  # an entry saved without this check: never rebuilt here
            raise ProgramUnpickling(f"rebuilding its guards would run the program's code: {found}")
        try:
            state = _in_a_scratch_trace(original, torch_state)
        except (KeyboardInterrupt, Exception):
            raise
        except BaseException as exc:  # never out of the program's call: a refused entry
            raise RuntimeError(f"objcache: rebuilding served guards raised {exc!r}") from exc
        with _lock:
            _state_records[id(state)] = records
        return state

    marked(load_guards_state)
    return load_guards_state


def _scope_is_the_codes_module(code: Any, scope: Any) -> bool:
    """Whether ``scope``, the globals torch installs a served guarded code's guards against
    (``sys.modules[entry.python_module].__dict__``), are those of the module the code belongs
    to. torch records the compiled function's ``__module__``, which ``functools.wraps``
    copies from the wrapped function: transformers' ``wrapper`` in ``utils/generic.py`` was
    guarded in ``modeling_bert``'s globals while it runs in its own, so a global it reads
    could change unchecked. A code no file names (a notebook cell, ``exec``) is left to
    torch's choice: its function's globals are the ones its key was taken in."""
    import inspect

    try:
        module = inspect.getmodule(code)
    except Exception:
        return False
    return module is None or getattr(module, "__dict__", None) is scope


def wrap_load_guard_manager(original: Callable[..., Any], counters: Counter[str]) -> Any:
    """torch's guards of a served guarded code plus one guard, run after all of torch's,
    checking the backend of the call and the portable replacements at every call; a
    guarded code without them, or installed by no known backend, is refused (raises: the
    install is rejected and put back). A failed check is counted ``guard_failed:<kind>``
    (once per code and kind): Dynamo compiles that frame as without the entry."""

    def guard_failed(why: str) -> None:
        counters[f"guard_failed:{why}"] += 1

    def load_guard_manager(guards_state: Any, target_code: Any, scope: Any) -> Any:
        if not installing_served.get():
            return original(guards_state, target_code, scope)
        if not _scope_is_the_codes_module(target_code, scope):
            counters["rejected:foreign_scope"] += 1
            raise RuntimeError("objcache: torch would guard this code in another module's globals")
        manager = original(guards_state, target_code, scope)
        with _lock:
            portable = _state_records.pop(id(guards_state), None)
        if portable is None or not portable_guards.has_one_settings_record(portable):
            raise RuntimeError("objcache: a served guarded code has no portable guards")
        backend = wrapping_backend.get()
        if backend is None:
            raise RuntimeError("objcache: a served guarded code installed by no known backend")
        # never empty here: the settings record is always one of them
        check = portable_guards.check_for(
            portable,
            scope,
            compile_settings.settings_digest,
            guard_failed,
            hooks_unguarded=_hook_guards_skipped(),
            compiler=backend_matcher(backend, _used_variants(target_code)),
        )
        parts = portable_guards.describe(portable)
        # last: after torch's own guards of this code (its shapes, dtypes, values), so that
        # the check holds only at a call that runs the code (docs/torch.md)
        try:
            manager.root.add_epilogue_lambda_guard(check, parts, None)
        except TypeError:  # torch releases whose lambda guards take no user stack
            manager.root.add_epilogue_lambda_guard(check, parts)
        counters["portable_guards"] += len(portable)
        return manager

    marked(load_guard_manager)
    return load_guard_manager


def _hook_guards_skipped() -> bool:
    """torch's ``skip_nnmodule_hook_guards`` (on by default): a normal compile then emits no
    guard on a module's empty hook dicts, so a hook added after it is not seen."""
    import torch._dynamo.config as dynamo_config

    return bool(getattr(dynamo_config, "skip_nnmodule_hook_guards", False))


def forget() -> None:
    """Drop the records between the two load steps (the part's uninstall)."""
    with _lock:
        _state_records.clear()


# --- the backend of the call ------------------------------------------------------------------
#
# Which compiler a call of a served code runs under (docs/torch.md, "What the entry was
# compiled with").
#
# torch runs a compiled code of a frame only for the backend that compiled it: its lookup
# compares each cache entry's backend with the current eval-frame callback's (its
# ``BACKEND_MATCH``). A served entry is installed on the code object as a *precompile* entry,
# which that lookup runs for any backend, so a second ``torch.compile`` of the same function
# with another backend or options would run the code served to the first. The served code's
# guard therefore also compares the backend of the call with the one the entry was served for
# (:func:`backend_matcher`), as torch compares them (the very object, or an equal one of its type).
#
# torch sets the eval-frame callback to None while it evaluates guards, so a guard cannot ask
# torch for it: objcache mirrors, per thread (torch keeps it per thread too), the callback
# Python sets (:func:`wrap_set_eval_frame`; every call of a ``torch.compile`` wrapper, and
# every region that disables Dynamo, sets it there). torch changes it on its own only to
# None or to run-only (``False``) and back, around its guards, its compiles and the frames
# it runs only: the mirror keeps the callback torch returns to, since a setting that changes
# nothing (None where it is None already: the hundreds of disabled regions one compile runs
# through) is not noted, and where a setting nested in such a window could leave it wrong it
# is left None, which fails the check (Dynamo then compiles the frame, as without the entry;
# run-only mode runs the frame as it is), never the other way round.

#: The callback Python last set on this thread, as :func:`wrap_set_eval_frame` notes it.
_state = threading.local()


def wrap_set_eval_frame(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """torch's ``set_eval_frame`` that also notes the callback for this thread."""

    def set_eval_frame(callback: Any) -> Any:
        prior = original(callback)
        if prior is callback and (callback is None or callback is False):
            return prior  # no change: inside one of torch's own windows, keep what it restores
        if callback is False and prior is not None:
            # run-only restored from a compiler's callback: perhaps into a window torch opened
            # itself (a frame it runs only), after which it restores a callback not seen here
            _state.callback = None
        else:
            _state.callback = callback
        return prior

    return marked(set_eval_frame, original)


def current_callback() -> Any:
    """The eval-frame callback Python last set on this thread (None where none was)."""
    return getattr(_state, "callback", None)


def _innermost(callback: Any) -> Any:
    """The backend under a callback's wrappers (torch's ``innermost_backend``)."""
    for _ in range(64):  # a chain of wrappers, never a cycle
        inner = getattr(callback, "_torchdynamo_orig_backend", None)
        if inner is None:
            break
        callback = inner
    return callback


def backend_of(context: Any) -> Any:
    """The backend of a ``torch.compile`` wrapper's context, or None (none known)."""
    callback = getattr(context, "callback", None)
    if callback is None or callback is False:
        return None
    return _innermost(callback)


#: id(code) -> how many of its served variants ran (a code lives as long as its function)
_used_by_code: dict[int, list[int]] = {}
#: Stances under which torch runs only code it already compiled (``torch.compiler.set_stance``).
_RUN_ONLY_STANCES = frozenset({"eager_on_recompile", "fail_on_recompile"})


def _used_variants(code: Any) -> list[int]:
    with _lock:
        return _used_by_code.setdefault(id(code), [0])


def _stance() -> str:
    held = getattr(sys.modules.get("torch._dynamo.eval_frame"), "_stance", None)
    return str(getattr(held, "stance", "default"))


def recompile_limit() -> int:
    config = sys.modules.get("torch._dynamo.config")
    limit: Any = getattr(config, "recompile_limit", None)
    if limit is None:
        limit = getattr(config, "cache_size_limit", 8)
    return int(limit)


def backend_matcher(backend: Any, used_of_code: list[int] | None = None) -> Callable[[], bool]:
    """Whether one served variant may run at the current call: its backend is the call's (the
    very object, or an equal one of its type, as torch's own match), and torch alone would
    have compiled it by now. In the default stance a variant runs as compiled code would, up
    to the recompile limit (``used_of_code``: the variants of its code that ran; one more
    than the limit allows is refused, and torch, at its limit, runs the frame eagerly as it
    would). Where torch runs only what it compiled before (``torch._dynamo.run``, the
    ``eager_on_recompile`` and ``fail_on_recompile`` stances) only a variant that already ran
    may; under ``eager_then_compile`` or ``force_eager`` none does (torch alone on a new
    machine ran those calls eagerly: the thirty-fourth review saw served code where it
    computed eagerly). The last callback that matched is held (its id is never reused) and
    matches again by identity: one thread-local read and a few comparisons per call."""
    matched: list[Any] = [None]
    ran = [False]
    used = used_of_code if used_of_code is not None else [0]

    def ran_now() -> bool:
        if not ran[0]:
            with _lock:
                if used[0] >= recompile_limit():
                    return False
                used[0] += 1
            ran[0] = True
        return True

    def matches() -> bool:
        stance = _stance()
        callback = getattr(_state, "callback", None)
        if callback is False or stance in _RUN_ONLY_STANCES:
            return ran[0]
        if stance != "default":
            return False
        if callback is matched[0] and callback is not None:
            return ran_now()
        if callback is None:
            return False  # not known: fail, Dynamo compiles the frame
        found = _innermost(callback)
        if found is backend or (type(found) is type(backend) and bool(found == backend)):
            matched[0] = callback
            return ran_now()
        return False

    return matches
