"""What rebuilding a frame's guards state would run of the program's code (docs/torch.md,
"What a served entry depends on"): judged from the bytes alone, nothing imported or run."""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import io
import pickle
from typing import Any

import pytest

from objcache.integrations.torch.precompile.unguarded import guards_unpickling

torch = pytest.importorskip("torch")


class Singleton:
    made: Singleton | None = None

    def __new__(cls) -> Singleton:
        if cls.made is None:
            cls.made = super().__new__(cls)
        return cls.made


def current() -> Any:
    return SHARED


class Shared:
    def __reduce__(self) -> Any:
        return (current, (), dict(self.__dict__))


class Reread:
    def __init__(self) -> None:
        self.scale = 2.0

    def __reduce__(self) -> Any:
        return (Reread, ())


class Plain:
    pass


class SetsItsState:
    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


@dataclasses.dataclass
class Fields:
    a: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenSlots:
    a: int = 1


class Colour(enum.Enum):
    RED = 1


class Slotted:
    __slots__ = ("a",)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


class Registry(dict[str, int]):
    def __setitem__(self, key: str, value: int) -> None:
        super().__setitem__(key, value)


def _with(obj: Any, **attrs: Any) -> Any:
    for name, value in attrs.items():
        setattr(obj, name, value)
    return obj


SHARED = _with(Shared(), scale=2.0)


def _registry() -> Registry:
    registry = Registry()
    registry["a"] = 1
    return registry


#: objects whose rebuilding runs only torch's, Python's or C code
FRESH = {
    "a plain object": lambda: _with(Plain(), scale=2.0),
    "a dataclass": Fields,
    "a frozen dataclass with slots": FrozenSlots,
    "an enum member": lambda: Colour.RED,
    "an ordered dict": lambda: collections.OrderedDict(a=1),
    "a partial of a builtin": lambda: functools.partial(max, 1),
    "a torch size": lambda: torch.Size([2, 3]),
    "a dtype": lambda: torch.float32,
    "a tensor": lambda: torch.ones(2),
    "a function by reference": lambda: current,
    "a class by reference": lambda: Singleton,
}
#: objects whose rebuilding runs the program's code, and what is named
PROGRAMS = {
    "a singleton's __new__": (Singleton, "Singleton.__new__"),
    "a __reduce__'s function": (lambda: SHARED, ":current"),
    "a __reduce__ calling its class": (Reread, "Reread.__init__"),
    "a __setstate__": (lambda: _with(SetsItsState(), a=1), "SetsItsState.__setstate__"),
    "a __setattr__ given slot state": (lambda: _with(Slotted(), a=1), "Slotted.__setattr__"),
    "a dict subclass's __setitem__": (_registry, "Registry.__setitem__"),
}


@pytest.mark.parametrize("name", sorted(FRESH))
def test_a_state_rebuilt_by_torchs_and_pythons_code_is_fine(name: str) -> None:
    assert guards_unpickling.program_code(pickle.dumps(FRESH[name]())) is None


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_state_whose_rebuilding_runs_the_programs_code_is_named(name: str) -> None:
    make, named = PROGRAMS[name]
    found = guards_unpickling.program_code(pickle.dumps(make()))
    assert found is not None and named in found, found


def test_judging_runs_nothing_and_imports_nothing() -> None:
    """The singleton keeps its own object and values; a module the state names that this
    process has not loaded is named, not imported."""
    Singleton.made = None
    mine = _with(Singleton(), scale=3.0)
    data = pickle.dumps(mine).replace(b"scale", b"scalf")
    assert guards_unpickling.program_code(data) is not None
    assert Singleton.made is mine and mine.scale == 3.0 and not hasattr(mine, "scalf")
    absent = b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x0cno_such_mod_\x8c\x01f\x93)R."
    assert "not loaded" in str(guards_unpickling.program_code(absent))
    import sys

    assert "no_such_mod_" not in sys.modules


class Base:
    @classmethod
    def rebuild(cls) -> Any:
        return SHARED


class Derived(Base):
    pass


class _Evaluates:
    def __reduce__(self) -> Any:
        return (eval, ("1 + 1",))


class _Persistent(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return "x" if isinstance(obj, Plain) else None


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"not a pickle", "unreadable"),
        (pickle.dumps(eval), None),  # a builtin by reference: never called
        (pickle.dumps(_Evaluates()), "builtins:eval"),
        # an attribute a class inherits (torch 2.15's pickler inherits its rebuilders)
        (b"\x80\x04cbuiltins\ngetattr\nctorch.nn\nLinear\n\x8c\x05train\x86R)R.", None),
        (  # of the program's class: its descriptors would run
            b"\x80\x04cbuiltins\ngetattr\nctests.integrations.torch.precompile.unguarded."
            b"test_guards_unpickling\nDerived\n\x8c\x07rebuild\x86R)R.",
            "getattr of",
        ),
        (b"\x80\x04cbuiltins\ngetattr\n)R)R.", "state made"),
        # torch's pickler names its own rebuilders as attributes of its class
        (
            b"\x80\x04cbuiltins\ngetattr\nctorch._dynamo.guards\nGuardsStatePickler\n"
            b"\x8c\x10_unpickle_tensor\x86R.",
            None,
        ),
        (
            b"\x80\x04cbuiltins\ngetattr\nctests.integrations.torch.precompile.unguarded.test_guards_unpickling"
            b"\nSingleton\n\x8c\x04made\x86R.",
            "getattr of",
        ),
    ],
)
def test_bad_states_fail_closed(data: bytes, why: str | None) -> None:
    import torch._dynamo.guards  # noqa: F401  (loaded in every process that saves guards)

    found = guards_unpickling.program_code(data)
    assert (found is None) if why is None else (found is not None and why in found), found


def test_a_persistent_name_is_fine_and_an_unbounded_state_is_not_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch 2.15 names the values it prunes by a persistent id (its own unpickler makes a
    marker of each): no code runs for them."""
    buffer = io.BytesIO()
    _Persistent(buffer).dump([Plain()])
    assert guards_unpickling.program_code(buffer.getvalue()) is None
    monkeypatch.setattr(guards_unpickling, "MAX_OPERATIONS", 10)
    many = pickle.dumps([collections.OrderedDict(a=i) for i in range(20)])
    assert "unjudged" in str(guards_unpickling.program_code(many))
