"""What the program put into Inductor's own namespace (docs/torch.md, "Custom ops in the
keys"): a method of one of its classes replaced (``CppOverrides.exp = fast_exp``, what a
"fast math" library does to the C++ code generator) or an entry added to one of its
module-level registries (``register_noop_decomp``, ``register_backend_for_device``'s
``device_custom_pass``, ``register_custom_op_autotuning``'s configs): Inductor runs it on
every graph it compiles, no graph's ops show it and torch's keys name at most a ``uuid()``
the program chose.

Which values are the program's is found again only when a hash of the identities the
classes and registries hold changes (one C-level pass, read once per frame compile; only
the dicts whose identities moved are scanned again); what each found value computes is
named at every key, by :func:`.traced_code.value_identity`. The decomposition and
lowering tables, the pattern passes and the settings are :mod:`.program_registrations`'
(left out here).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import types
from collections.abc import Callable
from operator import methodcaller
from typing import Any

from objcache.integrations.torch.precompile import program_registrations
from objcache.integrations.torch.precompile.traced_code import (
    is_torchs_name,
    value_identity,
)
from objcache.integrations.torch.timing import compile_windows

#: The package whose classes and registries decide the code a graph compiles to.
PACKAGE = "torch._inductor"
#: AOTAutograd's package, read as Inductor's is (its modules' globals, classes and
#: registries): its partitioner looks its helpers up as module globals at every call
#: (``get_default_op_list``: which activations the backward recomputes), so a function the
#: program put there decides the code as one put in Inductor's would.
AOT_PACKAGE = "torch._functorch"

#: torch's function namespaces that torch's own Python reads while AOTAutograd traces
#: (``F.layer_norm`` calls ``torch.layer_norm``, ``F.dropout`` ``torch._VF.dropout``,
#: ``torch.norm`` ``torch._VF.norm``), and the modules of its decompositions, references
#: and primitives, whose helpers a decomposition calls by global name
#: (``apply_loss_reduction`` in ``aten.mse_loss``'s): a function the program put there
#: runs in the trace, and the graph names torch's op or wrapper only. Read as Inductor's
#: namespaces are (their program values, labelled ``torch_function:``).
FUNCTION_NAMESPACES = (
    "torch",
    "torch.functional",
    "torch.nn.functional",
    "torch._C._nn",
    "torch._C._linalg",
    "torch._C._special",
    "torch._C._fft",
    "torch._VF",
    "torch.linalg",
    "torch.special",
    "torch.fft",
    "torch._decomp",
    "torch._decomp.decompositions",
    "torch._decomp.decompositions_for_rng",
    "torch._decomp.decompositions_for_jvp",
    "torch._refs",
    "torch._refs.nn.functional",
    "torch._refs.special",
    "torch._refs.linalg",
    "torch._refs.fft",
    "torch._prims",
    "torch._prims_common",
    "torch._prims_common.wrappers",
)

#: The modules Inductor makes of the code it compiled (``compile_tasks.<key>``), loaded from
#: its cache: the output, not the code generator, and one more per kernel.
COMPILED_MODULES = "torch._inductor.runtime.compile_tasks."

#: objcache's own package: its hooks on Inductor's classes are not the program's.
OWN_FOLDER = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))) + os.sep

#: Packages torch's own release depends on and imports into Inductor's namespace (sympy's
#: classes key some of its registries): theirs are part of the release, not the program's.
TORCH_DEPENDENCIES = frozenset(
    {"sympy", "mpmath", "networkx", "jinja2", "markupsafe", "filelock", "fsspec", "triton"}
    | {"torchgen"}  # torch's own code generator, shipped in its wheel beside it
    | {"typing_extensions", "numpy", "setuptools", "pkg_resources", "_distutils_hack"}
)

#: How deep a registry's items are followed (a dict of the program's objects, a list of
#: torch's config objects holding the program's functions).
MAX_DEPTH = 2
#: A registry is read up to this many items (Inductor's largest, past the tables read
#: elsewhere, holds a few hundred).
MAX_ITEMS = 4096

_lock = threading.Lock()
#: (modules loaded, class dicts, registries, each module's name with where its globals are in
#: the class dicts), found again when a module was imported or re-laid out
_layout: list[
    tuple[int, list[tuple[str, dict[str, Any]]], list[tuple[str, Any]], list[tuple[str, int]]]
] = []
#: (compile window, (token, the program's values)): one window's keys share one reading
_read_memo: list[tuple[Any, tuple[int, list[tuple[str, Any]]]]] = []
#: id of a class dict or registry -> it, -> the hash of what it held, -> the program's values
#: in it where there are any (flat dicts: no container kept an entry for the collector to walk,
#: see :data:`.program_registrations._entry_seen`)
_scanned_held: dict[int, Any] = {}
_scanned_hash: dict[int, int] = {}
_scanned_programs: dict[int, tuple[tuple[str, Any], ...]] = {}
_UNSEEN = object()
#: namespace -> the hash of the names and identities it held as copied, and -> what the copy's scan
#: named where it named anything: the first reading's scan where nothing changed since (a
#: class's ``__dict__`` is a new view each time it is read, so the identity memo above misses
#: what the copy scanned). Flat dicts of ints: nothing more for the collector to track.
_copied_hash: dict[str, int] = {}
_copied_programs: dict[str, tuple[tuple[str, Any], ...]] = {}


def _loaded() -> tuple[
    list[tuple[str, dict[str, Any]]], list[tuple[str, Any]], list[tuple[str, int]]
]:
    """The namespaces of Inductor's and AOTAutograd's loaded modules (their globals and the
    dicts of the classes they define), and their module-level containers (each once, less
    the tables and settings read elsewhere); and each module's name with where its globals
    are among the namespaces."""
    loaded = len(sys.modules)
    with _lock:
        if _layout and _layout[0][0] == loaded:
            return _layout[0][1], _layout[0][2], _layout[0][3]
    skip = {id(table) for _, table in program_registrations.tables()}
    namespaces: list[tuple[str, dict[str, Any]]] = []
    registries: list[tuple[str, Any]] = []
    laid_out: list[tuple[str, int]] = []
    for name, module in sorted(list(sys.modules.items())):
        if module is None or not (_in(name, PACKAGE) or _in(name, AOT_PACKAGE)):
            continue
        if name.startswith(COMPILED_MODULES):
            continue  # a compiled graph's own code (one per kernel), not the compiler's
        known = _modules.get(name)
        if known is None or known[0] is not module or known[1] != len(vars(module)):
            known = _modules[name] = _module_entry(name, module)
        laid_out.append((name, len(namespaces)))
        namespaces.extend(known[4])
        for where, registry in known[5]:
            if id(registry) not in skip:
                skip.add(id(registry))  # one registry imported under several names
                registries.append((where, registry))
    namespaces.extend(_function_namespaces())
    with _lock:
        _layout[:] = [(loaded, namespaces, registries, laid_out)]
    return namespaces, registries, laid_out


def _in(name: str, package: str) -> bool:
    """Whether module ``name`` is ``package`` or one of its modules."""
    return name == package or name.startswith(package + ".")


def _function_namespaces() -> list[tuple[str, dict[str, Any]]]:
    """The globals of :data:`FUNCTION_NAMESPACES` loaded now, and of each of torch's own
    modules they hold: torch's code calls through such a module at call time
    (``F.mse_loss`` reads ``_Reduction.get_enum``, ``torch.nn._reduction``'s; the eleventh
    review replaced it and a new machine was served the writer's code, off by 602), so a
    function the program put there runs in the trace as one put in the namespace itself
    would. Inductor's own modules are read as Inductor's (:func:`_loaded`)."""
    listed = [(name, vars(module)) for name, module in loaded_function_namespaces()]
    found = list(listed)
    seen = {id(namespace) for _, namespace in listed}
    for _, namespace in listed:
        for value in list(namespace.values()):
            if type(value) is not types.ModuleType:
                continue
            held_name = getattr(value, "__name__", None)
            held = getattr(value, "__dict__", None)
            if (
                isinstance(held_name, str)
                and isinstance(held, dict)
                and id(held) not in seen
                and (held_name == "torch" or held_name.startswith("torch."))
                and not _in(held_name, PACKAGE)
            ):
                seen.add(id(held))
                found.append((held_name, held))
    return found


def loaded_function_namespaces() -> list[tuple[str, Any]]:
    """``(name, module)`` for each of :data:`FUNCTION_NAMESPACES` loaded now (``torch._C._nn``
    and its kin are reached as attributes: they are not in ``sys.modules``)."""
    found: list[tuple[str, Any]] = []
    for name in FUNCTION_NAMESPACES:
        module = sys.modules.get(name)
        if module is None and name.startswith("torch._C."):
            module = getattr(sys.modules.get("torch._C"), name.rsplit(".", 1)[1], None)
        if isinstance(getattr(module, "__dict__", None), dict):
            found.append((name, module))
    return found


#: module name -> (module, its globals' count, the hash of its globals as laid out (as
#: :func:`_named_ids` says it), the hash of the registries and classes found in them, its
#: namespaces, its containers)
_ModuleEntry = tuple[Any, int, int, int, list[tuple[str, dict[str, Any]]], list[tuple[str, Any]]]
_modules: dict[str, _ModuleEntry] = {}


def _module_entry(name: str, module: Any) -> _ModuleEntry:
    module_dict = vars(module)
    globals_hash = _held_hash(module_dict)
    namespaces, registries, shape = _module_layout(name, module_dict)
    return (module, len(module_dict), globals_hash, shape, namespaces, registries)


def _module_layout(
    name: str, module_dict: dict[str, Any]
) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, Any]], int]:
    """The module's namespaces (its globals, the dicts of the classes it defines) and its
    containers, and a hash of which registries and classes those are."""
    namespaces: list[tuple[str, dict[str, Any]]] = [(name, module_dict)]
    registries: list[tuple[str, Any]] = []
    found: list[int] = []
    containers = _CONTAINERS
    for attr, value in list(module_dict.items()):
        kind = type(value)
        if kind in containers or (kind not in _LEAVES and isinstance(value, (dict, list))):
            if attr not in _NOT_REGISTRIES:
                registries.append((f"{name}.{attr}", value))
                found.append(id(value))
        elif isinstance(value, type) and value.__module__ == name:
            namespaces.append((f"{name}.{value.__qualname__}", value.__dict__))  # type: ignore[arg-type]
            found.append(id(value))
    return namespaces, registries, hash(tuple(found))


def _relaid_out(laid_out: list[tuple[str, int]], held_hashes: tuple[int, ...]) -> bool:
    """Lay out again each module whose globals changed since it was laid out; whether one of
    them now holds another registry or class than it did (a global re-bound to the
    program's own dict, as many globals as before): then the layout is made again."""
    moved = False
    for name, at in laid_out:
        known = _modules.get(name)
        if known is None or known[2] == held_hashes[at]:
            continue
        now = _modules[name] = _module_entry(name, known[0])
        moved = moved or now[3] != known[3]
    if moved:
        with _lock:
            _layout.clear()
    return moved


_CONTAINERS = frozenset({dict, list, tuple, set})
#: Module globals of these kinds are neither a registry nor a class (most of a module's).
_LEAVES = frozenset({types.FunctionType, types.ModuleType, str, int, float, bool, type(None)})

#: Module globals that are no registry: Python's own, a config module's settings.
_NOT_REGISTRIES = frozenset(
    {"__builtins__", "__all__", "__path__", "__annotations__", "_config", "_default"}
)


def _ids(values: Any) -> int:
    return _stable_hash(lambda: tuple(map(id, values)))


def _stable_hash(read: Callable[[], Any]) -> int:
    """``hash(read())``, read again where a dict changed while read (another thread
    registering); past three tries, a hash that matches no earlier one (a rescan)."""
    for _ in range(3):
        try:
            return hash(read())
        except RuntimeError:
            continue
    return hash(os.urandom(8))


def _read() -> tuple[int, list[tuple[str, Any]]]:
    """(the token, the program's values with where they are): each class dict and registry
    by the identities it holds, scanned again only where those changed."""
    compile_id = compile_windows.reading_id()
    with _lock:
        if compile_id is not None and _read_memo and _read_memo[0][0] == compile_id:
            return _read_memo[0][1]
    classes, registries, laid_out = _loaded()
    held_hashes = _held_hashes(classes, registries)
    if _relaid_out(laid_out, held_hashes):
        # the namespaces and registries read already keep their hashes (and stay alive while
        # their ids say which is which); only a moved module's are read again
        before = (classes, registries)
        read = zip([*classes, *registries], held_hashes, strict=True)
        known = {id(held): now for (_, held), now in read}
        classes, registries, _ = _loaded()
        held_hashes = tuple(
            known[id(held)] if id(held) in known else _held_hash(held)
            for _, held in [*classes, *registries]
        )
        del before
    overall = hash((len(sys.modules), held_hashes))
    with _lock:
        last = _read_memo[0][1] if _read_memo else None
    if last is not None and last[0] == overall:
        with _lock:
            _read_memo[:] = [(compile_id, last)]
        return last  # nothing put, replaced or removed since the last reading
    found: list[tuple[str, Any]] = []
    seen_held: dict[int, Any] = {}
    seen_hash: dict[int, int] = {}
    seen_programs: dict[int, tuple[tuple[str, Any], ...]] = {}
    for (where, held, scan), now in zip(
        [
            *((where, held, _scan_namespace) for where, held in classes),
            *((where, held, _scan_registry) for where, held in registries),
        ],
        held_hashes,
        strict=True,
    ):
        key = id(held)
        if _scanned_held.get(key, _UNSEEN) is held and _scanned_hash.get(key) == now:
            programs = _scanned_programs.get(key, ())
        elif scan is _scan_namespace and _copied_hash.get(where) == now:
            programs = _copied_programs.get(where, ())  # its scan as copied
        else:
            scanned = scan(where, held)
            if scan is _scan_namespace:
                scanned += _repointed(where, held, {label for label, _ in scanned})
            programs = tuple(scanned)
        seen_held[key], seen_hash[key] = held, now
        if programs:
            seen_programs[key] = programs
        found.extend(programs)
    result = (overall, found)
    with _lock:
        _scanned_held.clear()
        _scanned_held.update(seen_held)
        _scanned_hash.clear()
        _scanned_hash.update(seen_hash)
        _scanned_programs.clear()
        _scanned_programs.update(seen_programs)
        _read_memo[:] = [(compile_id, result)]
    return result


_values = methodcaller("values")
_ids_of = functools.partial(map, id)
#: A namespace is a module's dict or a class's read-only view of its own.
_MAPPINGS = (dict, types.MappingProxyType)


def _held_hashes(
    namespaces: list[tuple[str, Any]], registries: list[tuple[str, Any]]
) -> tuple[int, ...]:
    """What each namespace and registry holds, as :func:`_named_ids` says it (a mapping by
    its values' identities in order and its names', a list or set by its items'), in that
    order: one pass in C over Inductor's 40,000 names, the same hashes a copy was taken
    with (a per-namespace loop in Python cost twice as much)."""
    dicts = [held for _, held in namespaces]

    def read() -> tuple[int, ...]:
        values = map(hash, map(tuple, map(_ids_of, map(_values, dicts))))
        names = map(hash, map(tuple, map(_ids_of, dicts)))
        return (
            *map(hash, zip(values, names, strict=True)),
            *(_held_hash(held) for _, held in registries),
        )

    for _ in range(3):
        try:
            return read()
        except RuntimeError:  # a dict changed while read (another thread registering)
            continue
    return tuple(hash(os.urandom(8)) for _ in range(len(namespaces) + len(registries)))


def _held_hash(held: Any) -> int:
    """One namespace's or registry's hash, as :func:`_held_hashes` gives it."""
    return _named_ids(_ids(held.values()), held) if isinstance(held, _MAPPINGS) else _ids(held)


def current_compile_id() -> Any:
    """The frame compile Dynamo is in (None outside one): one compile's keys share a reading."""
    guards = sys.modules.get("torch._guards")
    context = getattr(guards, "CompileContext", None)
    try:
        return context.current_compile_id() if context is not None else None
    except Exception:
        return None


def overrides() -> tuple[tuple[str, str], ...]:
    """``((f"inductor:{where}", identity), ...)`` for each value of the program's in
    Inductor's classes and registries, named as it is now."""
    return tuple((label, _identity(value)) for label, value in _read()[1])


#: namespace -> a copy of its code as first seen (before the program ran, where the install
#: saw it imported): what torch's release holds there
_release: dict[str, dict[str, Any]] = {}
#: What torch's release holds as code in a namespace, compared by identity (by type alone:
#: ``isinstance`` reads ``__class__``, which a deprecated alias answers with a warning).
_CODE_KINDS = frozenset(
    {types.FunctionType, types.BuiltinFunctionType, staticmethod, classmethod, property}
)
#: What a namespace's copy is compared with, by identity: code, torch's modules a namespace
#: holds (torch calls through them at call time) and bound methods (``cexpr =
#: CppPrinter().doprint``: another printer's is other code with the same function).
_COMPARED_KINDS = _CODE_KINDS | {types.ModuleType, types.MethodType}
#: A name the program deleted from a namespace (``del CppOverrides.sigmoid``).
_REMOVED = object()


def remember_release(finished: str = "") -> None:
    """Copy the code of every namespace loaded now and not copied yet (the install calls this
    as torch and Inductor's lowering module finish importing; a namespace never copied is
    not compared). A module still running its body (``finished``:
    the one that just ended it) is copied as its own import ends, never half-made."""
    for name, module in sorted(list(sys.modules.items())):
        if module is None or name.startswith(COMPILED_MODULES):
            continue
        if not _in(name, PACKAGE):
            continue
        if name == finished or not initializing(module):
            remember_module(module)
    for where, held in _function_namespaces():
        if where == finished or not initializing(sys.modules.get(where)):
            _keep_release(where, held)


def initializing(module: Any) -> bool:
    """Whether ``module`` is still running its body (Python marks it done after)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def remember_module(module: Any) -> None:
    """Copy the namespaces one of Inductor's modules defines, as its import ends (the
    zero-code path's import watcher: the program may import a code generator and re-point
    one of its methods before any compile)."""
    name = getattr(module, "__name__", "")
    if not _in(name, PACKAGE) or name.startswith(COMPILED_MODULES):
        return
    entry = _modules[name] = _module_entry(name, module)  # what a read reuses
    for where, held in entry[4]:
        _keep_release(where, held)


def _named_ids(values: int, held: Any) -> int:
    """The hash of a namespace's values' identities (``values``) with its names': a name
    deleted and its function kept under another leaves the values as they were, in order."""
    return hash((values, _ids(held.keys())))


def _keep_release(where: str, held: dict[str, Any]) -> None:
    """Copy a namespace as the release's: less what :func:`_scan_namespace` names as the
    program's (an explicit install copies what is imported already, where the program, a
    test's ``monkeypatch``, may hold its own function for a while; taken as the release's,
    torch's own put back would read as re-pointed: such a name is not compared). That scan
    is also a reading's for the namespace while it holds the identities it was copied with
    (nothing can be re-pointed against a copy of itself): :data:`_copied_hash`."""
    if where in _release:
        return
    now = _held_hash(held)
    scanned = tuple(_scan_namespace(where, held))
    programs = {label.rsplit(".", 1)[1] for label, _ in scanned}
    copy = {attr: value for attr, value in held.items() if attr not in programs}
    with _lock:
        if _release.setdefault(where, copy) is copy:
            _copied_hash[where] = now
            if scanned:
                _copied_programs[where] = scanned


def _repointed(where: str, namespace: Any, named: set[str]) -> list[tuple[str, Any]]:
    """Torch's own code the program moved in a namespace: a name pointed at another of
    torch's functions (``CppOverrides.sigmoid = CppOverrides.tanh``; the program's own code
    is :func:`_scan_namespace`'s) or deleted, against the namespace's first copy. Torch's
    59 aliases (``get_device_or_error = get_device``) are in that copy: they name nothing."""
    with _lock:
        release = _release.get(where)
    if release is None:
        # never copied as imported: a copy now could hold an edit in place for a while (a
        # test's monkeypatch, a context manager), and name torch's own once it is undone
        return []
    found: list[tuple[str, Any]] = []
    for attr, then in list(release.items()):
        kind = type(then)
        if kind not in _COMPARED_KINDS and not issubclass(kind, type):
            continue  # data: Inductor's own caches and counters change as it compiles
        now = namespace.get(attr, _REMOVED)
        if now is then or _same_bound(now, then):
            continue
        same_function = getattr(now, "__func__", now) is getattr(then, "__func__", then)
        if same_function and kind is not types.MethodType:
            continue  # put back as the function a static method holds
        if now is not _REMOVED and _wraps(now, then):
            continue  # a wrapper of the release's own (Dynamo's ``disable`` of ``jit.trace``)
        if _objcaches(now) or _objcaches(then):
            continue  # objcache's own hooks, put in or taken out: they key what they wrap
        label = f"{_label(where)}:{where}.{attr}"
        if label not in named:
            found.append((label, now))
    return found


def _same_bound(now: Any, then: Any) -> bool:
    """Whether two bound methods are one function bound to one object."""
    return (
        type(now) is types.MethodType
        and type(then) is types.MethodType
        and now.__func__ is then.__func__
        and now.__self__ is then.__self__
    )


def _objcaches(value: Any) -> bool:
    if issubclass(type(value), type):  # objcache's classes in torch's place (its cache classes)
        module = vars(value).get("__module__")
        return isinstance(module, str) and module.startswith(OWN_PACKAGE + ".")
    code = getattr(getattr(value, "__func__", value), "__code__", None)
    return isinstance(code, types.CodeType) and code.co_filename.startswith(OWN_FOLDER)


def _wraps(value: Any, released: Any) -> bool:
    """Whether ``value`` and ``released`` are wrappers of one function through
    ``__wrapped__``, a few wrappers deep (Dynamo's ``disable`` of ``torch.jit.trace``, made
    again from the original by another ``disable``, or put in place after the copy)."""
    return not _chain(value).isdisjoint(_chain(released))


def _chain(value: Any) -> set[int]:
    found = {id(value)}
    for _ in range(4):
        value = _own_attr(value, "__wrapped__")
        if value is None:
            break
        found.add(id(value))
    return found


def _identity(value: Any) -> str:
    """A found value by what it computes; torch's own function closing over the program's
    (``register_custom_op_autotuning``'s lowering and its configs) by what it holds."""
    if value is _REMOVED:
        return "removed"
    if type(value) is types.ModuleType and not _releases(str(getattr(value, "__name__", ""))):
        # the program's module in place of torch's (``F._Reduction = its_module``): torch's
        # code calls through it at call time, so by the program's code in it, as it is now
        name = getattr(value, "__name__", "")
        code = _scan_namespace(str(name), vars(value))
        return f"module:{name};" + ",".join(f"{label}={_identity(item)}" for label, item in code)
    if type(value) is types.FunctionType and _torch_closure(value):
        held = program_registrations.entry_functions(value)
        return "|".join(",".join(program_registrations.identity(item)) for item in held)
    return value_identity(value, 0)


def _torch_closure(fn: Any) -> bool:
    return bool(fn.__closure__) and program_registrations.in_torch(fn.__code__.co_filename)


def _scan_namespace(where: str, namespace: Any) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    home = program_registrations.torch_home()
    function, skipped = types.FunctionType, _SKIPPED_MEMBERS
    for attr, value in list(namespace.items()):
        # the common cases decided here: torch's own methods, functions and classes
        kind = type(value)
        if kind in skipped:
            continue
        if kind is staticmethod or kind is classmethod:
            value, kind = value.__func__, type(value.__func__)
        if kind is function:
            if value.__code__.co_filename.startswith(home):
                continue
            # whose globals it runs in, never ``__module__``: ``functools.wraps`` copies the
            # wrapped function's (a program's wrapper of ``torch.layer_norm`` says "torch")
            module = value.__globals__.get("__name__")
            if isinstance(module, str) and _releases(module):
                continue  # another module's function, or generated by its maker's name
        elif issubclass(kind, type):  # by its type only: ``isinstance`` reads ``__class__``,
            if _released(value):  # which a deprecated alias answers with a warning
                continue
        elif kind is not property and not callable(value):
            continue  # a logger, a pattern, a symbol: data
        elif _released(kind) and kind not in _WRAPPERS and _own_attr(value, "__wrapped__") is None:
            continue  # torch's or a dependency's callable object (a sympy function, a JIT kernel)
        if issubclass(kind, type) or _programs_member(namespace[attr], attr):
            found.append((f"{_label(where)}:{where}.{attr}", namespace[attr]))
    return found


def _label(where: str) -> str:
    return "inductor" if _in(where, PACKAGE) else "torch_function"


#: Callables of Python's own that wrap another callable (followed to it).
_WRAPPERS = frozenset({functools.partial, types.MethodType})


def _scan_registry(where: str, registry: Any) -> list[tuple[str, Any]]:
    return [(f"inductor:{label}", value) for label, value in _items(registry, where, 0)]


def _programs_member(value: Any, attr: str = "") -> bool:
    """Whether a class attribute is the program's code (a method, static or class method,
    a property's accessors, a callable object)."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return any(_programs_code(f, attr) for f in (value.fget, value.fset, value.fdel) if f)
    return _programs_code(value, attr)


def _programs_code(value: Any, attr: str = "", depth: int = 0) -> bool:
    """Whether ``value`` is, or wraps, a function of the program's. Code generated without
    a module (``exec`` into an empty namespace, as torch makes its ops handlers' methods) is
    torch's where it sits under the name it was generated with."""
    if type(value) is types.FunctionType:
        code = value.__code__
        if program_registrations.in_torch(code.co_filename) or code.co_filename.startswith(
            OWN_FOLDER
        ):
            return False  # torch's, or objcache's own hooks (which key what they wrap)
        made_by = value.__globals__.get("__name__")
        if code.co_filename.startswith("<"):
            if isinstance(made_by, str):
                # generated (a dataclass's methods, a namedtuple's ``__new__``): by its maker
                return not (made_by.startswith("namedtuple_") or _releases(made_by))
            wrapped = _own_attr(value, "__wrapped__")  # torch's generated cache wrappers
            if wrapped is not None and wrapped is not value and depth <= 2:
                return _programs_code(wrapped, attr, depth + 1)
            return code.co_name != attr
        return not _releases(str(made_by or ""))  # by its globals, as above
    if depth > 2 or value is None or isinstance(value, (str, bytes, int, float, type)):
        return False
    if isinstance(value, functools.partial):
        held = [value.func, *value.args, *value.keywords.values()]
        return any(_programs_code(item, "", depth + 1) for item in held if callable(item))
    wrapped = _own_attr(value, "__wrapped__")  # functools.cache, lru_cache, wraps
    if wrapped is not None and wrapped is not value:
        return _programs_code(wrapped, attr, depth + 1)
    if isinstance(value, types.MethodType):
        fn, owner = value.__func__, type(value.__self__)
        if _released(owner) and any(
            vars(cls).get(getattr(fn, "__name__", "")) is fn for cls in owner.__mro__
        ):
            return False  # a method of torch's class (``ops.add``): judged with its class
        return _programs_code(fn, attr, depth + 1)
    # a callable object of the program's
    return callable(value) and not _releases(type(value).__module__)


def _own_attr(value: Any, name: str) -> Any:
    """``value.<name>`` where the object has it, never through a ``__getattr__`` (an ops
    handler's warns and makes up an op for any name)."""
    try:
        return object.__getattribute__(value, name)
    except Exception:
        return None


#: module name -> whether it comes with torch's release
_released_modules: dict[str, bool] = {}


def _releases(module: str) -> bool:
    """Whether code of ``module`` comes with torch's release (torch, Python, a package torch
    depends on)."""
    known = _released_modules.get(module)
    if known is None:
        known = _released_modules[module] = _releases_uncached(module)
    return known


def _releases_uncached(module: str) -> bool:
    top = module.split(".", 1)[0]
    return (
        is_torchs_name(module)
        or top in sys.stdlib_module_names
        or top in TORCH_DEPENDENCIES
        or top == OWN_PACKAGE  # objcache's own classes in torch's place (its hooks)
    )


OWN_PACKAGE = __name__.split(".", 1)[0]


#: Class attributes that are never code (plain data, nested classes, descriptors of C).
_SKIPPED_MEMBERS = frozenset(
    {str, bytes, int, float, bool, complex, type(None), type, dict, tuple, list, frozenset}
    | {set, types.ModuleType}
    | {types.GetSetDescriptorType, types.MemberDescriptorType, types.WrapperDescriptorType}
    | {types.BuiltinFunctionType, types.MethodDescriptorType}
)
#: Values never followed: plain data.
_PLAIN = frozenset({str, bytes, int, float, bool, complex, type(None)})
#: class -> whether it comes with torch's release (a class's module never changes)
_released_classes: dict[type, bool] = {}


def _released(cls: type) -> bool:
    known = _released_classes.get(cls)
    if known is None:
        known = _releases(str(getattr(cls, "__module__", "") or ""))
        if len(_released_classes) > 65_536:
            _released_classes.clear()
        _released_classes[cls] = known
    return known


def _children(value: Any) -> list[tuple[Any, Any]] | None:
    """``(key, item)`` for what a container or an object of torch's holds; None for a
    value not followed."""
    if isinstance(value, dict):
        return list(value.items())[:MAX_ITEMS]
    if isinstance(value, (list, tuple)):
        return list(enumerate(value))[:MAX_ITEMS]
    if isinstance(value, (set, frozenset)):
        return [("*", item) for item in list(value)[:MAX_ITEMS]]
    held = _own_attr(value, "__dict__")
    if isinstance(held, dict) and not isinstance(value, (type, types.ModuleType)):
        # torch's own object holding the program's (a backend's DeviceCodegen, an
        # autotuning CustomOpConfig with its decomposition)
        return [(f".{k}", v) for k, v in list(held.items())[:MAX_ITEMS]]
    return None


def _holds(value: Any, depth: int) -> bool:
    """Whether ``value`` is or holds (to :data:`MAX_DEPTH`) the program's code: the quick
    pass over every registry, without naming where."""
    if type(value) in _PLAIN:
        return False
    if _programs_thing(value):
        return True
    if depth >= MAX_DEPTH:
        return False
    children = _children(value)
    if not children:
        return False
    keyed = isinstance(value, dict)
    return any(
        (keyed and type(key) not in _PLAIN and _programs_thing(key)) or _holds(item, depth + 1)
        for key, item in children
    )


def _items(value: Any, where: str, depth: int) -> list[tuple[str, Any]]:
    """The program's functions, classes and objects ``value`` holds, each with where (only
    for a value :func:`_holds` found something in)."""
    if not _holds(value, depth):
        return []
    if depth > 0 and _programs_thing(value):
        return [(where, value)]
    keyed = isinstance(value, dict)
    found: list[tuple[str, Any]] = []
    for key, item in _children(value) or ():
        label = (
            f"{where}{key}"
            if isinstance(key, str) and key.startswith(".")
            else (f"{where}[{_key_name(key)}]")
        )
        if keyed and type(key) not in _PLAIN and _programs_thing(key):
            found.append((f"{label}:key", key))
        found.extend(_items(item, label, depth + 1))
    return found


def _programs_thing(value: Any) -> bool:
    """A function, class or object of the program's (not torch's release's)."""
    if isinstance(value, type):
        return not _released(value)
    if type(value) is types.FunctionType and _torch_closure(value):
        # torch's function made around the program's (an autotuning lowering over configs),
        # remembered by the function (torch's decompositions sit in several registries)
        return bool(program_registrations.entry_functions(value))
    if type(value) is types.FunctionType or isinstance(value, (staticmethod, classmethod)):
        return _programs_member(value)
    if isinstance(value, (types.ModuleType, types.BuiltinFunctionType)):
        return False
    if isinstance(value, types.MethodType):
        return _programs_code(value)
    if _released(type(value)):
        return callable(value) and _programs_code(value)  # a partial of the program's
    return True  # an object of a class of the program's


def _key_name(key: Any) -> str:
    if isinstance(key, (str, int)):
        return str(key)
    name = _own_attr(key, "__qualname__") or _own_attr(key, "__name__")
    return str(name) if isinstance(name, str) else type(key).__name__
