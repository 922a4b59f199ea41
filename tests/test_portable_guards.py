"""Portable guard records: identities, sources and the reader's check (no compile)."""

from __future__ import annotations

import math
import os.path
from types import SimpleNamespace
from typing import Any

import pytest

from objcache.integrations.torch import portable_guards as pg


def _square(x: Any) -> Any:
    return x * x


def _cube(x: Any) -> Any:
    return x * x * x


def test_identities_name_the_same_object_in_any_process() -> None:
    assert pg.identity(math) == "module:math"
    assert pg.identity(math.sqrt) != pg.identity(math.exp)
    assert pg.identity(os.path.join) == pg.identity(os.path.join)
    assert pg.identity(_square) is not None
    assert pg.identity(_square) != pg.identity(_cube)  # names and code digest
    assert pg.identity(dict) == "class:builtins.dict"
    assert pg.identity({"act": "relu"}) != pg.identity({"act": "sigmoid"})
    assert pg.identity(None) == "const:NoneType:None"


def test_objects_without_a_portable_name_have_no_identity() -> None:
    def local(x: Any) -> Any:
        return x

    class Local:
        pass

    assert pg.identity(local) is None  # defined in a function
    assert pg.identity(lambda x: x) is None
    assert pg.identity(Local) is None
    assert pg.identity(object()) is None  # an instance
    assert pg.identity({"f": object()}) is None


def test_a_closure_is_named_by_its_cells() -> None:
    def make(v: Any) -> Any:
        def inner(x: Any) -> Any:
            return v(x)

        return inner

    # the inner function is local: no portable identity whatever it closes over
    assert pg.identity(make(math.sqrt)) is None


@pytest.mark.parametrize(
    ("source", "parsed"),
    [
        ("G['ACT']", ("G", (("item", "ACT"),))),
        ("L['self'].act", ("L", (("item", "self"), ("attr", "act")))),
        ("G['CFG']['act']", ("G", (("item", "CFG"), ("item", "act")))),
        ("type(L['x'])", None),
        ("G['a'][L['i']]", None),
        ("G.x", None),
        ("__import__('os')", None),
        ("L[", None),
    ],
)
def test_sources_are_constant_paths_only(source: str, parsed: Any) -> None:
    assert pg.parse_source(source) == parsed


def test_the_readers_check_follows_rebinding() -> None:
    scope = {"ACT": math.sqrt}
    module = SimpleNamespace(act=math.sqrt)
    records = [
        pg.Portable("G['ACT']", "BUILTIN_MATCH", pg.identity(math.sqrt) or ""),
        pg.Portable("L['self'].act", "BUILTIN_MATCH", pg.identity(math.sqrt) or ""),
    ]
    check = pg.check_for(records, scope)
    assert check({"self": module})
    module.act = math.exp
    assert not check({"self": module})
    module.act = math.sqrt
    scope["ACT"] = math.exp
    assert not check({"self": module})
    del scope["ACT"]
    assert not check({"self": module})  # absent: a guard failure, never an exception


def test_split_keeps_what_torch_saves_and_refuses_what_it_cannot_name() -> None:
    def guard(kind: str, name: str, derived: tuple[str, ...] = ()) -> Any:
        return SimpleNamespace(create_fn_name=lambda: kind, name=name, guard_types=derived)

    values = {"G['torch']": math, "G['ACT']": math.sqrt, "L['self']": object()}
    kept, records = pg.split(
        [
            guard("TENSOR_MATCH", "L['x']"),
            guard("MODULE_MATCH", "G['torch']"),
            guard("BUILTIN_MATCH", "G['ACT']", ("ID_MATCH",)),
        ],
        lambda g: values[g.name],
    )
    assert [g.name for g in kept] == ["L['x']"]
    assert [r.source for r in records] == ["G['torch']", "G['ACT']"]
    with pytest.raises(pg.Unportable) as refused:
        pg.split([guard("ID_MATCH", "L['self']")], lambda g: values[g.name])
    assert refused.value.kind == "ID_MATCH"


def test_a_builtin_bound_to_an_object_has_no_portable_identity() -> None:
    """``a.append`` and ``b.append`` are different guards' objects: not one name."""
    assert pg.identity([].append) is None
    assert pg.identity(dict.fromkeys) == pg.identity(dict.fromkeys)  # bound to a class
    assert pg.identity(math.sqrt) is not None  # bound to a module


def test_a_dict_is_checked_by_content_at_every_call() -> None:
    """The same dict object, mutated after it passed, fails (DICT_VERSION's job)."""
    cfg = {"act": "relu"}
    check = pg.check_for([pg.Portable("G['CFG']", "DICT_VERSION", pg.identity(cfg) or "")], {})
    assert check({}) is False  # absent
    scope = {"CFG": cfg}
    check = pg.check_for([pg.Portable("G['CFG']", "DICT_VERSION", pg.identity(cfg) or "")], scope)
    assert check({})
    cfg["act"] = "sigmoid"
    assert not check({})


def test_the_compiler_settings_hold_at_the_first_call_as_a_normal_compile_fixes_them() -> None:
    """The settings record is compared until the whole guard first holds; a mismatch is a
    guard failure reported once; without a settings reader it never holds."""
    now = {"digest": "other"}
    failures: list[str] = []
    records = [
        pg.settings_record("writer"),
        pg.Portable("G['ACT']", "BUILTIN_MATCH", pg.identity(math.sqrt) or ""),
    ]
    scope = {"ACT": math.sqrt}
    check = pg.check_for(records, scope, lambda: now["digest"], failures.append)
    assert not check({}) and not check({})
    assert failures == ["settings"]  # once per kind
    now["digest"] = "writer"
    assert check({})
    now["digest"] = "changed after the first compile"
    assert check({})  # settled, as torch keeps a compiled frame's code
    scope["ACT"] = math.exp
    assert not check({})
    assert failures == ["settings", "BUILTIN_MATCH"]
    assert not pg.check_for(records, {"ACT": math.sqrt})({})  # no reader: never holds
    assert pg.has_one_settings_record(records)
    assert not pg.has_one_settings_record(records[1:])
    assert not pg.has_one_settings_record([*records, pg.settings_record("x")])


def test_a_check_that_meets_an_unexpected_object_fails_the_guard_and_never_raises() -> None:
    class Hostile:
        def __getattribute__(self, name: str) -> Any:
            raise RuntimeError("no attribute for you")

    failures: list[str] = []
    records = [pg.Portable("G['ACT']", "ID_MATCH", pg.identity(math.sqrt) or "")]
    check = pg.check_for(records, {"ACT": Hostile()}, None, failures.append)
    assert check({}) is False and failures == ["error"]


def test_records_travel_with_their_own_guards_state() -> None:
    records = (pg.Portable("G['ACT']", "BUILTIN_MATCH", "builtin:math.sqrt"),)
    state = b"torch's pickle\x00bytes"
    joined = pg.attach(state, records)
    assert pg.detach(joined) == (state, records)
    assert pg.detach(pg.attach(state, ())) == (state, ())
    assert pg.detach(state) is None  # no records: refused by the reader
    assert pg.detach(joined[:-1]) is None  # truncated
    assert pg.detach(joined.replace(b"[[", b"[{")) is None  # records of another shape
    assert pg.detach(b"\xff" * 3) is None
