"""Portable replacements for the guards torch cannot save in a precompile entry
(docs/torch.md, "Precompile entries: what a served entry still checks").

torch's guards on *which object* a name holds (``ID_MATCH``, ``CLOSURE_MATCH``,
``DICT_VERSION``, ``WEAKREF_ALIVE`` and the guards derived from them: ``BUILTIN_MATCH``,
``MODULE_MATCH``, ``FUNCTION_MATCH``, ``CLASS_MATCH``, ``NN_MODULE``) hold object ids, which
mean nothing in another process; under ``caching_precompile`` torch drops them, from the
saved entry *and* from the live process. Then ``ACT = getattr(torch, os.environ["ACT"])``
saved with ``relu`` is served to a process that chose ``sigmoid``, and rebinding
``self.act`` after a compile keeps the old code.

This module replaces each such guard by a portable one, or refuses the frame:

* **writer**: torch builds the live guards as a normal compile does (nothing dropped; the
  precompile part turns torch's filter off); only the saved copy leaves them out
  (:func:`split`), each replaced
  by a :class:`Portable` record: the guard's source (``G['ACT']``, ``L['self'].act``, only
  subscripts by constant and attributes) and the portable identity of the object it held
  (:func:`identity`: a module's name; a function's, builtin's or class's module and
  qualified name, plus a Python function's code digest and its closure's identities; a
  constant; a dict of such values by content). A guard whose object has no portable identity
  makes the frame unsaveable (:class:`Unportable`, counted ``unsaved:dropped_guard:<kind>``):
  torch then bypasses its package and the process compiles as usual. The records travel
  appended to the very guards state they belong to (:func:`attach`), so they can never be
  paired with another guarded code's.
* **reader**: every guarded code of a served entry gets one more guard, run after all of
  torch's own (:func:`check_for`), that resolves each record's source in the frame's locals
  and the module's globals and compares identities, at every call, where torch checks its
  own guards: a mismatch is a guard failure, so Dynamo compiles that frame normally. An object
  that passed is remembered: the same object again passes without recomputing its
  identity (what torch's ``ID_MATCH`` checks), except dicts, lists and tuples, whose
  contents are checked at every call (``DICT_VERSION``'s job).
"""

from __future__ import annotations

import abc
import ast
import builtins
import copyreg
import dataclasses
import enum
import hashlib
import json
import keyword
import logging
import operator
import re
import struct
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

from objcache.integrations.torch.precompile.unguarded import object_aliasing

log = logging.getLogger("objcache.torch")

#: Guard kinds torch drops under caching precompile (``CheckFunctionManager.__init__``) or
#: cannot serialize (``UNSUPPORTED_SERIALIZATION_GUARD_TYPES``).
DROPPED = frozenset(
    {
        "ID_MATCH",
        "CLOSURE_MATCH",
        "WEAKREF_ALIVE",
        "DICT_VERSION",
        "NN_MODULE",
        "FUNCTION_MATCH",
        "CLASS_MATCH",
        "MODULE_MATCH",
    }
)
#: How deep :func:`identity` follows closures and containers.
MAX_DEPTH = 4
#: Largest dict :func:`identity` digests by content.
MAX_DICT = 256
#: Most objects one identity visits, and its longest rendering: a record's check at every
#: call is bounded (a value over either makes the frame unsaveable at save).
MAX_NODES = 1024
MAX_IDENTITY_CHARS = 32768
#: Most records one frame may carry (each is resolved at every call).
MAX_RECORDS = 2048
_CONSTANTS = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis))
#: torch's value types, each fully said by its repr (``torch.float32``, ``device(type='cpu')``).
_TORCH_VALUES = frozenset({"dtype", "device", "layout", "memory_format"})


class Unportable(Exception):
    """A dropped guard with no portable replacement: the frame is not saved."""

    def __init__(self, kind: str, source: str, why: str) -> None:
        super().__init__(f"{kind} guard on {source} has no portable replacement ({why})")
        self.kind = kind


@dataclasses.dataclass(frozen=True)
class Portable:
    """One replaced guard: where the object is found and what it must be."""

    source: str
    kind: str
    identity: str


def dropped_kind(guard: Any) -> str | None:
    """The kind under which torch would drop ``guard`` from a saved entry, or None."""
    kind = str(guard.create_fn_name())
    derived = tuple(getattr(guard, "guard_types", None) or ())
    return kind if kind in DROPPED or any(d in DROPPED for d in derived) else None


# --- identities ------------------------------------------------------------------------------


def code_digest(code: types.CodeType) -> str:
    """What a code object does (bytecode, names, constants, nested code), not its path."""
    known = _digests.get(id(code))
    if known is not None and known[0] is code:
        return known[1]
    h = hashlib.sha256()
    code_into(code, h)
    digest = h.hexdigest()[:32]
    if len(_digests) > 65_536:
        _digests.clear()
    _digests[id(code)] = (code, digest)
    return digest


#: id of a code object -> (the code, its digest): code never changes, a class's many
#: methods are digested again for each class layout (:func:`class_layout`)
_digests: dict[int, tuple[types.CodeType, str]] = {}


def code_into(code: types.CodeType, h: Any) -> None:
    h.update(code.co_code)
    for attr in ("co_names", "co_varnames", "co_freevars", "co_cellvars"):
        h.update(("\0".join(getattr(code, attr)) + "\1").encode())
    for attr in ("co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_flags"):
        h.update(f"{getattr(code, attr)}\0".encode())
    h.update(f"{code.co_name}\0{code.co_firstlineno}\0".encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            code_into(const, h)
        elif isinstance(const, frozenset):  # iteration order follows the str hash seed
            h.update(("{" + "\0".join(sorted(repr(v) for v in const)) + "}").encode())
        else:
            h.update(f"{type(const).__name__}:{const!r}\0".encode())


def _reachable(value: Any, module: Any, path: str) -> str | None:
    """``module.path`` where that module holds ``value`` under that dotted path, else None."""
    if not isinstance(module, str):
        return None
    target: Any = sys.modules.get(module)
    for part in path.split("."):
        target = getattr(target, part, None)
    return f"{module}.{path}" if target is value else None


#: The types of a C class's methods and attributes read from the class itself
#: (``torch.Tensor.relu``, ``torch.Tensor.__add__``, ``torch.Tensor.T``).
DESCRIPTORS = (
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
    types.ClassMethodDescriptorType,
)


def _named(value: Any) -> str | None:
    """``module.qualname`` of a function, builtin or class that is reachable by that name
    (so that the name means the same object in another process), else None."""
    if isinstance(value, DESCRIPTORS):
        # a C class's method or attribute taken from the class (``torch.Tensor.relu``):
        # named by its class and name
        owner = _named(getattr(value, "__objclass__", None))
        name = getattr(value, "__name__", None)
        return None if owner is None or not isinstance(name, str) else f"{owner}#{name}"
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if not isinstance(qualname, str):
        return None
    if "<" in qualname:
        # a lambda, or defined in a local scope: reached only where its module holds it
        # under its own name (``torch.nn.functional.max_pool2d``, built by a decorator)
        name = getattr(value, "__name__", None)
        if isinstance(value, types.FunctionType) and isinstance(name, str) and "<" not in name:
            return _reachable(value, module, name)
        return None
    if isinstance(value, types.BuiltinFunctionType | types.BuiltinMethodType):
        # builtins from C: their module and name are fixed by the implementation. One bound
        # to an object (``registry.append``) names that object too: only a module, a class
        # (``dict.fromkeys``) or a module that holds it under its name (an extension's
        # function whose ``__self__`` is a capsule: ``torch._C._get_tracing_state``) does
        bound = getattr(value, "__self__", None)
        if bound is None or isinstance(bound, types.ModuleType):
            return f"{module}.{qualname}"
        if isinstance(bound, type):
            owner = _named(bound)
            return None if owner is None else f"{owner}#{qualname}"
        name = getattr(value, "__name__", None)  # pybind11 qualifies by its record type
        return _reachable(value, module, name) if isinstance(name, str) else None
    return _reachable(value, module, qualname)


def class_layout(cls: type) -> str | None:
    """The code a class's instances run, as a short suffix of its identity: each class of
    its method resolution order that holds Python code, by name, and the functions,
    properties, builtins and descriptors its own dict holds, by name and code. Dynamo reads
    an object's method through ``type(obj).__mro__`` and never guards what it found (one
    process never changes a class's methods): a reader whose ``Net`` derives from another
    base chosen at start-up, or whose ``nn.GELU.forward`` the program did (or did not)
    replace, names another layout. None where such a class has no portable name. Classes
    with no Python code of their own (C's types, pybind11's) are left out: empty for a
    class made of them alone."""
    mro = getattr(cls, "__mro__", None)
    h, found = hashlib.sha256(), False
    for base in mro if isinstance(mro, tuple) else ():
        own = vars(base)
        if not any(_python_code(member) for member in list(own.values())):
            continue
        name = _named(base)
        if name is None:
            return None
        found = True
        h.update(f"{name}\1".encode())
        for attr, member in list(own.items()):
            named = _member_code(member)
            if named is not None:
                h.update(f"{attr}={named}\0".encode())
    return "@" + h.hexdigest()[:24] if found else ""


def _python_code(member: Any) -> bool:
    if isinstance(member, staticmethod | classmethod):
        member = member.__func__
    if isinstance(member, property):
        member = member.fget
    return isinstance(member, types.FunctionType)


def _member_code(member: Any) -> str | None:
    """What a class attribute runs when called: a function's home and code, a property's
    accessors', a builtin's or descriptor's name; None for data (torch guards the values it
    reads) and for what has no name (counted as what it is)."""
    if isinstance(member, staticmethod | classmethod):
        member = member.__func__
    if isinstance(member, property):
        parts = [_member_code(f) if f is not None else "-" for f in (member.fget, member.fset)]
        return "property:" + ",".join(p or "?" for p in parts)
    if isinstance(member, types.FunctionType):
        home = _named(member) or _labelled(member) or "unnamed"
        return f"{home}:{code_digest(member.__code__)}"
    if isinstance(member, (*DESCRIPTORS, types.BuiltinFunctionType)):
        return _named(member) or str(type(member).__name__)
    return None


def _labelled(fn: types.FunctionType) -> str | None:
    """``module:qualname`` of a Python function no name reaches (a lambda, a closure, the
    function a decorator wraps), where its globals are a module's: what it does is then
    its code, defaults and closure, which :func:`identity` adds; the module, which Dynamo
    reaches by name, is the same module in any process. The module and qualified name are
    the code's own (its globals' ``__name__``, ``co_qualname``), never what
    ``functools.wraps`` copied onto a wrapper. None for code run with globals of its own
    (``exec``)."""
    scope = fn.__globals__
    module = scope.get("__name__") if isinstance(scope, dict) else None
    held = sys.modules.get(module) if isinstance(module, str) else None
    if held is None or scope is not getattr(held, "__dict__", None):
        return None
    return f"{module}:{getattr(fn.__code__, 'co_qualname', fn.__qualname__)}"


def identity(value: Any, depth: int = 0, within: tuple[int, ...] = ()) -> str | None:
    """A string that names ``value`` the same way in any process, or None (also where naming
    it would visit more than :data:`MAX_NODES` objects or say more than
    :data:`MAX_IDENTITY_CHARS`: a record's check at every call stays bounded)."""
    found = _identity(value, depth, within, [MAX_NODES])
    return found if found is None or len(found) <= MAX_IDENTITY_CHARS else None


def _identity(value: Any, depth: int, within: tuple[int, ...], budget: list[int]) -> str | None:
    """A string that names ``value`` the same way in any process, or None. ``within``: the
    ids of the functions whose closures are being named around this value; a cell that holds
    one of them (a wrapper that refers to itself, as ``type(self).forward is wrapper``) is
    named by how many levels up it is, so the name stays finite and says the same thing."""
    budget[0] -= 1
    if depth > MAX_DEPTH or budget[0] < 0:
        return None
    if isinstance(value, enum.Enum):  # an IntEnum member is an int too: its class first
        owner = _named(type(value))
        # and its value: Dynamo folds it into the graph (``x * Lvl.N``), and a class body can
        # compute it at start-up (``N = int(os.environ["N"])``: the thirty-fourth review)
        held = _identity(value.value, depth + 1, within, budget)
        return None if owner is None or held is None else f"enum:{owner}.{value.name}={held}"
    if isinstance(value, _CONSTANTS):
        return f"const:{type(value).__name__}:{value!r}"
    if isinstance(value, types.ModuleType):
        return f"module:{value.__name__}"
    if isinstance(value, types.CodeType):  # a method's ``__code__``: what it does
        return f"code:{code_digest(value)}"
    if isinstance(value, types.FunctionType):
        if id(value) in within:
            return f"ref:{len(within) - within.index(id(value))}"
        name = _named(value) or _labelled(value)
        if name is None:
            return None
        cells: list[str] = []
        defaults = [*(value.__defaults__ or ()), *sorted((value.__kwdefaults__ or {}).items())]
        for default in defaults:
            inner = _identity(default, depth + 1, (*within, id(value)), budget)
            if inner is None:
                return None
            cells.append(f"default={inner}")
        for cell in value.__closure__ or ():
            try:
                inner = _identity(cell.cell_contents, depth + 1, (*within, id(value)), budget)
            except ValueError:  # an empty cell
                inner = "empty"
            if inner is None:
                return None
            cells.append(inner)
        return f"function:{name}:{code_digest(value.__code__)}:[{','.join(cells)}]"
    if isinstance(value, type):
        name = _named(value)
        layout = class_layout(value) if name is not None else None
        return None if layout is None else f"class:{name}{layout}"
    if isinstance(value, types.MethodType):
        func = _identity(value.__func__, depth + 1, within, budget)
        owner = _identity(value.__self__, depth + 1, within, budget)
        return None if func is None or owner is None else f"method:{func}@{owner}"
    if type(value).__module__ == "torch" and type(value).__qualname__ in _TORCH_VALUES:
        return f"torch.{type(value).__qualname__}:{value!r}"  # its repr is its value
    named = _named(value) if callable(value) else None
    if named is not None:  # builtins, method descriptors, ufuncs
        return f"builtin:{named}"
    if isinstance(value, dict) and len(value) <= MAX_DICT:
        items: list[str] = []
        for k, v in value.items():
            ik, iv = (
                _identity(k, depth + 1, within, budget),
                _identity(v, depth + 1, within, budget),
            )
            if ik is None or iv is None:
                return None
            items.append(f"{ik}={iv}")
        return "dict:" + hashlib.sha256("\0".join(items).encode()).hexdigest()[:32]
    if isinstance(value, set | frozenset) and len(value) <= MAX_DICT:  # by content; its
        elements = [_identity(v, depth + 1, within, budget) for v in value]  # order: SET_ORDER
        if any(p is None for p in elements):
            return None
        return f"{type(value).__name__}:{{{','.join(sorted(p or '' for p in elements))}}}"
    if isinstance(value, tuple | list) and len(value) <= MAX_DICT:
        parts = [_identity(v, depth + 1, within, budget) for v in value]
        if any(p is None for p in parts):
            return None
        return f"{type(value).__name__}:[{','.join(p or '' for p in parts)}]"
    return None


# --- sources ---------------------------------------------------------------------------------

#: One step from a root (``L``, ``G`` or ``M``): ("item", key), ("attr", name), ("item_at",
#: (root, steps)) for a key another source names, their ``dict.__getitem__`` forms
#: ("dict_item", "dict_item_at"), or a call step ("type", "keys", ...).
Step = tuple[str, Any]


#: How deep a subscript may nest another source as its key (``X[list(dict.keys(D))[0]]``).
MAX_NESTED = 3


def parse_source(source: str) -> tuple[str, tuple[Step, ...]] | None:
    """``("L"|"G"|"M", steps)`` of a guard source made of constant subscripts and attributes
    (``G['ACT']``, ``L['self'].act``, ``G['CFG']['act']``), an import of a module by name
    and its attributes (``__import__('torch')``, root ``M``), and subscripts whose key is
    itself such a source (``M[...][list(dict.keys(G['C'].__dict__))[0]]``, how Dynamo names
    a dict entry keyed by an object), each also as ``dict.__getitem__(D, K)`` (how it names
    an entry of a dict subclass), or None for anything else."""
    try:
        node: ast.expr = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return _parse(node, 0)


def _parse(node: ast.expr, depth: int) -> tuple[str, tuple[Step, ...]] | None:
    steps: list[Step] = []
    while True:
        if isinstance(node, ast.Attribute):
            steps.append(("attr", node.attr))
            node = node.value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
            if not isinstance(key, str | int):
                return None
            steps.append(("item", key))
            node = node.value
        elif isinstance(node, ast.Subscript):  # the key is the object another source names
            inner = _parse(node.slice, depth + 1) if depth < MAX_NESTED else None
            if inner is None:
                return None
            steps.append(("item_at", inner))
            node = node.value
        elif isinstance(node, ast.Name) and node.id in ("L", "G") and steps:
            steps.reverse()
            if steps[0][0] != "item":
                return None
            return node.id, tuple(steps)
        elif _type_of(node) is not None:  # ``type(X)``
            steps.append(("type", None))
            node = _type_of(node)  # type: ignore[assignment]
        elif _keys_of(node) is not None:  # ``list(dict.keys(D))``: a dict's keys in order
            steps.append(("keys", None))
            node = _keys_of(node)  # type: ignore[assignment]
        elif _class_dict_of(node) is not None:  # ``dict(C.__dict__)``: a class's own members
            steps.append(("dict_of", None))
            node = _class_dict_of(node)  # type: ignore[assignment]
        elif (pair := _dict_getitem_of(node)) is not None:  # ``dict.__getitem__(D, K)``
            mapping, key_node = pair
            if isinstance(key_node, ast.Constant) and isinstance(key_node.value, str | int):
                steps.append(("dict_item", key_node.value))
            else:
                inner = _parse(key_node, depth + 1) if depth < MAX_NESTED else None
                if inner is None:
                    return None
                steps.append(("dict_item_at", inner))
            node = mapping
        elif _imported_name(node) is not None:  # ``__import__('torch')``, then attributes
            steps.reverse()
            return "M", (("import", _imported_name(node)), *steps)
        else:
            return None


def _argument_of(node: ast.expr, function: str) -> ast.expr | None:
    """``X`` of the expression ``function(X)`` (one positional argument), else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == function
        and len(node.args) == 1
        and not node.keywords
    ):
        return node.args[0]
    return None


def _type_of(node: ast.expr) -> ast.expr | None:
    """``X`` of the expression ``type(X)``, else None."""
    return _argument_of(node, "type")


def _dict_call_of(node: ast.expr | None, method: str, count: int) -> list[ast.expr] | None:
    """The ``count`` arguments of the expression ``dict.<method>(...)``, else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "dict"
        and node.func.attr == method
        and len(node.args) == count
        and not node.keywords
    ):
        return node.args
    return None


def _keys_of(node: ast.expr) -> ast.expr | None:
    """``D`` of the expression ``list(dict.keys(D))``, else None."""
    args = _dict_call_of(_argument_of(node, "list"), "keys", 1)
    return None if args is None else args[0]


def _dict_getitem_of(node: ast.expr) -> tuple[ast.expr, ast.expr] | None:
    """``(D, K)`` of the expression ``dict.__getitem__(D, K)`` (how Dynamo reads an entry of
    a dict subclass, past any ``__getitem__`` of its own), else None."""
    args = _dict_call_of(node, "__getitem__", 2)
    return None if args is None else (args[0], args[1])


def _class_dict_of(node: ast.expr) -> ast.expr | None:
    """``X`` of the expression ``dict(X.__dict__)`` (how Dynamo reaches a staticmethod or
    classmethod object), else None."""
    inner = _argument_of(node, "dict")
    if isinstance(inner, ast.Attribute) and inner.attr == "__dict__":
        return inner.value
    return None


def _imported_name(node: ast.expr) -> str | None:
    """``name`` of the expression ``__import__('name')``, else None."""
    inner = _argument_of(node, "__import__")
    if isinstance(inner, ast.Constant) and isinstance(inner.value, str):
        return inner.value
    return None


_MISSING = object()


def resolve(root: str, steps: Sequence[Step], f_locals: Any, f_globals: Any) -> Any:
    """The object a parsed source names now, or a sentinel when it is absent. Attributes are
    read with ``getattr`` as the guarded code reads them."""
    value = f_locals if root == "L" else f_globals
    try:
        for how, key in steps:
            if how == "import":  # what the guarded code's ``__import__(key)`` returns
                value = builtins.__import__(key)
            elif how == "dict_of":
                value = dict(value.__dict__)
            elif how == "keys":
                value = list(dict.keys(value))
            elif how == "type":
                value = type(value)
            elif how in ("item_at", "dict_item_at"):  # a key that another source names
                inner_root, inner_steps = key
                inner = resolve(inner_root, inner_steps, f_locals, f_globals)
                if inner is _MISSING:
                    return _MISSING
                value = dict.__getitem__(value, inner) if how == "dict_item_at" else value[inner]
            elif how == "dict_item":
                value = dict.__getitem__(value, key)
            else:
                value = value[key] if how == "item" else getattr(value, key)
    except Exception:
        return _MISSING
    return value


def _plain_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and name.isascii()
        and name.isidentifier()
        and not (keyword.iskeyword(name))
    )


def _missing_key(value: Any, key: Any, f_locals: Any, f_globals: Any, as_dict: bool) -> Any:
    """A subscript by a key another source names (raises where it is absent)."""
    inner = resolve(key[0], key[1], f_locals, f_globals)
    if inner is _MISSING:
        raise LookupError("absent")
    return dict.__getitem__(value, inner) if as_dict else value[inner]


def fast_resolver(
    paths: Sequence[tuple[str, Sequence[Step]]],
) -> Callable[[Any, Any], tuple[Any, ...]] | None:
    """One function that reads every path at once, each shared prefix once (a served
    entry's records mostly hang under the same few modules), as straight-line code; it
    raises where any path is absent (the caller then reads them one by one with
    :func:`resolve`, which says which). Only generated names, plain identifiers (checked)
    and indexes into a tuple of the paths' own keys are written into its source. None where
    a step has no such form."""
    consts: list[Any] = []
    lines = ["def resolve_all(L, G):"]
    #: (parent, step kind, hash of the step) -> (its variable, the step itself)
    nodes: dict[tuple[str, str, int], tuple[str, tuple[str, str, Any]]] = {}
    outs: list[str] = []
    #: a ``dict_of`` node's variable -> the variable of the object whose ``__dict__`` it
    #: copies: an item of it is read from that ``__dict__`` itself, and the copy, made only
    #: where a record holds it, is dropped from the source below otherwise
    proxies: dict[str, str] = {}
    copied: set[str] = set()

    def const(value: Any) -> str:
        consts.append(value)
        return f"K[{len(consts) - 1}]"

    for root, steps in paths:
        var = "L" if root == "L" else "G"
        for how, key in steps:
            try:
                ident = (var, how, hash((how, key)))
                memo = (var, how, key)
            except TypeError:
                return None
            found = nodes.get(ident)
            if found is not None and found[1] == memo:
                var = found[0]
                continue
            if var in proxies and how != "dict_item":
                copied.add(var)  # a step that reads the copy itself
            if how == "dict_item" and var in proxies:  # the object's own dict: no copy
                expr = f"{proxies[var]}.__dict__[{const(key)}]"
            elif how == "import":
                expr = f"_import({const(key)})"
            elif how == "dict_of":
                expr = f"dict({var}.__dict__)"
            elif how == "keys":
                expr = f"list(_keys({var}))"
            elif how == "type":
                expr = f"_type({var})"
            elif how in ("item_at", "dict_item_at"):
                expr = f"_at({var}, {const(key)}, L, G, {how == 'dict_item_at'})"
            elif how == "dict_item":
                expr = f"_getitem({var}, {const(key)})"
            elif how == "item":
                expr = f"{var}[{const(key)}]"
            elif how == "attr" and _plain_name(key):
                expr = f"{var}.{key}"
            elif how == "attr" and isinstance(key, str):
                expr = f"getattr({var}, {const(key)})"
            else:
                return None
            name = f"v{len(nodes)}"
            nodes[ident] = (name, memo)
            lines.append(f"    {name} = {expr}")
            if how == "dict_of":
                proxies[name] = var
            var = name
        outs.append(var)
    lines.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    unused = proxies.keys() - set(outs) - copied
    lines = [line for line in lines if line[4:].split(" = ", 1)[0] not in unused]
    scope: dict[str, Any] = {
        "__builtins__": {"dict": dict, "list": list, "getattr": getattr},
        "K": tuple(consts),
        "_import": builtins.__import__,
        "_keys": dict.keys,
        "_type": type,
        "_at": _missing_key,
        "_getitem": dict.__getitem__,
    }
    try:
        exec(compile("\n".join(lines), "<objcache portable guards>", "exec"), scope)
    except (SyntaxError, RecursionError, MemoryError):
        return None
    resolver: Callable[[Any, Any], tuple[Any, ...]] = scope["resolve_all"]
    return resolver


# --- writer ------------------------------------------------------------------------------------


#: What torch's guards state holds by reference: pickled by name, so the reader's guard is
#: rebuilt from the reader's live object (a module, a class, a function and what hangs
#: under them), never from the writer's value.
BY_REFERENCE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)


#: Guard kinds that carry what they expect in the guard itself (a key, an attribute name,
#: another source), never read from the object at their source when torch rebuilds them:
#: the reader's copy checks the reader's object against the writer's expectation.
SELF_CONTAINED = frozenset(
    {
        "DICT_CONTAINS",
        "DICT_NOT_CONTAINS",
        "NOT_PRESENT_IN_GENERIC_DICT",
        "HASATTR",
        "DUPLICATE_INPUT",
        "NOT_NONE",
    }
)


def under_a_reference(guard: Any, value_of: Callable[[Any], Any]) -> bool:
    """Whether ``guard``'s source passes through an object torch saves by reference
    (``G['cfg'].SCALE``, ``G['Knobs'].bias``, ``type(L['self']).forward``), through an
    attribute an instance finds on its class rather than in its own state
    (``L['d'].__dataclass_fields__``: the instance is pickled by value, the class by
    reference), or through an object that pickles by code of its own
    (:func:`pickled_by_its_own_code`): torch keeps the guard, but on the reader it compares
    the reader's value with itself. A source whose chain cannot be read counts as such (fail
    closed)."""
    node = getattr(guard, "originating_source", None)
    base = getattr(node, "base", None)
    while base is not None:
        try:
            value = value_of(base)
        except Exception:
            return True
        if isinstance(value, BY_REFERENCE) or pickled_by_its_own_code(value):
            return True
        member = getattr(node, "member", None)
        if isinstance(member, str) and _found_on_its_class(value, member):
            return True
        node, base = base, getattr(base, "base", None)
    return False


#: The methods by which a class decides how its instances pickle.
_PICKLE_HOOKS = (
    "__reduce_ex__",
    "__reduce__",
    "__getstate__",
    "__setstate__",
    "__getnewargs_ex__",
    "__getnewargs__",
)
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement


def pickled_by_its_own_code(value: Any) -> bool:
    """Whether ``value`` pickles by a method of the program's own (a ``__reduce__`` that
    rebuilds it from defaults or the environment, a ``__getstate__`` that drops an attribute
    its ``__setstate__`` computes again, a copyreg entry, a name): torch's guards state
    holds what that code writes, and the reader rebuilds the guard from what it reads back
    there, so the value the guard read may not travel (the forty-first review: a config whose
    ``__reduce__`` re-reads a module constant was served the writer's branch). Python's own
    C types and torch's classes pickle their state as it is; undecidable counts as the
    program's."""
    try:
        cls = type(value)
        if cls in copyreg.dispatch_table:
            return cls.__module__ != "torch" and not cls.__module__.startswith("torch.")
        for klass in cls.__mro__:
            if klass is object or not klass.__flags__ & _HEAPTYPE:
                continue  # Python's own C types: their state as it is
            module = str(getattr(klass, "__module__", ""))
            if module == "torch" or module.startswith("torch."):
                continue
            held = vars(klass)
            if any(hook in held for hook in _PICKLE_HOOKS):
                return True
    except Exception:
        return True
    return False


#: What a class holds for each instance's own state (``__slots__``' members, C-level
#: attributes such as ``__dict__``): read from the instance, pickled with it.
_PER_INSTANCE = (types.MemberDescriptorType, types.GetSetDescriptorType)


def _found_on_its_class(obj: Any, member: str) -> bool:
    """Whether ``obj.<member>`` comes from ``obj``'s class (a class attribute, a property,
    a method) rather than from ``obj``'s own state; undecidable counts as the class's."""
    try:
        own = getattr(obj, "__dict__", None)
        if isinstance(own, dict) and member in own:
            return False
        for cls in type(obj).__mro__:
            held = vars(cls).get(member, _MISSING)
            if held is not _MISSING:
                return not isinstance(held, _PER_INSTANCE)
    except Exception:
        return True
    return False  # reached through ``__getattr__`` (a module's submodules): its own state


def _record(kind: str, source: str, guard: Any, value_of: Callable[[Any], Any]) -> Portable:
    """The portable record of what ``guard``'s source held on the writer; raises
    :class:`Unportable` where it has no portable rendering."""
    if parse_source(source) is None:
        raise Unportable(kind, source, "its source is not a plain path")
    try:
        value = value_of(guard)
    except Exception as exc:
        raise Unportable(kind, source, f"its value cannot be read: {exc!r}") from exc
    ident = identity(value)
    if ident is None:
        raise Unportable(kind, source, f"a {type(value).__name__} has no portable name")
    return Portable(source, kind, ident)


#: A module's own hook dicts, which Dynamo does not guard (``skip_nnmodule_hook_guards``): a
#: hook added on the reader runs in eager and would be missing from the served code.
MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
#: The process-wide hooks every module call runs (``register_module_forward_hook`` ...).
GLOBAL_HOOKS = tuple(
    f"__import__('torch').nn.modules.module._global{name}"
    for name in (*MODULE_HOOKS, "_forward_hooks_always_called")
)
HOOKS_KIND = "MODULE_HOOKS"
#: A set's iteration order, which Dynamo folds into a trace with no guard (a guard on a set
#: compares its contents): salted per process for strings (:mod:`.hash_order`).
SET_ORDER_KIND = "SET_ORDER"
GLOBAL_HOOKS_KIND = "GLOBAL_HOOKS"
INLINED_KIND = "INLINED_CODE"
#: Record kinds of facts torch checks only when it compiles a frame (one process never
#: changes a class's methods, as torch assumes): checked until a served code's whole guard
#: first holds in the process, as a normal compile would have read them then.
UNGUARDED_KIND = "UNGUARDED_VALUE"
#: The class a kept ``TYPE_MATCH`` checks, by its bases and methods (:func:`class_layout`).
LAYOUT_KIND = "CLASS_LAYOUT"
#: Names the trace looked up in an object and did not find (:mod:`.absent_names`): none
#: may be there on the reader.
ABSENT_KIND = "ABSENT_NAMES"
#: Keys the trace looked up in a dict a guard's source reaches and did not find
#: (:mod:`.absent_names`; torch guards no such absence): none may be there on the reader.
ABSENT_KEYS_KIND = "ABSENT_KEYS"
#: Keys an object's ``__dict__`` held when the trace asked whether it held them (torch
#: guards no such answer): each must be there on the reader.
PRESENT_KEYS_KIND = "PRESENT_KEYS"
#: What the trace asked an abstract class (:mod:`.unguarded.abc_membership`): each member's
#: answer, asked again on the reader.
MEMBERSHIP_KIND = "ABC_MEMBERSHIP"
CHECKED_ONCE = frozenset(
    {
        INLINED_KIND,
        UNGUARDED_KIND,
        LAYOUT_KIND,
        ABSENT_KIND,
        ABSENT_KEYS_KIND,
        PRESENT_KEYS_KIND,
        MEMBERSHIP_KIND,
    }
)
#: Which guarded objects are one object (:mod:`.unguarded.object_aliasing`).
ALIASES_KIND = object_aliasing.RECORD_KIND
#: The identity of a module with no hooks of its own.
_NO_HOOKS = identity(({}, {}, {}, {}))


def hooks_of(module: Any) -> tuple[Any, ...] | None:
    """A module's own hook dicts (duck-typed: an object that has all four), or None."""
    own = getattr(module, "__dict__", None)
    if not isinstance(own, dict):
        return None
    get = own.get  # at every call of a served entry: no loop
    fwd, pre, bwd, bwd_pre = MODULE_HOOKS
    a, b, c, d = get(fwd), get(pre), get(bwd), get(bwd_pre)
    if isinstance(a, dict) and isinstance(b, dict) and isinstance(c, dict) and isinstance(d, dict):
        return a, b, c, d
    return None


def _hook_records(source: str, value: Any) -> list[Portable]:
    """The record of the hook dicts of ``value`` when it is a module: one record, at the
    module's own source, of kind :data:`HOOKS_KIND` (the reader reads the module's dicts)."""
    hooks = hooks_of(value)
    if hooks is None:
        return []
    ident = identity(hooks)
    if ident is None:
        raise Unportable(HOOKS_KIND, source, "a hook has no portable name")
    return [Portable(source, HOOKS_KIND, ident)]


def global_hook_records() -> tuple[Portable, ...]:
    """The process-wide module hooks as records (empty dicts on most writers); raises
    :class:`Unportable` where a hook has no portable name."""
    out = []
    for source in GLOBAL_HOOKS:
        path = parse_source(source)
        value = resolve(*path, {}, {}) if path is not None else _MISSING
        if value is _MISSING:
            continue  # a torch without that dict: nothing there to run either
        ident = identity(value)
        if ident is None:
            raise Unportable(GLOBAL_HOOKS_KIND, source, "a global hook has no portable name")
        out.append(Portable(source, GLOBAL_HOOKS_KIND, ident))
    return tuple(out)


def inlined_code_records(codes: Sequence[types.CodeType]) -> tuple[Portable, ...]:
    """Records of the functions Dynamo inlined into a frame (all but the frame's own code,
    the first), each as ``<module>.<qualname>`` holding that very function: its code, its
    defaults and what its closure holds (:func:`identity`). torch never guards them (one
    process never changes a class's method), so a patched ``nn.Linear.forward`` on the
    reader would run the writer's inlined code, and a constructor's default computed at
    start-up (``def __init__(self, k=float(os.environ["K"]))``, a dataclass field's default,
    a decorator's closure) would be the writer's, baked into the graph (the thirty-fourth
    review). A local function or lambda is left out: its code is a constant of the code that
    made it, or a dropped guard's record names it. A function no name reaches, or whose
    defaults or closure have no portable name, raises :class:`Unportable`."""
    out: list[Portable] = []
    for code in list(dict.fromkeys(codes))[1:]:
        qualname = str(getattr(code, "co_qualname", code.co_name))
        if "<" in qualname:
            if code.co_filename == "<string>":  # made by ``exec``: a dataclass's ``__init__``
                out.extend(_exec_made_records(code, qualname))
            continue
        source = _code_source(code, qualname)
        if source is None:
            raise Unportable(INLINED_KIND, qualname, "no module name reaches its function")
        function_source = source.removesuffix(".__code__")
        path = parse_source(function_source)
        function = resolve(*path, {}, {}) if path is not None else _MISSING
        named = identity(function) if getattr(function, "__code__", None) is code else None
        if named is None:
            raise Unportable(
                INLINED_KIND, qualname, "its defaults or closure have no portable name"
            )
        out.append(Portable(function_source, INLINED_KIND, named))
    return tuple(out)


def _exec_made_records(code: types.CodeType, qualname: str) -> list[Portable]:
    """Records of the functions made by ``exec`` that hold ``code`` (a dataclass's
    ``__init__``, whose code is ``__create_fn__.<locals>.__init__`` and whose defaults are the
    fields' defaults, bound when the class was made: the thirty-fourth review was served a
    writer's field default computed at start-up), each by the name its function carries
    (``DC.__init__``); one no name reaches raises :class:`Unportable`. Rare (few codes come
    from ``exec``), so the functions are found among the referrers of the code, once per code
    (their names; what each holds is read at every save)."""
    held = _exec_made.get(id(code))
    if held is None or held[0] is not code:
        import gc

        sources = []
        for holder in gc.get_referrers(code):
            if isinstance(holder, types.FunctionType) and holder.__code__ is code:
                module = sys.modules.get(str(holder.__module__))
                source = _path_in(module, code, holder.__qualname__)
                if source is None:
                    raise Unportable(
                        INLINED_KIND, qualname, "a function made by exec has no portable name"
                    )
                sources.append(source.removesuffix(".__code__"))
        if len(_exec_made) > 4096:
            _exec_made.clear()
        held = _exec_made[id(code)] = (code, sources)
    found = []
    for source in held[1]:
        path = parse_source(source)
        function = resolve(*path, {}, {}) if path is not None else _MISSING
        named = identity(function) if getattr(function, "__code__", None) is code else None
        if named is None:
            raise Unportable(INLINED_KIND, qualname, "a function made by exec has no portable name")
        found.append(Portable(source, INLINED_KIND, named))
    if not found:
        raise Unportable(INLINED_KIND, qualname, "no function holds this code made by exec")
    return found


#: id(code) -> (the code, held so its id stays its own; the sources of the functions holding
#: it): a dataclass's ``__init__`` is inlined into every frame that builds one (model outputs)
_exec_made: dict[int, tuple[types.CodeType, list[str]]] = {}


#: Tensor facts Dynamo reads while it traces and never guards (one process keeps passing the
#: same kind of tensor): whether an input is a view of another, pinned, shared. A frame whose
#: traced code reads one is not saved (docs/torch.md, "Precompile entries").
UNGUARDED_TENSOR_FACTS = frozenset(
    {
        "_base",
        "_is_view",
        "is_pinned",
        "is_shared",
        "_version",
        # whether an input is a leaf of autograd's graph: Dynamo folds ``is_leaf`` and
        # ``grad_fn is None`` (no guard checks it: requires_grad alone is guarded)
        "is_leaf",
        "grad_fn",
        "output_nr",
        "retains_grad",
    }
)
UNGUARDED_TENSOR_UNSAVED = "unguarded_tensor_fact"


def unguarded_tensor_read(codes: Sequence[types.CodeType]) -> str | None:
    """The first fact of :data:`UNGUARDED_TENSOR_FACTS` a traced code names, or None."""
    stack = list(dict.fromkeys(codes))
    while stack:
        code = stack.pop()
        if not isinstance(code, types.CodeType):
            continue
        found = UNGUARDED_TENSOR_FACTS.intersection(code.co_names)
        if found:
            return min(found)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return None


def unguarded_value_records(
    codes: Sequence[types.CodeType], f_locals: Any = None
) -> tuple[Portable, ...]:
    """Records of the C classes' methods a frame reads where Dynamo guards nothing: a
    traced code's module global holding one (``ACT = getattr(torch.Tensor, name)``) and a
    module attribute of the frame's local modules and their submodules holding one
    (``self.act = torch.Tensor.relu``). Dynamo turns the call into a method call by name and
    installs no guard on the value (one process never changes it), so a reader that chose
    another method would run the writer's. Each is recorded as the name of what it holds
    there; one with no name raises :class:`Unportable`."""
    import inspect

    out: list[Portable] = []

    def record(source: str, value: Any) -> None:
        ident = identity(value)
        if ident is None:
            raise Unportable(UNGUARDED_KIND, source, "an unguarded value has no portable name")
        out.append(Portable(source, UNGUARDED_KIND, ident))

    for code in dict.fromkeys(codes):
        module = inspect.getmodule(code)
        name = getattr(module, "__name__", None)
        if module is None or not isinstance(name, str) or sys.modules.get(name) is not module:
            continue
        scope = vars(module)
        for attr in dict.fromkeys(code.co_names):
            value = scope.get(attr)
            if isinstance(value, DESCRIPTORS):
                record(import_source(name, attr), value)
    if isinstance(f_locals, dict):
        torch = sys.modules.get("torch")
        module_type = getattr(getattr(torch, "nn", None), "Module", None)
        for local, value in f_locals.items():
            if module_type is None or not isinstance(value, module_type):
                continue
            for path, sub in list(value.named_modules())[:MAX_NODES]:
                for attr, held in list(vars(sub).items()):
                    if not isinstance(held, DESCRIPTORS):
                        continue
                    steps = [*(path.split(".") if path else ()), attr]
                    source = f"L[{local!r}]" + "".join(f".{s}" for s in steps)
                    if not all(s.isidentifier() for s in steps):
                        raise Unportable(UNGUARDED_KIND, source, "no attribute path reaches it")
                    record(source, held)
    return tuple(out)


def import_source(module: str, *attrs: str) -> str:
    """The source of ``module`` imported by name, then ``attrs`` (``__import__('a').b.c``)."""
    top, *below = module.split(".")
    return f"__import__({top!r})" + "".join(f".{s}" for s in (*below, *attrs))


def _code_source(code: types.CodeType, qualname: str) -> str | None:
    """``__import__('<top>').<module path>.<qualname>[.__wrapped__ ...].__code__`` where that
    path reaches ``code`` now, else None. The module is the one ``inspect`` finds by the
    code's file, the one a frozen module's ``<frozen NAME>`` names (``_collections_abc``'s
    ``Mapping.get``), else the first loaded module, by name, whose path reaches the code."""
    import inspect

    first = [inspect.getmodule(code)]
    frozen = re.fullmatch(r"<frozen ([\w.]+)>", code.co_filename)
    if frozen:
        first.append(sys.modules.get(frozen[1]))
    for module in first:
        found = _path_in(module, code, qualname)
        if found is not None:
            return found
    for name in sorted(n for n in list(sys.modules) if isinstance(n, str)):
        found = _path_in(sys.modules.get(name), code, qualname)
        if found is not None:
            return found
    return None


def _path_in(module: Any, code: types.CodeType, qualname: str) -> str | None:
    """The source of ``code`` through ``module`` (see :func:`_code_source`), or None."""
    name = getattr(module, "__name__", None)
    if module is None or not isinstance(name, str) or sys.modules.get(name) is not module:
        return None
    top, *below = name.split(".")
    steps = [*below, *qualname.split(".")]
    target: Any = sys.modules.get(top)
    for step in steps:
        target = getattr(target, step, None)
        if target is None:
            return None
    for _ in range(MAX_DEPTH):
        if isinstance(target, property):
            target, steps = target.fget, [*steps, "fget"]
        elif isinstance(target, types.MethodType):
            target, steps = target.__func__, [*steps, "__func__"]
        if getattr(target, "__code__", None) is code:
            return f"__import__({top!r})" + "".join(f".{s}" for s in (*steps, "__code__"))
        wrapped = getattr(target, "__wrapped__", None)
        if wrapped is None:  # a wrapper holding what it wraps in its closure (Dynamo's own
            return _in_closure(target, code, top, steps)  # patch of nn.Module.__init__)
        target, steps = wrapped, [*steps, "__wrapped__"]
    return None


def _in_closure(fn: Any, code: types.CodeType, top: str, steps: list[str]) -> str | None:
    """The source of ``code`` as the code of a function in one of ``fn``'s closure cells."""
    for i, cell in enumerate(getattr(fn, "__closure__", None) or ()):
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if getattr(held, "__code__", None) is code:
            path = "".join(f".{s}" for s in steps)
            return f"__import__({top!r}){path}.__closure__[{i}].cell_contents.__code__"
    return None


def bounded(records: Sequence[Portable]) -> tuple[Portable, ...]:
    """``records`` without repeats; raises :class:`Unportable` where one frame would carry
    more than :data:`MAX_RECORDS` of them (each is resolved at every call)."""
    unique = tuple(dict.fromkeys(records))
    if len(unique) > MAX_RECORDS:
        raise Unportable("RECORDS", "<frame>", f"more than {MAX_RECORDS} portable records")
    return unique


def _by_value_record(guard: Any, source: str, value_of: Callable[[Any], Any]) -> Portable:
    """The record of what a guard under a by-reference root checks on the writer: the value
    itself, or for a ``TYPE_MATCH`` (which checks nothing else) the value's class where the
    value has no portable rendering (pytree's ``_LEAF_SPEC``, a library's sentinel object)."""
    kind = str(guard.create_fn_name())
    try:
        return _record(kind, source, guard, value_of)
    except Unportable:
        if kind != "TYPE_MATCH":
            raise
    return _record(kind, f"type({source})", guard, lambda g: type(value_of(g)))


def _layout_record(source: str, guard: Any, value_of: Callable[[Any], Any]) -> list[Portable]:
    """The record of the class a kept ``TYPE_MATCH`` checks, by its layout
    (:func:`class_layout`): torch rebuilds that guard on the reader as the class of the same
    name, whatever bases and methods it has there. None for a class with no Python code of
    its own (:func:`class_layout` is empty)."""
    try:
        cls = type(value_of(guard))
    except Exception as exc:
        raise Unportable(LAYOUT_KIND, source, f"its value cannot be read: {exc!r}") from exc
    if class_layout(cls) == "":
        return []
    return [_record(LAYOUT_KIND, f"type({source})", guard, lambda g: type(value_of(g)))]


def split(
    guards: Sequence[Any], value_of: Callable[[Any], Any]
) -> tuple[list[Any], tuple[Portable, ...]]:
    """``(guards torch can save, portable records of the rest)``; raises :class:`Unportable`
    where a dropped guard has no replacement.

    A guard torch keeps whose source passes through an object saved by reference
    (:func:`under_a_reference`) is kept *and* gets a record of the writer's value at its
    source, whatever its kind (``EQUALS_MATCH``, ``TYPE_MATCH``, ``LENGTH_CHECK``,
    ``TENSOR_MATCH``, ...): torch's own copy of it would check the reader against itself."""
    kept: list[Any] = []
    records: list[Portable] = []
    by_value: set[str] = set()
    for guard in guards:
        kind = dropped_kind(guard)
        source = str(guard.name)
        if kind is not None:
            records.append(_record(kind, source, guard, value_of))
            continue
        kept.append(guard)
        if str(guard.create_fn_name()) == "TYPE_MATCH":
            records.extend(_layout_record(source, guard, value_of))
        if str(guard.create_fn_name()) in SELF_CONTAINED:
            continue
        if source not in by_value and under_a_reference(guard, value_of):
            by_value.add(source)
            records.append(_by_value_record(guard, source, value_of))

    hooked: set[str] = set()
    for guard in guards:  # every module a guard reaches: its own hooks
        source = str(guard.name)
        if source in hooked or parse_source(source) is None:
            continue
        hooked.add(source)
        try:
            value = value_of(guard)
        except Exception:
            continue  # nothing there to hold a hook
        records.extend(_hook_records(source, value))
        records.extend(_set_order_records(source, value))
    records.extend(_aliasing_records(guards, value_of))
    return kept, tuple(dict.fromkeys(records))


def _aliasing_records(guards: Sequence[Any], value_of: Callable[[Any], Any]) -> list[Portable]:
    """Which mutable objects the guards reach (:data:`.object_aliasing.OBJECT_GUARDS`) are one
    object (:mod:`.object_aliasing`); raises :class:`Unportable` where one cannot be named
    again on a reader, or there are too many to compare at every call."""
    candidates: list[tuple[str, Any]] = []
    seen: set[str] = set()

    def add(source: str, read: Any, any_kind: bool) -> None:
        if source in seen:
            return
        seen.add(source)
        try:
            value = value_of(read)
        except Exception as exc:
            raise Unportable(ALIASES_KIND, source, "its object cannot be read") from exc
        if not any_kind and not object_aliasing.is_object(value):
            return
        if parse_source(source) is None:
            raise Unportable(ALIASES_KIND, source, "no portable source")
        candidates.append((source, value))

    for guard in guards:
        kind = str(guard.create_fn_name())
        if kind in object_aliasing.OBJECT_GUARDS:
            add(str(guard.name), guard, False)
        elif kind == "DUPLICATE_INPUT":  # two sources Dynamo found holding one object: both
            # (torch's own guard on it did not hold on a reader: the forty-second review)
            other = getattr(getattr(guard, "create_fn", None), "keywords", {}).get("source_b")
            if other is None:
                raise Unportable(ALIASES_KIND, str(guard.name), "no second source")
            name = other.name() if callable(other.name) else other.name
            add(str(guard.name), guard, True)
            add(str(name), other, True)
    skipped = object_aliasing.bookkeeping([v for _, v in candidates])
    candidates = [(s, v) for s, v in candidates if id(v) not in skipped]
    if len(candidates) > object_aliasing.MAX_OBJECTS:
        raise Unportable(ALIASES_KIND, "<frame>", f"{len(candidates)} objects")
    return [Portable(s, ALIASES_KIND, same) for s, same in object_aliasing.partition(candidates)]


def _set_order_records(source: str, value: Any) -> list[Portable]:
    """The record of a set's iteration order on the writer, when ``value`` is a set of more
    than one element; raises :class:`Unportable` where an element has no portable name."""
    if not isinstance(value, set | frozenset) or len(value) < 2:
        return []
    ident = identity(tuple(value))
    if ident is None:
        raise Unportable(SET_ORDER_KIND, source, "an element of a set has no portable name")
    return [Portable(source, SET_ORDER_KIND, ident)]


def absent_records(
    absent: dict[str, set[str]],
    keys: dict[str, set[Any]] | None = None,
    present: dict[str, set[Any]] | None = None,
) -> tuple[Portable, ...]:
    """One record per source of the names a trace did not find there, one per dict of the
    keys it did not find there and one per dict of the keys it found there when it asked
    (:mod:`.absent_names`; a key is a ``str``, ``int``, ``bool`` or None, which JSON carries
    as itself); raises :class:`Unportable` where a source cannot be read on another
    machine."""
    out = []
    kinds = ((ABSENT_KIND, absent), (ABSENT_KEYS_KIND, keys), (PRESENT_KEYS_KIND, present))
    for kind, found in ((kind, found or {}) for kind, found in kinds):
        for source in sorted(found):
            if parse_source(source) is None:
                raise Unportable(kind, source, "its source cannot be read on another machine")
            out.append(Portable(source, kind, json.dumps(sorted(found[source], key=repr))))
    return tuple(out)


def membership_records(asked: dict[str, dict[str, bool]]) -> tuple[Portable, ...]:
    """One record per abstract class a trace asked (:mod:`.unguarded.abc_membership`): its
    source, and each member's source with the answer, as JSON."""
    out = []
    for source in sorted(asked):
        answers = sorted(asked[source].items())
        if parse_source(source) is None or any(parse_source(m) is None for m, _ in answers):
            raise Unportable(MEMBERSHIP_KIND, source, "a class cannot be named on another machine")
        out.append(Portable(source, MEMBERSHIP_KIND, json.dumps(answers)))
    return tuple(out)


def _membership_differs(cls: Any, expected: str) -> str | None:
    """The first member an ``ABC_MEMBERSHIP`` record's abstract class answers otherwise here
    (named), or None where every answer is the recorded one."""
    if not isinstance(cls, abc.ABCMeta):
        return "not an abstract class"
    for source, answer in json.loads(expected):
        path = parse_source(str(source))
        member = resolve(*path, {}, {}) if path is not None else _MISSING
        if not isinstance(member, type):
            return f"{source} absent"
        if issubclass(member, cls) is not (answer is True):
            return f"{source}: {answer is not True}"
    return None


def _present(value: Any, expected: str, kind: str) -> str | None:
    """What breaks a record of names or keys at ``value``: the first name of an
    ``ABSENT_NAMES`` record it has, the first key of an ``ABSENT_KEYS`` record dict ``value``
    holds, the first key of a ``PRESENT_KEYS`` record it lacks; else None."""
    if kind != ABSENT_KIND and not isinstance(value, dict):
        return f"a {type(value).__name__}, not a dict"
    for name in json.loads(expected):
        if kind == ABSENT_KIND and hasattr(value, name):
            return f"{name!r} present"
        if kind == ABSENT_KEYS_KIND and dict.__contains__(value, name):
            return f"{name!r} present"
        if kind == PRESENT_KEYS_KIND and not dict.__contains__(value, name):
            return f"{name!r} absent"
    return None


# --- reader ------------------------------------------------------------------------------------


#: Source of the record naming the compiler settings a frame was compiled with
#: (``compile_settings.settings_digest``).
SETTINGS = "<compiler settings>"
SETTINGS_KIND = "COMPILE_SETTINGS"


def settings_record(digest: str) -> Portable:
    return Portable(SETTINGS, SETTINGS_KIND, digest)


def has_one_settings_record(records: Sequence[Portable]) -> bool:
    return sum(r.source == SETTINGS for r in records) == 1


def check_for(
    records: Sequence[Portable],
    f_globals: Any,
    settings: Callable[[], str | None] | None = None,
    failed: Callable[[str], None] | None = None,
    hooks_unguarded: bool = False,
    compiler: Callable[[], bool] | None = None,
) -> Callable[[Any], bool]:
    """The last guard of one served guarded code: True while every record holds. It must
    run after every other guard of that code (an epilogue guard), so that its True means
    the whole guard held and the code runs: the compiler settings record and the
    :data:`CHECKED_ONCE` records are checked until then (a normal compile fixes its
    settings, and reads the methods it inlines, at the frame's compile); without a
    ``settings`` reader it never holds. A module's empty hook dicts are checked each time
    another module object sits at the record's source, where torch's
    ``skip_nnmodule_hook_guards`` (its default) has a normal compile emit no guard on them
    (``hooks_unguarded``); otherwise at every call. ``compiler`` says, at every call,
    whether the call runs under the compiler the code was served for
    (:func:`.precompile_guards.backend_matcher`). ``failed`` hears the first failure of
    each kind (``backend``, ``settings`` or the failing record's guard kind)."""
    expected_settings = [r.identity for r in records if r.source == SETTINGS]
    reported: set[str] = set()
    aliasing = _aliasing_check(
        [(r.source, r.identity) for r in records if r.kind == ALIASES_KIND], f_globals
    )
    records = [r for r in records if r.kind != ALIASES_KIND]

    def fail(why: str, source: str = "", expected: str = "", found: str | None = None) -> bool:
        if why not in reported:
            reported.add(why)
            if failed is not None:
                failed(why)
            if source:  # what an operator needs to see why a served entry was traced again
                log.info(
                    "objcache: a served precompile entry's %s guard failed on %s: stored %s, "
                    "here %s; Dynamo compiles the frame",
                    why,
                    _short(source),
                    _short(expected),
                    "absent" if found is None else _short(found),
                )
        return False

    parsed: list[_Parsed] = []
    for record in records:
        if record.source == SETTINGS:
            continue
        path = parse_source(record.source)
        if path is None:
            raise ValueError(f"unparseable portable guard source {record.source!r}")
        parsed.append((path[0], path[1], record.identity, record.kind, record.source))

    def over(parsed: list[_Parsed], settled: bool, state: _Passed) -> Any:
        """The check of ``parsed`` at one call (``settled``: the settings record held), from
        what passed before (``state``)."""
        passed, frozen, shallow = state.passed, state.frozen, state.shallow
        texts, stable, sealed = state.texts, state.stable, state.sealed
        fast = fast_resolver([(root, steps) for root, steps, *_ in parsed])
        #: one snapshot (replaced whole: calls may come from several threads) of a getter of
        #: the stable records' values, the objects that last passed there (compared in one
        #: C-level pass at every call) and the other records' indexes, which go through the loop
        same: list[_Snapshot | None] = [None]
        _index_stable(same, stable, passed, sealed)

        def holds(f_locals: Any) -> bool:
            if not settled:
                now = settings() if settings is not None else None
                if now is None or any(now != e for e in expected_settings):
                    return fail("settings")
            values: tuple[Any, ...] | None = None
            if fast is not None:
                try:
                    values = fast(f_locals, f_globals)
                except Exception:  # one is absent: read one by one, which says which
                    values = None
            rest: Sequence[int] = range(len(parsed))
            snapshot = same[0]
            if values is not None and snapshot is not None and snapshot.holds(values):
                rest = snapshot.others  # every such record holds what passed there
            changed = False
            for i in rest:
                root, steps, expected, kind, source = parsed[i]
                if values is None:
                    value = resolve(root, steps, f_locals, f_globals)
                else:
                    value = values[i]
                    if value is passed[i] and stable[i]:
                        continue
                if value is _MISSING:
                    return fail(kind, source, expected)
                if kind in (ABSENT_KIND, ABSENT_KEYS_KIND, PRESENT_KEYS_KIND):
                    if value is not passed[i]:
                        differs = _present(value, expected, kind)
                        if differs is not None:
                            return fail(kind, source, expected, differs)
                        passed[i] = value
                    continue
                if kind == MEMBERSHIP_KIND:  # asked again until the whole guard first holds
                    differs = _membership_differs(value, expected)
                    if differs is not None:
                        return fail(kind, source, expected, differs)
                    continue
                if kind == SET_ORDER_KIND:  # the order, at every call (a set changes inside)
                    if not isinstance(value, set | frozenset):
                        return fail(kind, source, expected, identity(value))
                    order = tuple(value)
                    if value is passed[i] and order == shallow[i]:
                        continue
                    found = identity(order)
                    if found != expected:
                        return fail(kind, source, expected, found or "no portable identity")
                    passed[i], shallow[i] = value, order
                    continue
                if kind == HOOKS_KIND:  # the module's own hook dicts, usually all empty
                    module, value = value, hooks_of(value)
                    if expected == _NO_HOOKS and value is not None and not any(value):
                        if hooks_unguarded:  # as torch: this module object is not looked at again
                            passed[i], stable[i], changed = module, True, True
                        continue
                if value is passed[i]:
                    if frozen[i] or not isinstance(value, dict | list | tuple):
                        continue
                    seal = sealed[i]
                    if seal is not None and _unchanged(value, seal):
                        continue
                text = texts[i]
                if (
                    text is not None
                    and type(value) is tuple
                    and set(map(type, value)) <= _TEXT
                    and value == text
                ):
                    if stable[i] or sealed[i] is not None:  # rebuilt at each call
                        stable[i], sealed[i], changed = False, None, True
                    continue  # a tuple of strings made at each call (a code's names)
                if shallow[i] is not None and _shallow(value) == shallow[i]:
                    if value is passed[i]:  # changed and changed back: sealed as it is now
                        sealed[i], changed = _seal(value), True
                    elif stable[i] or sealed[i] is not None:  # rebuilt at each call
                        stable[i], sealed[i], changed = False, None, True
                    continue  # a container holding the very same objects
                found = identity(value)
                if found != expected:
                    return fail(kind, source, expected, found or "no portable identity")
                passed[i], frozen[i], shallow[i] = value, _frozen(value), _shallow(value)
                sealed[i] = _seal(value) if shallow[i] is not None else None
                is_text = type(value) is tuple and set(map(type, value)) <= _TEXT
                texts[i] = value if is_text else None
                was, stable[i] = (
                    stable[i],
                    kind != HOOKS_KIND
                    and (frozen[i] or not isinstance(value, dict | list | tuple)),
                )
                changed = changed or was != stable[i] or stable[i] or sealed[i] is not None
            if changed:
                _index_stable(same, stable, passed, sealed)
            return True

        return holds

    #: the check at each call: every record until the whole guard first holds, then only
    #: those torch itself checks at every call (:data:`CHECKED_ONCE` left out), replaced whole
    state = _Passed.fresh(len(parsed))
    current = [over(parsed, not expected_settings, state)]
    steady = [i for i, p in enumerate(parsed) if p[3] not in CHECKED_ONCE]

    def check(f_locals: Any) -> bool:
        """Never raises into torch's guard evaluation: anything unexpected fails the guard
        (Dynamo then compiles the frame as without the entry)."""
        holds = current[0]
        try:
            if compiler is not None and not compiler():
                return fail("backend")
            ok = bool(holds(f_locals))
            if ok and aliasing is not None and not aliasing(f_locals):
                return fail(ALIASES_KIND)
        except Exception:
            return fail("error")
        if ok and holds is first:
            current[0] = over([parsed[i] for i in steady], True, state.only(steady))
        return ok

    first = current[0]
    return check


def _aliasing_check(records: Sequence[tuple[str, str]], f_globals: Any) -> Any:
    """The check of the ``ALIASES`` records (:mod:`.object_aliasing`), or None."""
    if not records:
        return None
    paths: list[tuple[str, tuple[Step, ...]]] = []
    for source, _ in records:
        path = parse_source(source)
        if path is None:
            raise ValueError(f"unparseable portable guard source {source!r}")
        paths.append(path)
    fast = fast_resolver(paths)

    def read_all(f_locals: Any) -> tuple[Any, ...]:
        if fast is not None:
            try:
                return fast(f_locals, f_globals)
            except Exception:  # one is absent: read one by one (absent reads as one marker)
                pass
        return tuple(resolve(root, steps, f_locals, f_globals) for root, steps in paths)

    return object_aliasing.checker(records, read_all)


#: A record as :func:`check_for` reads it: root, steps, identity, kind, source.
_Parsed = tuple[str, tuple[Step, ...], str, str, str]
#: A sealed container's dicts (itself and those nested in it) with their version tags, and
#: its functions with their code (:func:`_seal`).
_Seal = tuple[tuple[tuple[Any, int], ...], tuple[tuple[Any, Any], ...]]
#: How deep dicts nested in a dict are compared (a registry of per-model dicts).
_NESTED_DICTS = 2


@dataclasses.dataclass
class _Passed:
    """Per record of :func:`check_for`, what last passed there and how it may pass again."""

    #: the last object that passed (see the module docstring)
    passed: list[Any]
    #: whether that object can never change (a tuple of constants)
    frozen: list[bool]
    #: a container's items as they were when it passed (see :func:`_shallow`)
    shallow: list[tuple[Any, ...] | None]
    #: a tuple of strings that passed (compared with ``==`` when rebuilt at each call)
    texts: list[tuple[str, ...] | None]
    #: whether the object that last passed passes again as it is (an object named by what
    #: it is, never a container that can change inside)
    stable: list[bool]
    #: how the very container that passed is known unchanged (:func:`_seal`)
    sealed: list[_Seal | None]

    @classmethod
    def fresh(cls, count: int) -> _Passed:
        return cls(
            [_MISSING] * count,
            [False] * count,
            [None] * count,
            [None] * count,
            [False] * count,
            [None] * count,
        )

    def only(self, keep: Sequence[int]) -> _Passed:
        """A copy of the records at ``keep``, in that order."""
        columns = (getattr(self, field.name) for field in dataclasses.fields(self))
        return _Passed(*([column[i] for i in keep] for column in columns))


@dataclasses.dataclass(frozen=True)
class _Snapshot:
    """What :func:`check_for` compares at every call in a few C-level passes: the records
    that last passed as objects named by what they are (:func:`_unchanging` ones) or as
    sealed containers (:func:`_seal`), each the very object that passed, the sealed dicts'
    version tags and the sealed functions' code; ``others`` go through the loop."""

    pick: Callable[[tuple[Any, ...]], tuple[Any, ...]]
    objects: tuple[Any, ...]
    #: the sealed dicts (a record's own and those nested in it) and their version tags
    dicts: tuple[Any, ...]
    versions: list[int]
    functions: tuple[Any, ...]
    codes: tuple[Any, ...]
    others: list[int]

    def holds(self, values: tuple[Any, ...]) -> bool:
        if not all(map(operator.is_, self.pick(values), self.objects)):
            return False
        if self.dicts and list(map(_READER[0], self.dicts)) != self.versions:
            return False
        return all(map(operator.is_, map(_CODE_OF, self.functions), self.codes))


_CODE_OF = operator.attrgetter("__code__")
_TEXT = frozenset({str})


def _picker(indexes: Sequence[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """A getter of ``indexes``' values as a tuple (even of one)."""
    getter = operator.itemgetter(*indexes)
    if len(indexes) > 1:
        return getter
    return lambda values: (getter(values),)


def _index_stable(
    same: list[Any],
    stable: Sequence[bool],
    passed: Sequence[Any],
    sealed: Sequence[_Seal | None],
) -> None:
    """``same`` of :func:`check_for`: one :class:`_Snapshot` of the records that pass as
    they last passed, replaced whole; None while there are none."""
    keep = [i for i, s in enumerate(stable) if s or sealed[i] is not None]
    if not keep:
        same[0] = None
        return
    kept = set(keep)
    seals = [(i, seal) for i in keep if (seal := sealed[i]) is not None]
    dicts = [pair for _, seal in seals for pair in seal[0]]
    pairs = [pair for _, seal in seals for pair in seal[1]]
    same[0] = _Snapshot(
        pick=_picker(keep),
        objects=tuple(passed[i] for i in keep),
        dicts=tuple(d for d, _ in dicts),
        versions=[version for _, version in dicts],
        functions=tuple(fn for fn, _ in pairs),
        codes=tuple(code for _, code in pairs),
        others=[i for i in range(len(stable)) if i not in kept],
    )


def _seal(value: Any) -> _Seal | None:
    """How a container of unchanging items that passed is known unchanged at the next call
    without naming its items again: a tuple never changes; a dict, and each dict nested in
    it, while its version tag (PEP 509, changed by every insert, delete or rebinding of a
    key) stays the same; an ``OrderedDict`` of two or more items never (``move_to_end``
    reorders it with no new version). Its Python functions are kept with their code,
    compared too. None where there is no such way (a list; no version reader in this torch)."""
    dicts: list[tuple[Any, int]] = []
    codes: list[tuple[Any, Any]] = []
    if isinstance(value, tuple):
        codes.extend((v, v.__code__) for v in value if isinstance(v, types.FunctionType))
    elif isinstance(value, dict) and (reader := _version_reader()) is not None:
        if not _versioned(value, reader, dicts, codes, 0):
            return None
    else:
        return None
    return tuple(dicts), tuple(codes)


def _versioned(
    value: Any,
    reader: Callable[[Any], int],
    dicts: list[tuple[Any, int]],
    codes: list[tuple[Any, Any]],
    depth: int,
) -> bool:
    """Collect ``value``'s and its nested dicts' version tags and its functions' code
    (:func:`_seal`); False where one cannot be sealed."""
    if (type(value) is not dict and len(value) > 1) or depth > _NESTED_DICTS:
        return False
    dicts.append((value, reader(value)))
    for v in value.values():
        if isinstance(v, dict):
            if not _versioned(v, reader, dicts, codes, depth + 1):
                return False
        elif isinstance(v, types.FunctionType):
            codes.append((v, v.__code__))
    return True


def _unchanged(value: Any, seal: _Seal) -> bool:
    """Whether the very container :func:`_seal` sealed still holds what it held then."""
    dicts, codes = seal
    if dicts and any(_READER[0](d) != version for d, version in dicts):
        return False
    return all(fn.__code__ is code for fn, code in codes)


#: torch's reader of a dict's version tag, once looked up (a one-item list: None inside
#: where this torch has none)
_READER: list[Any] = []


def _version_reader() -> Callable[[Any], int] | None:
    """torch's reader of a dict's version tag (``torch._C._dynamo.guards.dict_version``, in
    every release objcache supports); None where it is absent."""
    if not _READER:
        found: Callable[[Any], int] | None
        try:
            from torch._C._dynamo.guards import dict_version as found
        except Exception:  # no reader: containers are compared item by item
            found = None
        _READER.append(found)
    reader: Callable[[Any], int] | None = _READER[0]
    return reader


def _frozen(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is a tuple that can never change (of constants and such tuples): the
    same object again needs no second look, as for :func:`identity`'s other objects."""
    if not isinstance(value, tuple) or depth > MAX_DEPTH:
        return False
    return all(isinstance(v, _CONSTANTS) or _frozen(v, depth + 1) for v in value)


#: Values whose identity depends on nothing a container's items compare would miss: a
#: constant, a class, a module, a builtin (itself), a Python function (with its ``__code__``
#: compared too), an enum member, torch's dtype, device, layout and memory format.
_SHALLOW = (*_CONSTANTS, type, types.ModuleType, types.BuiltinFunctionType, types.FunctionType)


_UNCHANGING = (*_SHALLOW, enum.Enum)


def _unchanging(value: Any) -> bool:
    if isinstance(value, _UNCHANGING):
        return True
    kind = type(value)
    return kind.__module__ == "torch" and kind.__qualname__ in _TORCH_VALUES


def _item(value: Any) -> tuple[Any, ...]:
    """What an item is compared by: its type, itself (a float by its repr: -0.0 is not 0.0)
    and a function's code."""
    same = repr(value) if isinstance(value, float | complex) else value
    return (type(value), same, getattr(value, "__code__", None))


def _shallow(value: Any, depth: int = 0) -> tuple[Any, ...] | None:
    """A dict's items, or a tuple's or list's, as a tuple that compares equal only while
    the container holds the very same keys and values (a function's code included; a dict
    nested in a dict by its own items), or None where a value could change inside (a list,
    an instance): such a container
    is named again at every call. Module hook dicts, usually empty, are checked in O(1) this
    way; a tuple rebuilt at every call with the same items passes without being named."""
    if not isinstance(value, dict | tuple | list) or len(value) > MAX_DICT:
        return None
    items: list[Any] = [type(value)]
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, _CONSTANTS):
                return None
            if isinstance(v, dict) and depth < _NESTED_DICTS:
                inner = _shallow(v, depth + 1)
                if inner is None:
                    return None
                items.append((_item(k), inner))
                continue
            if not _unchanging(v):
                return None
            items.append((_item(k), _item(v)))
        return tuple(items)
    for v in value:
        if not _unchanging(v):
            return None
        items.append(_item(v))
    return tuple(items)


def _short(text: str, limit: int = 200) -> str:
    """``text`` for a log line: printable ASCII only (a source or identity may name anything
    a program defined), at most ``limit`` characters."""
    clean = "".join(c if 32 <= ord(c) < 127 else "?" for c in text)
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."


# --- records beside their guards state -----------------------------------------------------

_TRAILER = b"\0objcache-portable-guards-v1\0"
#: Largest records trailer read back (a frame's records are a few KB).
MAX_TRAILER = 1 << 20


def attach(state: bytes, records: Sequence[Portable]) -> bytes:
    """torch's guards state with its records appended (torch never reads past its pickle's
    end; :func:`detach` gives torch its own bytes back before it unpickles them)."""
    body = json.dumps([[r.source, r.kind, r.identity] for r in records]).encode()
    return state + _TRAILER + body + struct.pack(">I", len(body))


def detach(data: bytes) -> tuple[bytes, tuple[Portable, ...]] | None:
    """``(torch's guards state, its records)``, or None where no valid records trail it."""
    if len(data) < 4:
        return None
    (size,) = struct.unpack(">I", data[-4:])
    start = len(data) - 4 - size
    if size > MAX_TRAILER or start < len(_TRAILER):
        return None
    if data[start - len(_TRAILER) : start] != _TRAILER:
        return None
    try:
        raw = json.loads(data[start : len(data) - 4])
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, list) or not all(
        isinstance(r, list) and len(r) == 3 and all(isinstance(x, str) for x in r) for r in raw
    ):
        return None
    return data[: start - len(_TRAILER)], tuple(Portable(*r) for r in raw)


def describe(records: Sequence[Portable]) -> list[str]:
    """The verbose parts torch prints when the root guard fails (recompile reasons)."""
    return [
        f"objcache portable guard: {r.source} {'are' if r.source == SETTINGS else 'is'} "
        f"{r.identity}"
        for r in records
    ] or ["objcache portable guards"]
