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

A frame can also turn strict after its inputs were read (``torch._dynamo.error_on_graph_break``
as a decorator of a helper it calls, or a ``with`` block inside it): its trace then fails
where a static one would not. So a frame whose trace fails with a graph-break error
(``Unsupported``) while it holds its loaded entry is traced again without it (torch's own
restart of a frame's analysis), once: what a machine without the profile does.

A frame whose trace, holding its loaded entry, made a float of a symbolic size (``n * 0.7``,
``n / 2``, ``math.sqrt(n)``: a ``ToFloat`` or an integer true division in a graph value, a
tensor's size or a guard) is traced again without it too, before its graph is compiled. Such
float arithmetic is not the program's: sympy folds a product's float constants first
(``n * 0.7 * 3`` becomes ``2.1 * n``, whose 2.0999999999999996 makes ``int(...)`` of it one
less at n=10), Inductor's kernels then compute that expression, and Dynamo's guard on it may
disagree with the hint it traced with (a crash). A static compile computes Python's floats.
The same for an integer of sizes past 64 bits at the call's sizes (``n**5`` at n=7000): a
kernel wraps it around, Python does not.

Whatever else fails in a frame's compile while it holds its loaded entry (an error Dynamo,
AOTAutograd or Inductor raises only for a dynamic trace, or Dynamo's own check of the guards
it built) is compiled once more without it, as a machine without the profile compiles it: the
error a static compile raises, if any, is the one the program sees.

And a Python scalar argument (an ``int``) a loaded profile marks dynamic starts static in
every frame: traced as a symbol, the program's integer arithmetic on it runs in the kernel
in 64 bits, where a static compile folds Python's exact integer (``x + n ** 5`` at n=7000
wraps around; a 64-bit hash of ``n`` raises ``OverflowError``). The process makes it dynamic
itself once it sees the argument change, as torch does on a fresh machine.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from objcache.integrations.patching import marked
from objcache.integrations.torch.remote.remote_cache_classes import counters

#: ``counters``: the torch hooks' own (``stats()["hooks"]``): ``strict_frames_started_static``,
#: loaded profile entries a strict frame did not take; ``failed_frames_restarted_static``,
#: frames traced again without theirs; ``loaded_scalars_started_static``, scalar inputs a
#: loaded profile marked dynamic, traced static first.
#: ``size_arithmetic_restarted_static``: frames traced again without theirs after their
#: trace made a float of a size, or an integer of sizes past 64 bits.
#: ``failed_compiles_retried_static``: frames whose compile failed while they held theirs,
#: compiled once more without it.
__all__ = [
    "counters",
    "wrap_compile",
    "wrap_compile_graph",
    "wrap_run",
    "wrap_update_automatic_dynamic",
]
#: The frames (torch's ``CodeId``) whose loaded entry was decided on, and the profile they
#: were decided in: ``torch._dynamo.reset()`` drops torch's profile, the next compile reads
#: it again, and each strict frame is decided again in the new one.
_decided: set[Any] = set()
#: A kernel's integers are 64-bit.
_INT64 = 1 << 63
_decided_in: list[Any] = [None]
#: The frames whose loaded entry was dropped (either way), in that same profile.
_dropped: set[Any] = set()
#: (CodeId, input name) whose loaded scalar entry was decided on, in that same profile.
_scalars_decided: set[tuple[Any, str]] = set()


def _strict(tx: Any) -> bool:
    return bool(getattr(tx, "one_graph", False) or getattr(tx, "error_on_graph_break", False))


def _frame(tx: Any) -> tuple[Any, Any, Any]:
    """``(torch's pgo module, the profile in force, tx's frame's CodeId)``; a new profile
    (after ``torch._dynamo.reset()``) forgets what was decided in the last."""
    return _code_frame(tx.f_code, tx.closure)


def _code_frame(code: Any, closure: Any) -> tuple[Any, Any, Any]:
    """:func:`_frame` of a code object and its closure."""
    pgo = sys.modules["torch._dynamo.pgo"]
    state = pgo.get_code_state()  # the first call reads the profile (local file or store)
    if state is not _decided_in[0]:
        _decided.clear()
        _dropped.clear()
        _scalars_decided.clear()
        _decided_in[0] = state
    return pgo, state, pgo.CodeId.make(code, closure)


def _drop(pgo: Any, state: Any, code_id: Any) -> bool:
    """Drop the frame's loaded entry (once); whether one was dropped now."""
    loaded = pgo._INIT_CODE_STATE  # what the first read found
    if code_id in _dropped or loaded is None or code_id not in loaded or code_id not in state:
        return False
    _dropped.add(code_id)
    state[code_id] = pgo.CodeState()
    return True


def _start_static(tx: Any) -> None:
    """Drop the profile entry loaded at start for ``tx``'s frame, the first time only."""
    pgo, state, code_id = _frame(tx)
    if code_id in _decided:
        return
    _decided.add(code_id)
    if _drop(pgo, state, code_id):
        counters["strict_frames_started_static"] += 1


def _scalar_starts_static(tx: Any, name: str) -> None:
    """A scalar input the loaded profile marks dynamic starts static (once per input)."""
    pgo, state, code_id = _frame(tx)
    if (code_id, name) in _scalars_decided:
        return
    _scalars_decided.add((code_id, name))
    loaded = pgo._INIT_CODE_STATE
    held = None if loaded is None or code_id not in loaded else loaded[code_id]
    was = None if held is None else held.automatic_dynamic.get(name)
    if was is None or was.scalar is not pgo.auto_dynamic:
        return
    frame = state.get(code_id)
    now = None if frame is None else frame.automatic_dynamic.get(name)
    if now is not None and now.scalar is pgo.auto_dynamic:
        now.scalar = pgo.auto_unset
        counters["loaded_scalars_started_static"] += 1


def _restart_static(tx: Any, error: BaseException) -> BaseException | None:
    """The restart to raise for a root frame whose trace failed with ``error`` while it held
    its loaded entry (now dropped), or None."""
    exc = sys.modules.get("torch._dynamo.exc")
    unsupported = getattr(exc, "Unsupported", None)
    restart = getattr(exc, "UnspecializeRestartAnalysis", None)  # clears the speculation log
    if unsupported is None or restart is None or not isinstance(error, unsupported):
        return None
    pgo, state, code_id = _frame(tx)
    if not _drop(pgo, state, code_id):
        return None
    counters["failed_frames_restarted_static"] += 1
    restarted: BaseException = restart(restart_reason="objcache: traced again without the profile")
    return restarted


def _size_arithmetic(output: Any) -> bool:
    """Whether a trace computed with symbolic sizes what a static compile computes in
    Python: a float of a size (a value of the graph or of a subgraph's body, a tensor size or
    a guard whose expression holds a ``ToFloat`` or an integer true division, or a symbolic
    float value), or an integer of sizes past 64 bits at this call's sizes (a kernel
    computes it in 64; Python exactly)."""
    import torch

    functions = sys.modules["torch.utils._sympy.functions"]
    kinds = (functions.ToFloat, functions.IntTrueDiv)

    def floaty(value: Any) -> bool:
        if isinstance(value, torch.SymFloat):
            return bool(value.node.expr.free_symbols)
        if isinstance(value, torch.SymInt):
            hint = value.node.hint
            if isinstance(hint, int) and not -_INT64 <= hint < _INT64:
                return True
            return bool(value.node.expr.has(*kinds))
        if isinstance(value, torch.SymBool):
            return bool(value.node.expr.has(*kinds))
        return False

    # the frame's graph and every body Dynamo installed beside it (a checkpoint's, a
    # ``nested_compile_region``'s, an ``autograd.Function``'s forward, nested ones too: each
    # is a GraphModule among the output's modules), whose sizes never reach the outer graph
    bodies = [m.graph for m in output.nn_modules.values() if isinstance(m, torch.fx.GraphModule)]
    nodes = [node for graph in (output.graph, *bodies) for node in graph.nodes]
    for node in nodes:
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            if any(floaty(d) for d in (*value.shape, *value.stride())):
                return True
        elif floaty(value):
            return True
    return any(guard.expr.has(*kinds) for guard in output.shape_env.guards)


def _restart_for_sizes(output: Any) -> BaseException | None:
    """The restart to raise for a root frame about to compile a graph whose size arithmetic
    (:func:`_size_arithmetic`) a static compile does in Python, while it held its loaded
    entry (now dropped), or None."""
    tx = output.root_tx
    env = output.shape_env
    values = env.backed_var_to_val if hasattr(env, "backed_var_to_val") else env.var_to_val
    if not values:  # nothing symbolic: the common case, at once
        return None
    pgo, state, code_id = _frame(tx)
    loaded = pgo._INIT_CODE_STATE
    if loaded is None or code_id not in loaded or code_id in _dropped:
        return None
    if not _size_arithmetic(output) or not _drop(pgo, state, code_id):
        return None
    counters["size_arithmetic_restarted_static"] += 1
    restart = sys.modules["torch._dynamo.exc"].UnspecializeRestartAnalysis
    restarted: BaseException = restart(restart_reason="objcache: arithmetic on a profiled size")
    return restarted


def _retry_static(code: Any, closure: Any) -> bool:
    """Whether a frame whose compile just failed held its loaded entry (now dropped)."""
    if "torch._dynamo.pgo" not in sys.modules:
        return False
    pgo, state, code_id = _code_frame(code, closure)
    return _drop(pgo, state, code_id)


def wrap_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch's ``convert_frame._compile`` (one frame's whole compile: trace, graph compile,
    guards): one that fails while the frame held its loaded profile entry compiles once more
    without it; what that compile raises, the program sees."""

    def _compile(
        code: Any, globals: Any, locals: Any, builtins: Any, closure: Any, *args: Any, **kwargs: Any
    ) -> Any:
        try:
            return original(code, globals, locals, builtins, closure, *args, **kwargs)
        except Exception:
            try:
                retry = _retry_static(code, closure)
            except Exception:  # torch's own profile as it stands: its error, unchanged
                counters["errors:pgo_strict"] += 1
                retry = False
            if not retry:
                raise
        counters["failed_compiles_retried_static"] += 1
        return original(code, globals, locals, builtins, closure, *args, **kwargs)

    return marked(_compile, original)


def wrap_compile_graph(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch's ``OutputGraph.compile_and_call_fx_graph`` (a traced graph about to be
    compiled): a trace whose size arithmetic a static compile does in Python, while its frame
    held its loaded profile entry, restarts the analysis without it."""

    def compile_and_call_fx_graph(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            restart = _restart_for_sizes(self)
        except Exception:  # torch's own graph as it stands: compiled, unchanged
            counters["errors:pgo_strict"] += 1
            restart = None
        if restart is not None:
            raise restart
        return original(self, *args, **kwargs)

    return marked(compile_and_call_fx_graph, original)


def wrap_run(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch's ``InstructionTranslator.run`` (a root frame's trace): a graph-break error
    while the frame held its loaded profile entry restarts the analysis without it."""

    def run(self: Any) -> Any:
        try:
            return original(self)
        except Exception as error:
            try:
                restart = _restart_static(self, error)
            except Exception:  # torch's own profile as it stands: its error, unchanged
                counters["errors:pgo_strict"] += 1
                restart = None
            if restart is not None:
                raise restart from error
            raise

    return marked(run, original)


def wrap_update_automatic_dynamic(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch's ``pgo.update_automatic_dynamic`` (each input's profile entry, as a frame is
    traced), with a strict frame's loaded entry dropped before torch reads it."""

    def update_automatic_dynamic(tx: Any, name: str, entry: Any, **kwargs: Any) -> Any:
        try:
            if _strict(tx):
                _start_static(tx)
            _scalar_starts_static(tx, name)
        except Exception:  # torch's own profile as it stands: never fail a compile
            counters["errors:pgo_strict"] += 1
        return original(tx, name, entry, **kwargs)

    return marked(update_automatic_dynamic, original)
