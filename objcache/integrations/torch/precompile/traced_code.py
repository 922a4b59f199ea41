"""The program's Python code a compile runs while it traces, which no graph shows and no key
of torch's names (docs/torch.md, "Custom ops in the keys").

AOTAutograd and Inductor run Python the program supplies while they turn a Dynamo graph into
code: a kernel registered for an op, a ``custom_op``'s backward, a tensor subclass's
``__torch_dispatch__``, an entry the program put in Inductor's decomposition or lowering
table. Their *results* are baked into the compiled code. Here each such function is named
by what decides what it does, as far as a digest can tell: its code, the content of the
source file it sits in (the helpers beside it), and the values it reads from its module's
globals and its closure (a setting read from the environment at import), following the
functions it reads one level further. A class is named by those of its methods and its
plain attributes. What is torch's own (its package's files) is in its release, which every
key holds already.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import threading
import types
from collections.abc import Iterable, Iterator
from typing import Any

from objcache.integrations.torch.precompile import portable_guards

#: Largest source file digested (a larger one is named by size and mtime).
MAX_SOURCE_BYTES = 8 << 20
#: How far the functions a function reads are followed.
MAX_DEPTH = 2
#: Longest rendering of one value read (a longer one is named by its digest).
MAX_VALUE_CHARS = 4096
#: Most items of a container read by a function that are named one by one.
MAX_ITEMS = 256
#: Largest tensor read by a function that is named by its content (larger: shape and dtype).
MAX_TENSOR_ELEMENTS = 4096

_PLAIN = (str, bytes, int, float, complex, bool, tuple, frozenset)

_lock = threading.Lock()
_sources: dict[tuple[str, int, int], str] = {}


def source_digest(path: str) -> str:
    """The content of a source file, by digest (not its path: another venv, another machine);
    remembered by size and mtime."""
    try:
        st = os.stat(path)
    except OSError:
        return "absent"
    key = (path, st.st_size, st.st_mtime_ns)
    with _lock:
        known = _sources.get(key)
    if known is not None:
        return known
    if st.st_size > MAX_SOURCE_BYTES:
        digest = f"size:{st.st_size}:mtime:{st.st_mtime_ns}"
    else:
        try:
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read(MAX_SOURCE_BYTES)).hexdigest()[:32]
        except OSError:
            digest = "unreadable"
    with _lock:
        _sources[key] = digest
    return digest


def is_torchs(value: Any) -> bool:
    """Whether a function, class or module comes from torch's own package (or Python
    itself)."""
    module = (
        value.__name__
        if isinstance(value, types.ModuleType)
        else getattr(value, "__module__", None)
    )
    if not isinstance(module, str):
        return False
    return module in ("builtins", "functools") or module == "torch" or module.startswith("torch.")


def _names_read(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names_read(const)


def function_identity(fn: Any, depth: int = 0) -> list[str]:
    """What decides what ``fn`` computes: its code, its source file, what it reads."""
    if isinstance(fn, functools.partial):
        return [
            "partial",
            *function_identity(fn.func, depth),
            *(value_identity(a, depth) for a in fn.args),
            *(f"{k}={value_identity(v, depth)}" for k, v in sorted(fn.keywords.items())),
        ]
    fn = getattr(fn, "__func__", fn)  # a bound method, a classmethod, a staticmethod
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return [f"callable:{type(fn).__module__}.{type(fn).__qualname__}"]
    parts = [portable_guards.code_digest(code), source_digest(code.co_filename)]
    if depth >= MAX_DEPTH:
        return parts
    scope = getattr(fn, "__globals__", None)
    names = sorted(set(_names_read(code)))
    if isinstance(scope, dict):
        for name in names:
            if name not in scope:
                continue
            value = scope[name]
            parts.append(f"{name}={value_identity(value, depth + 1)}")
            if isinstance(value, types.ModuleType) and not is_torchs(value):
                # a setting read through a config module (``cfg.SCALE``): the plain data
                # under the names the code reads
                for attr in names:
                    held = getattr(value, attr, None)
                    if held is None or isinstance(held, _PLAIN):
                        parts.append(f"{name}.{attr}={value_identity(held, MAX_DEPTH)}")
    for i, cell in enumerate(getattr(fn, "__closure__", None) or ()):
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        parts.append(f"cell{i}={value_identity(contents, depth + 1)}")
    return parts


def value_identity(value: Any, depth: int) -> str:
    """One value a traced function reads: by value where it is plain data, by identity where
    it is code, by name where it is a module or torch's own."""
    if value is None or isinstance(value, (str, bytes, int, float, complex, bool)):
        rendered = repr(value)
    elif isinstance(value, (tuple, list, frozenset, set, dict)) and len(value) > MAX_ITEMS:
        rendered = f"{type(value).__name__}:{len(value)} items"  # a registry, not a setting
    elif isinstance(value, (tuple, list, frozenset, set)) and depth <= MAX_DEPTH:
        items = [value_identity(v, depth + 1) for v in value]
        rendered = repr(sorted(items) if isinstance(value, (set, frozenset)) else items)
    elif isinstance(value, dict) and depth <= MAX_DEPTH:
        rendered = repr(sorted((repr(k), value_identity(v, depth + 1)) for k, v in value.items()))
    elif isinstance(value, types.ModuleType):
        rendered = f"module:{value.__name__}"
    elif isinstance(value, type):
        rendered = f"class:{value.__module__}.{value.__qualname__}"
        if not is_torchs(value) and depth <= MAX_DEPTH:
            rendered += ":" + class_identity(value, depth + 1)
    elif isinstance(value, functools.partial) or (callable(value) and not is_torchs(value)):
        # a partial's class is functools': it is named by what it calls and its arguments
        rendered = ",".join(function_identity(value, depth))
    else:
        rendered = _object_identity(value)
    if len(rendered) > MAX_VALUE_CHARS:
        return "sha256:" + hashlib.sha256(rendered.encode()).hexdigest()[:32]
    return rendered


def _object_identity(value: Any) -> str:
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        try:
            described = f"tensor:{value.dtype}:{tuple(value.shape)}"
            if value.numel() <= MAX_TENSOR_ELEMENTS and value.device.type == "cpu":
                data = value.detach().contiguous().numpy().tobytes()
                described += ":" + hashlib.sha256(data).hexdigest()[:32]
            return described
        except Exception:
            return kind
    if type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "device"):
        return str(value)
    return kind


def class_identity(cls: type, depth: int = 0) -> str:
    """A class outside torch by its methods and plain attributes, and those of each of its
    bases outside torch."""
    parts: list[str] = []
    for klass in cls.__mro__:
        if is_torchs(klass) or klass is object:
            continue
        parts.append(f"{klass.__module__}.{klass.__qualname__}")
        for name, attr in sorted(vars(klass).items()):
            if name in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__"):
                continue
            if isinstance(attr, property):
                attr = attr.fget
            if isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            if getattr(attr, "__code__", None) is not None:
                parts.append(name + ":" + ",".join(function_identity(attr, depth)))
            elif attr is None or isinstance(attr, (str, bytes, int, float, bool, tuple)):
                parts.append(f"{name}={value_identity(attr, MAX_DEPTH)}")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def tensor_subclasses(values: Iterable[Any]) -> set[type]:
    """The tensor subclasses outside torch among ``values`` (nested lists, tuples, dicts)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return set()
    found: set[type] = set()
    stack = list(values)
    seen = 0
    while stack and seen < 100_000:
        seen += 1
        value = stack.pop()
        if isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, torch.Tensor) and not is_torchs(type(value)):
            found.add(type(value))
        elif isinstance(value, type) and issubclass(value, torch.Tensor) and not is_torchs(value):
            found.add(value)
    return found


def _tables() -> list[tuple[str, dict[Any, Any]]]:
    tables: list[tuple[str, dict[Any, Any]]] = []
    for label, module, attr in (
        ("decomposition", "torch._inductor.decomposition", "decompositions"),
        ("decomposition", "torch._inductor.decomposition", "fast_random_decomps"),
        ("lowering", "torch._inductor.lowering", "lowerings"),
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


def tables_token() -> int:
    """What changes when an entry of Inductor's decomposition or lowering tables is put,
    replaced or removed (a sum of the entries' identities: ~0.15 ms)."""
    total = 0
    for _, table in _tables():
        total += len(table) + sum(map(id, list(table.values())))
    return total


def table_overrides() -> tuple[tuple[str, str], ...]:
    """``((f"{table}:{op}", identity), ...)`` for each entry of Inductor's decomposition or
    lowering tables whose function is the program's (not from torch's package): Inductor
    runs it on every graph that uses the op, and torch's keys do not name it."""
    found: dict[str, str] = {}
    for label, table in _tables():
        for op, fn in list(table.items()):
            inner = fn.func if isinstance(fn, functools.partial) else fn
            code_of = inner if hasattr(inner, "__code__") else type(inner)  # else a callable object
            if is_torchs(code_of):
                continue
            identity = ",".join(function_identity(fn))
            found[f"{label}:{op}"] = hashlib.sha256(identity.encode()).hexdigest()[:32]
    return tuple(sorted(found.items()))
