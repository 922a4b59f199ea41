"""What a trace takes from this process's hash order and object addresses (docs/torch.md,
"What a served entry depends on").

Unless ``PYTHONHASHSEED`` fixes it when the interpreter starts, Python salts the hash of
``str`` and ``bytes`` per process: a set of names iterates in another order in every
process, and ``hash("x")`` is another number. Dynamo folds both into a trace as constants
with no guard that could tell (a guard on a set compares its contents, not its order), so a
served entry would replay the writer's order on a reader that iterates its own. objcache:

* a set at a guard's source is a ``SET_ORDER`` record (:mod:`.portable_guards`): its order
  on the writer, checked on the reader;
* a frozenset constant of a traced code that the code iterates (``for n in {"a", "b"}``
  compiles to one; an ``in`` test does not iterate) makes the frame unsaveable in a process
  whose hash order is its own (:func:`iterated_constant_sets`);
* ``hash()`` of anything but a number while tracing does the same (:func:`wrap_generic_hash`).

``id()`` of an object while tracing is its address in this process, folded in as a constant;
torch guards the object's identity (``ID_MATCH``), which a portable record names by what it
is, never by where it lies: such a frame is not saved either (:func:`wrap_call_id`), where the
program's code asked (Python's and torch's own use ``id()`` for memos).

``a is b`` between two values of a number, string or bytes type (or a tuple of them) folds the
identity of two objects into the trace: torch guards each value, not that the two are one
object, and two equal values are one object or two as the program's history made them (a
float read twice from the environment, a string joined at run time): such a frame is not
saved either (:func:`wrap_is_op`).

A fixed seed is part of the compiler settings a served frame is checked against
(:mod:`.compile_settings`), so there both are the same in every process that shares it.
"""

from __future__ import annotations

import dis
import functools
import os
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

from objcache.integrations.patching import marked

#: Values whose hash is the same in every process, whatever the seed.
_NUMBERS = (type(None), bool, int, float, complex)
#: The ``counters`` reason of a frame whose trace read the hash order.
UNSAVED = "hash_order"
#: The ``counters`` reason of a frame whose trace folded an object's address.
OBJECT_ID_UNSAVED = "object_id"


@functools.cache
def fixed_seed() -> str | None:
    """``PYTHONHASHSEED`` as the interpreter read it at start (``/proc/self/environ``: a
    program may change ``os.environ`` later), or None where hashes are salted per process."""
    value: str | None = None
    try:
        with open("/proc/self/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"PYTHONHASHSEED="):
                    value = item.split(b"=", 1)[1].decode("ascii", "replace")
    except OSError:  # not Linux: the environment as it is now
        value = os.environ.get("PYTHONHASHSEED")
    if not sys.flags.hash_randomization:
        return "0"
    if value is None or not value.isdigit():  # unset or "random"
        return None
    return value


def per_process() -> bool:
    """Whether this process's hashes of strings are its own."""
    return fixed_seed() is None


def _seed_dependent(value: Any) -> bool:
    return not isinstance(value, _NUMBERS)


def iterated_constant_sets(codes: Iterable[types.CodeType]) -> bool:
    """Whether a code iterates (or otherwise uses, other than an ``in`` test) a frozenset
    constant whose order depends on the hash seed."""
    for code in codes:
        try:
            instructions = list(dis.get_instructions(code))
        except Exception:
            return True  # fail closed: a code we cannot read
        for i, ins in enumerate(instructions):
            value = ins.argval
            if ins.opname != "LOAD_CONST" or not isinstance(value, frozenset):
                continue
            if not any(_seed_dependent(v) for v in value) or len(value) < 2:
                continue
            following = instructions[i + 1].opname if i + 1 < len(instructions) else ""
            if following != "CONTAINS_OP":
                return True
    return False


def _mark(tx: Any, why: str = UNSAVED) -> None:
    output = getattr(tx, "output", None)
    package = getattr(output, "package", None)
    if package is not None:
        package.__dict__.setdefault("_objcache_unsaveable", why)


def wrap_generic_hash(original: Callable[..., Any]) -> Any:
    """Dynamo's ``hash()`` of a traced value: a value whose hash is salted per process makes
    the frame's package unsaveable (its result is folded into the trace)."""

    def generic_hash(tx: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if per_process():
                constant = obj.as_python_constant() if obj.is_python_constant() else obj
                if _seed_dependent(constant):
                    _mark(tx)
        except Exception:
            _mark(tx)
        return original(tx, obj, *args, **kwargs)

    marked(generic_hash, original)
    return generic_hash


def _programs_call(tx: Any) -> bool:
    """Whether the code ``tx`` traces is outside torch and Python's own library (where
    unreadable: True). Python's and torch's own code use ``id()`` for memos and cycle checks
    (``inspect.unwrap``), never to compute a value."""
    from objcache.integrations.torch.precompile.traced_code import in_torch_or_python

    filename = getattr(getattr(tx, "f_code", None), "co_filename", None)
    return not (isinstance(filename, str) and in_torch_or_python(filename))


def wrap_call_id(original: Callable[..., Any]) -> Any:
    """Dynamo's ``id()`` of a traced value (``BuiltinVariable.call_id``) in the program's
    code: the frame's package is unsaveable, whatever the value (an address is this
    process's own)."""

    def call_id(self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if _programs_call(tx):
                _mark(tx, OBJECT_ID_UNSAVED)
        except Exception:
            _mark(tx, OBJECT_ID_UNSAVED)
        return original(self, tx, *args, **kwargs)

    marked(call_id, original)
    return call_id


#: The ``counters`` reason of a frame whose trace compared two values by identity.
VALUE_IDENTITY_UNSAVED = "value_identity"
#: Values CPython keeps one object of, whatever made them.
_SINGLETONS = (type(None), bool, type(Ellipsis), type(NotImplemented))
#: What a traced value is when it is none of Dynamo's constants.
_NOT_A_VALUE = object()


def identity_of_history(value: Any) -> bool:
    """Whether ``value is other`` may answer otherwise in another process holding equal
    values: numbers past CPython's small ints, non-empty strings, bytes, tuples and
    frozensets (the empty ones and the singletons are one object in every process)."""
    if isinstance(value, _SINGLETONS):
        return False
    if type(value) is int:
        return not -5 <= value <= 256
    if type(value) in (str, bytes, tuple, frozenset):
        return len(value) > 0
    return type(value) in (float, complex)


def _traced_value(variable: Any) -> Any:
    """The Python value a stack entry stands for where it is one of Dynamo's constants (or a
    lazily built one, peeked without building it), else a marker."""
    unwrap = getattr(variable, "unwrap", None)
    if callable(unwrap):
        variable = unwrap()
    if callable(getattr(variable, "peek_value", None)) and not variable.is_realized():
        return variable.peek_value()
    if type(variable).__name__ == "ConstantVariable":
        return variable.value
    return _NOT_A_VALUE


def wrap_is_op(original: Callable[..., Any]) -> Any:
    """Dynamo's handler of ``a is b`` (or ``a is not b``: ``compare_op_handlers["is"]``,
    which ``IS_OP`` calls with the two stack entries): where both sides are values whose
    identity is their history's (:func:`identity_of_history`), the frame's package is
    unsaveable."""

    def compare(tx: Any, args: Any, kwargs: Any) -> Any:
        try:
            values = [_traced_value(v) for v in args]
            if len(values) == 2 and all(
                v is not _NOT_A_VALUE and identity_of_history(v) for v in values
            ):
                _mark(tx, VALUE_IDENTITY_UNSAVED)
        except Exception:
            _mark(tx, VALUE_IDENTITY_UNSAVED)
        return original(tx, args, kwargs)

    marked(compare, original)
    return compare
