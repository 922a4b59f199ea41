"""What unpickling a frame's guards state would run of the program's code (docs/torch.md,
"What a served entry depends on").

torch saves the objects a frame's guards read (its scope) with :mod:`pickle`, the program's
objects by value, and a reader rebuilds them with :func:`pickle.loads` before any guard is
checked. Rebuilding runs code: a class's ``__new__`` (a singleton's returns the reader's own
live object), ``__setstate__``, a ``__reduce__``'s callable (``get_config()``), then sets the
writer's state on what they returned. Where that code is the program's, the reader's live
objects can take the writer's values before the guards compare them (the guard then holds
whatever the reader had), and the program's own eager code computes with them afterwards.

So the writer's state is read once with every global replaced by a stand-in that records
what would be called on it (no import, no code of anyone's runs), and each call is judged:
torch's and Python's own code, and C code, rebuild fresh objects; the program's code may
not. :func:`program_code` names the first call that would run the program's code, or
returns None. The writer does not save such a frame; the reader refuses such a state before
unpickling it (an entry written otherwise).
"""

from __future__ import annotations

import io
import pickle
import sys
import types
from typing import Any

from objcache.integrations.torch.precompile.traced_code import in_torch_or_python

#: The ``counters`` reason of a frame whose guards state would run the program's code.
UNSAVED = "program_unpickling"
#: A state with more stand-in operations than this is not judged (fails closed).
MAX_OPERATIONS = 200_000

#: Python's helpers that build an instance of the class they are given (its ``__new__``,
#: and for ``_reconstructor`` its base's ``__new__`` and ``__init__``).
_INSTANTIATORS = frozenset(
    {("copyreg", "__newobj__"), ("copyreg", "__newobj_ex__"), ("copyreg", "_reconstructor")}
)
#: Python's builtins that read or set an attribute of their first argument (its class's
#: descriptors, ``__getattr__`` or ``__setattr__`` run).
_ATTRIBUTE_CALLS = frozenset({("builtins", "getattr"), ("builtins", "setattr")})
#: Builtins that run code given as text or reach outside the process: never a rebuild.
_RUNS_TEXT = frozenset(
    ("builtins", name) for name in ("eval", "exec", "compile", "__import__", "breakpoint", "open")
)


class _Refused(Exception):
    """A state this module does not judge (too many operations, a persistent id that is not
    a name)."""


class _Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any, tuple[Any, ...]]] = []
        self._classes: dict[tuple[str, str], type] = {}

    def add(self, what: str, target: Any, args: tuple[Any, ...] = ()) -> None:
        if len(self.events) >= MAX_OPERATIONS:
            raise _Refused("too many operations")
        self.events.append((what, target, args))

    def stand_in(self, where: tuple[str, str]) -> type:
        """The stand-in of the global ``module:qualname`` (one per name)."""
        cls = self._classes.get(where)
        if cls is None:
            if len(self._classes) >= MAX_OPERATIONS:
                raise _Refused("too many globals")
            cls = _StandInMeta("_StandIn", (_StandIn,), {"_log": self, "_where": where})
            self._classes[where] = cls
        return cls


class _StandInMeta(type):
    """The type of a stand-in global: calling it is a call of that global."""

    _log: _Log
    _where: tuple[str, str]

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        cls._log.add("call", cls._where, args)
        owner = args[0] if args else None
        if (
            cls._where == ("builtins", "getattr")
            and len(args) == 2
            and isinstance(owner, _StandInMeta)
            and isinstance(args[1], str)
        ):  # an attribute of a global (torch's rebuilders on its pickler class): that global
            module, qualname = owner._where
            return cls._log.stand_in((module, f"{qualname}.{args[1]}"))
        return _Made(cls._log, cls._where)


class _StandIn(metaclass=_StandInMeta):
    """A global as :meth:`pickle.Unpickler.find_class` would return it."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:  # NEWOBJ: cls.__new__(cls, ...)
        cls._log.add("new", cls._where)
        return _Made(cls._log, cls._where)


class _Made:
    """What a stand-in call returned: an object whose state pickle then sets."""

    def __init__(self, log: _Log, made_by: tuple[str, str] | None = None) -> None:
        self._log = log
        self._made_by = made_by

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._log.add("call_made", self._made_by)
        return _Made(self._log)

    def __setstate__(self, state: Any) -> None:
        slots = isinstance(state, tuple) and len(state) == 2 and state[1] is not None
        self._log.add("build_slots" if slots else "build", self._made_by)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._log.add("setitem", self._made_by)

    def append(self, value: Any) -> None:
        self._log.add("append", self._made_by)

    def extend(self, values: Any) -> None:
        self._log.add("append", self._made_by)


class _Reader(pickle.Unpickler):
    def __init__(self, data: bytes, log: _Log) -> None:
        super().__init__(io.BytesIO(data))
        self._log = log

    def find_class(self, module: str, name: str) -> Any:
        return self._log.stand_in((module, name))

    def persistent_load(self, pid: Any) -> Any:
        # torch 2.15 names a pruned value so (its unpickler makes a marker of it): no code
        # of the program's runs; what the state would then set on it is judged as unknown
        if not isinstance(pid, (str, int)):
            raise _Refused("a persistent id that is not a name")
        return _Made(self._log)


def _resolve(where: tuple[str, str]) -> Any:
    """The loaded object ``module:qualname`` names, read from the module's and classes'
    own dicts (no import, no ``__getattr__``); raises LookupError where not loaded."""
    module = sys.modules.get(where[0])
    if module is None:
        raise LookupError(f"{where[0]} is not loaded")
    value: Any = module
    for part in where[1].split("."):
        # a class's attribute may come from a base (torch's pickler inherits rebuilders)
        owners = value.__mro__ if isinstance(value, type) else (value,)
        for owner in owners:
            namespace = getattr(owner, "__dict__", None)
            if isinstance(namespace, (dict, types.MappingProxyType)) and part in namespace:
                value = namespace[part]
                break
        else:
            raise LookupError(f"{where[0]}:{where[1]}")
    return value


def _function(value: Any) -> Any:
    if isinstance(value, (staticmethod, classmethod)):
        return value.__func__
    return value


def _programs_code(value: Any) -> bool:
    """Whether calling ``value`` runs Python code outside torch's package and Python's own
    (C code, torch's and the standard library's are not the program's)."""
    fn = _function(value)
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    if type(fn) is not types.FunctionType:
        return False  # C: a builtin, a slot wrapper, a method descriptor
    filename = fn.__code__.co_filename
    if not filename.startswith("<"):
        return not in_torch_or_python(filename)
    made_by = fn.__globals__.get("__name__")  # code without a file (exec): by its globals
    if not isinstance(made_by, str):
        return True
    top = made_by.split(".", 1)[0]
    return not (top == "torch" or top in sys.stdlib_module_names)


def _class_runs(cls: type, names: tuple[str, ...]) -> str | None:
    """The first of ``names`` that ``cls`` (or its metaclass, for ``__call__``) finds in a
    class whose definition is the program's code."""
    for name in names:
        owner = type(cls) if name == "__call__" else cls
        for klass in getattr(owner, "__mro__", ()):
            value = vars(klass).get(name)
            if value is None:
                continue
            if _programs_code(value):
                return f"{klass.__module__}.{klass.__qualname__}.{name}"
            break
    return None


def _target(where: Any) -> Any:
    if where is None:
        raise LookupError("an object a call made")
    return _resolve(where)


def _judge(what: str, where: Any, args: tuple[Any, ...]) -> str | None:
    """Why this stand-in operation would run the program's code (None where it would not);
    raises LookupError where the global is not loaded."""
    if what == "call_made":
        return "a call of an object the state made"
    target = _target(where)
    label = f"{where[0]}:{where[1]}"
    if what == "call":
        if where in _ATTRIBUTE_CALLS:
            return _attribute_call(label, args[0] if args else None)
        if where in _RUNS_TEXT:
            return label
        if where in _INSTANTIATORS:
            return _instantiation(where, args)
        if isinstance(target, type):
            return _class_runs(target, ("__call__", "__new__", "__init__"))
        return label if _programs_code(target) else None
    if not isinstance(target, type):
        return f"{label} returned what the state then sets"
    if what == "new":
        return _class_runs(target, ("__new__",))
    if what == "build":
        return _class_runs(target, ("__setstate__",))
    if what == "build_slots":
        return _class_runs(target, ("__setstate__",)) or (
            None if _has_setstate(target) else _class_runs(target, ("__setattr__",))
        )
    if what == "setitem":
        return _class_runs(target, ("__setitem__",))
    if what == "append":
        return _class_runs(target, ("append", "extend"))
    return what


def _attribute_call(label: str, owner: Any) -> str | None:
    """``getattr``/``setattr`` of ``owner``: its class's descriptors and attribute hooks run.
    A global of torch's or Python's, or a plain value the state holds, is fine; the
    program's classes and their objects, and what a call made, are not judged further."""
    if isinstance(owner, _Made):
        return f"{label} of an object the state made"
    inner = getattr(owner, "_where", None) if isinstance(owner, _StandInMeta) else None
    if inner is not None:  # a global: the object it names here
        owner = _resolve(inner)
    cls = owner if isinstance(owner, type) else type(owner)
    if programs_class(cls) or programs_class(type(cls)):
        return f"{label} of {cls.__module__}.{cls.__qualname__}"
    return None


def _instantiation(where: tuple[str, str], args: tuple[Any, ...]) -> str | None:
    """Python's pickling helpers: ``__newobj__(cls, ...)`` and ``__newobj_ex__`` run
    ``cls.__new__``; ``_reconstructor(cls, base, state)`` runs ``base.__new__`` and
    ``base.__init__``."""
    classes = [a for a in args[:2] if isinstance(a, type) and hasattr(a, "_where")]
    if not classes:
        return None
    if where[1] == "_reconstructor":
        base = _resolve(classes[-1]._where)
        return _class_runs(base, ("__new__", "__init__")) if isinstance(base, type) else None
    cls = _resolve(classes[0]._where)
    return _class_runs(cls, ("__new__",)) if isinstance(cls, type) else None


def programs_class(cls: Any) -> bool:
    """Whether ``cls`` is defined outside torch, Python's own modules and C."""
    module = getattr(cls, "__module__", None)
    if not isinstance(module, str):
        return True
    top = module.split(".", 1)[0]
    return not (top in ("torch", "builtins") or top in sys.stdlib_module_names)


def _has_setstate(cls: type) -> bool:
    return any("__setstate__" in vars(klass) for klass in cls.__mro__ if klass is not object)


def program_code(data: bytes) -> str | None:
    """What of the program's code unpickling ``data`` would run (the first such call, named),
    or None where it would run only torch's, Python's and C code. A state it cannot read, a
    global not loaded in this process, or one past its bounds is named too (fails closed)."""
    log = _Log()
    try:
        _Reader(data, log).load()
    except _Refused as exc:
        return f"unjudged: {exc}"
    except Exception as exc:
        return f"unreadable: {type(exc).__name__}"
    for what, where, args in log.events:
        try:
            found = _judge(what, where, args)
        except LookupError as exc:
            return f"not loaded: {exc}"
        except Exception as exc:
            return f"unjudged: {type(exc).__name__}"
        if found:
            return found
    return None
