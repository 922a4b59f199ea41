"""The implementations of the ``torch.library`` ops a graph calls, in its FX and AOTAutograd
keys (docs/torch.md, "Custom ops in the keys").

torch keys an FX graph and a Dynamo graph by their code, which names a custom op
(``torch.ops.mylib.scale.default``) but not what it does: a ``CompositeImplicitAutograd``
kernel is decomposed while AOTAutograd traces, so two machines with another version of the
kernel library share one key and the second is served the first one's decomposition. Plain
torch does the same with two runs sharing one cache directory; objcache would carry it to
the fleet.

Here each key-details object torch builds (``FxGraphHashDetails`` and
``AOTAutogradCacheDetails``, pickled into the key) of a graph that calls an op outside
torch's own namespaces gets one more field: for each such op, the dispatcher's record of
its kernels (which dispatch keys, registered where), the digest of every Python source file
it names, and the code of the Python functions registered for it (``torch.library.impl``
after objcache installed, ``torch.library.custom_op``'s functions). Another implementation
is another key: a miss, not another result. A graph without such ops keeps the key torch
gives it, unless the program replaced a kernel of one of torch's own ops in Python
(``Library("aten", "IMPL").impl("linear", ...)``): AOTAutograd traces that kernel for graphs
whose ops never name it, so every graph of such a process is keyed by those overrides
(:func:`torch_overrides`, in ``precompile/op_overrides.py``: a precompile entry's settings
record carries them too).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import sysconfig
import threading
import types
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from objcache.integrations.patching import is_marked, marked
from objcache.integrations.torch.precompile import (
    compile_settings,
    inductor_namespace,
    program_registrations,
    traced_code,
)
from objcache.integrations.torch.precompile.op_overrides import (
    TORCH_NAMESPACES,
    op_identity,
    record_kernel,
    torch_overrides,
)
from objcache.integrations.torch.remote import graph_facts

counters: Counter[str] = Counter()

#: The field added to a key-details object.
FIELD = "_objcache_custom_ops"

_lock = threading.Lock()
_patched: list[tuple[Any, str, Any]] = []


def _graphs(gm: Any) -> Iterator[Any]:
    """The graph module and each of its subgraphs (a checkpoint's body, a
    ``nested_compile_region``'s), at any depth."""
    modules = [gm]
    seen: set[int] = set()
    while modules:
        module = modules.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        yield module
        graph = getattr(module, "graph", None)
        for node in getattr(graph, "nodes", ()):
            if getattr(node, "op", None) == "get_attr":
                sub = getattr(module, str(node.target), None)
                if getattr(sub, "graph", None) is not None:
                    modules.append(sub)


def _call_targets(gm: Any) -> Iterator[Any]:
    """What every ``call_function`` node of the graph and of its subgraphs calls."""
    for module in _graphs(gm):
        for node in getattr(getattr(module, "graph", None), "nodes", ()):
            if getattr(node, "op", None) == "call_function":
                yield node.target


def _ops_of(gm: Any) -> Iterator[str]:
    """``ns::name`` of every op outside torch's namespaces the graph (and its subgraphs)
    calls."""
    for target in _call_targets(gm):
        name = _qualified_name(target)
        if name is not None and name.split("::", 1)[0] not in TORCH_NAMESPACES:
            yield name


def _program_callables(gm: Any) -> dict[str, Any]:
    """``{"callable:<module>.<name>": target}`` for each of the program's functions and
    callable objects the graph or a subgraph calls (``allow_in_graph``'d into a
    checkpoint's body): AOTAutograd runs them while it traces, and torch's AOTAutograd key
    names them by their import path only (it refuses them at the top level, not in a
    subgraph), so what they compute and read is named here."""
    found: dict[str, Any] = {}
    for target in _call_targets(gm):
        if _qualified_name(target) is not None or not traced_code.is_programs_callable(target):
            continue
        owner = target if traced_code.is_programs_function(target) else type(target)
        name = f"{getattr(owner, '__module__', '?')}.{getattr(owner, '__qualname__', '?')}"
        found.setdefault(f"callable:{name}", target)
    return found


def _qualified_name(target: Any) -> str | None:
    """``ns::name`` of an ``OpOverload`` or ``OpOverloadPacket``, else None."""
    qualified = getattr(target, "_qualified_op_name", None)  # a packet
    if isinstance(qualified, str):
        return qualified
    schema = getattr(target, "_schema", None)
    name = getattr(schema, "name", None)
    return name if isinstance(name, str) and "::" in name else None


def graph_identity(gm: Any, example_inputs: Any = ()) -> tuple[tuple[str, str], ...]:
    """``((op, identity), ...)`` for the ops outside torch's namespaces ``gm`` calls, the
    program's functions its subgraphs call (:func:`_program_callables`), the
    tensor subclasses outside torch among its inputs, state and values (AOTAutograd runs
    their ``__torch_dispatch__`` while it traces), then every op of torch's own namespaces
    whose kernel the program replaced and the program's entries in Inductor's
    decomposition and lowering tables (:func:`torch_overrides`)."""
    ops = tuple((name, op_identity(name)) for name in sorted(set(_ops_of(gm))))
    ops += _traced_ops(gm)
    callables = _program_callables(gm)
    ops += tuple(
        (name, traced_code.value_identity(target, 0)) for name, target in sorted(callables.items())
    )
    subclasses = traced_code.tensor_subclasses(_values_of(gm, example_inputs))
    ops += tuple(
        (f"subclass:{cls.__module__}.{cls.__qualname__}", traced_code.class_identity(cls))
        for cls in sorted(subclasses, key=lambda c: f"{c.__module__}.{c.__qualname__}")
    )
    return ops + torch_overrides()


def graph_trace(gm: Any) -> tuple[tuple[str, str], ...]:
    """``(("traced:graph", digest),)`` where the program replaced anything of torch's
    (:func:`torch_overrides`): what its code computes for this graph here
    (:func:`_graph_trace_digest`); else nothing."""
    return (("traced:graph", _graph_trace_digest(gm)),) if torch_overrides() else ()


def _graph_trace_digest(gm: Any) -> str:
    """The digest of the whole graph traced as AOTAutograd traces it for Inductor (with
    Inductor's decompositions, and its backward where an input requires grad), at inputs
    like its example inputs: where the program replaced a kernel, a table entry or a
    function of torch's, what that code computes is known only by running it here (the
    forty-fifth review: a ``linear`` kernel, a ``gelu`` decomposition and a replaced
    ``torch.layer_norm`` that read the CPUs this process may use were served another
    machine's code). Its source and the values it reads, which the other items name, do
    not show what it gets from the machine. Raises where the trace cannot be made (the key
    is then unreadable: shared with no other process)."""
    import torch
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    mode, args, _ = _alike(types.SimpleNamespace(args=tuple(placeholders), kwargs={}))
    table = select_decomp_table()
    kind = "joint"
    with _random_state_kept(), torch._guards.tracing(None), mode:
        try:
            traced = make_fx(functools.partial(_joint, gm, True), table)(*args)
        except Exception:  # a graph without a backward to trace: its forward
            kind = "forward"
            traced = make_fx(functools.partial(_joint, gm, False), table)(*args)
    return _digest_of(traced, kind, "the graph")


#: The dispatch keys whose kernels AOTAutograd runs while it traces (their code decides the
#: graph it compiles, whatever they read).
_TRACED_KEYS = ("CompositeImplicitAutograd", "Autograd")


def _traced_ops(gm: Any) -> tuple[tuple[str, str], ...]:
    """``(("traced:ns::name", digest), ...)`` for each op outside torch's namespaces that
    ``gm`` (a Dynamo graph: its nodes hold their example values) calls and whose kernel
    AOTAutograd runs while it traces (a ``CompositeImplicitAutograd`` or ``Autograd``
    kernel): what that kernel traces to here, at each call's inputs. The kernel may be C++
    reading state no key names (its environment variable, a global a setter changed, a
    shared library it links at another version); tracing it is what a compile on this
    machine would put in the graph. Raises where the trace cannot be read (the key is then
    unreadable: shared with no other process)."""
    found: dict[str, set[str]] = {}
    traced: dict[tuple[str, str], str] = {}  # calls alike trace alike: each traced once
    for module in _graphs(gm):
        for node in getattr(getattr(module, "graph", None), "nodes", ()):
            if getattr(node, "op", None) != "call_function":
                continue
            name = _qualified_name(node.target)
            if name is None or name.split("::", 1)[0] in TORCH_NAMESPACES:
                continue
            if "example_value" not in node.meta or not _runs_while_tracing(node.target):
                continue
            call = (str(_overload(node.target)), _call_signature(node))
            if call not in traced:
                traced[call] = _trace_digest(node)
            found.setdefault(name, set()).add(traced[call])
    return tuple((f"traced:{name}", "|".join(sorted(found[name]))) for name in sorted(found))


def _call_signature(node: Any) -> str:
    """What a trace of ``node``'s call depends on besides the kernel (what :func:`_alike`
    makes its inputs from): each input's sizes, strides, dtype, device and whether it
    requires grad, and the other arguments' values."""
    import torch

    def one(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return (
                tuple(str(d) for d in value.shape),
                tuple(str(d) for d in value.stride()),
                str(value.dtype),
                str(value.device),
                value.requires_grad,
            )
        return repr(value)

    values = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["example_value"])
    return repr(torch.utils._pytree.tree_map(one, values))


def _runs_while_tracing(target: Any) -> bool:
    """Whether the op ``target`` (an overload, or a packet: its default) has a kernel
    AOTAutograd runs while it traces."""
    import torch

    op = _overload(target)
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), k) for k in _TRACED_KEYS)


def _overload(target: Any) -> Any:
    import torch

    return target if isinstance(target, torch._ops.OpOverload) else target.default


def _trace_digest(node: Any) -> str:
    """The digest of what the op ``node`` calls traces to, at inputs like its example
    inputs (with its backward where an input requires grad): the traced code (constants
    inline) and its tensor constants' bytes. Traced in a fake mode and shape environment of
    its own (:func:`_alike`): what the trace assumes of the sizes (a kernel's size test, a
    backward's fast path) never reaches the compile's own guards."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    op = _overload(node.target)  # a packet: the overload Dynamo's graph calls by it
    mode, args, kwargs = _alike(node)
    kind = "joint"
    with _random_state_kept(), torch._guards.tracing(None), mode:
        try:
            traced = make_fx(functools.partial(_joint, op, True))(*args, **kwargs)
        except Exception:  # no backward to trace (a custom op without one): the forward
            kind = "forward"
            traced = make_fx(functools.partial(_joint, op, False))(*args, **kwargs)
    return _digest_of(traced, kind, str(op))


def _digest_of(traced: Any, kind: str, what: str) -> str:
    """The digest of a ``make_fx`` trace: its code (constants inline), what each of its
    values is (sizes, strides, dtype: a kernel whose output's size is computed from the
    machine, a fake kernel padding to the core count, shows only there) and its tensor
    constants' bytes."""
    import hashlib

    import torch

    digest = hashlib.sha256(f"{kind}\0{traced.code}".encode())
    for node in traced.graph.nodes:
        value = node.meta.get("val")
        for leaf in torch.utils._pytree.tree_leaves(value):
            if isinstance(leaf, torch.Tensor):
                digest.update(f"{leaf.shape}|{leaf.stride()}|{leaf.dtype};".encode())
            elif isinstance(leaf, int | float | bool | torch.SymInt | torch.SymFloat):
                # numbers only: another object's text may hold its address (a key no
                # other process would share)
                digest.update(f"{type(leaf).__name__}:{leaf};".encode())
    for constant in traced.graph.find_nodes(op="get_attr"):
        value = getattr(traced, str(constant.target))
        value = getattr(value, "constant", None) if hasattr(value, "fake_mode") else value
        if not isinstance(value, torch.Tensor) or hasattr(value, "fake_mode"):
            raise ValueError(f"{what}: a constant whose bytes are not known")
        digest.update(value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:32]


@contextlib.contextmanager
def _random_state_kept() -> Iterator[None]:
    """Python's, numpy's and torch's CPU random states as they were: a kernel that draws
    while it traces (AOTAutograd runs it once, on a miss) draws nothing more for the key."""
    import random

    import torch

    python, cpu = random.getstate(), torch.get_rng_state()
    numpy = sys.modules.get("numpy")
    legacy = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        random.setstate(python)
        torch.set_rng_state(cpu)
        if numpy is not None:
            numpy.random.set_state(legacy)


def _alike(node: Any) -> tuple[Any, Any, Any]:
    """``(mode, args, kwargs)``: ``node``'s call's inputs made again in a fake mode with a
    shape environment of its own, each symbolic size (or int) a fresh symbol at the same
    hint, each tensor laid out as its example value (contiguous, channels-last, or its
    strides at their hints) with its dtype, device and grad."""
    import torch
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env = ShapeEnv(duck_shape=False)
    mode = FakeTensorMode(shape_env=env)
    made = [0]

    def size(value: Any) -> Any:
        if not isinstance(value, torch.SymInt):
            return value
        if not value.node.expr.free_symbols:
            return int(value)
        hint = _hint(value)  # a data-dependent size has none: nothing to trace at
        made[0] += 1
        source = ConstantSource(f"objcache_traced_{made[0]}")
        symbol = env.create_symbol(hint, source, dynamic_dim=DimDynamic.DYNAMIC)
        return env.create_symintnode(symbol, hint=hint, source=source)

    def one(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return size(value)
        if not isinstance(value, FakeTensor) or value.layout != torch.strided:
            raise ValueError(f"an input of layout {value.layout}, type {type(value).__name__}")
        sizes = [size(d) for d in value.shape]
        dtype, device = value.dtype, value.device
        with mode:
            if value.is_contiguous():
                fresh = torch.empty(sizes, dtype=dtype, device=device)
            elif value.dim() == 4 and value.is_contiguous(memory_format=torch.channels_last):
                layout = torch.channels_last
                fresh = torch.empty(sizes, dtype=dtype, device=device, memory_format=layout)
            else:
                strides = [_hint(d) for d in value.stride()]
                fresh = torch.empty_strided(sizes, strides, dtype=dtype, device=device)
        return fresh.requires_grad_(value.requires_grad)

    args, kwargs = torch.utils._pytree.tree_map(
        one, torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["example_value"])
    )
    return mode, args, kwargs


def _hint(value: Any) -> int:
    """A size's value at this call (its hint where symbolic)."""
    node = getattr(value, "node", None)
    hint = value if node is None else node.hint
    if not isinstance(hint, int):
        raise ValueError("a size without a hint (data-dependent)")
    return hint


def _joint(op: Any, grads: bool, *args: Any, **kwargs: Any) -> Any:
    """``op``'s outputs and, where an input requires grad (and ``grads``), their gradients:
    the forward and the backward AOTAutograd traces for the call (an ``Autograd`` kernel's
    own formula)."""
    import torch
    from torch.utils._pytree import tree_leaves

    out = op(*args, **kwargs)  # the inputs are :func:`_alike`'s leaves
    outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    ins = [
        i for i in tree_leaves((args, kwargs)) if isinstance(i, torch.Tensor) and i.requires_grad
    ]
    if not grads or not outs or not ins:
        return out
    ones = [torch.ones_like(o) for o in outs]
    return out, torch.autograd.grad(outs, ins, ones, allow_unused=True)


def _values_of(gm: Any, example_inputs: Any) -> list[Any]:
    """The example inputs, the module's parameters and buffers, the example values of the
    nodes of its graph and subgraphs (a subclass made inside a checkpoint's body)."""
    values: list[Any] = []
    if isinstance(example_inputs, (list, tuple)):
        values.extend(example_inputs)
    for attr in ("parameters", "buffers"):
        method = getattr(gm, attr, None)
        if callable(method):
            values.extend(method())
    for module in _graphs(gm):
        for node in getattr(getattr(module, "graph", None), "nodes", ()):
            meta = getattr(node, "meta", None)
            if isinstance(meta, dict) and "example_value" in meta:
                values.append(meta["example_value"])
            if getattr(node, "op", None) == "call_function" and isinstance(node.target, type):
                values.append(node.target)  # a class the graph calls: constructed inside
    return values


#: How deep the compilers AOTAutograd is given are followed to the program's functions:
#: ``SerializableAOTDispatchCompiler`` -> ``partial(fw_compiler_base)`` -> its closure ->
#: ``partial(inner_compile)`` -> a ``config.patch`` wrapper -> the backend's function.
_COMPILER_DEPTH = 8


def compilers_identity(aot_config: Any) -> tuple[tuple[str, str], ...]:
    """The program's functions among the compilers and decompositions AOTAutograd was
    given (a backend's ``compile_fx(gm, inputs, inner_compile=my_pass)``, its own
    ``decompositions``): they decide the code an AOTAutograd entry holds, and torch's key
    names none of them. Nothing for Inductor's own compilers and tables."""
    if aot_config is None or isinstance(aot_config, dict):
        return ()
    given = _compilers_given(aot_config)
    found: list[tuple[str, str]] = []
    for attr in _COMPILERS:
        fns = program_registrations.program_functions(given.get(attr), max_depth=_COMPILER_DEPTH)
        if fns:
            named = (",".join(traced_code.function_identity(fn)) for fn in fns)
            found.append((f"compiler:{attr}", "|".join(named)))
    decompositions = given.get("decompositions")
    if isinstance(decompositions, dict) and not program_registrations.is_torchs_table(
        decompositions
    ):
        for op, fn in list(decompositions.items()):
            fns = program_registrations.program_functions(fn)
            if fns:
                named = (",".join(traced_code.function_identity(f)) for f in fns)
                found.append((f"aot_decomposition:{op}", "|".join(named)))
    return tuple(found)


_COMPILERS = ("fw_compiler", "bw_compiler", "inference_compiler", "partition_fn")


def _compilers_given(aot_config: Any) -> dict[str, Any]:
    """The compilers and decompositions AOTAutograd was given for the graph being keyed:
    the ``AOTConfig``'s where it holds them (torch 2.13), else the locals of torch's
    ``aot_module_simplified`` frame that is computing the key (2.14 and later pass them
    beside the config)."""
    given = {attr: getattr(aot_config, attr, None) for attr in (*_COMPILERS, "decompositions")}
    frame: types.FrameType | None = sys._getframe(1)
    for _ in range(24):
        if frame is None:
            break
        code = frame.f_code
        if "fw_compiler" in code.co_varnames and traced_code.is_torchs_name(
            str(frame.f_globals.get("__name__", ""))
        ):
            local = frame.f_locals
            for attr in given:
                if given[attr] is None:
                    given[attr] = local.get(attr)
            break
        frame = frame.f_back
    return given


def register_external_matmuls() -> None:
    """Register the program's ``config.external_matmul`` kernels as Inductor's lowering does
    (``extern_kernels.<name>``, never raises). Inductor registers them only while it lowers
    a matmul, and code it compiled calls one there by name when it chose it: a process served
    that code from a cache never lowered, and the call raised ``AttributeError`` (a crash
    where a fresh compile runs; torch with one shared cache folder does the same). Done
    before a graph's key is read: the key names these functions by what they compute
    (``config:``), so the code served calls this process's same functions."""
    config = sys.modules.get("torch._inductor.config")
    kernels = list(getattr(config, "external_matmul", None) or ())
    if not kernels:
        return
    try:
        import importlib

        register = importlib.import_module("torch._inductor.kernel.mm").lazy_register_extern_choice
    except Exception:
        return
    for kernel in kernels:
        try:
            register(kernel)
        except Exception:
            counters["external_matmul_unregistered"] += 1


def _wrap_details_init(original: Callable[..., None]) -> Any:
    def __init__(self: Any, gm: Any, *args: Any, **kwargs: Any) -> None:
        original(self, gm, *args, **kwargs)
        if FIELD in self.__dict__:
            return
        register_external_matmuls()
        try:
            ops = graph_identity(gm, args[0] if args else kwargs.get("example_inputs", ()))
            ops += graph_trace(gm)
            ops += compilers_identity(args[1] if len(args) > 1 else kwargs.get("aot_config"))
            if ops:  # the program's code runs while this graph traces: torch's switches too
                ops += (("flags:torch", program_registrations.torch_flags()),)
            off = compile_settings.sdp_backends_off()
            switches = compile_settings.aten_switches_changed()
            gemm = compile_settings.cpu_gemm_geometry()
            facts = graph_facts.facts(gm, args[0] if args else kwargs.get("example_inputs"))
        except Exception as exc:  # never a key torch would share with another implementation
            ops = (("<unreadable>", f"{type(exc).__name__}:{os.urandom(8).hex()}"),)
            off = switches = facts = ()
            gemm = ""
            counters["unreadable"] += 1
        if any(not name.startswith(PROCESS_WIDE) for name, _ in ops):
            _not_a_precompile_entry()
        if off:
            ops += (("sdp_backends_off", ",".join(off)),)
        if switches:
            ops += (("aten_switches", ",".join(switches)),)
        if gemm:
            ops += (("cpu_gemm", gemm),)
        ops += facts
        ops += _fixed_threading(self) + _vector_isa_asked()
        if ops:
            self.__dict__[FIELD] = ops
            counters["keyed_graphs"] += 1

    marked(__init__, original)
    return __init__


def _fixed_threading(details: Any) -> tuple[tuple[str, str], ...]:
    """``(("cpp_threads", "fixed"),)`` where the graph's C++ kernels get a fixed OpenMP thread
    count: Inductor writes ``#pragma omp parallel`` where the thread count it generates for
    (which torch's key names, ``cpp_runtime_thread_count``) equals ``os.cpu_count()``, and
    ``num_threads(N)`` where it does not; the CPU count is in no key. A machine with
    hyperthreads (torch's threads: its cores) and one without (its vCPUs) shared keys, and a
    backward run at another thread count than compiled for summed in another order. Nothing
    where the region is dynamic, so those keys stay torch's."""
    threads = details.__dict__.get("cpp_runtime_thread_count")
    if threads is None or threads == os.cpu_count():
        return ()
    return (("cpp_threads", "fixed"),)


def _vector_isa_asked() -> tuple[tuple[str, str], ...]:
    """``(("aten_cpu_capability", value),)`` where the variable asks for another level than
    the environment's namespace names: Inductor picks the vector ISA of its C++ kernels from
    ``ATEN_CPU_CAPABILITY`` as it is at each compile, the namespace names ATen's level, fixed
    as torch started; a program that set it after ``import torch`` published AVX2 kernels
    among AVX-512 ones."""
    from objcache.config.fingerprint import vector_isa_asked_since

    asked = vector_isa_asked_since()
    return () if asked is None else (("aten_cpu_capability", asked),)


#: The items of :func:`graph_identity` that hold for the whole process, which a precompile
#: entry's compiler settings record carries (``precompile/compile_settings.py``).
PROCESS_WIDE = (
    "override:",
    "decomposition:",
    "lowering:",
    "pattern:",
    "tensor_method:",
    "py_impl:",
    "fake:",
    "dispatch_rule:",
    "config:",
    "flags:",
    "inductor:",
    "torch_function:",
    "torch_data:",
    "replaced:",
    "added:",
)


def _not_a_precompile_entry() -> None:
    """The frame being compiled calls the program's own ops or takes its tensor subclasses:
    a precompile entry would skip the keys that name them, so its package is not saved
    (``unsaved:traced_code``); its graphs are still cached under those keys."""
    try:
        from torch._guards import TracingContext

        context = TracingContext.try_get()
    except Exception:
        return
    if context is not None:  # read where the frame's guards are serialized
        context.__dict__.setdefault("_objcache_unsaveable", "traced_code")


def _wrap_library_impl(original: Callable[..., Any]) -> Any:
    def impl(self: Any, op_name: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, op_name, fn, *args, **kwargs)
        try:
            name = op_name if isinstance(op_name, str) else _qualified_name(op_name) or ""
            if "::" not in name:
                name = f"{self.ns}::{name}"
            name = name.split(".", 1)[0]
            code = getattr(fn, "__code__", None)
            # torch's own kernel by its code's file, never by ``__module__``: ``functools.wraps``
            # copies torch's onto a program's (``aten::layer_norm`` overridden with a wrapper)
            torchs = name.split("::", 1)[0] in TORCH_NAMESPACES and traced_code.is_torchs(fn)
            # torch's own kernels are in its release, unless the program asked torch's helper
            # for one (``torch.library.register_autocast("aten::exp", ...)``: the kernel is a
            # closure of torch's code)
            if code is not None and (not torchs or _asked_by_program()):
                record_kernel(name, fn)
        except Exception:
            counters["impl_unrecorded"] += 1
        return result

    marked(impl, original)
    return impl


def _asked_by_program() -> bool:
    """Whether the registration under way was asked for by code outside torch (the program,
    or a library) through one of torch's public registration helpers
    (``torch.library.register_autocast``), not made by torch itself: the nearest caller
    outside torch's and objcache's files is neither the import machinery (torch's modules
    register as they are imported) nor Python's own library, the outermost
    frame of torch's under it is a registration helper's (vmap's first call registers torch's
    decompositions from ``torch._functorch``: torch's), and no compile is under way (what
    Dynamo runs while it traces is torch's)."""
    if inductor_namespace.current_compile_id() is not None:
        return False
    home = program_registrations.torch_home()
    frame = sys._getframe(1)
    outermost = ""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(home):
            outermost = filename[len(home) :]
        elif not filename.startswith(inductor_namespace.OWN_FOLDER):
            return outermost.startswith(_REGISTRATION_HELPERS) and not (
                filename.startswith("<frozen importlib") or _pythons_own(filename)
            )
        frame = frame.f_back  # type: ignore[assignment]
    return False


#: torch's public registration helpers, as paths under torch's package folder.
_REGISTRATION_HELPERS = ("library.py", "_library" + os.sep)


def _pythons_own(filename: str) -> bool:
    """Whether ``filename`` is Python's own library (``contextlib``, ``threading``), never
    the program: under the standard library's folder, not under a packages folder in it."""
    paths = sysconfig.get_paths()
    packages = tuple(paths[k] + os.sep for k in ("purelib", "platlib") if k in paths)
    return filename.startswith(paths["stdlib"] + os.sep) and not filename.startswith(packages)


def _wrap_py_impl(original: Callable[..., Any]) -> Any:
    """``OperatorBase.py_impl(key)``: a Python kernel of the program's on an op object
    (``torch.ops.aten.sin.default.py_impl(DispatchKey.AutogradCPU)``), recorded as it is
    registered (``program_registrations.record_py_impl``)."""

    def py_impl(self: Any, k: Any) -> Any:
        decorate = original(self, k)

        def inner(fn: Any) -> Any:
            result = decorate(fn)
            try:
                if program_registrations.program_functions(fn):
                    program_registrations.record_py_impl(self, k, fn)
            except Exception:
                counters["py_impl_unrecorded"] += 1
            return result

        return inner

    marked(py_impl, original)
    return py_impl


def _wrap_library_fallback(original: Callable[..., Any]) -> Any:
    """``Library("_", "IMPL").fallback(fn, key)``: a Python kernel for every op at a dispatch
    key, which AOTAutograd runs for whichever op it traces; recorded like a ``py_impl``."""

    def fallback(self: Any, fn: Any, dispatch_key: Any = "", *args: Any, **kwargs: Any) -> Any:
        result = original(self, fn, dispatch_key, *args, **kwargs)
        try:
            if program_registrations.program_functions(fn):
                key = dispatch_key or getattr(self, "dispatch_key", "")
                program_registrations.record_py_impl(f"fallback:{self.ns}", key, fn)
        except Exception:
            counters["fallback_unrecorded"] += 1
        return result

    marked(fallback, original)
    return fallback


def _wrap_make_autograd_impl(original: Callable[..., Any]) -> Any:
    """``torch.library.register_autograd`` of an op a ``Library`` defined: torch registers a
    kernel of its own that calls the program's backward and setup-context functions, which
    are recorded as the op's kernels here."""

    def make_autograd_impl(op: Any, info: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(op, info, *args, **kwargs)
        try:
            name = _qualified_name(op) or ""
            for attr in ("_backward_fn", "_setup_context_fn"):
                fn = getattr(info, attr, None)
                if fn is not None and "::" in name:
                    record_kernel(name.split(".", 1)[0], fn)
        except Exception:
            counters["autograd_unrecorded"] += 1
        return result

    marked(make_autograd_impl, original)
    return make_autograd_impl


def _patch(obj: Any, attr: str, value: Any) -> None:
    _patched.append((obj, attr, obj.__dict__.get(attr)))
    setattr(obj, attr, value)


def apply(details_classes: list[Any], library_module: Any = None) -> None:
    """Add the field to each key-details class, and record ``Library.impl`` kernels.
    ``library_module``: ``torch.library`` itself where it is applied as that module has
    just run, inside ``import torch`` (``torch.library`` is not an attribute of ``torch``
    yet)."""
    import importlib

    module = library_module or importlib.import_module("torch.library")
    with _lock:
        for cls in details_classes:
            init = cls.__dict__.get("__init__")
            if init is not None and not is_marked(init):
                _patch(cls, "__init__", _wrap_details_init(init))
        library = module.Library
        impl = library.__dict__.get("impl")
        if impl is not None and not is_marked(impl):
            _patch(library, "impl", _wrap_library_impl(impl))
        fallback = library.__dict__.get("fallback")
        if fallback is not None and not is_marked(fallback):
            _patch(library, "fallback", _wrap_library_fallback(fallback))
        base = getattr(sys.modules.get("torch._ops"), "OperatorBase", None)
        py_impl = base.__dict__.get("py_impl") if isinstance(base, type) else None
        if base is not None and py_impl is not None and not is_marked(py_impl):
            _patch(base, "py_impl", _wrap_py_impl(py_impl))
        autograd = importlib.import_module("torch._library.autograd")
        make = autograd.__dict__.get("make_autograd_impl")
        if make is not None and not is_marked(make):
            _patch(autograd, "make_autograd_impl", _wrap_make_autograd_impl(make))


def uninstall() -> None:
    with _lock:
        for obj, attr, value in reversed(_patched):
            if value is None:
                continue
            setattr(obj, attr, value)
        _patched.clear()
