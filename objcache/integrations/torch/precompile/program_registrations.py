"""What the program registered with torch outside any graph that a compile runs (docs/torch.md,
"Custom ops in the keys"): its entries in Inductor's decomposition and lowering tables and in
its pattern-matcher passes, and the native extensions that can register C++ kernels.

Each is named the way :mod:`.traced_code` names the program's functions; torch's own entries
(its package's files, the functions it generates) are in its release, which every key holds
already.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from objcache.integrations.torch.precompile.traced_code import (
    MAX_DEPTH,
    UNIDENTIFIED,
    class_identity,
    file_digest,
    function_identity,
    is_programs_object,
    is_stdlib,
    is_torchs,
    is_torchs_name,
    value_identity,
)

#: A native library up to this size is digested whole; a larger one (a CUDA build's
#: hundreds of MB) by its size and each end, where its ELF build id sits.
NATIVE_WHOLE_BYTES = 64 << 20
NATIVE_READ_BYTES = 1 << 20

_lock = threading.Lock()


def tables() -> list[tuple[str, dict[Any, Any]]]:
    """Inductor's and AOTAutograd's decomposition and lowering tables, each with its label."""
    tables: list[tuple[str, dict[Any, Any]]] = []
    for label, module, attr in (
        ("decomposition", "torch._inductor.decomposition", "decompositions"),
        ("decomposition", "torch._inductor.decomposition", "fast_random_decomps"),
        ("lowering", "torch._inductor.lowering", "lowerings"),
        # applied by AOTAutograd to every graph it traces, before Inductor's own
        ("decomposition", "torch._functorch.aot_autograd", "aot_autograd_decompositions"),
    ):
        table = getattr(sys.modules.get(module), attr, None)
        if callable(table) and not isinstance(table, dict):
            # torch's cached copy of the table (what Inductor uses by default), read only once
            # made: making it here would freeze the table before the program's own entries
            try:
                table = table() if table.cache_info().currsize else None
            except Exception:
                table = None
        if isinstance(table, dict):
            tables.append((label, table))
    return tables


#: The namespaces of torch's own ops.
TORCH_NAMESPACES = frozenset({"aten", "prims", "prim", "higher_order"})

#: ``(label, function)`` for each Python kernel the program registered on an op with
#: ``py_impl`` (``torch.ops.aten.sin.default.py_impl(DispatchKey.AutogradCPU)``): torch
#: keeps them in each op object's ``py_kernels``, which no key names.
_py_impls: list[tuple[str, Any]] = []


def record_py_impl(op: Any, key: Any, fn: Any) -> None:
    """Note a ``py_impl`` kernel of the program's (``custom_ops`` wraps ``py_impl``)."""
    name = (
        op
        if isinstance(op, str)
        else getattr(op, "_name", None) or getattr(op, "__name__", None) or type(op).__name__
    )
    with _lock:
        _py_impls.append((f"py_impl:{name}:{key}", fn))


def _registry_entries() -> list[tuple[str, str, Any]]:
    """``(op, label, function)`` for the fake kernels and ``__torch_dispatch__`` rules in
    torch's registry of the "simple" ``torch.library`` APIs (``register_fake``,
    ``register_torch_dispatch``): AOTAutograd runs them while it traces. ``op`` is
    ``ns::name`` without its overload."""
    registry = getattr(sys.modules.get("torch._library.simple_registry"), "singleton", None)
    data = getattr(registry, "_data", None)
    found: list[tuple[str, str, Any]] = []
    if not isinstance(data, dict):
        return found
    for qualname, entry in list(data.items()):
        op = str(qualname).split(".", 1)[0]
        kernel = getattr(getattr(entry, "fake_impl", None), "kernel", None)
        if kernel is not None:
            found.append((op, f"fake:{qualname}", getattr(kernel, "func", kernel)))
        rules = getattr(getattr(entry, "torch_dispatch_rules", None), "_data", None)
        if isinstance(rules, dict):
            for cls, fn in list(rules.items()):
                owner = f"{getattr(cls, '__module__', '')}.{getattr(cls, '__qualname__', cls)}"
                found.append((op, f"dispatch_rule:{qualname}:{owner}", fn))
    return found


def registry_functions(name: str) -> list[tuple[str, Any]]:
    """The registry's fake kernels and rules of the op ``ns::name`` (any overload)."""
    return [(label, fn) for op, label, fn in _registry_entries() if op == name]


def is_torchs_table(table: Any) -> bool:
    """Whether ``table`` is one of the decomposition or lowering tables :func:`_tables` reads
    (what Inductor hands AOTAutograd; their program entries are named by
    :func:`table_overrides`)."""
    return any(table is known for _, known in tables())


#: Settings modules whose entries may hold the program's callables that run while a graph
#: compiles (Inductor's custom passes and partitioner, AOTAutograd's memory-budget
#: estimator and solver).
_CONFIG_MODULES = ("torch._inductor.config", "torch._functorch.config")
_CONFIG_WORDS = ("pass", "partition", "custom", "estimat", "solver", "hook")
_config_names: dict[str, tuple[str, ...]] = {}


def config_callables() -> tuple[tuple[str, str], ...]:
    """``((f"config:{module}.{name}", identity), ...)`` for the program's functions and
    objects set in torch's compiler settings (``config.post_grad_custom_post_pass =
    MyPass()``, ``config.external_matmul.append(fn)``): torch keys such a pass by the
    ``uuid()`` it returns, which says nothing of what it reads; here, by what it runs. Read
    at every key (a ``config.patch`` changes them): the settings named like a pass, those
    whose default is a container, and those the program set."""
    found: list[tuple[str, str]] = []
    for module_name in _CONFIG_MODULES:
        module = sys.modules.get(module_name)
        entries = getattr(module, "_config", None)
        if module is None or not isinstance(entries, dict):
            continue
        names = _config_names.get(module_name)
        if names is None:
            # by name, and each entry whose default is a container (one appended to in place,
            # ``config.external_matmul.append(fn)``, is not an override)
            names = tuple(
                k
                for k, entry in entries.items()
                if any(w in k.lower() for w in _CONFIG_WORDS)
                or isinstance(getattr(entry, "default", None), (list, dict, set))
            )
            _config_names[module_name] = names
        for name in dict.fromkeys((*names, *_overridden(entries))):
            try:
                value = getattr(module, name)
            except Exception:
                continue
            held = list(value) if isinstance(value, (list, tuple)) else [value]
            fns = [fn for item in held if callable(item) for fn in program_functions(item)]
            if fns:
                named = "|".join(",".join(identity(fn)) for fn in fns)
                found.append((f"config:{module_name}.{name}", named))
    found.extend(choices_identity())
    return tuple(found)


def _overridden(entries: dict[str, Any]) -> list[str]:
    """The settings the program set (``config.x = ...``, a ``config.patch``): only they can
    hold the program's objects, whatever their names (torch's defaults are torch's)."""
    unset = getattr(sys.modules.get("torch.utils._config_module"), "_UNSET_SENTINEL", None)
    found: list[str] = []
    for name, entry in entries.items():
        held = getattr(entry, "user_override", unset)
        get = getattr(held, "get", None)  # torch >= 2.13: a context variable
        with contextlib.suppress(Exception):
            if (get() if callable(get) else held) is not unset:
                found.append(name)
    return found


def choices_identity() -> list[tuple[str, str]]:
    """Inductor's heuristics object where the program gave its own: an ``InductorChoices``
    subclass set as ``config.inductor_choices_class``, registered
    (``register_inductor_choices``) or set for the thread (``V.set_choices_handler``).
    Inductor's scheduler asks it which nodes to fuse and how to tile; torch's key names a
    configured class by the ``uuid()`` it returns and a thread's handler not at all. Named by
    the class's code and what the object holds (``config:inductor_choices:<where>``)."""
    found: list[tuple[str, str]] = []
    virtualized = sys.modules.get("torch._inductor.virtualized")
    choices_module = sys.modules.get("torch._inductor.choices")
    config = sys.modules.get("torch._inductor.config")
    candidates: list[tuple[str, Any]] = []
    with contextlib.suppress(Exception):
        key = getattr(getattr(virtualized, "_choices", None), "_key", None)
        if isinstance(key, str):
            held = getattr(virtualized, "threadlocal", None)
            candidates.append(("thread", getattr(held, key, None)))
    with contextlib.suppress(Exception):
        candidates.append(("config", getattr(config, "inductor_choices_class", None)))
    with contextlib.suppress(Exception):
        registered = getattr(choices_module, "_registered_inductor_choices", None) or {}
        candidates.extend((f"registered:{k}", v) for k, v in sorted(registered.items()))
    for where, value in candidates:
        named = _choices_part(value)
        if named:
            found.append((f"config:inductor_choices:{where}", named))
    return found


def _choices_part(value: Any, depth: int = 0) -> str:
    """The program's part of a choices object, class or factory ("" for torch's own): a class
    by its code, a factory function by its identity, an object of the program's by its class
    and state, torch's object (a composed handler) by the program's objects it holds."""
    if isinstance(value, type):
        return "" if is_torchs(value) else class_identity(value)
    if isinstance(value, (types.FunctionType, types.MethodType, functools.partial)):
        return ",".join(",".join(identity(fn)) for fn in program_functions(value))
    if is_programs_object(value):
        return value_identity(value, 0)
    if depth >= 2 or not is_torchs(type(value)) or not hasattr(value, "__dict__"):
        return ""
    held = [
        item
        for attr in list(vars(value).values())
        for item in (attr if isinstance(attr, (list, tuple)) else [attr])
    ]
    return "|".join(part for part in (_choices_part(item, depth + 1) for item in held) if part)


_flag_reads: list[tuple[int, list[tuple[str, Any, str]]]] = []


def torch_flags() -> str:
    """torch's process-wide switches a kernel may branch on while it traces, which torch's
    keys do not all name (``torch.backends.mkldnn.enabled``, ``quantized.engine``,
    ``fp32_precision``, the attention fast path, print options), by value. Which
    switches exist is found again only when modules were imported (0.9 ms); reading them
    is a few dozen attribute reads."""
    loaded = len(sys.modules)
    with _lock:
        known = _flag_reads[0] if _flag_reads and _flag_reads[0][0] == loaded else None
    if known is None:
        reads: list[tuple[str, Any, str]] = []
        for name, module in sorted(list(sys.modules.items())):
            if module is None or not (
                name == "torch.backends" or name.startswith("torch.backends.")
            ):
                continue
            for attr, held in list(vars(type(module)).items()):  # ContextProp, property
                if not attr.startswith("_") and hasattr(held, "__get__") and not callable(held):
                    reads.append((f"{name}.{attr}", module, attr))
            for attr, held in list(vars(module).items()):
                if not attr.startswith("_") and type(held) in (bool, int, float, str):
                    reads.append((f"{name}.{attr}", module, attr))
        known = (loaded, reads)
        with _lock:
            _flag_reads[:] = [known]
    values: list[str] = []
    for label, module, attr in known[1]:
        try:
            held = getattr(module, attr)
        except Exception:
            continue
        if held is None or type(held) in (bool, int, float, str):
            values.append(f"{label}={held!r}")
    torch: Any = sys.modules.get("torch")
    extra: tuple[tuple[str, Callable[[], Any]], ...] = (
        ("matmul", lambda: vars(torch.backends.cuda.matmul)),
        ("mha_fastpath", lambda: torch.backends.mha.get_fastpath_enabled()),
        ("print_options", lambda: vars(torch._tensor_str.PRINT_OPTS)),
    )
    for label, read in extra:
        try:
            values.append(f"{label}={read()!r}")
        except Exception:
            values.append(f"{label}=?")
    return hashlib.sha256("\0".join(values).encode()).hexdigest()[:32]


def tables_token() -> int:
    """What changes when an entry of Inductor's decomposition or lowering tables, of its
    pattern-matcher passes or a method of ``torch.Tensor`` is put, replaced, removed or
    moved (a hash of the entries' identities and of the keys they are under, in order: an
    entry taken off one op and put on another by a delete and an add leaves every value in
    place, only a key says it moved; 0.3 ms measured after a compile). A table's keys are
    torch's op objects, which torch keeps for the process (their ids), a method's its name."""
    ids: list[int] = []
    for _, table in tables():
        ids.append(len(table))
        ids.extend(map(id, list(table)))
        ids.extend(map(id, list(table.values())))
    methods = _tensor_methods()
    ids.append(hash(tuple(methods)))
    ids.extend(map(id, list(methods.values())))
    ids.append(len(_py_impls))
    ids.extend(id(fn) for _, fn in list(_py_impls))
    for _, label, fn in _registry_entries():
        ids.append(hash(label))
        ids.append(id(fn))
    for _, matcher in _pattern_passes():
        for key, entries in list(matcher.patterns.items()):
            ids.extend(map(id, key) if isinstance(key, tuple) else (id(key),))
            ids.append(len(entries))
            ids.extend(map(id, list(entries)))
    return hash(tuple(ids))


#: (modules loaded, what held the passes then, the passes found)
_passes_memo: list[tuple[int, int, list[tuple[str, Any]]]] = []
#: The globals of Inductor's pass modules that held a pass at the last scan: (module dict, name)
_pass_holders: list[tuple[dict[str, Any], str]] = []


def _tensor_methods() -> dict[str, Any]:
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)
    return dict(vars(tensor)) if isinstance(tensor, type) else {}


def tensor_method_overrides() -> tuple[tuple[str, str], ...]:
    """``((f"tensor_method:{name}", identity), ...)`` for each method of ``torch.Tensor`` the
    program replaced with its own Python (``torch.Tensor.softmax = fn``): Dynamo's graph
    records the method's name only and AOTAutograd runs the program's function while it
    traces, so every graph of such a process is keyed by it."""
    return tuple(item for item in table_overrides() if item[0].startswith("tensor_method:"))


def _pattern_passes() -> list[tuple[str, Any]]:
    """Inductor's pattern-matcher passes (``joint_graph.patterns``, ``post_grad``'s
    ``pass_patterns``, ...): module globals of its ``fx_passes`` package, found again when a
    module was imported or when what holds them changed (the program's pass put in place of
    one of Inductor's: ``pass_patterns[0] = its_pass``, or the global re-bound)."""
    loaded = len(sys.modules)
    with _lock:
        if _passes_memo and _passes_memo[0][0] == loaded and _passes_memo[0][1] == _held_passes():
            return _passes_memo[0][2]
    matcher = getattr(
        sys.modules.get("torch._inductor.pattern_matcher"), "PatternMatcherPass", None
    )
    found: list[tuple[str, Any]] = []
    holders: list[tuple[dict[str, Any], str]] = []
    seen: set[int] = set()
    if isinstance(matcher, type):
        for name, module in list(sys.modules.items()):
            if not name.startswith("torch._inductor.fx_passes"):
                continue
            namespace = vars(module)
            for attr, value in list(namespace.items()):
                held = value if isinstance(value, (list, tuple)) else [value]
                for i, item in enumerate(held):
                    if isinstance(item, matcher):
                        if not holders or holders[-1][0] is not namespace or holders[-1][1] != attr:
                            holders.append((namespace, attr))
                        if id(item) not in seen:
                            seen.add(id(item))  # a pass also listed under another name
                            label = f"{name}.{attr}" + (f"[{i}]" if held is value else "")
                            found.append((label, item))
    with _lock:
        _pass_holders[:] = holders
        _passes_memo[:] = [(loaded, _held_passes(), found)]
    return found


def _held_passes() -> int:
    """The identities the globals that held Inductor's passes hold now (a list's items too)."""
    ids: list[int] = []
    for namespace, attr in _pass_holders:
        value = namespace.get(attr)
        ids.append(id(value))
        if isinstance(value, (list, tuple)):
            ids.extend(map(id, list(value)))
    return hash(tuple(ids))


#: id -> the entry, and id -> its program functions where it has any: a table's entries are
#: found again whenever Inductor registers a fallback while it compiles, and thousands of them
#: are torch's own. Two flat dicts, not a pair and a list an entry: every container kept
#: alive is one more object each of the program's full collections walks (docs/benchmarks.md,
#: "Where a full collection lands").
_entry_seen: dict[int, Any] = {}
_entry_found: dict[int, tuple[Any, ...]] = {}
_UNSEEN = object()


def entry_functions(value: Any) -> tuple[Any, ...]:
    """:func:`program_functions` of a table entry, remembered by the entry (held, so its id
    is never another's)."""
    key = id(value)
    if _entry_seen.get(key, _UNSEEN) is value:
        return _entry_found.get(key, ())
    found = tuple(program_functions(value))
    with _lock:
        if len(_entry_seen) > 65_536:
            _entry_seen.clear()
            _entry_found.clear()
        _entry_seen[key] = value
        if found:
            _entry_found[key] = found
        else:
            _entry_found.pop(key, None)
    return found


_op_types: list[tuple[Any, frozenset[type]]] = []


def _torch_op_types() -> frozenset[type]:
    """The exact classes of torch's op objects (``OpOverload``, its packet, the TorchBind
    overload), once ``torch._ops`` is imported."""
    ops = sys.modules.get("torch._ops")
    known = _op_types[0] if _op_types else None
    if known is None or known[0] is not ops:
        names = ("OpOverload", "OpOverloadPacket", "TorchBindOpOverload")
        found = (getattr(ops, name, None) for name in names)
        _op_types[:] = [known := (ops, frozenset(t for t in found if isinstance(t, type)))]
    return known[1]


def program_functions(value: Any, depth: int = 0, max_depth: int = MAX_DEPTH) -> list[Any]:
    """The program's functions ``value`` is or holds in its closure (``register_replacement``
    keeps the program's search and replacement functions in the closure of torch's own), in
    a partial's arguments, or in the attributes of torch's own callable object, followed
    ``max_depth`` levels."""
    kind = type(value)
    if kind is types.BuiltinFunctionType or kind in _torch_op_types():
        # a C function (never followed further: it holds no Python function), or one of
        # torch's op objects: the program's kernels of an op are named from the dispatcher
        # and the Python kernels recorded (``op_overrides``), never from the op's attributes
        return []
    if kind is types.FunctionType and value.__closure__ is None:
        # the common case, a function of its own (most of torch's table entries): its file
        # alone says whose it is
        made_by = value.__globals__.get("__name__")
        code = value.__code__
        if not code.co_filename.startswith("<") or not isinstance(made_by, str):
            return [] if in_torch(code.co_filename) else [value]
    inner = value.func if isinstance(value, functools.partial) else value
    owner = getattr(inner, "__self__", None)
    if isinstance(inner, types.MethodType) and is_torchs(type(owner)):
        return []  # a method of torch's own object (``ops.add`` of Inductor's ops handler)
    inner = getattr(inner, "__func__", inner)  # a bound method
    code = getattr(inner, "__code__", None)
    if isinstance(code, types.CodeType):
        scope = getattr(inner, "__globals__", None)
        made_by = scope.get("__name__") if isinstance(scope, dict) else None
        generated = code.co_filename.startswith("<") and isinstance(made_by, str)
        if not (in_torch(code.co_filename) or (generated and is_torchs_name(str(made_by)))):
            return [value]
    elif callable(inner) and not isinstance(inner, type) and not is_torchs(type(inner)):
        return [value]  # a callable object of the program's
    if depth >= max_depth:
        return []
    held: list[Any] = []
    if isinstance(value, functools.partial):
        # torch's function bound to the program's (``partial(fw_compiler_base,
        # inner_compile=...)``, what ``compile_fx`` builds around a backend's inner compile)
        held.extend((*value.args, *value.keywords.values()))
    for cell in getattr(inner, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # an empty cell
            held.append(cell.cell_contents)
    if not isinstance(inner, types.FunctionType) and callable(inner):
        # torch's callable object (AOTAutograd's ``SerializableAOTDispatchCompiler``): the
        # functions it holds
        held.extend(vars(inner).values() if hasattr(inner, "__dict__") else ())
    found: list[Any] = []
    for item in held:
        if callable(item) and not isinstance(item, type):
            found.extend(program_functions(item, depth + 1, max_depth))
        elif _holds_programs_code(item, _HELD_DEPTH):
            # a list of torch's config objects holding the program's functions and settings
            # (``register_custom_op_autotuning``'s ``CustomOpConfig``s): named by what it holds
            found.append(_state(item, _HELD_DEPTH))
    return found


#: A container or object in a closure is read up to this many items, this many levels deep
#: (a list of config objects, each holding a function and its parameters).
_HELD_ITEMS = 64
_HELD_DEPTH = 2
#: Values that hold no function of the program's.
_NEVER_HOLDERS = (str, bytes, int, float, complex, type, types.ModuleType, enum.Enum)


def _holds_programs_code(value: Any, depth: int) -> bool:
    """Whether a container, or an object of torch's, holds the program's functions (up to
    ``depth`` levels, :data:`_HELD_ITEMS` items each)."""
    if depth <= 0 or value is None or isinstance(value, _NEVER_HOLDERS):
        return False  # most closure cells: a flag, a number, a name, an enum member
    if isinstance(value, dict):
        items: list[Any] = list(value.values())
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    elif is_torchs(type(value)) and isinstance(getattr(value, "__dict__", None), dict):
        items = list(vars(value).values())
    else:
        return False
    if len(items) > _HELD_ITEMS:
        return False
    return any(
        bool(program_functions(item, MAX_DEPTH))
        if callable(item) and not isinstance(item, type)
        else _holds_programs_code(item, depth - 1)
        for item in items
    )


def _state(value: Any, depth: int) -> Any:
    """``value`` with each of torch's objects in it replaced by what it holds (torch's
    objects are otherwise named by their kind)."""
    if depth <= 0:
        return value
    if isinstance(value, dict):
        return {k: _state(v, depth - 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_state(v, depth - 1) for v in value]
    if is_torchs(type(value)) and isinstance(getattr(value, "__dict__", None), dict):
        return {"class": type(value).__qualname__, **_state(vars(value), depth - 1)}
    return value


def identity(value: Any) -> list[str]:
    """A found value's identity: a function by :func:`function_identity`, what a container
    or object holds by :func:`value_identity`."""
    if callable(value):
        return function_identity(value)
    return [value_identity(value, 0)]


def _target_name(target: Any) -> str:
    """An FX target by name (an op's ``aten.mul.Tensor``; a function's module and qualname;
    never a ``repr`` with an address)."""
    if isinstance(target, str):
        return target
    if type(target) in _torch_op_types():
        return str(target)  # its qualname names neither the overload nor the packet
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if isinstance(name, str):
        return f"{getattr(target, '__module__', '') or ''}.{name}"
    return str(target) if "0x" not in str(target) else type(target).__qualname__


#: (torch's module, the folder it was imported from): a process imports torch from one place.
_torch_home: list[tuple[Any, str]] = []


def torch_home() -> str:
    """The folder torch was imported from, with a trailing separator."""
    torch = sys.modules.get("torch")
    known = _torch_home[0] if _torch_home else None
    if known is None or known[0] is not torch:
        home = os.path.dirname(getattr(torch, "__file__", None) or "/nonexistent") + os.sep
        _torch_home[:] = [known := (torch, home)]
    return known[1]


def in_torch(filename: str) -> bool:
    return filename.startswith(torch_home())


def pattern_overrides() -> tuple[tuple[str, str], ...]:
    """``((f"pattern:{pass}:{op}", identity), ...)`` for the program's entries in Inductor's
    pattern-matcher passes (``register_replacement(search, replace, ...,
    joint_graph.patterns)``): Inductor rewrites every graph they match, which no key of
    torch's names."""
    return tuple(item for item in table_overrides() if item[0].startswith("pattern:"))


def table_overrides() -> tuple[tuple[str, str], ...]:
    """``((label, identity), ...)`` for the program's entries in Inductor's decomposition and
    lowering tables (``decomposition:<op>``, ``lowering:<op>``), in its pattern-matcher
    passes (``pattern:<pass>:<op>:<target>``) and the methods of ``torch.Tensor`` it replaced
    (``tensor_method:<name>``): Inductor or AOTAutograd run them on every graph that uses
    them, and torch's keys do not name them. Which entries are the program's is found again
    only when :func:`tables_token` changes; what each computes (the values its functions read)
    is named at every call."""
    return tuple(
        (
            label,
            hashlib.sha256("\0".join(",".join(identity(fn)) for fn in fns).encode()).hexdigest()[
                :32
            ],
        )
        for label, fns in _program_entries()
    )


_entries_memo: list[tuple[int, list[tuple[str, list[Any]]]]] = []


def _program_entries() -> list[tuple[str, list[Any]]]:
    now = tables_token()
    with _lock:
        if _entries_memo and _entries_memo[0][0] == now:
            return _entries_memo[0][1]
    found: dict[str, list[Any]] = {}
    for label, table in tables():
        for op, fn in list(table.items()):
            named = entry_functions(fn)  # as a pattern's: by file, scope and closure
            if named:
                found.setdefault(f"{label}:{op}", []).extend(named)
    for name, matcher in _pattern_passes():
        for (op, target), entries in list(matcher.patterns.items()):
            for entry in list(entries):
                fields = ("extra_check", "normalize_args", "handler")
                named = tuple(f for n in fields for f in entry_functions(getattr(entry, n, None)))
                if named:
                    label = f"pattern:{name}:{op}:{_target_name(target)}"
                    found.setdefault(label, []).extend(named)
    with _lock:
        py_impls = list(_py_impls)
    for label, fn in py_impls:
        fns = program_functions(fn)
        if fns:
            found.setdefault(label, []).extend(fns)
    for op, label, fn in _registry_entries():
        # an op of torch's own (``aten::sin``): its rules key every graph; the program's own
        # ops name theirs with the op (``op_overrides``)
        if op.split("::", 1)[0] in TORCH_NAMESPACES:
            fns = program_functions(fn)
            if fns:
                found.setdefault(label, []).extend(fns)
    for method, held in sorted(_tensor_methods().items()):
        if isinstance(held, property):
            held = held.fget
        if isinstance(held, (staticmethod, classmethod)):
            held = held.__func__
        fns = program_functions(held)
        if fns:
            found[f"tensor_method:{method}"] = fns
    entries_now = sorted(found.items())
    with _lock:
        _entries_memo[:] = [(now, entries_now)]
    return entries_now


_binaries: dict[tuple[str, int, int], str] = {}
_native_memo: dict[frozenset[str], str] = {}
#: (the module and library counts it was found at, the digest)
_native_last: list[tuple[tuple[int, int], str]] = []


def native_libraries() -> str:
    """The native extensions outside torch and Python the process imported or loaded (a
    kernel library registering C++ kernels: its meta, autograd and composite kernels run
    while AOTAutograd traces), each by a digest of its size and both ends of its file (the
    ELF build id sits in the first pages): another build of a kernel library is another
    value. Only what registers ops: Python extension modules and ``torch.ops.load_library``'s
    libraries, never the shared objects they pull in or the compiled kernels a compile loads
    from its cache (which a machine served from a store loads at other moments)."""
    torch = sys.modules.get("torch")
    moment = (len(sys.modules), len(getattr(getattr(torch, "ops", None), "loaded_libraries", ())))
    with _lock:
        last = _native_last[0] if _native_last else None
    if last is not None and last[0] == moment:
        return last[1]  # nothing imported or loaded since
    paths = _extension_binaries()
    with _lock:
        digest = _native_memo.get(paths)
    if digest is None:
        named = sorted(f"{os.path.basename(p)}:{_binary_digest(p)}" for p in paths)
        digest = hashlib.sha256("\0".join(named).encode()).hexdigest()[:32]
    with _lock:
        if len(_native_memo) > 64:
            _native_memo.clear()
        _native_memo[paths] = digest
        _native_last[:] = [(moment, digest)]
    return digest


def _extension_binaries() -> frozenset[str]:
    """The extension modules and loaded libraries that link against torch (only those can
    register kernels with its dispatcher; numpy's or a template engine's, imported by a
    compile at some moment, never)."""
    found: set[str] = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not path.endswith((".so", ".pyd", ".dylib")):
            continue
        if not (is_torchs(module) or is_stdlib(module)):
            found.add(os.path.realpath(path))
    torch = sys.modules.get("torch")
    loaded = getattr(getattr(torch, "ops", None), "loaded_libraries", None)
    if isinstance(loaded, (set, list, tuple)):
        found.update(os.path.realpath(p) for p in loaded if isinstance(p, str))
    skipped = tuple(d for d in _kernel_cache_dirs() if d != os.sep)
    return frozenset(p for p in found if not p.startswith(skipped) and _links_torch(p))


_links: dict[tuple[str, int, int], str] = {}


def _links_torch(path: str) -> bool:
    """Whether the shared object at ``path`` names one of torch's libraries among those it
    needs (its ELF dynamic section; a file that is no ELF object: yes, to be safe)."""
    return file_digest(path, _links, _needs_torch, "1") == "1"


def _needs_torch(f: Any, size: int) -> str:
    needed = elf_needed(f, size)
    if needed is None:
        return "1"
    return "1" if any(n.startswith(("libtorch", "libc10")) for n in needed) else "0"


def elf_needed(f: Any, size: int) -> list[str] | None:
    """The ``DT_NEEDED`` names of a 64-bit little-endian ELF shared object, or None when
    ``f`` holds something else (read: the headers and the dynamic section, not the file)."""
    import struct

    head = f.read(64)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    phoff, phentsize, phnum = (
        struct.unpack_from("<Q", head, 32)[0],
        *struct.unpack_from("<HH", head, 54),
    )
    if phentsize < 56 or phnum > 256 or phoff + phentsize * phnum > size:
        return None
    f.seek(phoff)
    table = f.read(phentsize * phnum)
    loads: list[tuple[int, int, int]] = []
    dynamic: tuple[int, int] | None = None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(
            "<IIQQQQ", table, i * phentsize
        )
        if p_type == 1:  # PT_LOAD
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (p_offset, min(p_filesz, 1 << 20))
    if dynamic is None:
        return []
    f.seek(dynamic[0])
    entries = f.read(dynamic[1])
    strtab, strsz, wanted = None, 0, []
    for tag, value in struct.iter_unpack("<qQ", entries[: len(entries) // 16 * 16]):
        if tag == 0:
            break
        if tag == 1:
            wanted.append(value)
        elif tag == 5:
            strtab = value
        elif tag == 10:
            strsz = value
    if strtab is None:
        return None
    offset = next((o + strtab - v for v, o, n in loads if v <= strtab < v + n), None)
    if offset is None or strsz <= 0 or strsz > 64 << 20:
        return None
    f.seek(offset)
    strings = f.read(strsz)
    return [strings[w : strings.find(b"\0", w)].decode("utf-8", "replace") for w in wanted]


def _kernel_cache_dirs() -> list[str]:
    """Where compiled kernels are loaded from (Inductor's and Triton's caches)."""
    dirs = [os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ.get("TRITON_CACHE_DIR")]
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    with contextlib.suppress(Exception):
        dirs.append(utils.cache_dir() if utils is not None else None)
    dirs.append(os.path.join(os.path.expanduser("~"), ".triton"))
    return [os.path.realpath(d) + os.sep for d in dirs if d]


def _binary_digest(path: str) -> str:
    def digest(f: Any, size: int) -> str:
        h = hashlib.sha256(str(size).encode())
        if size <= NATIVE_WHOLE_BYTES:  # most extensions: the whole file, once a process
            h.update(f.read(NATIVE_WHOLE_BYTES))
            return h.hexdigest()[:32]
        h.update(f.read(NATIVE_READ_BYTES))
        if size > NATIVE_READ_BYTES:
            f.seek(max(NATIVE_READ_BYTES, size - NATIVE_READ_BYTES))
            h.update(f.read(NATIVE_READ_BYTES))
        return h.hexdigest()[:32]

    return file_digest(path, _binaries, digest, UNIDENTIFIED)
