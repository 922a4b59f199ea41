"""The program's edits of torch's own data and of Inductor's tables, found against what
torch's modules held as they were imported (docs/torch.md, "Custom ops in the keys").

Torch's code reads plain data of its own modules while AOTAutograd traces
(``torch._prims_common._computation_dtype_map``: the dtype a normalization's decomposition
computes in), and a program can put into Inductor's lowering table a function torch's own
helper made (``make_fallback(aten.exp.default)`` stores ``fallback_handler``'s closure, whose
code is torch's). Neither holds code of the program's, so no reading of what the program put
there names them (:mod:`.inductor_namespace`, :mod:`.program_registrations`); they are found
as differences from the release: :func:`remember` copies torch's function namespaces and the
loaded tables as torch and Inductor's lowering module finish importing, and
:func:`remember_module` each of Inductor's modules as it is imported (parts of the install);
:func:`changes` names what differs at every key. A table the program had completed before
objcache could copy it (an explicit ``install()`` after ``torch.compile``) is compared with
the release's entries, read in a fresh interpreter (the last section).

Inductor's scalars (a module's or a class's ``int``, ``float``, ``str``... of any name) are
the program's only when they changed between compiles: each frame compile, lazy backward
compile, call of Inductor as a backend (``aot_compile`` makes one outside Dynamo's context)
and graph compile is a window (:func:`compile_started`, :func:`compile_ended`), and
what changes inside one is torch's own state (counters, flags set lazily), never keyed.

Entries replaced in or removed from a table count, and entries added to any table; to the
lowering table only outside every compile window: Inductor adds fallbacks there as it compiles
(for an op without a lowering), so what that table gains inside a window depends on what the
process compiled before, while a lowering the program registers between compiles (an op torch
falls back on) changes the code. No module of Inductor's imported after the lowering module
adds to it (2.13.0: every module of ``torch._inductor`` imported in turn). Measured on torch
2.13.0, 2.14.1 and 2.15.0: compiling forward, backward, dynamic shapes, einsum, FFT,
normalizations, float64, a convolution and an optimizer step changed none of the data read
here, and replaced or removed no table entry.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import json
import operator
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from objcache.integrations.patching import marked
from objcache.integrations.torch.precompile import (
    inductor_namespace,
    program_registrations,
    traced_code,
)
from objcache.integrations.torch.timing import compile_windows

#: How deep a module's container is copied and compared (a dict of tuples of dtypes).
MAX_DEPTH = 2
#: A container past this many items is not copied (torch's largest plain table holds ~100).
MAX_ITEMS = 4096

_lock = threading.Lock()
#: "module.name" -> (the module's globals, the name, a copy of the value as imported)
_data: dict[str, tuple[dict[str, Any], str, Any]] = {}
#: modules whose data is remembered
_modules: set[str] = set()
_DECOMPOSITION = "torch._inductor.decomposition"
#: Inductor modules whose data is remembered
_inductor_modules: set[str] = set()
#: id(table) -> (its label, the table, a copy as first seen)
_tables: dict[int, tuple[str, dict[Any, Any], dict[Any, Any]]] = {}

#: Inductor's and AOTAutograd's tables: (label, module, attribute, the module whose import
#: completes it: Inductor's decomposition module adds its random decompositions to the table
#: torch._decomp defines). Torch grows only the lowering table while it compiles (a fallback
#: for an op without a lowering, made on demand); an entry added to another is the program's.
TABLES = (
    ("decomposition", _DECOMPOSITION, "decompositions", _DECOMPOSITION),
    ("lowering", "torch._inductor.lowering", "lowerings", "torch._inductor.lowering"),
    (
        "decomposition",
        "torch._functorch.aot_autograd",
        "aot_autograd_decompositions",
        "torch._functorch.aot_autograd",
    ),
    (
        "random decomposition",
        "torch._decomp.decompositions_for_rng",
        "extra_random_decomps",
        _DECOMPOSITION,
    ),
)
#: Where Inductor's cached table comes from: ``{**decompositions, **extra_random_decomps}``,
#: made at the first compile (the program may have edited either before; compared with the
#: same merge of their copies).
_MERGED = ("decompositions", "extra_random_decomps")
_GROWN_BY_TORCH = frozenset({"lowering"})
#: The modules whose import completes a table (what a fresh interpreter imports to read the
#: release's tables).
COMPLETING_MODULES = tuple(dict.fromkeys(completed_by for *_, completed_by in TABLES))
#: Completing modules the program had imported before objcache could watch them (an explicit
#: ``install()`` after ``torch.compile``): a table they complete, first copied now, is
#: compared with the release's identities, read in a fresh interpreter (:func:`note_preloaded`).
_preloaded: set[str] = set()
#: id(table) -> "module.attribute" of each table whose first copy was taken as found
_as_found: dict[int, str] = {}
#: Inductor's modules the program had imported before objcache watched them: their data's
#: first copies are taken as found and compared with the release's renderings
_preloaded_modules: set[str] = set()
#: labels of the data copied as found (of :data:`_preloaded_modules`)
_data_as_found: set[str] = set()
#: id(entry) -> (the entry, held so its id stays its own, its identity)
_entry_identities: dict[int, tuple[Any, str]] = {}
#: how many modules were loaded when :func:`changes` last copied what was new
_loaded_at: list[int] = []
#: (the frame compile, the identities read then, the changes named then)
_memo: list[tuple[Any, int, tuple[tuple[str, str], ...]]] = []


class _Scalars:
    """Inductor's scalars of one namespace (a module's globals, a class's attributes, of any
    name: ``ALIGN_BYTES``, a pass's ``cpu_max_other_dimension_decomposition``), read in one
    C-level call."""

    __slots__ = ("_get", "imported", "labels", "namespace")

    def __init__(self, where: str, namespace: dict[str, Any], attrs: list[str]) -> None:
        self.namespace = namespace
        self.labels = tuple(f"{where}.{attr}" for attr in attrs)
        self._get = operator.itemgetter(*attrs)
        self.imported = self.values()

    def values(self) -> tuple[Any, ...]:
        try:
            found = self._get(self.namespace)
        except KeyError:  # one was deleted
            return tuple(
                self.namespace.get(label.rsplit(".", 1)[1], _MISSING) for label in self.labels
            )
        return found if len(self.labels) > 1 else (found,)


_scalars: list[_Scalars] = []
#: each group's values at the last edge of a compile window (or as imported)
_scalar_last: list[tuple[Any, ...]] = []
#: each group's values as the compile window under way began
_scalar_start: list[tuple[Any, ...]] = []
#: scalars changed outside every compile window (the program's), and inside one (torch's)
_set_outside: set[str] = set()
_set_inside: set[str] = set()
#: id(table) -> {op: entry} of what a table torch grows holds beyond its copy, as last seen at
#: a window's edge
_grown_seen: dict[int, dict[Any, Any]] = {}
#: id(table) -> the ops added to (or re-pointed in) it outside every compile window: the
#: program's
_grown_by_program: dict[int, set[Any]] = {}

_MISSING = object()
_SCALARS = (int, float, complex, str, bytes, bool, type(None))
_CONTAINERS = (dict, list, tuple, set, frozenset)


def remember(finished: str = "") -> None:
    """Copy the plain data of torch's loaded function namespaces and of Inductor's loaded
    modules, and the entries of the loaded tables, each the first time it is seen (never
    raises). ``finished``: a module whose body has just run (the import watcher calls before
    Python marks it imported)."""
    # a module torch did not finish, a table changing in another thread: copied next time
    with contextlib.suppress(Exception):
        _remember(finished)
    with contextlib.suppress(Exception):
        inductor_namespace.remember_release(finished)


def remember_module(module: Any) -> None:
    """Copy what one of Inductor's modules defines as its import ends (the zero-code path's
    import watcher: the program may edit it before any compile): its code
    (:func:`.inductor_namespace.remember_module`), its data and its table (never raises)."""
    with contextlib.suppress(Exception):
        inductor_namespace.remember_module(module)
    with contextlib.suppress(Exception):
        name = getattr(module, "__name__", "")
        if name.startswith(inductor_namespace.COMPILED_MODULES):
            return
        with _lock:
            _remember_inductor_data(name, module, _leaves())
            _remember_tables(name)


def _remember(finished: str) -> None:
    leaves = _leaves()
    with _lock:
        for name, namespace in _namespaces(finished):
            if name in _modules:
                continue
            _modules.add(name)
            for attr, value in list(namespace.items()):
                if attr.startswith("__"):
                    continue
                copied = _copy(value, leaves, 0)
                if copied is not _MISSING:
                    _data[f"{name}.{attr}"] = (namespace, attr, copied)
        package = inductor_namespace.PACKAGE
        for name, module in list(sys.modules.items()):
            if (
                name.startswith(package + ".")
                and not name.startswith(inductor_namespace.COMPILED_MODULES)
                and (name == finished or not inductor_namespace.initializing(module))
            ):
                _remember_inductor_data(name, module, leaves)  # mid-import: at its end
        _remember_tables(finished)


def _remember_inductor_data(name: str, module: Any, leaves: tuple[type, ...]) -> None:
    """Inductor's data that no compile changes: the containers its modules and classes hold
    that are not empty as imported (a set of dtypes the C++ code generator vectorizes).
    Measured: a compile changes Inductor's counters and flags (scalars) and fills caches
    that start empty, never one of these."""
    if name in _inductor_modules or module is None:
        return
    _inductor_modules.add(name)
    # a module the program imported before objcache watched it: its containers compared with
    # the release's renderings (one the program emptied before is not seen: as imported,
    # torch's empty containers are not read either, some of them fill as torch imports more)
    as_found = name in _preloaded_modules
    module_dict = getattr(module, "__dict__", None)
    if not isinstance(module_dict, dict):
        return
    spaces: list[tuple[str, Any]] = [(name, module_dict)]
    for value in list(module_dict.values()):
        if type(value) is type and value.__module__ == name:
            spaces.append((f"{name}.{value.__qualname__}", value.__dict__))
    for where, namespace in spaces:
        scalars = []
        for attr, value in list(namespace.items()):
            if type(value) in _SCALARS and not as_found and not attr.startswith("__"):
                scalars.append(attr)
            elif type(value) in _CONTAINERS and value and not attr.startswith("__"):
                copied = _copy(value, leaves, 0)
                if copied is not _MISSING:
                    _data[f"{where}.{attr}"] = (namespace, attr, copied)
                    if as_found:
                        _data_as_found.add(f"{where}.{attr}")
        if scalars:
            group = _Scalars(where, namespace, scalars)
            _scalars.append(group)
            _scalar_last.append(group.imported)


def _remember_tables(finished: str = "") -> None:
    """Copy each table once the module that completes it has finished importing."""
    for label, name, attr, completed_by in TABLES:
        completing = sys.modules.get(completed_by)
        if completed_by != finished and (
            completing is None or inductor_namespace.initializing(completing)
        ):
            continue
        table = getattr(sys.modules.get(name), attr, None)
        if isinstance(table, dict) and id(table) not in _tables:
            _tables[id(table)] = (label, table, dict(table))
            if completed_by in _preloaded:
                _as_found[id(table)] = f"{name}.{attr}"


def note_preloaded(names: list[str]) -> None:
    """``names``: the modules the program imported before objcache watched them (an explicit
    ``install()`` after ``torch.compile``). Tables they complete and data of Inductor's
    modules among them, copied from now on, are taken as found, and the release's are read
    in a fresh interpreter, starting now."""
    with _lock:
        _preloaded.update(n for n in names if n in COMPLETING_MODULES)
        _preloaded_modules.update(
            n
            for n in names
            if n.startswith(inductor_namespace.PACKAGE + ".")
            and not n.startswith(inductor_namespace.COMPILED_MODULES)
            and n not in _inductor_modules
        )
        late = bool(_preloaded_modules) or any(
            completed_by in _preloaded
            and id(getattr(sys.modules.get(name), attr, None)) not in _tables
            for _, name, attr, completed_by in TABLES
        )
        modules = sorted(_preloaded_modules)
    if late:
        _start_reading_release(modules)


def op_name(op: Any) -> str:
    """A table's key as every process names it: an op overload by its name, anything else
    (a builtin torch function, whose text carries its address) by its identity."""
    text = str(op)
    return text if " at 0x" not in text else traced_code.value_identity(op, 0)


def _entry_identity(entry: Any) -> str:
    """:func:`_identity` of a table entry (of one of torch's functions: computed once)."""
    held = _entry_identities.get(id(entry))
    if held is not None and held[0] is entry:
        return held[1]
    identity = _identity(entry)
    if identity.startswith("torch:"):  # torch's own function: what the program's reads may change
        _entry_identities[id(entry)] = (entry, identity)
    return identity


def release_identities(modules: list[str]) -> dict[str, dict[str, str]]:
    """What the fresh interpreter prints for a process that copied tables or data as found:
    ``{"table:<module>.<attribute>": {op name: entry identity}}`` for every loaded table,
    and ``{"data": {label: identity}}`` for the containers of Inductor's ``modules``
    (imported by the caller), as they are now."""
    found: dict[str, dict[str, str]] = {}
    for _, name, attr, _ in TABLES:
        table = getattr(sys.modules.get(name), attr, None)
        if isinstance(table, dict):
            found[f"table:{name}.{attr}"] = {
                op_name(op): _identity(e) for op, e in list(table.items())
            }
    with _lock:
        _preloaded_modules.update(modules)  # the same containers as the asking process's
        for name in modules:
            _remember_inductor_data(name, sys.modules.get(name), _leaves())
        data = [(label, then) for label, (_, _, then) in _data.items() if label in _data_as_found]
    found["data"] = {label: _identity(then) for label, then in data}
    return found


def _namespaces(finished: str) -> list[tuple[str, dict[str, Any]]]:
    """The globals of each of torch's function namespaces that finished importing."""
    return [
        (name, vars(module))
        for name, module in inductor_namespace.loaded_function_namespaces()
        if name == finished or not inductor_namespace.initializing(module)
    ]


def _leaves() -> tuple[type, ...]:
    """The kinds of value copied as they are: Python's scalars, torch's dtypes, devices,
    layouts and memory formats, enum members and classes (compared by identity)."""
    torch = sys.modules.get("torch")
    kinds = [getattr(torch, name, None) for name in ("dtype", "device", "layout", "memory_format")]
    return (*_SCALARS, *(k for k in kinds if isinstance(k, type)), type, enum.Enum)


def _copy(value: Any, leaves: tuple[type, ...], depth: int) -> Any:
    """A copy of plain data (a leaf, or a container of them to :data:`MAX_DEPTH`), else
    ``_MISSING``: a function, a module, a registry of objects is not data read here."""
    kind = type(value)
    if kind in _CONTAINERS:
        if depth >= MAX_DEPTH or len(value) > MAX_ITEMS:
            return _MISSING
        if kind is dict:
            items = {}
            for key, item in list(value.items()):
                if not isinstance(key, leaves):
                    return _MISSING
                copied = _copy(item, leaves, depth + 1)
                if copied is _MISSING:
                    return _MISSING
                items[key] = copied
            return items
        copies = [_copy(item, leaves, depth + 1) for item in list(value)]
        if any(item is _MISSING for item in copies):
            return _MISSING
        return kind(copies)
    if isinstance(value, leaves):
        return value
    return _MISSING


def _same(now: Any, then: Any) -> bool:
    """Whether a value equals its copy, item by item (an identical NaN is the same)."""
    if now is then:
        return True
    if type(now) is not type(then):
        return False
    if type(now) is dict:
        return list(now) == list(then) and all(_same(now[k], then[k]) for k in then)
    if type(now) in (list, tuple):
        return len(now) == len(then) and all(map(_same, now, then))
    try:
        return bool(now == then)
    except Exception:
        return False


def _read_token() -> int:
    """The identities of everything :func:`changes` compares, in one C-level hash."""
    ids: list[int] = [len(_data), len(_scalars)]
    for namespace, attr, _ in _data.values():
        _ids(namespace.get(attr, _MISSING), ids, 0)
    for group in _scalars:
        ids.extend(map(id, group.values()))
    for _, table in program_registrations.tables():  # Inductor's cached merge among them
        ids.append(len(table))
        ids.extend(map(id, list(table.values())))
        ids.extend(map(id, list(table)))
    for _, table, _ in _tables.values():
        ids.append(len(table))
        ids.extend(map(id, list(table.values())))
        ids.extend(map(id, list(table)))
    return hash(tuple(ids))


def token() -> int:
    """What changes when :func:`changes` may: the identities it compares (about 0.3 ms)."""
    with _lock:
        return _read_token()


def _ids(value: Any, ids: list[int], depth: int) -> None:
    """``value``'s identity and, for a container, its items' (to :data:`MAX_DEPTH`), read
    in C where the items are leaves."""
    ids.append(id(value))
    if type(value) not in _CONTAINERS:
        return
    items = list(value.values() if type(value) is dict else value)
    ids.append(len(items))
    ids.extend(map(id, items))
    if type(value) is dict:
        ids.extend(map(id, value))  # a key moved to another value
    if depth + 1 < MAX_DEPTH:
        for item in items:
            if type(item) in _CONTAINERS:
                _ids(item, ids, depth + 1)


def changes() -> tuple[tuple[str, str], ...]:
    """``((label, identity), ...)`` for each value of torch's data that differs from the
    release's (``torch_data:<module>.<name>``) and each entry of Inductor's tables the
    program replaced, removed (``replaced:<table>:<op>``) or added where torch adds none
    (``added:<table>:<op>``): empty where nothing was."""
    compile_id = compile_windows.reading_id()
    with _lock:
        if compile_id is not None and _memo and _memo[0][0] == compile_id:
            return _memo[0][2]  # one compile window's keys share one reading
    if _loaded_at[:1] != [len(sys.modules)]:
        # data and tables of a module imported since (torch's random decompositions, on first
        # use); namespaces' code only where imported or installed (never a copy made mid-edit)
        with contextlib.suppress(Exception):
            _remember("")
        _loaded_at[:] = [len(sys.modules)]
    with _lock:
        if not compile_windows.open_now():
            _note_changes_outside()  # a served entry's check: no compile under way
        token = _read_token()
        if _memo and _memo[0][1] == token:
            _memo[:] = [(compile_id, token, _memo[0][2])]
            return _memo[0][2]
        data = list(_data.items())
        tables = list(_tables.values())
        grown = {key: set(ops) for key, ops in _grown_by_program.items()}
        program_s = _set_outside - _set_inside
        scalars = [
            (label, now, then)
            for group in _scalars
            for label, now, then in zip(group.labels, group.values(), group.imported, strict=True)
            if label in program_s
        ]
    found: list[tuple[str, str]] = []
    for label, now, then in scalars:
        if not _same(now, then):
            found.append((f"torch_data:{label}", "removed" if now is _MISSING else _identity(now)))
    for label, (namespace, attr, then) in data:
        now = namespace.get(attr, _MISSING)
        if label in _data_as_found:
            found.extend(_data_from_release(label, now, then))
        elif not _same(now, then):
            found.append((f"torch_data:{label}", "removed" if now is _MISSING else _identity(now)))
    for label, table, then in tables:
        where = _as_found.get(id(table))
        if where is None:
            found.extend(_table_changes(label, table, then))
        else:
            found.extend(_changes_from_release(label, table, then, where))
        found.extend(  # added between compiles where torch grows the table as it compiles
            (f"added:{label}:{op}", _identity(table[op]))
            for op in grown.get(id(table), ())
            if op in table and op not in then
        )
    merged = _merged_release(tables)
    for label, table in program_registrations.tables():
        if merged is not None and all(table is not known for _, known, _ in tables):
            found.extend(_table_changes(label, table, merged))  # Inductor's cached merge
    result = tuple(sorted(found))
    with _lock:
        _memo[:] = [(compile_id, token, result)]
    return result


def _table_changes(
    label: str, table: dict[Any, Any], then: dict[Any, Any]
) -> list[tuple[str, str]]:
    """An entry replaced or removed against the copy, or added where torch adds none."""
    found: list[tuple[str, str]] = []
    ops, entries = list(table), list(table.values())
    size = len(then)
    if ops[:size] == list(then) and list(map(id, entries[:size])) == list(map(id, then.values())):
        added = ops[size:]  # the common case, compared in C: entries appended, none moved
    else:
        for op, entry in list(then.items()):
            now = table.get(op, _MISSING)
            if now is not entry:
                named = "removed" if now is _MISSING else _identity(now)
                found.append((f"replaced:{label}:{op}", named))
        added = [op for op in ops if op not in then]
    if label not in _GROWN_BY_TORCH:
        found.extend((f"added:{label}:{op}", _identity(table[op])) for op in added)
    return found


def _data_from_release(label: str, now: Any, then: Any) -> list[tuple[str, str]]:
    """Data of Inductor's copied as found, against the release's rendering: named where it
    differs, as :func:`changes` names it for a process that copied the release; where the
    release could not be read, by its rendering as found."""
    release = _release_identities_read()
    known = None if release is None else release.get("data", {}).get(label)
    if known is None:
        return [(f"as_found:torch_data:{label}", _identity(then))]
    if now is _MISSING:
        return [(f"torch_data:{label}", "removed")]
    identity = _identity(now)
    return [] if identity == known else [(f"torch_data:{label}", identity)]


def _changes_from_release(
    label: str, table: dict[Any, Any], then: dict[Any, Any], where: str
) -> list[tuple[str, str]]:
    """A table copied as found, against the release's identities: what :func:`_table_changes`
    names for a process that copied the release. Where the release could not be read, the
    copy as found is named by its digest (a key no process with another copy shares)."""
    release = _release_identities_read()
    known = None if release is None else release.get(f"table:{where}")
    if known is None:
        digest = hashlib.blake2b(digest_size=16)
        for name, identity in sorted((op_name(op), _entry_identity(e)) for op, e in then.items()):
            digest.update(f"{name}\0{identity}\0".encode())
        return [(f"as_found:{label}:{where}", digest.hexdigest())]
    found: list[tuple[str, str]] = []
    now = {op_name(op): (op, entry) for op, entry in list(table.items())}
    for name, identity in known.items():
        _, entry = now.get(name, (None, _MISSING))
        if entry is _MISSING:
            found.append((f"replaced:{label}:{name}", "removed"))
        elif _entry_identity(entry) != identity:
            found.append((f"replaced:{label}:{name}", _entry_identity(entry)))
    found.extend(
        (f"added:{label}:{name}", _entry_identity(entry))
        for name, (op, entry) in now.items()
        if name not in known and (label not in _GROWN_BY_TORCH or not _torch_s_fallback(op, entry))
    )
    return found


def _torch_s_fallback(op: Any, entry: Any) -> bool:
    """Whether a lowering-table entry is the fallback Inductor itself makes for ``op`` while
    compiling (``make_fallback(op)``: ``register_lowering``'s wrapper of
    ``fallback_handler``'s handler calling ``op`` itself): what a copy taken after compiles
    holds beyond the release without the program's doing. Anything else there (one of torch's
    lowerings put at an op torch falls back on, a shape this release does not make) is
    named: a needless miss at worst."""
    handler: Any = getattr(entry, "__wrapped__", None)
    outer, inner = getattr(entry, "__code__", None), getattr(handler, "__code__", None)
    if outer is None or inner is None:
        return False
    if not all(program_registrations.in_torch(c.co_filename) for c in (outer, inner)):
        return False
    if (outer.co_qualname, inner.co_qualname) != (
        "_register_lowering.<locals>.wrapped",
        "fallback_handler.<locals>.handler",
    ):
        return False
    try:
        cells = dict(
            zip(outer.co_freevars, (c.cell_contents for c in entry.__closure__), strict=True)
        )
        kernel = dict(
            zip(inner.co_freevars, (c.cell_contents for c in handler.__closure__), strict=True)
        )
    except (TypeError, ValueError):  # no closure, an empty cell
        return False
    return cells.get("decomp_fn") is handler and (
        kernel.get("kernel") is op or kernel.get("kernel") is getattr(op, "overloadpacket", op)
    )


def _merged_release(
    tables: list[tuple[str, dict[Any, Any], dict[Any, Any]]],
) -> dict[Any, Any] | None:
    """What Inductor's cached table holds where neither table it merges was edited."""
    parts: dict[str, dict[Any, Any]] = {}
    for _, module, attr, _ in TABLES:
        table = getattr(sys.modules.get(module), attr, None)
        for _, known, copy in tables:
            if known is table and attr in _MERGED:
                parts[attr] = copy
    if len(parts) != len(_MERGED):
        return None
    return {**parts["decompositions"], **parts["extra_random_decomps"]}


def _identity(value: Any) -> str:
    """What a changed value is: plain data by value, torch's function (``fallback_handler``'s
    closure) by its name and what it closes over, the program's by what it computes."""
    code = getattr(value, "__code__", None)
    if code is not None and program_registrations.in_torch(code.co_filename):
        cells = getattr(value, "__closure__", None) or ()
        held = []
        for cell in cells:
            try:
                held.append(traced_code.value_identity(cell.cell_contents, 1))
            except ValueError:  # an empty cell
                held.append("empty")
        return f"torch:{getattr(code, 'co_qualname', code.co_name)}:{held}"
    if _holds_release_classes(value):
        return _release_rendering(value)
    return traced_code.value_identity(value, 0)


def _release_class(value: Any) -> bool:
    """A class of torch's or of a package its release depends on (sympy's relations)."""
    top = str(getattr(value, "__module__", "")).split(".", 1)[0]
    return isinstance(value, type) and (
        top == "torch" or top in inductor_namespace.TORCH_DEPENDENCIES
    )


def _holds_release_classes(value: Any, depth: int = 0) -> bool:
    if _release_class(value):
        return True
    if type(value) not in _CONTAINERS or depth >= MAX_DEPTH:
        return False
    items = list(value.items()) if type(value) is dict else [(v, None) for v in value]
    return any(
        _holds_release_classes(k, depth + 1) or _holds_release_classes(v, depth + 1)
        for k, v in items
    )


def _release_rendering(value: Any, depth: int = 0) -> str:
    """Copied data holding classes of torch's or its dependencies', those classes by name: a
    dependency's class read as the program's is named by code that reads process-local state
    (sympy's caches, in hash order), so a rendering by identity differs between two fresh
    processes, and a process that copied Inductor's data as found never matched the release's
    rendering (2.15.0's ``sizevars._RANGE_BOUND_OPS``, a tuple of sympy's relations)."""
    if _release_class(value):
        return f"class:{value.__module__}.{value.__qualname__}"
    if type(value) in _CONTAINERS and depth < MAX_DEPTH:
        if type(value) is dict:
            items = [(_release_rendering(k, depth + 1), _release_rendering(v, depth + 1))
                     for k, v in value.items()]  # fmt: skip
            return f"dict:{items!r}"
        rendered = [_release_rendering(v, depth + 1) for v in value]
        if type(value) in (set, frozenset):
            rendered.sort()
        return f"{type(value).__name__}:{rendered!r}"
    return traced_code.value_identity(value, 0)


def _read_scalars() -> list[tuple[Any, ...]]:
    return [group.values() for group in _scalars]


def _changed(now: list[tuple[Any, ...]], then: list[tuple[Any, ...]], into: set[str]) -> None:
    """Add to ``into`` each scalar whose value differs (a group new since ``then``: from its
    value as imported)."""
    for index, values in enumerate(now):
        group = _scalars[index]
        before = then[index] if index < len(then) else group.imported
        if values != before:  # one C-level comparison a group (identity first: NaN is NaN)
            for label, value, was in zip(group.labels, values, before, strict=True):
                if not _same(value, was):
                    into.add(label)


def _note_changes_outside() -> list[tuple[Any, ...]]:
    """Mark the scalars changed and the lowerings added since the last window's edge as the
    program's (under ``_lock``); returns the scalars' values now."""
    now = _read_scalars()
    _changed(now, _scalar_last, _set_outside)
    _scalar_last[:] = now
    _note_grown(by_program=True)
    return now


def _note_grown(by_program: bool) -> None:
    """What each table torch grows holds beyond its copy now (a C-level key difference: a
    few entries), remembered; with ``by_program``, what is new or re-pointed since the last
    edge is the program's (under ``_lock``)."""
    for key, (label, table, then) in list(_tables.items()):
        if label not in _GROWN_BY_TORCH:
            continue
        beyond = {op: table.get(op, _MISSING) for op in table.keys() - then.keys()}
        program_s = _grown_by_program.get(key, set()) & beyond.keys()  # gone since: forgotten
        if by_program:
            seen = _grown_seen.get(key, {})
            program_s |= {op for op, entry in beyond.items() if seen.get(op, _MISSING) is not entry}
        if program_s or key in _grown_by_program:
            _grown_by_program[key] = program_s
        _grown_seen[key] = beyond


def compile_started() -> None:
    """A compile window opens (a frame compile, a lazy backward compile, a graph compile):
    what changed Inductor's scalars since the last one closed was the program (never raises)."""
    with contextlib.suppress(Exception), _lock:
        if compile_windows.opened():
            _scalar_start[:] = _note_changes_outside()


def compile_ended() -> None:
    """A compile window closes: what changed Inductor's scalars while it was open was torch
    (its counters, its lazily set flags), never keyed (never raises)."""
    with contextlib.suppress(Exception), _lock:
        if not compile_windows.closed():
            return
        now = _read_scalars()
        _changed(now, _scalar_start, _set_inside)
        _scalar_last[:] = now
        _note_grown(by_program=False)  # the fallbacks Inductor added while it compiled


@contextlib.contextmanager
def torch_at_work() -> Iterator[None]:
    """torch's own work outside a compile (a served precompile entry's load and install, an
    entry's save: they load compiled modules and set Inductor's lazy flags) as a window."""
    compile_started()
    try:
        yield
    finally:
        compile_ended()


def wrap_window(original: Callable[..., Any]) -> Callable[..., Any]:
    """A function of torch's that compiles (Inductor's ``_compile_fx_inner``) as a window."""

    def compiling(*args: Any, **kwargs: Any) -> Any:
        compile_started()
        try:
            return original(*args, **kwargs)
        finally:
            compile_ended()

    return marked(functools.wraps(original)(compiling), original)


def wrap_window_context(original: Callable[..., Any]) -> Callable[..., Any]:
    """Dynamo's ``CompilationCallbackHandler.install_callbacks`` (the context around each frame
    compile and each lazy backward compile) as a window."""

    @contextlib.contextmanager
    def install_callbacks(self: Any, *args: Any, **kwargs: Any) -> Iterator[None]:
        compile_started()
        try:
            with original(self, *args, **kwargs):
                yield
        finally:
            compile_ended()

    return marked(install_callbacks, original)


def reset() -> None:
    """Forget every copy (tests)."""
    with _lock:
        _data.clear()
        _modules.clear()
        _tables.clear()
        _inductor_modules.clear()
        _loaded_at.clear()
        _memo.clear()
        _preloaded.clear()
        _as_found.clear()
        _preloaded_modules.clear()
        _data_as_found.clear()
        _entry_identities.clear()
        _scalars.clear()
        _scalar_last.clear()
        _scalar_start.clear()
        _set_outside.clear()
        _set_inside.clear()
        _grown_seen.clear()
        _grown_by_program.clear()
    compile_windows.reset()
    with _release_lock:
        _started.clear()
        _answer.clear()
        _asked.clear()


# --- the release's tables and Inductor's data, read in a fresh interpreter --------------
# Where the program imported a table's completing module, or one of Inductor's modules,
# before objcache could watch it (an explicit ``install()`` after ``torch.compile(model)``,
# which imports Inductor; or after ``import torch._dynamo``), the first copy holds whatever
# the program did before. What the release holds is then asked of a fresh interpreter of the
# same Python and torch, which imports those modules and prints each table entry's identity
# and each container's rendering (:func:`release_identities`); the answer is kept per
# machine beside the fingerprint cache, keyed by what decides torch's release and the
# modules asked about. One that cannot be had leaves the copies as found, named in the keys
# by what they hold (a miss where another process's differ).

_release_lock = threading.Lock()
#: Bump when what the child prints changes.
FORMAT = "3"
#: The child imports torch and Inductor's tables (4.5 s of one core here); past this the
#: compile waiting for it goes on with the tables as found (named by digest: a miss).
TIMEOUT_S = 60.0
#: The most a child's answer may hold (two tables of ~2,000 entries are ~1 MiB).
MAX_ANSWER_BYTES = 16 << 20
#: What the fresh interpreter runs: the tables' modules imported as the release defines them,
#: nothing of the program's, objcache's zero-code path off.
CHILD = (
    "import importlib, json, sys\n"
    "from objcache.integrations.torch.precompile import torch_edits\n"
    "for name in torch_edits.COMPLETING_MODULES:\n"
    "    importlib.import_module(name)\n"
    "modules = []\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        importlib.import_module(name)\n"
    "        modules.append(name)\n"
    "    except Exception:\n"
    "        pass  # its data is left as found (a miss), the rest is still read\n"
    "sys.stdout.write(json.dumps(torch_edits.release_identities(modules)))\n"
)

_started: list[threading.Thread] = []
#: the Inductor modules the reading asks about (those the program had imported)
_asked: list[str] = []
_answer: list[dict[str, dict[str, str]] | None] = []


def _start_reading_release(modules: list[str] | None = None) -> None:
    """Begin reading the release's tables and the data of Inductor's ``modules`` in a fresh
    interpreter, in the background (idempotent; never raises)."""
    with _release_lock:
        if _started or _answer:
            return
        _asked[:] = modules or []
        thread = threading.Thread(target=_read, name="objcache-release-tables", daemon=True)
        _started.append(thread)
    thread.start()


def _release_identities_read(timeout_s: float = TIMEOUT_S) -> dict[str, dict[str, str]] | None:
    """:func:`release_identities` of the release, or None where they could not be read
    (waits for the reading, bounded)."""
    _start_reading_release()
    thread = _started[0] if _started else None
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout_s)
    return _answer[0] if _answer else None


def _read() -> None:
    found: dict[str, dict[str, str]] | None = None
    with contextlib.suppress(Exception):
        found = _cached()
        if found is None:
            found = _ask_child()
            if found is not None:
                _store(found)
    with _release_lock:
        _answer[:] = [found]


def _cache_file() -> Path | None:
    from objcache.config import fingerprint
    from objcache.config.settings import user_cache_dir

    key = fingerprint.torch_inputs_key()
    if key is None:
        return None
    asked = hashlib.blake2b("\0".join(_asked).encode(), digest_size=8).hexdigest()
    return user_cache_dir() / "release-tables" / f"{key}-{asked}-{FORMAT}.json"


def _cached() -> dict[str, dict[str, str]] | None:
    path = _cache_file()
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return _valid(f.read(MAX_ANSWER_BYTES + 1))
    except OSError:
        return None


def _store(found: dict[str, dict[str, str]]) -> None:
    from objcache.config.files import publish_file
    from objcache.config.settings import user_cache_dir

    path = _cache_file()
    if path is None:
        return
    data = json.dumps(found, sort_keys=True).encode()
    # this user's folder, opened without following a link; a refused one: asked again next time
    with contextlib.suppress(OSError):
        publish_file(user_cache_dir(), [path.parent.name, path.name], data, mode=0o600,
                     create_root=True)  # fmt: skip


def _ask_child() -> dict[str, dict[str, str]] | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJCACHE_")}
    env["OBJCACHE_ENABLE"] = "0"  # the child must not install (nor prefetch, nor write)
    try:
        done = subprocess.run(
            [sys.executable, "-P", "-c", CHILD, *_asked],  # -P: not the working folder's
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return _valid(done.stdout)


def _valid(data: bytes) -> dict[str, dict[str, str]] | None:
    """The answer if it is what the child prints: tables of strings, bounded."""
    if len(data) > MAX_ANSWER_BYTES:
        return None
    try:
        found: Any = json.loads(data)
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    for label, table in found.items():
        if not isinstance(label, str) or not isinstance(table, dict):
            return None
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
            return None
    return found
