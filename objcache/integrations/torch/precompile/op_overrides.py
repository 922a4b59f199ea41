"""The program's own kernels of torch's ops (docs/torch.md, "Custom ops in the keys"), for
every place that says what a compiled graph was traced through.

AOTAutograd traces a ``CompositeImplicitAutograd`` kernel the program registered in Python
for one of torch's own ops (``torch.library.Library("aten", "IMPL").impl("linear", ...)``,
what kernel-patching libraries do) where a graph names ``torch.nn.functional.linear``; no
graph's ops show it and torch guards nothing about it. The plain path keys every graph of
such a process by these overrides (``remote/custom_ops.py``); a precompile entry carries
them in its compiler settings record (:mod:`.compile_settings`), so a reader with other
overrides (or none, or the writer none) compiles the frame. Both use :func:`torch_overrides`
from here: precompile may not import the remote caches (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
from typing import Any

from objcache.integrations.torch.precompile import (
    inductor_namespace,
    program_registrations,
    torch_edits,
    traced_code,
)
from objcache.integrations.torch.timing import compile_windows

#: torch's own operator namespaces: their kernels are torch's, whose release is in every key.
TORCH_NAMESPACES = program_registrations.TORCH_NAMESPACES
_REGISTERED_AT = re.compile(r"registered at (.+?\.py)(?=:\d+)")
#: Dispatch keys whose kernels only say what an op's result looks like (shapes, dtypes),
#: never its values; torch registers a thousand of them in Python itself.
_SHAPE_ONLY_KEYS = frozenset({"Meta"})

_lock = threading.Lock()
#: Python kernels registered through ``Library.impl`` since objcache installed
#: (:func:`record_kernel`): ``"ns::name"`` -> the functions.
_python_kernels: dict[str, list[Any]] = {}
#: How many kernels :func:`record_kernel` heard of: with the size of torch's registry of
#: Python registrations, what says whether the overrides changed (:func:`token`).
_generation = [0]
#: (the :func:`token` they were found at, the overrides then)
_overrides_memo: list[tuple[Any, tuple[str, ...]]] = []
#: (the compile window, what :func:`torch_overrides` named in it): one window's keys share it
_named_memo: list[tuple[Any, tuple[tuple[str, str], ...]]] = []


def record_kernel(name: str, fn: Any) -> None:
    """Note a Python kernel registered for ``ns::name`` (``Library.impl``)."""
    with _lock:
        _python_kernels.setdefault(name, []).append(fn)
        _generation[0] += 1


def token() -> tuple[int, int, int, int]:
    """What changes whenever :func:`torch_overrides` may: the number of Python registrations
    torch keeps (``torch.library._impls``, which a library's removal shrinks) and of the
    kernels :func:`record_kernel` heard of (every ``Library.impl`` once objcache installed).
    And what changes when an entry of Inductor's decomposition or lowering tables does
    (:func:`.program_registrations.tables_token`, ~0.15 ms), and torch's data and tables
    (:func:`.torch_edits.token`, ~0.3 ms): cheap enough for every call of a served entry until
    its settings held."""
    library = sys.modules.get("torch.library")
    impls = getattr(library, "_impls", None)
    return (
        len(impls) if isinstance(impls, set) else -1,
        _generation[0],
        program_registrations.tables_token(),
        torch_edits.token(),
    )


def op_identity(name: str) -> str:
    """What ``ns::name`` does in this process, as far as objcache can say: the dispatcher's
    kernels and where they were registered, the sources named there, its Python kernels,
    and, the same way, each op of the program's its functions call by name
    (``torch.ops.lib.inner(x)`` inside ``lib::outer``'s kernel, which no graph shows)."""
    busy = _identifying.__dict__.setdefault("ops", set())
    if name in busy:
        return "cycle"  # an op whose kernels call it back: named once, where it started
    busy.add(name)
    try:
        with traced_code.names_read_by() as names:
            parts = _own_identity(name)
        for called in sorted(_ops_named(names) - {name}):
            parts.append(f"calls:{called}={op_identity(called)}")
    finally:
        busy.discard(name)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


_identifying = threading.local()
#: (what says the ops changed, ``{namespace: {op, ...}}``) outside torch's namespaces
_namespaces: list[tuple[Any, dict[str, set[str]]]] = []


def _ops_named(names: set[str]) -> set[str]:
    """``ns::op`` for every op outside torch's namespaces whose namespace and name are both
    among ``names`` (the attribute names a code reads: ``torch.ops.ns.op``)."""
    import torch

    # what changes when ops are defined or removed, cheaply (the dispatcher's list of names
    # costs ~1.5 ms): Python definitions (``torch.library._defs``), libraries loaded, modules
    # imported (a C++ extension registers as Python imports it)
    library = sys.modules.get("torch.library")
    defs = getattr(library, "_defs", None)
    version = (
        len(defs) if isinstance(defs, set) else -1,
        hash(frozenset(defs)) if isinstance(defs, set) else 0,
        len(getattr(torch.ops, "loaded_libraries", ())),
        len(sys.modules),
    )
    with _lock:
        known = _namespaces[0] if _namespaces else None
    if known is None or known[0] != version:
        try:
            every = torch._C._dispatch_get_all_op_names()
        except Exception:
            return set()
        table: dict[str, set[str]] = {}
        for qualified in every:
            ns, _, op = qualified.partition("::")
            if ns not in TORCH_NAMESPACES:
                table.setdefault(ns, set()).add(op.split(".", 1)[0])
        known = (version, table)
        with _lock:
            _namespaces[:] = [known]
    found: set[str] = set()
    for ns in names.intersection(known[1]):
        found.update(f"{ns}::{op}" for op in names.intersection(known[1][ns]))
    return found


def _own_identity(name: str) -> list[str]:
    import torch

    parts = [name]
    try:
        dump = str(torch._C._dispatch_dump(name))
    except Exception:
        dump = "no dump"
    # a Python source is named by its content, not its path (another venv, another machine)
    parts.append(
        _REGISTERED_AT.sub(lambda m: f"registered at {traced_code.source_digest(m[1])}", dump)
    )
    if _native_registrations(dump):
        # a C++ kernel outside torch's build (a kernel library's extension): named by the
        # binaries the process loaded, not by its build's source paths (the same in every
        # version of the library)
        parts.append("native:" + program_registrations.native_libraries())
    with _lock:
        kernels = list(_python_kernels.get(name, ()))
    for fn in kernels:
        parts.extend(traced_code.function_identity(fn))
    for label, fn in program_registrations.registry_functions(name):
        # its fake kernel and ``__torch_dispatch__`` rules (``register_fake``,
        # ``register_torch_dispatch``), which torch keeps outside the dispatcher
        parts.append(f"{label}=" + ",".join(traced_code.function_identity(fn)))
    if (not kernels and _python_registrations(name)) or _unrecorded_python_kernel(name, dump):
        # a Python kernel registered before objcache installed: its function is not known,
        # only where it was registered (a library's helper, the same in every version), so
        # nothing says what it does: a key of this process alone (a miss, never another's)
        parts.append(traced_code.UNIDENTIFIED)
        with _lock:
            unidentified.add(name)
    try:
        from torch._library import custom_ops as library_custom_ops

        opdef = library_custom_ops.OPDEFS.get(name)
    except Exception:
        opdef = None
    if opdef is not None:
        # everything its definition holds: each function (kernels, fake kernel, backward,
        # setup-context, vmap and dispatch rules) by what decides what it computes, its
        # settings (autocast dtypes, disabled devices, tags) by value
        for attr, value in sorted(vars(opdef).items()):
            parts.append(f"{attr}={traced_code.value_identity(value, 0)}")
    return parts


#: Ops with a Python kernel registered before objcache installed (:func:`op_identity`).
unidentified: set[str] = set()


_REGISTERED_IN = re.compile(r"registered at (\S+?):\d+")
_torch_build: list[str] = []


def _native_registrations(dump: str) -> bool:
    """Whether the dispatcher's record names a kernel registered from C++ outside torch's
    own build (whose source root its ``aten`` kernels name)."""
    if not _torch_build:
        import torch

        try:
            add = str(torch._C._dispatch_dump("aten::add.Tensor"))
            where = _REGISTERED_IN.search(add.split("CPU:", 1)[-1])
            path = where[1] if where else ""
        except Exception:
            path = ""
        # ``/__w/pytorch/pytorch/build/aten/src/...`` -> ``/__w/pytorch/pytorch/``
        for marker in ("/build/", "/aten/", "/torch/"):
            if marker in path:
                path = path.split(marker, 1)[0] + "/"
                break
        _torch_build.append(path or "\0")
    root = _torch_build[0]
    for where in _REGISTERED_IN.findall(dump):
        if not where.endswith(".py") and not where.startswith(root):
            return True
    return False


_KERNEL_LINE = re.compile(r"^(\w+)(?:\[alias\])?: registered at (.+?):\d+", re.M)


def _unrecorded_python_kernel(name: str, dump: str) -> bool:
    """Whether the dispatcher holds a Python kernel of the program's for ``ns::name`` at a
    key no ``Library.impl`` registered (``lib.m.impl(...)``, the C++ library object's own
    method): its function is not known here, so nothing says what it computes."""
    library = sys.modules.get("torch.library")
    impls = getattr(library, "_impls", None)
    known = impls if isinstance(impls, set) else set()
    ns, _, op = name.partition("::")
    for key, path in _KERNEL_LINE.findall(dump):
        python = path.endswith(".py") or path.startswith("<")
        if key == "debug" or not python or key in _SHAPE_ONLY_KEYS:
            continue  # ``debug``: where the schema was defined
        if program_registrations.in_torch(path):
            continue
        if f"{ns}/{op}/{key}" not in known and not any(
            e.startswith(f"{ns}/{op}.") and e.endswith(f"/{key}") for e in known
        ):
            return True
    return False


def _python_registrations(name: str) -> bool:
    """Whether a Python kernel registered by the program (not torch, not shape-only) is in
    place for ``ns::name`` (``torch.library._impls``)."""
    library = sys.modules.get("torch.library")
    impls = getattr(library, "_impls", None)
    if not isinstance(impls, set):
        return False
    ns, _, op = name.partition("::")
    for entry in list(impls):
        parts = entry.split("/")
        if len(parts) != 3 or parts[0] != ns or parts[1].split(".", 1)[0] != op:
            continue
        if parts[2] not in _SHAPE_ONLY_KEYS and not registered_by_torch(name, parts[2]):
            return True
    return False


def torch_overrides() -> tuple[tuple[str, str], ...]:
    """``((op, identity), ...)`` for each op of torch's own namespaces whose kernel the
    program registered in Python (``torch.library.Library("aten", "IMPL").impl(...)``):
    AOTAutograd traces that kernel where a graph names ``torch.nn.functional.linear``, which
    no graph's ops show, so such an override keys every graph of the process. Registrations
    torch makes itself (from its own sources, or of shape-only kernels) are left out: they
    are part of the release in every key. Found again only when :func:`token` changes, and
    named once per compile window (:mod:`objcache.integrations.torch.timing.compile_windows`:
    the program does not run there)."""
    window = compile_windows.reading_id()
    with _lock:
        if window is not None and _named_memo and _named_memo[0][0] == window:
            return _named_memo[0][1]
    named = _torch_overrides()
    with _lock:
        _named_memo[:] = [(window, named)] if window is not None else []
    return named


def _torch_overrides() -> tuple[tuple[str, str], ...]:
    import torch.library

    impls = getattr(torch.library, "_impls", None)
    if not isinstance(impls, set):
        return ()
    now = token()
    with _lock:
        known = _overrides_memo[0] if _overrides_memo else None
        later = [n for n in _python_kernels if n.split("::", 1)[0] in TORCH_NAMESPACES]
    if known is not None and known[0] == now:
        # which ops are overridden is known; what each computes is named again
        return _named(known[1])
    mine = [
        entry
        for entry in list(impls)
        if entry.split("/", 1)[0] in TORCH_NAMESPACES
        and entry.rsplit("/", 1)[-1] not in _SHAPE_ONLY_KEYS
    ]
    names: set[str] = set()
    present: set[str] = set()
    for entry in mine:
        ns, op, key = entry.split("/")
        name = f"{ns}::{op.split('.', 1)[0]}"
        present.add(name)
        if not registered_by_torch(name, key):
            names.add(name)
    # registered through torch's own helpers (``@torch.library.impl``: the dispatcher names
    # torch's file), while still registered
    names.update(n for n in later if n in present)
    overridden = tuple(sorted(names))
    with _lock:
        _overrides_memo[:] = [(now, overridden)]
    return _named(overridden)


def _named(overridden: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The overridden ops, the program's table entries and its edits of torch's own data
    and tables, each named as it is now (the values its kernels read may have changed since
    the registrations did)."""
    found = tuple((f"override:{name}", op_identity(name)) for name in overridden)
    entries = program_registrations.table_overrides()
    named = {label for label, _ in entries}
    # a table entry that is the program's code is named once, by what it computes
    edits = tuple(e for e in torch_edits.changes() if e[0].split(":", 1)[1] not in named)
    return (
        found
        + entries
        + program_registrations.config_callables()
        + inductor_namespace.overrides()
        + edits
    )


def registered_by_torch(name: str, key: str) -> bool:
    """Whether the dispatcher says ``key``'s kernel of ``name`` was registered from torch's
    own files (a C++ source of its build, or a Python file of its package)."""
    import torch

    try:
        dump = str(torch._C._dispatch_dump(name))
    except Exception:
        return False
    home = os.path.dirname(torch.__file__) + os.sep  # not torchvision's, beside it
    for line in dump.splitlines():
        if line.startswith(f"{key}:") or line.startswith(f"{key}[alias]:"):
            # only Python registrations are in ``_impls``: torch's come from its package
            where = line.split("registered at ", 1)[-1].split(":", 1)[0]
            return where.startswith(home)
    return True  # no such kernel now: nothing of the program's runs there
