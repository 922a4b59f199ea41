"""The program's Python code a compile runs while it traces, which no graph shows and no key
of torch's names (docs/torch.md, "Custom ops in the keys").

AOTAutograd and Inductor run Python the program supplies while they turn a Dynamo graph into
code: a kernel registered for an op, a ``custom_op``'s backward, a tensor subclass's
``__torch_dispatch__``, an entry the program put in Inductor's decomposition or lowering
table. Their *results* are baked into the compiled code. Here each such function is named
by what decides what it does, as far as a digest can tell: its code, the content of the
source file it sits in (the helpers beside it), and the values it reads from its module's
globals and its closure (a setting read from the environment at import), the environment
variables it names where it reads the environment, following the objects it reads two levels
further and the program's functions it calls to any depth. A class is named by those of its
methods and its plain attributes; an object by its
class and its attributes; a C++ kernel by the binaries the process loaded. What is torch's own
(its package's files) is in its release, which every key holds already. What cannot be named
within the bounds below (a container or tensor too large to digest) is named by a value of
this process alone: a miss on every other machine, never another machine's result.
"""

from __future__ import annotations

import _threading_local
import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import datetime
import decimal
import dis
import enum
import fractions
import functools
import hashlib
import importlib.util
import io
import logging
import operator
import os
import socket
import subprocess
import sys
import sysconfig
import threading
import types
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from objcache.integrations.torch.precompile import portable_guards

#: Largest source file digested (a larger one is named by size and mtime).
MAX_SOURCE_BYTES = 8 << 20
#: How far the objects a function reads are followed (the program's functions it calls are
#: followed by their code and plain data to any depth, each once: :func:`_code_chain`).
MAX_DEPTH = 2
#: Longest rendering of one value read (a longer one is named by its digest).
MAX_VALUE_CHARS = 4096
#: Most items of a container read by a function that are named one by one (followed).
MAX_ITEMS = 256
#: Most items of a container named at all (by a cheap rendering of each, unfollowed); a
#: larger one is named by this process alone.
MAX_DIGESTED_ITEMS = 100_000
#: Largest array or tensor read by a function that is named by its content (larger: by
#: this process alone).
MAX_ARRAY_BYTES = 64 << 20

#: The value that names what cannot be named: of this process alone (a miss elsewhere).
PROCESS_NONCE = os.urandom(8).hex()
UNIDENTIFIED = f"unidentified:{PROCESS_NONCE}"

_lock = threading.Lock()
_sources: dict[tuple[str, int, int], str] = {}


def source_digest(path: str) -> str:
    """The content of a source file, by digest (not its path: another venv, another machine);
    remembered by size and mtime."""

    def digest(f: Any, size: int) -> str:
        if size > MAX_SOURCE_BYTES:
            return f"size:{size}:mtime:{os.fstat(f.fileno()).st_mtime_ns}"
        return hashlib.sha256(f.read(MAX_SOURCE_BYTES)).hexdigest()[:32]

    return file_digest(path, _sources, digest, "unreadable")


def file_digest(
    path: str, memo: dict[tuple[str, int, int], str], digest: Any, unreadable: str
) -> str:
    """``digest(file, size)`` of ``path``, remembered in ``memo`` by size and mtime."""
    try:
        st = os.stat(path)
    except OSError:
        return "absent"
    key = (path, st.st_size, st.st_mtime_ns)
    with _lock:
        known = memo.get(key)
    if known is not None:
        return known
    try:
        with open(path, "rb") as f:
            value = str(digest(f, st.st_size))
    except OSError:
        value = unreadable
    with _lock:
        if len(memo) > 4096:
            memo.clear()
        memo[key] = value
    return value


def is_torchs_name(module: str) -> bool:
    return module in ("builtins", "functools") or module == "torch" or module.startswith("torch.")


def is_torchs(value: Any) -> bool:
    """Whether a function, class or module comes from torch's own package (or Python
    itself). A Python function whose code sits in a file outside torch and Python is not,
    whatever its ``__module__`` says: ``functools.wraps`` copies the wrapped function's (a
    program's replacement of ``torch.layer_norm`` says ``torch``)."""
    module = (
        value.__name__
        if isinstance(value, types.ModuleType)
        else getattr(value, "__module__", None)
    )
    if not (isinstance(module, str) and is_torchs_name(module)):
        return False
    # only a function's own attributes: an op namespace's ``__getattr__`` makes up ops
    bound = isinstance(value, (types.MethodType, staticmethod, classmethod))
    fn = value.__func__ if bound else value
    if type(fn) is types.FunctionType:
        if not fn.__code__.co_filename.startswith("<"):
            return _in_torch_or_python(fn.__code__.co_filename)
        made_by = fn.__globals__.get("__name__")  # code without a file: by its globals
        if isinstance(made_by, str):
            return is_torchs_name(made_by) or made_by.split(".", 1)[0] in sys.stdlib_module_names
    return True


def in_torch_or_python(filename: str) -> bool:
    """Whether ``filename`` is a file of torch's package or of Python's own library."""
    return _in_torch_or_python(filename)


def _in_torch_or_python(filename: str) -> bool:
    known = _file_is_torchs.get(filename)
    if known is None:
        torch_file = getattr(sys.modules.get("torch"), "__file__", None)
        homes = (
            *((os.path.dirname(torch_file) + os.sep,) if torch_file else ()),
            *_STDLIB_DIRS,
        )
        path = os.path.realpath(filename) if os.path.isabs(filename) else filename
        known = filename.startswith(homes) or path.startswith(homes)
        if len(_file_is_torchs) > 4096:
            _file_is_torchs.clear()
        _file_is_torchs[filename] = known
    return known


#: code file -> whether it is torch's or Python's own (a few hundred in a process)
_file_is_torchs: dict[str, bool] = {}


def is_stdlib(value: Any) -> bool:
    """Whether a module, or an object's class, is Python's own (named by its kind: the
    interpreter's release is in every key)."""
    name = (
        value.__name__
        if isinstance(value, types.ModuleType)
        else getattr(type(value), "__module__", None)
    )
    if not isinstance(name, str) or name.split(".", 1)[0] not in sys.stdlib_module_names:
        return False
    module = value if isinstance(value, types.ModuleType) else sys.modules.get(name)
    path = getattr(module, "__file__", None)  # not a program's module of the same name
    return path is None or os.path.realpath(path).startswith(_STDLIB_DIRS)


_STDLIB_DIRS = tuple(
    os.path.realpath(sysconfig.get_paths()[kind]) + os.sep for kind in ("stdlib", "platstdlib")
)
#: Python's own classes whose objects are settings (what they hold names them).
_STDLIB_VALUES: tuple[type, ...] = (
    range,
    slice,
    bytearray,
    collections.deque,
    decimal.Decimal,
    fractions.Fraction,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    # callables that hold their arguments (``methodcaller("mul", scale)``): their repr
    # says which
    operator.methodcaller,
    operator.attrgetter,
    operator.itemgetter,
)
#: Python's own objects that hold no setting a kernel computes from: named by their kind.
_HOLDS_NO_SETTING: tuple[type, ...] = (
    logging.Logger,
    logging.LoggerAdapter,
    logging.Handler,
    threading.Thread,
    type(threading.Lock()),
    type(threading.RLock()),
    threading.Condition,
    threading.Semaphore,
    io.IOBase,
    socket.socket,
    concurrent.futures.Executor,
    subprocess.Popen,
    asyncio.AbstractEventLoop,
)

_SETTINGS_CLASSES = frozenset(
    {
        "types.SimpleNamespace",
        "argparse.Namespace",
        "configparser.ConfigParser",
        "configparser.RawConfigParser",
        "configparser.SectionProxy",
    }
)


def _names_and_spelled(code: types.CodeType) -> list[str]:
    """The names the code reads, and the names it spells as strings (``getattr(cfg,
    "SCALE")``, ``globals()["_S"]``, ``getattr(torch.ops.lib, "inner")``,
    ``sys.modules["cfg"]``): each part of a dotted string constant that is an identifier."""
    spelled = {
        part
        for const in _strings(code)
        if 0 < len(const) <= 256 and not const.isspace()
        for part in const.split(".")
        if part.isidentifier()
    }
    return sorted(set(_names_read(code)) | spelled)


def _names_read(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names_read(const)


_ENV_READS = frozenset({"environ", "getenv", "environb", "getenvb"})
#: What ``functools.wraps`` and the interpreter put on a function: not a setting.
_FUNCTION_BOOKKEEPING = frozenset(
    {"__doc__", "__module__", "__qualname__", "__name__", "__annotations__", "__type_params__"}
)


def _strings(code: types.CodeType) -> Iterator[str]:
    for const in code.co_consts:
        if isinstance(const, str):
            yield const
        elif isinstance(const, types.CodeType):
            yield from _strings(const)


#: While :func:`names_read_by` runs: the names the functions it follows read.
_collector = threading.local()


@contextlib.contextmanager
def names_read_by() -> Iterator[set[str]]:
    """The names every code :func:`function_identity` follows inside the block reads (the
    ops a kernel calls through ``torch.ops.<ns>.<op>``: :mod:`.op_overrides`)."""
    outer = _collector.__dict__.get("names")
    names: set[str] = set()
    _collector.names = names
    try:
        yield names
    finally:
        _collector.names = outer
        if outer is not None:
            outer.update(names)


#: Work one identity may take (values rendered, items walked), shared by every value it
#: follows: past it, the rest is named by this process alone.
MAX_WORK = 200_000
_work = threading.local()


@contextlib.contextmanager
def _bounded() -> Iterator[None]:
    """The top-level call sets the budget; the nested ones share it."""
    if _work.__dict__.get("left") is not None:
        yield
        return
    _work.left = MAX_WORK
    _work.chained = set()  # the functions a code chain named (by id), once each
    try:
        yield
    finally:
        _work.left = None
        _work.chained = None


def _spend(n: int = 1) -> bool:
    """Take ``n`` units of the budget; False once it is spent."""
    left = _work.__dict__.get("left")
    if left is None:
        return True
    _work.left = left - n
    return bool(left - n >= 0)


def function_identity(fn: Any, depth: int = 0) -> list[str]:
    """What decides what ``fn`` computes: its code, its source file, what it reads; a
    function that cannot be read, or past the work budget, by this process alone."""
    with _bounded():
        if not _spend():
            return [UNIDENTIFIED]
        try:
            return _function_identity(fn, depth)
        except Exception:  # an object that refuses to be read (a raising property, ...)
            return [UNIDENTIFIED]


def _function_identity(fn: Any, depth: int) -> list[str]:
    if isinstance(fn, functools.partial):
        return [
            "partial",
            *function_identity(fn.func, depth),
            *(value_identity(a, depth) for a in fn.args),
            *(f"{k}={value_identity(v, depth)}" for k, v in sorted(fn.keywords.items())),
        ]
    owner: list[str] = []
    if isinstance(fn, types.MethodType):  # a bound method: what its object holds counts
        owner = [f"self={value_identity(fn.__self__, depth + 1)}"]
    fn = getattr(fn, "__func__", fn)  # a bound method, a classmethod, a staticmethod
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None and wrapped is not fn and depth <= MAX_DEPTH:
            # ``functools.cache``/``lru_cache`` of a getter, a ``wraps`` wrapper object: what
            # it wraps (a cached value is computed by that code, from what it reads)
            return ["wrapped", *function_identity(wrapped, depth + 1)]
        kind = f"callable:{type(fn).__module__}.{type(fn).__qualname__}"
        # a C function or method by its name (``torch.Tensor.relu``); a callable object by
        # what it holds
        return [kind, _qualified(fn) or "", _object_identity(fn, depth)]
    names = _names_and_spelled(code)
    held_by_fn = {k: v for k, v in vars(fn).items() if k not in _FUNCTION_BOOKKEEPING}
    if held_by_fn:
        # what the function object carries: a ``singledispatch`` function's registry of
        # implementations, a decorator's ``__wrapped__``, a setting stored on it
        owner.append(f"attrs={value_identity(held_by_fn, min(depth + 1, MAX_DEPTH))}")
    collected = _collector.__dict__.get("names")
    if collected is not None:
        collected.update(names)
    parts = [portable_guards.code_digest(code), source_digest(code.co_filename), *owner]
    # defaults bound at definition (``def k(x, s=float(os.environ["S"]))``)
    for label, bound in (("defaults", fn.__defaults__), ("kwdefaults", fn.__kwdefaults__)):
        if bound:
            parts.append(f"{label}={value_identity(bound, MAX_DEPTH)}")
    scope = getattr(fn, "__globals__", None)
    if _ENV_READS.intersection(names) or _calls_an_environment_reader(names, scope):
        parts.extend(_environment_read(code))
    if depth >= MAX_DEPTH:
        # objects are not followed further, but what decides the code it runs still is: the
        # plain data it reads (``SCALE = ...``) and the program's functions it calls, to
        # any depth (each once an identity)
        parts.extend(_code_chain(fn, names, scope))
        return parts
    if isinstance(scope, dict):
        for name in names:
            if name not in scope:
                continue
            value = scope[name]
            parts.append(f"{name}={value_identity(value, depth + 1)}")
            for attr, held in _read_through(value, names):
                parts.append(f"{name}.{attr}={value_identity(held, depth + 1)}")
    for label, module in _imported(code, scope):
        parts.append(f"{label}={value_identity(module, depth + 1)}")
        for attr, held in _read_through(module, names):
            parts.append(f"{label}.{attr}={value_identity(held, depth + 1)}")
    for i, cell in enumerate(getattr(fn, "__closure__", None) or ()):
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        parts.append(f"cell{i}={value_identity(contents, depth + 1)}")
    return parts


def _spelled_modules(code: types.CodeType) -> Iterator[tuple[str, Any]]:
    """The program's modules a string constant of the code names (``sys.modules["cfg"]``,
    ``importlib.import_module("cfg")``), as imported now."""
    for const in sorted(set(_strings(code))):
        if len(const) > 256 or not all(p.isidentifier() for p in const.split(".")):
            continue
        module = sys.modules.get(const)
        if isinstance(module, types.ModuleType) and not (is_torchs(module) or is_stdlib(module)):
            yield f"module:{const}", module


def _imported(code: types.CodeType, scope: Any) -> Iterator[tuple[str, Any]]:
    """The modules the code imports in its body (``from settings import SCALE`` inside a
    kernel, to break an import cycle), as imported now; one of the program's not imported
    yet (its values, set as it runs, unknown) is named by this process alone."""
    yield from _spelled_modules(code)
    package = scope.get("__package__") if isinstance(scope, dict) else None
    for name, level in _imports_of(code):
        try:
            absolute = importlib.util.resolve_name("." * level + name, package) if level else name
        except (ImportError, ValueError):
            yield f"import:{name}", UNIDENTIFIED
            continue
        module = sys.modules.get(absolute)
        if module is None:
            top = absolute.split(".", 1)[0]
            python_s = top in sys.stdlib_module_names or is_torchs_name(top)
            yield f"import:{absolute}", f"module:{absolute}" if python_s else UNIDENTIFIED
        else:
            yield f"import:{absolute}", module


_imports_memo: dict[types.CodeType, tuple[tuple[str, int], ...]] = {}


def _imports_of(code: types.CodeType) -> tuple[tuple[str, int], ...]:
    """``(module, level)`` of every ``import`` in the code and the code nested in it
    (remembered by code object)."""
    known = _imports_memo.get(code)
    if known is not None:
        return known
    found: list[tuple[str, int]] = []
    level = 0
    for instruction in dis.get_instructions(code):
        if instruction.opname == "LOAD_CONST" and isinstance(instruction.argval, int):
            level = instruction.argval  # ``import`` pushes its level, then its from-list
        elif instruction.opname == "IMPORT_NAME":
            found.append((str(instruction.argval), level))
            level = 0
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found.extend(_imports_of(const))
    with _lock:
        if len(_imports_memo) > 4096:
            _imports_memo.clear()
        _imports_memo[code] = tuple(found)
    return tuple(found)


def _code_chain(fn: Any, names: list[str], scope: Any) -> Iterator[str]:
    """Past the depth objects are followed: the plain data and the program's functions
    ``fn`` reads by name (in its globals, through a program's module it reads, in its
    closure), each function by its own code chain. A function already named in this
    identity is named by its code alone (a cycle ends there)."""
    held: list[tuple[str, Any]] = []
    if isinstance(scope, dict):
        for name in names:
            if name not in scope:
                continue
            value = scope[name]
            held.append((name, value))
            held.extend((f"{name}.{attr}", item) for attr, item in _read_through(value, names))
    for i, cell in enumerate(getattr(fn, "__closure__", None) or ()):
        with contextlib.suppress(ValueError):  # an empty cell
            held.append((f"cell{i}", cell.cell_contents))
    code = getattr(fn, "__code__", None)
    if isinstance(code, types.CodeType):
        for label, module in _imported(code, scope):
            if module is UNIDENTIFIED:
                yield f"{label}={UNIDENTIFIED}"
            held.extend((f"{label}.{attr}", item) for attr, item in _read_through(module, names))
    for label, value in held:
        plain = _plain_data(value, [MAX_ITEMS])
        if plain is not None:
            yield f"{label}={plain}"
        elif _is_programs_function(value):
            yield f"{label}={_chained(value)}"


#: How deep a package's submodules are read through (``pkg.sub.cfg.SCALE``).
_SUBMODULE_DEPTH = 3


#: What code reading ``sys`` may compute from (never ``sys.modules`` or ``sys.path``: those
#: name this process's imports and folders, not a setting).
_SYS_FACTS = frozenset(
    {"argv", "orig_argv", "flags", "platform", "byteorder", "maxsize", "version_info"}
)


def _read_through(value: Any, names: list[str], depth: int = 0) -> Iterator[tuple[str, Any]]:
    """What code reading ``value`` may read through it where it is a module of the
    program's (``cfg.SCALE``, ``helpers.scale(x)``, a submodule ``pkg.cfg.SCALE``): the
    values under the names the code reads, never a lazy module's import; and the module's
    ``__getattr__`` (PEP 562), which computes the names it does not hold (a settings module
    reading the environment)."""
    if value is sys:
        # the interpreter's facts a program branches on (``"--fast" in sys.argv``)
        yield from ((attr, getattr(sys, attr)) for attr in names if attr in _SYS_FACTS)
        return
    if not isinstance(value, types.ModuleType) or is_torchs(value) or is_stdlib(value):
        return
    held = vars(value)
    for attr in names:
        item = held.get(attr)
        if isinstance(item, types.ModuleType):
            if depth < _SUBMODULE_DEPTH:  # a submodule the code reads through its package
                for sub, inner in _read_through(item, names, depth + 1):
                    yield f"{attr}.{sub}", inner
        elif item is not None:
            yield attr, item
    computed = held.get("__getattr__")
    if computed is not None and any(attr not in held for attr in names):
        yield "__getattr__", computed


def _calls_an_environment_reader(names: list[str], scope: Any) -> bool:
    """Whether the code calls a function of the program's that reads the environment
    (``env_float("SCALE")``): the names it passes are its own constants."""
    if not isinstance(scope, dict):
        return False
    for name in names:
        value = scope.get(name)
        candidates = [value, *(item for _, item in _read_through(value, names))]
        for candidate in candidates:
            if _is_programs_function(candidate) and _ENV_READS.intersection(
                _names_read(_function_of(candidate).__code__)
            ):
                return True
    return False


#: Shortest string constant taken as a part of an environment variable's name.
_MIN_ENV_PART = 3


def _environment_read(code: types.CodeType) -> Iterator[str]:
    """``os.environ["SCALE"]``, ``os.getenv("SCALE")`` while the code traces: the variables
    its string constants name, by their value here; and where it composes a name
    (``os.environ["CFG_" + name]``, ``f"{name}_SCALE"``), every variable whose name holds
    one of its constants of at least three characters."""
    constants = sorted({c for c in _strings(code) if c and len(c) <= 256})
    for const in constants:
        if const.isidentifier():
            yield f"env:{const}={_digest(repr(os.environ.get(const)))}"
    parts = [c for c in constants if len(c) >= _MIN_ENV_PART and _is_name_part(c)]
    if parts:
        composed = sorted(
            (k, v) for k, v in os.environ.items() if any(p in k and p != k for p in parts)
        )
        if composed:
            yield f"env~{','.join(parts)}={_digest(repr(composed))}"


def _digest(text: str) -> str:
    """A value by digest (an environment variable's value may be a credential: a key's
    details are pickled and may be logged by torch)."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _is_name_part(text: str) -> bool:
    return all(ch.isalnum() or ch == "_" for ch in text)


def _is_programs_function(value: Any) -> bool:
    """A Python function (or method) outside torch and Python's own library."""
    fn = _function_of(value)
    if not isinstance(fn, types.FunctionType) or is_torchs(fn):
        return False
    module = sys.modules.get(str(getattr(fn, "__module__", None)))
    return module is None or not is_stdlib(module)


def is_programs_function(value: Any) -> bool:
    """A Python function (or method) outside torch and Python's own library."""
    return _is_programs_function(value)


def is_programs_object(value: Any) -> bool:
    """An instance of a class of the program's (not a function, class, module or container;
    not torch's or Python's own)."""
    return _is_programs_object(value)


def is_programs_callable(value: Any) -> bool:
    """A function of the program's, or a callable instance of one of its classes."""
    return _is_programs_function(value) or (callable(value) and _is_programs_object(value))


def _function_of(value: Any) -> Any:
    """A bound method's function; anything else as it is (never an attribute read, which
    a module's or an object's ``__getattr__`` would compute)."""
    return value.__func__ if isinstance(value, types.MethodType) else value


def _chained(value: Any) -> str:
    fn = _function_of(value)
    if _named_before(fn):
        return "seen:" + portable_guards.code_digest(fn.__code__)
    return "fn:" + ",".join(function_identity(value, MAX_DEPTH))


def _named_before(value: Any) -> bool:
    """Whether this identity already named ``value`` past the depth objects are followed
    (then it is named once, and a cycle ends); notes it otherwise."""
    seen = _work.__dict__.get("chained")
    if seen is None:
        return False
    if id(value) in seen:
        return True
    seen.add(id(value))
    return False


def value_identity(value: Any, depth: int) -> str:
    """One value a traced function reads: by value where it is plain data, by identity where
    it is code, by name where it is a module or torch's own; one that cannot be read, or
    past the work budget, by this process alone."""
    with _bounded():
        if not _spend():
            return UNIDENTIFIED
        try:
            return _value_identity(value, depth)
        except Exception:
            return UNIDENTIFIED


def _value_identity(value: Any, depth: int) -> str:
    plain = _plain_data(value, [MAX_DIGESTED_ITEMS])
    subclassed = _subclass_of_python_s(value)
    if plain is not None:
        rendered = plain
    elif subclassed is not None and not _pythons_class(type(value)):
        # a NamedTuple, a float subclass of the program's: what it holds and its class's code
        rendered = (
            f"{type(value).__module__}.{type(value).__qualname__}:"
            f"{value_identity(subclassed(value), depth)}:{_chained_class(type(value))}"
        )
    elif isinstance(value, (tuple, list, frozenset, set, dict)) and (
        len(value) > MAX_ITEMS or depth > MAX_DEPTH
    ):
        rendered = _container_digest(value)  # a registry: each item named, unfollowed
    elif isinstance(value, (tuple, list, frozenset, set)):
        items = [value_identity(v, depth + 1) for v in value]
        rendered = repr(sorted(items) if isinstance(value, (set, frozenset)) else items)
    elif isinstance(value, dict):
        # in insertion order, which is the program's (a kernel iterating it sees that order)
        rendered = repr([(_shallow(k), value_identity(v, depth + 1)) for k, v in value.items()])
    elif type(value).__name__ == "_OpNamespace" and is_torchs(type(value)):
        namespace = str(getattr(value, "name", ""))
        rendered = f"ops:{namespace}"  # ``L = torch.ops.lib``: its ops join by name
        collected = _collector.__dict__.get("names")
        if collected is not None:
            collected.add(namespace)
    elif isinstance(value, types.ModuleType):
        rendered = f"module:{value.__name__}"
    elif isinstance(value, type):
        rendered = f"class:{value.__module__}.{value.__qualname__}"
        if not is_torchs(value) and depth <= MAX_DEPTH:
            rendered += ":" + class_identity(value, depth + 1)
        elif not is_torchs(value) and not _pythons_class(value):
            rendered += ":" + _chained_class(value)  # past the depth: each class once
    elif _op_name(value) is not None:
        op = str(_op_name(value))
        rendered = f"op:{op}"  # the op's own identity joins through the names read
        collected = _collector.__dict__.get("names")
        if collected is not None:
            collected.update(op.replace("::", ".").split(".")[:2])
    elif isinstance(value, functools.partial) or (callable(value) and not is_torchs(value)):
        # a partial's class is functools': it is named by what it calls and its arguments
        rendered = ",".join(function_identity(value, depth))
    elif callable(value) and _qualified(value) is not None:
        rendered = f"callable:{_qualified(value)}"  # torch's own function: by its name
    else:
        rendered = _object_identity(value, depth)
    if len(rendered) > MAX_VALUE_CHARS:
        return "sha256:" + hashlib.sha256(rendered.encode()).hexdigest()[:32]
    return rendered


def _subclass_of_python_s(value: Any) -> Any:
    """The scalar or container type of Python's that ``value``'s class subclasses (to read
    its content as that type), or None."""
    cls = type(value)
    if cls in _SCALARS or cls in _CONTAINERS or isinstance(value, enum.Enum):
        return None
    if not cls.__flags__ & _HEAP_TYPE:
        return None  # a class written in C (numpy's float64): no Python code of its own
    for base in (*_CONTAINERS, *_SCALARS):
        if isinstance(value, base):
            return base
    return None


#: ``Py_TPFLAGS_HEAPTYPE``: a class made by a ``class`` statement (not one written in C).
_HEAP_TYPE = 1 << 9


def _pythons_class(cls: type) -> bool:
    return str(cls.__module__).split(".", 1)[0] in sys.stdlib_module_names or is_torchs(cls)


def _chained_class(cls: type) -> str:
    """A class of the program's past the depth classes are followed, once an identity."""
    return "seen" if _named_before(cls) else class_identity(cls, MAX_DEPTH)


def _op_name(value: Any) -> str | None:
    """``ns::name`` of an op object a function holds (``OP = torch.ops.lib.inner.default``)."""
    if not is_torchs(type(value)):
        return None
    qualified = getattr(value, "_qualified_op_name", None)  # a packet
    if isinstance(qualified, str):
        return qualified
    name = getattr(getattr(value, "_schema", None), "name", None)
    return name if isinstance(name, str) and "::" in name else None


def _qualified(value: Any) -> str | None:
    """``module.qualname`` of a function or method (``torch.sigmoid``), or None."""
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    owner = getattr(value, "__module__", None)
    if owner is None:
        owner = getattr(getattr(value, "__objclass__", None), "__qualname__", None)
    return f"{owner}.{name}" if isinstance(name, str) and isinstance(owner, str) else None


#: Plain data: these types exactly (a subclass of one carries its class's code).
_SCALARS = frozenset({str, bytes, int, float, complex, bool})
_CONTAINERS = frozenset({tuple, list, frozenset, set, dict})


def _plain_data(value: Any, budget: list[int]) -> str | None:
    """Numbers, strings and containers of them however nested, by value; None for anything
    else, or past ``budget`` items."""
    budget[0] -= 1
    if budget[0] < 0 or (len(budget) > 1 and budget[1] > _PLAIN_NESTING) or not _spend():
        return None
    if value is None or type(value) in _SCALARS:
        return repr(value)
    if type(value) in _CONTAINERS:
        # nesting counted in the budget's second slot (a cycle ends there, as not plain)
        nested = [budget[0], (budget[1] if len(budget) > 1 else 0) + 1]
        rendered_all = _plain_items(value, nested)
        budget[0] = nested[0]
        return rendered_all
    return None


#: How deep plain containers nest before they are not plain data (a cycle, a tree).
_PLAIN_NESTING = 32


def _plain_items(value: Any, budget: list[int]) -> str | None:
    if isinstance(value, (tuple, list, frozenset, set)):
        items = []
        for item in value:
            rendered = _plain_data(item, budget)
            if rendered is None:
                return None
            items.append(rendered)
        if isinstance(value, (set, frozenset)):
            items.sort()
        return f"{type(value).__name__}[{','.join(items)}]"
    if isinstance(value, dict):
        pairs = []
        for key, item in value.items():
            k, v = _plain_data(key, budget), _plain_data(item, budget)
            if k is None or v is None:
                return None
            pairs.append(f"{k}:{v}")
        return "dict{" + ",".join(pairs) + "}"  # in insertion order, as a loop sees it
    return None


def _container_digest(value: Any) -> str:
    """A container too large (or too deep) to follow: each item by what it is without
    following it further (plain data by value, code by its code and source); past
    :data:`MAX_DIGESTED_ITEMS` items, this process alone."""
    if len(value) > MAX_DIGESTED_ITEMS:
        return UNIDENTIFIED
    pairs = value.items() if isinstance(value, dict) else ((None, v) for v in value)
    digests = [
        hashlib.sha256(f"{_shallow(k)}\0{_shallow(v)}".encode()).hexdigest() for k, v in pairs
    ]
    if isinstance(value, (set, frozenset)):
        digests.sort()  # a set's order is the process's hash seed's; a dict's is the program's
    joined = "".join(digests).encode()
    return f"{type(value).__name__}:{len(value)}:" + hashlib.sha256(joined).hexdigest()[:32]


def _shallow(value: Any) -> str:
    plain = _plain_data(value, [MAX_ITEMS])
    if plain is not None:
        return plain
    if isinstance(value, (tuple, list, frozenset, set, dict)):
        return UNIDENTIFIED  # a container in a container past the depth followed
    return value_identity(value, MAX_DEPTH + 1)


def _object_identity(value: Any, depth: int = MAX_DEPTH + 1) -> str:
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return _tensor_identity(value, kind)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):
        return f"{kind}:{value.item()!r}"  # a numpy scalar (``np.float32(2.0)``)
    if numpy is not None and isinstance(value, numpy.ndarray):
        if value.nbytes > MAX_ARRAY_BYTES or value.dtype.hasobject:
            return UNIDENTIFIED
        data = numpy.ascontiguousarray(value).tobytes()
        return f"ndarray:{value.dtype}:{value.shape}:" + hashlib.sha256(data).hexdigest()[:32]
    if type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "device"):
        return str(value)
    if isinstance(value, enum.Enum):
        member = f"{kind}.{value.name}={_plain_data(value.value, [MAX_ITEMS]) or ''}"
        if is_torchs(type(value)) or is_stdlib(value):
            return member
        # the program's enum: what its class computes for a member (a property, a method);
        # once an identity (the class holds its members, which name the class again)
        return f"{member}:{_chained_class(type(value))}"
    held = _state_held(value)
    if held is not None:
        # Python's own holders of a setting (a ``ContextVar``, a ``threading.local``, a
        # ``ChainMap``, a read-only mapping): what they hold here and now
        return f"{kind}:{value_identity(held, min(depth, MAX_DEPTH))}"
    module_type = getattr(getattr(torch, "nn", None), "Module", None)
    if module_type is not None and isinstance(value, module_type) and depth <= MAX_DEPTH:
        return _module_identity(value, kind, depth)
    if is_torchs(type(value)) or isinstance(value, _STDLIB_VALUES):
        # torch's own objects (a memory format, a layout, ``finfo``) and Python's plain
        # values (a range, a Decimal) by what they print, where that names no address
        try:
            printed = repr(value)
        except Exception:
            printed = "0x"
        return f"{kind}:{printed}" if "0x" not in printed and len(printed) <= 512 else kind
    if is_stdlib(value) and kind not in _SETTINGS_CLASSES:
        return _stdlib_identity(value, kind, depth)
    if depth > MAX_DEPTH:
        is_module = module_type is not None and isinstance(value, module_type)
        return kind if is_module else _settings_chain(value, kind)
    # an object of the program's (a settings object, a dataclass): its class and what it
    # holds, followed one level more
    held = getattr(value, "__dict__", None)
    parts = [kind]
    if not is_stdlib(value):
        parts.append(class_identity(type(value), MAX_DEPTH))
    if isinstance(held, dict):
        if len(held) > MAX_ITEMS:
            return UNIDENTIFIED
        for name, item in sorted(held.items(), key=lambda kv: str(kv[0])):
            parts.append(f"{name}={value_identity(item, depth + 1)}")
    for name in _slots(type(value)):
        if hasattr(value, name):
            parts.append(f"{name}={value_identity(getattr(value, name), depth + 1)}")
    buffer = _buffer_digest(value)  # a ``ctypes.Structure`` of the program's: its fields
    if buffer is not None:
        parts.append(buffer)
    return ";".join(parts)


def _stdlib_identity(value: Any, kind: str, depth: int) -> str:
    """An object of Python's own not named above: what it holds, where that can be read
    (its bytes: ``array.array``, a ``ctypes`` value, a ``multiprocessing.Value``; what it
    prints; its attributes: ``UserDict``, ``threading.Event``), by its kind where it holds no
    setting (a logger, a lock, a file, a thread), else by this process alone."""
    if isinstance(value, _HOLDS_NO_SETTING):
        return kind
    buffer = _buffer_digest(value)
    if buffer is not None:
        return f"{kind}:{buffer}"
    try:
        printed = repr(value)
    except Exception:
        printed = "0x"
    if "0x" not in printed and len(printed) <= 512 and "<" not in printed:
        return f"{kind}:{printed}"  # ``repeat(2.0)``, ``re.compile('a+')``
    held = getattr(value, "__dict__", None)
    if isinstance(held, dict) and len(held) <= MAX_ITEMS and depth <= MAX_DEPTH:
        return ";".join(
            [kind]
            + [
                f"{name}={value_identity(item, depth + 1)}"
                for name, item in sorted(held.items(), key=lambda kv: str(kv[0]))
            ]
        )
    return UNIDENTIFIED


def _buffer_digest(value: Any) -> str | None:
    """The bytes an object exposes through the buffer protocol, by digest (None where it
    has none); past :data:`MAX_ARRAY_BYTES`, this process alone."""
    if isinstance(value, (bytes, str)):
        return None
    try:
        view = memoryview(value)
    except Exception:
        return None
    with view:
        if view.nbytes > MAX_ARRAY_BYTES:
            return UNIDENTIFIED
        return "bytes:" + hashlib.sha256(view.tobytes()).hexdigest()[:32]


def _settings_chain(value: Any, kind: str) -> str:
    """An object of the program's past the depth objects are followed (a nested settings
    object, ``CFG.model.act.slope``): its class and the plain data it holds, and the
    objects of the program's it holds the same way, to any depth, each once an identity."""
    if _named_before(value):
        return f"{kind}:seen"
    held = getattr(value, "__dict__", None)
    items = list(held.items()) if isinstance(held, dict) else []
    items += [(n, getattr(value, n)) for n in _slots(type(value)) if hasattr(value, n)]
    if len(items) > MAX_ITEMS:
        return UNIDENTIFIED
    parts = [kind]
    for name, item in sorted(items, key=lambda kv: str(kv[0])):
        if not _spend():
            return UNIDENTIFIED
        plain = _plain_data(item, [MAX_ITEMS])
        if plain is not None:
            parts.append(f"{name}={plain}")
        elif _is_programs_object(item):
            item_kind = f"{type(item).__module__}.{type(item).__qualname__}"
            parts.append(f"{name}={_settings_chain(item, item_kind)}")
    return ";".join(parts)


def _is_programs_object(value: Any) -> bool:
    """An instance of a class of the program's (not a function, class, module or
    container; not torch's or Python's own)."""
    if isinstance(value, (type, types.ModuleType, types.FunctionType, types.MethodType)):
        return False
    if isinstance(value, (tuple, list, dict, set, frozenset)) or is_torchs(type(value)):
        return False
    return not is_stdlib(value) and (
        isinstance(getattr(value, "__dict__", None), dict) or bool(_slots(type(value)))
    )


_UNSET = object()


def _state_held(value: Any) -> Any:
    """What a holder of state of Python's own holds for this thread and context, or None
    where ``value`` is no such holder."""
    if isinstance(value, contextvars.ContextVar):
        held = value.get(_UNSET)
        return ["unset"] if held is _UNSET else [held]
    if isinstance(value, (threading.local, _threading_local.local)):
        return dict(vars(value))  # this thread's
    if isinstance(value, collections.ChainMap):
        return list(value.maps)
    if isinstance(value, types.MappingProxyType):
        return dict(value)
    if isinstance(value, weakref.ref):
        return [value()]
    if isinstance(value, (weakref.WeakValueDictionary, weakref.WeakKeyDictionary)):
        return dict(value.items())
    if isinstance(value, functools.partialmethod):
        return [value.func, value.args, dict(value.keywords)]
    return None


def _module_identity(module: Any, kind: str, depth: int) -> str:
    """An ``nn.Module`` a kernel calls (``ACT = nn.LeakyReLU(negative_slope=...)``): its class,
    its settings (the plain attributes its ``__init__`` set), its parameters and buffers by
    content, its submodules the same way one level down."""
    parts = [kind]
    if not is_torchs(type(module)):
        parts.append(class_identity(type(module), MAX_DEPTH))
    torchs = is_torchs(type(module))
    held_by = vars(module)
    if len(held_by) > MAX_ITEMS:
        return UNIDENTIFIED
    for name, held in sorted(held_by.items(), key=lambda kv: str(kv[0])):
        if isinstance(held, dict) and "hook" in name:
            # hooks by their order, values only (their keys are a process-wide counter)
            if len(held) > MAX_ITEMS:
                return UNIDENTIFIED
            for i, item in enumerate(list(held.values())):
                parts.append(f"{name}.{i}={value_identity(item, depth + 1)}")
        elif name in _MODULE_CONTENTS:
            if len(held) > MAX_ITEMS:
                return UNIDENTIFIED
            for sub, item in list(held.items()):
                parts.append(f"{name}.{sub}={value_identity(item, depth + 1)}")
        elif not (torchs and name.startswith("_")):  # torch's own bookkeeping
            parts.append(f"{name}={value_identity(held, depth + 1)}")
    return ";".join(parts)


#: What an ``nn.Module`` holds that decides what it computes, item by item (with every
#: dict of hooks, by order).
_MODULE_CONTENTS = frozenset({"_parameters", "_buffers", "_modules"})


def _slots(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else list(slots))
    return [n for n in names if n not in ("__dict__", "__weakref__")][:MAX_ITEMS]


def _tensor_identity(value: Any, kind: str) -> str:
    try:
        described = f"tensor:{value.dtype}:{tuple(value.shape)}:{value.device.type}"
        if value.device.type == "meta":
            return described  # no content to name
        nbytes = value.numel() * value.element_size()
        if nbytes > MAX_ARRAY_BYTES or type(value).__name__ not in ("Tensor", "Parameter"):
            return UNIDENTIFIED  # too large to digest, or a subclass holding what it holds
        data = (
            value.detach()
            .to("cpu")
            .contiguous()
            .reshape(-1)
            .view(sys.modules["torch"].uint8)
            .numpy()
            .tobytes()
        )
        return described + ":" + hashlib.sha256(data).hexdigest()[:32]
    except Exception:
        return UNIDENTIFIED


def class_identity(cls: type, depth: int = 0) -> str:
    """A class outside torch by its methods and plain attributes, and those of each of its
    bases outside torch; and its metaclass the same way (a class-level property it
    computes: ``Settings.SCALE``)."""
    parts: list[str] = []
    meta = type(cls)
    python_s = str(meta.__module__).split(".", 1)[0] in sys.stdlib_module_names  # ABCMeta
    if meta is not type and not is_torchs(meta) and not python_s and cls is not meta:
        parts.append("meta:" + class_identity(meta, depth))
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
            else:  # a setting of the class (a dtype, a table, a partial): not followed
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
