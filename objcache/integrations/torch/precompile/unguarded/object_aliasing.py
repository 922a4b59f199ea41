"""Which of a frame's guarded objects are one object (docs/torch.md, "What a served entry
depends on").

Dynamo traces two names that hold one object (``B = A``) as one object, and two that hold
two objects as two: a frame that sets ``A.n`` and then reads ``B.n`` computes another result
either way. torch guards each object's type and the values it read, never which of them are
the same object (one process keeps its bindings), so an entry written where ``A`` and ``B``
were two objects was served to a reader where they are one, and the other way round (the
forty-second adversarial review: off by 7 both ways; torch with one shared cache folder
too).

Each object a kept ``TYPE_MATCH`` reaches (an instance: not a class, module, function,
tensor or ``nn.Module``: the tensors a graph reads are its inputs, whose sharing torch's own
duplicate-input guards and ``precompile_guards._caller_may_alias`` cover) is an ``ALIASES``
record: its source, and the source of the first such object it is (empty where it is its
own). The reader resolves the sources at every call and compares the same partition.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Any

#: The record kind (:class:`.portable_guards.Portable`).
RECORD_KIND = "ALIASES"
#: At most this many objects are compared a call; a frame guarding more is not saved
#: (:class:`.portable_guards.Unportable`, raised by the caller).
MAX_OBJECTS = 64

_NOT_OBJECTS: tuple[type, ...] = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
)


def is_object(value: Any) -> bool:
    """Whether ``value`` is an instance whose sharing a trace can depend on: it holds state
    of its own (a ``__dict__``) and is not a class, module, function or tensor."""
    if isinstance(value, _NOT_OBJECTS) or not isinstance(getattr(value, "__dict__", None), dict):
        return False
    torch = _torch()
    # a module's parameters and buffers are the graph's inputs: torch guards their sharing
    return torch is None or not isinstance(value, torch.Tensor | torch.nn.Module)


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

    def holds(f_locals: Any) -> bool:
        values = read_all(f_locals)
        first: dict[int, int] = {}
        return tuple(first.setdefault(id(v), i) for i, v in enumerate(values)) == expected

    return holds
