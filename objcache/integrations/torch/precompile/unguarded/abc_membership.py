"""What a trace asked an abstract class, as records of a precompile entry (docs/torch.md,
"What a served entry depends on").

``isinstance(obj, Kind)`` and ``issubclass(C, Kind)`` against an abstract class are answered
by its registry (``Kind.register(C)``) and its ``__subclasshook__``, which Dynamo does not
trace: it folds the answer into the trace and torch guards none of it (one process keeps its
registrations). A reader that registered the class otherwise would run the writer's branch
(the forty-third adversarial review: off by 7).

While a frame of a precompile package is traced, each such question is collected as the
sources of the two classes and the answer: :func:`.portable_guards.membership_records`
makes one ``ABC_MEMBERSHIP`` record per abstract class, which the reader asks again
(:func:`.portable_guards.check_for`, until the whole guard first holds, as a compile there
would have asked then). A class no import path names (one defined in a function), or an
abstract class with a ``__subclasshook__`` of the program's (code that may read anything),
makes the frame unsaveable (``unsaved:abc_check``). A subclass through its own bases with
no such hook is one in every process, and Python's own abstract classes about Python's and
torch's types are answered alike everywhere: neither is recorded.
"""

from __future__ import annotations

import abc
import types
import typing
from collections.abc import Callable
from typing import Any

from objcache.integrations.patching import marked
from objcache.integrations.torch.precompile.portable_guards import (
    import_source,
    parse_source,
    resolve,
)
from objcache.integrations.torch.precompile.precompile_entry import unsaveable
from objcache.integrations.torch.precompile.unguarded.guards_unpickling import programs_class

#: The ``counters`` reason of a frame whose question to an abstract class cannot be recorded.
UNSAVED = "abc_check"
#: Where the questions are collected: an attribute of the frame's ``OutputGraph``.
_ATTR = "_objcache_memberships"


def _abstract(cls: Any) -> bool:
    return isinstance(cls, abc.ABCMeta)


class Unflattenable(Exception):
    """A second argument of ``isinstance``/``issubclass`` this module cannot list classes of."""


def _classes(value: Any, depth: int = 0) -> list[Any]:
    """The classes ``isinstance``/``issubclass`` asks, flattened as CPython and Dynamo do:
    nested tuples, ``X | Y`` unions, ``typing.Union`` and ``typing`` aliases of a class
    (``typing.Sequence`` asks ``collections.abc.Sequence``); raises :class:`Unflattenable`
    for anything else."""
    if depth > 32:
        raise Unflattenable(repr(value))
    if isinstance(value, tuple):
        return [c for v in value for c in _classes(v, depth + 1)]
    if isinstance(value, type):
        return [value]
    if isinstance(value, types.UnionType) or typing.get_origin(value) is typing.Union:
        return [c for v in typing.get_args(value) for c in _classes(v, depth + 1)]
    origin = getattr(value, "__origin__", None)
    if isinstance(origin, type) and not typing.get_args(value):
        return [origin]  # a bare alias: ``typing.Sequence``
    raise Unflattenable(repr(value))


def asked(member: Any, classes: Any) -> list[Any]:
    """The abstract classes of ``classes`` whose answer about ``member`` (a class) a process
    can change without Dynamo seeing it: by a ``register()`` (the answer False, or True by a
    registration), or by a ``__subclasshook__`` of a library's or the program's (a
    runtime-checkable protocol's included). A subclass through its own bases, with no such
    hook, is one in every process; Python's own abstract classes about Python's and torch's
    types are answered alike everywhere."""
    out = []
    for cls in _classes(classes):
        if not _abstract(cls) or not (programs_class(cls) or programs_class(member)):
            continue
        if programs_hook(cls) or not _by_its_bases(member, cls):
            out.append(cls)
    return out


def programs_hook(cls: Any) -> bool:
    """Whether a class of ``cls``'s bases that is the program's defines ``__subclasshook__``."""
    return any("__subclasshook__" in vars(k) and programs_class(k) for k in cls.__mro__)


def _by_its_bases(member: Any, cls: Any) -> bool:
    """Whether ``member`` is a subclass of ``cls`` through its own bases: ``cls`` itself, or
    a class of Python's or torch's that is one (a transformers output is an ``OrderedDict``,
    a ``Mapping`` in every process)."""
    try:
        mro = member.__mro__
        ours = [base for base in mro if base is not object and not programs_class(base)]
        return cls in mro or (not programs_class(cls) and any(issubclass(b, cls) for b in ours))
    except Exception:
        return False


def class_source(cls: Any) -> str | None:
    """``__import__('<module>').<qualname>`` where that path reaches ``cls`` now, else None
    (a class defined in a function, or one its module does not hold under its name)."""
    module = getattr(cls, "__module__", None)
    qualname = getattr(cls, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    source = import_source(module, *qualname.split("."))
    path = parse_source(source)
    if path is None or resolve(*path, {}, {}) is not cls:
        return None
    return source


def record(tx: Any, member: Any, classes: Any) -> None:
    """Collect what ``isinstance``/``issubclass`` of ``member`` against ``classes`` asked
    abstract classes (:func:`asked`) for the frame ``tx`` traces; where one cannot be asked
    again on another machine, the frame's package is unsaveable."""
    output = getattr(tx, "output", None)
    package = getattr(output, "package", None)
    if package is None:
        return  # not a frame of a precompile package
    questions = asked(member, classes)
    if not questions:
        return
    member_source = class_source(member)
    found: dict[str, dict[str, bool]] = output.__dict__.setdefault(_ATTR, {})
    for cls in questions:
        source = class_source(cls)
        if member_source is None or source is None or programs_hook(cls):
            unsaveable(tx, UNSAVED)
            return
        found.setdefault(source, {})[member_source] = bool(issubclass(member, cls))


def collected(output_graph: Any) -> dict[str, dict[str, bool]]:
    """The answers the frame's trace read: abstract class source -> member source -> answer."""
    found = getattr(output_graph, "__dict__", {}).get(_ATTR, {})
    return found if isinstance(found, dict) else {}


def wrap_membership(original: Callable[..., Any], of_value: bool) -> Any:
    """Dynamo's ``isinstance`` (``of_value``) or ``issubclass``: the answers an abstract
    class's machinery gave (which Dynamo does not trace and torch never guards) are
    recorded for the frame (:func:`record`)."""

    def membership(self: Any, tx: Any, left: Any, right: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            classes = right.as_python_constant()
        except Exception:  # classes Dynamo cannot name as a constant: torch's own path
            return original(self, tx, left, right, *args, **kwargs)
        try:
            member = left.python_type() if of_value else left.as_python_constant()
            record(tx, member, classes)
        except Exception:  # a member or an answer that cannot be read: fails closed
            unsaveable(tx, UNSAVED)
        return original(self, tx, left, right, *args, **kwargs)

    marked(membership, original)
    return membership
