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
(:func:`torch_overrides`).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from objcache.integrations.patching import is_marked, marked
from objcache.integrations.torch.precompile import compile_settings, portable_guards

counters: Counter[str] = Counter()

#: torch's own operator namespaces: their kernels are torch's, whose release is in every key.
TORCH_NAMESPACES = frozenset({"aten", "prims", "prim", "higher_order"})
#: The field added to a key-details object.
FIELD = "_objcache_custom_ops"
#: Largest source file digested (a larger one is named by size and mtime).
MAX_SOURCE_BYTES = 8 << 20
_REGISTERED_AT = re.compile(r"registered at (.+?\.py)(?=:\d+)")

_lock = threading.Lock()
#: Python kernels registered through ``Library.impl`` since objcache installed:
#: ``"ns::name"`` -> code digests.
_python_kernels: dict[str, list[str]] = {}
_sources: dict[tuple[str, int, int], str] = {}
_patched: list[tuple[Any, str, Any]] = []


def _ops_of(gm: Any) -> Iterator[str]:
    """``ns::name`` of every op outside torch's namespaces the graph (and its subgraphs)
    calls."""
    graphs = [gm]
    seen: set[int] = set()
    while graphs:
        module = graphs.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        graph = getattr(module, "graph", None)
        for node in getattr(graph, "nodes", ()):
            if getattr(node, "op", None) == "get_attr":
                sub = getattr(module, str(node.target), None)
                if getattr(sub, "graph", None) is not None:
                    graphs.append(sub)
            if getattr(node, "op", None) != "call_function":
                continue
            name = _qualified_name(node.target)
            if name is not None and name.split("::", 1)[0] not in TORCH_NAMESPACES:
                yield name


def _qualified_name(target: Any) -> str | None:
    """``ns::name`` of an ``OpOverload`` or ``OpOverloadPacket``, else None."""
    qualified = getattr(target, "_qualified_op_name", None)  # a packet
    if isinstance(qualified, str):
        return qualified
    schema = getattr(target, "_schema", None)
    name = getattr(schema, "name", None)
    return name if isinstance(name, str) and "::" in name else None


def _source_digest(path: str) -> str:
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


def op_identity(name: str) -> str:
    """What ``ns::name`` does in this process, as far as objcache can say: the dispatcher's
    kernels and where they were registered, the sources named there, its Python kernels."""
    import torch

    parts = [name]
    try:
        dump = str(torch._C._dispatch_dump(name))
    except Exception:
        dump = "no dump"
    # a Python source is named by its content, not its path (another venv, another machine)
    parts.append(_REGISTERED_AT.sub(lambda m: f"registered at {_source_digest(m[1])}", dump))
    with _lock:
        parts.extend(_python_kernels.get(name, ()))
    try:
        from torch._library import custom_ops as library_custom_ops

        opdef = library_custom_ops.OPDEFS.get(name)
    except Exception:
        opdef = None
    if opdef is not None:
        fns = [getattr(opdef, "_init_fn", None), getattr(opdef, "_abstract_fn", None)]
        fns.extend((getattr(opdef, "_backend_fns", None) or {}).values())
        for fn in fns:
            code = getattr(fn, "__code__", None)
            if code is not None:
                parts.append(portable_guards.code_digest(code))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def graph_identity(gm: Any) -> tuple[tuple[str, str], ...]:
    """``((op, identity), ...)`` for the ops outside torch's namespaces ``gm`` calls, then
    every op of torch's own namespaces whose kernel the program replaced
    (:func:`torch_overrides`)."""
    ops = tuple((name, op_identity(name)) for name in sorted(set(_ops_of(gm))))
    return ops + torch_overrides()


#: Dispatch keys whose kernels only say what an op's result looks like (shapes, dtypes),
#: never its values; torch registers a thousand of them in Python itself.
_SHAPE_ONLY_KEYS = frozenset({"Meta"})
#: the sizes of ``_impls`` and of the Python kernels recorded -> the overrides then
_overrides_memo: dict[int, tuple[tuple[str, str], ...]] = {}


def torch_overrides() -> tuple[tuple[str, str], ...]:
    """``((op, identity), ...)`` for each op of torch's own namespaces whose kernel the
    program registered in Python (``torch.library.Library("aten", "IMPL").impl(...)``):
    AOTAutograd traces that kernel where a graph names ``torch.nn.functional.linear``, which
    no graph's ops show, so such an override keys every graph of the process. Registrations
    torch makes itself (from its own sources, or of shape-only kernels) are left out: they
    are part of the release in every key."""
    import torch.library

    impls = getattr(torch.library, "_impls", None)
    if not isinstance(impls, set):
        return ()
    with _lock:
        later = [n for n in _python_kernels if n.split("::", 1)[0] in TORCH_NAMESPACES]
        # registrations are added (a library's are dropped only with it): the sizes say
        # whether anything changed since the last graph's key
        token = hash((len(impls), sum(len(_python_kernels[n]) for n in later)))
        known = _overrides_memo.get(token)
    if known is not None:
        return known
    mine = [
        entry
        for entry in list(impls)
        if entry.split("/", 1)[0] in TORCH_NAMESPACES
        and entry.rsplit("/", 1)[-1] not in _SHAPE_ONLY_KEYS
    ]
    names = set(later)
    for entry in mine:
        ns, op, key = entry.split("/")
        name = f"{ns}::{op.split('.', 1)[0]}"
        if not _registered_by_torch(name, key):
            names.add(name)
    found = tuple((f"override:{name}", op_identity(name)) for name in sorted(names))
    with _lock:
        _overrides_memo[token] = found
    return found


def _registered_by_torch(name: str, key: str) -> bool:
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


def _wrap_details_init(original: Callable[..., None]) -> Any:
    def __init__(self: Any, gm: Any, *args: Any, **kwargs: Any) -> None:
        original(self, gm, *args, **kwargs)
        if FIELD in self.__dict__:
            return
        try:
            ops = graph_identity(gm)
            off = compile_settings.sdp_backends_off()
        except Exception as exc:  # never a key torch would share with another implementation
            ops = (("<unreadable>", f"{type(exc).__name__}:{os.urandom(8).hex()}"),)
            off = ()
            counters["unreadable"] += 1
        if off:
            ops += (("sdp_backends_off", ",".join(off)),)
        if ops:
            self.__dict__[FIELD] = ops
            counters["keyed_graphs"] += 1

    marked(__init__, original)
    return __init__


def _wrap_library_impl(original: Callable[..., Any]) -> Any:
    def impl(self: Any, op_name: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, op_name, fn, *args, **kwargs)
        try:
            name = op_name if isinstance(op_name, str) else _qualified_name(op_name) or ""
            if "::" not in name:
                name = f"{self.ns}::{name}"
            name = name.split(".", 1)[0]
            code = getattr(fn, "__code__", None)
            module = str(getattr(fn, "__module__", "") or "")
            torchs = name.split("::", 1)[0] in TORCH_NAMESPACES and (
                module == "torch" or module.startswith("torch.")
            )
            if code is not None and not torchs:  # torch's own kernels are in its release
                with _lock:
                    _python_kernels.setdefault(name, []).append(portable_guards.code_digest(code))
        except Exception:
            counters["impl_unrecorded"] += 1
        return result

    marked(impl, original)
    return impl


def _patch(obj: Any, attr: str, value: Any) -> None:
    _patched.append((obj, attr, obj.__dict__.get(attr)))
    setattr(obj, attr, value)


def apply(details_classes: list[Any]) -> None:
    """Add the field to each key-details class, and record ``Library.impl`` kernels."""
    import torch.library

    with _lock:
        for cls in details_classes:
            init = cls.__dict__.get("__init__")
            if init is not None and not is_marked(init):
                _patch(cls, "__init__", _wrap_details_init(init))
        library = torch.library.Library
        impl = library.__dict__.get("impl")
        if impl is not None and not is_marked(impl):
            _patch(library, "impl", _wrap_library_impl(impl))


def uninstall() -> None:
    with _lock:
        for obj, attr, value in reversed(_patched):
            if value is None:
                continue
            setattr(obj, attr, value)
        _patched.clear()
