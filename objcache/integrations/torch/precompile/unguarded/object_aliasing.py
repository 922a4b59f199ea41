"""Which of a frame's guarded objects are one object (docs/torch.md, "What a served entry
depends on").

Dynamo traces two names that hold one object (``B = A``) as one object, and two that hold
two objects as two: a frame that sets ``A.n`` and then reads ``B.n`` computes another result
either way. torch guards each object's type and the values it read, never which of them are
the same object (one process keeps its bindings), so an entry written where ``A`` and ``B``
were two objects was served to a reader where they are one, and the other way round (the
forty-second adversarial review: off by 7 both ways; torch with one shared cache folder
too).

Each mutable object a guard reaches (:data:`OBJECT_GUARDS`: an instance with state of its own,
a ``__slots__`` instance, a container such as a ``dict``, ``list``, ``set`` or ``deque``, an
``nn.Module``; not a class, module, function, an immutable value or a tensor: the tensors a
graph reads are its inputs, whose sharing torch's own duplicate-input guards and
``precompile_guards._caller_may_alias`` cover) is an ``ALIASES`` record: its source, and the
source of the first such object it is (empty where it is its own). An ``nn.Module``'s own
bookkeeping (its ``__dict__``, ``_modules``, ``_parameters``, ``_buffers``) is read with the
module and not compared on its own. The reader resolves the sources at every call and
compares the same partition (the forty-fifth review: two names holding one ``dict``,
``list``, ``set``, ``__slots__`` instance or submodule on the reader, two on the writer,
was served the writer's code, off by 1).
"""

from __future__ import annotations

import enum
import operator
import types
from collections.abc import Callable, Sequence
from typing import Any

#: The record kind (:class:`.portable_guards.Portable`).
RECORD_KIND = "ALIASES"
#: At most this many objects are compared a call; a frame guarding more is not saved
#: (:class:`.portable_guards.Unportable`, raised by the caller).
MAX_OBJECTS = 1024
#: The guards whose source names an object a frame may mutate through one name and read
#: through another: a type check (an instance, a dict, a module), a length (a list), a
#: value (a set Dynamo treats as a constant), a dict's keys.
OBJECT_GUARDS = frozenset(
    {
        "TYPE_MATCH",
        "SEQUENCE_LENGTH",
        "LIST_LENGTH",
        "DICT_LENGTH",
        "CONSTANT_MATCH",
        "EQUALS_MATCH",
        "DICT_KEYS",
        "DICT_KEYS_MATCH",
        "DICT_VERSION",
    }
)

_NOT_OBJECTS: tuple[type, ...] = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    enum.Enum,  # a member is one object everywhere; its value is guarded
)
#: Immutable: one object or two, a trace reads the same; not a subclass's instance with a
#: ``__dict__`` of its own (``class T(tuple)``, ``A.n = 3.0``: the forty-sixth review).
_IMMUTABLE: tuple[type, ...] = (
    int,
    float,
    complex,
    str,
    bytes,
    type(None),
    tuple,
    frozenset,
    range,
    slice,
    type(Ellipsis),
    type(NotImplemented),
)


def is_object(value: Any) -> bool:
    """Whether ``value`` is an object whose sharing a trace can depend on: one that can be
    changed in place (not a class, module, function or immutable value) and is not a tensor
    or one of torch's value types."""
    if isinstance(value, _NOT_OBJECTS):
        return False
    if isinstance(value, _IMMUTABLE) and not isinstance(getattr(value, "__dict__", None), dict):
        return False
    torch = _torch()
    # a tensor read by a graph is its input: torch guards its sharing
    return torch is None or not isinstance(
        value, torch.Tensor | torch.dtype | torch.device | torch.layout | torch.memory_format
    )


def bookkeeping(values: Sequence[Any]) -> set[int]:
    """The addresses of the ``nn.Module`` objects' own bookkeeping among ``values`` (each
    module's ``__dict__``, ``_modules``, ``_parameters``, ``_buffers``): read with their
    module, not compared on their own."""
    torch = _torch()
    if torch is None:
        return set()
    found: set[int] = set()
    for value in values:
        if isinstance(value, torch.nn.Module):
            own = vars(value)
            found.add(id(own))
            found.update(id(own.get(n)) for n in ("_modules", "_parameters", "_buffers"))
    return found


def _torch() -> Any:
    import sys

    return sys.modules.get("torch")


def partition(candidates: Sequence[tuple[str, Any]]) -> list[tuple[str, str]]:
    """``(source, source of the first candidate that is the same object, or "")`` for each
    candidate (sources unique, in order); empty where fewer than two."""
    if len(candidates) < 2:
        return []
    first: dict[int, str] = {}
    out: list[tuple[str, str]] = []
    for source, value in candidates:
        known = first.setdefault(id(value), source)
        out.append((source, "" if known == source else known))
    return out


def checker(
    records: Sequence[tuple[str, str]],
    read_all: Callable[[Any], tuple[Any, ...]],
) -> Callable[[Any], bool]:
    """True at a call where the objects at the records' sources (``read_all(f_locals)``, in
    the records' order) are shared exactly as on the writer."""
    index = {source: i for i, (source, _) in enumerate(records)}
    expected = tuple(index[same] if same else i for i, (_, same) in enumerate(records))
    #: the objects that last held (replaced whole: calls may come from several threads): the
    #: very same objects again hold without the partition (one C-level pass a call)
    passed: list[tuple[Any, ...]] = [()]

    def holds(f_locals: Any) -> bool:
        values = read_all(f_locals)
        last = passed[0]
        if len(last) == len(values) and all(map(operator.is_, values, last)):
            return True
        first: dict[int, int] = {}
        if tuple(first.setdefault(id(v), i) for i, v in enumerate(values)) != expected:
            return False
        passed[0] = values
        return True

    return holds
