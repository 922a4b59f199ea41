"""What a trace asked an abstract class: which questions a process can answer otherwise, how
they are recorded, and how a reader asks them again (docs/torch.md, "What a served entry
depends on")."""

from __future__ import annotations

import abc
import collections.abc
import numbers
from types import SimpleNamespace
from typing import Any

import pytest

from objcache.integrations.torch.precompile import portable_guards
from objcache.integrations.torch.precompile.unguarded import abc_membership


class _Kind(abc.ABC):
    @abc.abstractmethod
    def kind(self) -> str: ...


class _Mine:
    pass


class _Layer(_Kind):
    def kind(self) -> str:
        return "layer"


class _Hooked(abc.ABC):  # noqa: B024
    @classmethod
    def __subclasshook__(cls, other: type) -> bool:
        return True


class _Ordered(collections.OrderedDict[str, int]):
    pass


class _Registry(abc.ABC):  # noqa: B024  # a kind a test registers classes with
    pass


class _Late:
    pass


def _asked(member: type, classes: Any) -> bool:
    return bool(abc_membership.asked(member, classes))


def test_membership_of_an_abstract_class_is_asked_where_a_process_can_change_it() -> None:
    """``isinstance``/``issubclass`` against a library's or the program's abstract class,
    or against Python's own about a class of the program's: a registration or a hook can
    answer otherwise in another process. Python's own abstract classes about builtin
    types, and plain classes, are answered the same everywhere."""
    assert _asked(int, _Kind) and _asked(int, (str, _Kind))
    assert abc_membership.asked(int, (str, _Kind)) == [_Kind]
    assert _asked(_Mine, numbers.Number) and _asked(_Mine, collections.abc.Mapping)
    assert not _asked(int, numbers.Number) and not _asked(dict, collections.abc.Mapping)
    assert not _asked(_Mine, _Mine) and not _asked(_Mine, (int, str))
    # a class of the program's that is a Mapping through its own bases: the same everywhere
    assert not _asked(_Ordered, collections.abc.Mapping)
    assert _asked(_Ordered, numbers.Number)  # False here: a registration could change it
    # a library's abstract class asked about its own subclass (transformers' cache layers),
    # unless it has a hook of its own
    assert not _asked(_Layer, _Kind) and _asked(_Mine, _Kind)
    assert _asked(_Hooked, _Hooked)


def _frame() -> Any:
    """A stand-in for the frame a trace is in: an output graph holding a package."""
    return SimpleNamespace(output=SimpleNamespace(package=SimpleNamespace()))


def test_a_question_is_recorded_with_its_answer_and_asked_again_on_the_reader() -> None:
    """The answer is recorded by the two classes' import paths; the reader's check holds
    where its registry answers alike and fails where a registration answers otherwise."""
    tx = _frame()
    abc_membership.record(tx, _Late, (int, _Registry))
    asked = abc_membership.collected(tx.output)
    here = f"__import__({__name__.split('.')[0]!r})" + "".join(
        f".{p}" for p in __name__.split(".")[1:]
    )
    assert asked == {f"{here}._Registry": {f"{here}._Late": False}}, asked
    assert "_objcache_unsaveable" not in vars(tx.output.package)
    records = portable_guards.membership_records(asked)
    assert [r.kind for r in records] == [portable_guards.MEMBERSHIP_KIND]
    failures: list[str] = []
    check = portable_guards.check_for(records, {}, settings=lambda: "", failed=failures.append)
    assert check({}) and not failures
    _Registry.register(_Late)  # another process's registration: the answer differs
    check = portable_guards.check_for(records, {}, settings=lambda: "", failed=failures.append)
    assert not check({}) and failures == [portable_guards.MEMBERSHIP_KIND]


def test_a_question_that_cannot_be_asked_again_makes_the_frame_unsaveable() -> None:
    """A class no import path names (defined in a function), or an abstract class with a
    ``__subclasshook__`` of the program's (code that may read anything): not saved."""

    class Local:
        pass

    for member, cls in ((Local, _Registry), (_Mine, _Hooked)):
        tx = _frame()
        abc_membership.record(tx, member, cls)
        assert vars(tx.output.package).get("_objcache_unsaveable") == abc_membership.UNSAVED
    outside = SimpleNamespace(output=SimpleNamespace(package=None))  # not a precompile frame
    abc_membership.record(outside, _Mine, _Kind)
    assert abc_membership.collected(outside.output) == {}


def test_the_classes_are_flattened_as_isinstance_flattens_them() -> None:
    """A nested tuple, an ``X | Y`` union, ``typing.Union`` and a ``typing`` alias of an
    abstract class ask that class (the forty-fourth review: each was served the writer's
    branch, off by 6); anything else makes the frame unsaveable."""
    import typing

    seq = typing.Sequence  # the alias itself is the case
    for classes in ((int, (_Kind,)), _Kind | int, typing.Union[_Kind, int], (str, (int, _Kind))):  # noqa: UP007
        assert abc_membership.asked(_Mine, classes) == [_Kind], classes
    assert abc_membership.asked(_Mine, seq) == [collections.abc.Sequence]
    tx = _frame()
    abc_membership.record(tx, _Late, (int, (_Registry,)))
    assert abc_membership.collected(tx.output), "a nested tuple's abstract class is recorded"
    with pytest.raises(abc_membership.Unflattenable):
        abc_membership.asked(_Mine, object())
