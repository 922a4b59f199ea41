"""Portable guard records: identities, sources and the reader's check (no compile)."""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
import os.path
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from objcache.integrations.torch.precompile import portable_guards as pg


def _square(x: Any) -> Any:
    return x * x


def _cube(x: Any) -> Any:
    return x * x * x


def _double(x: Any) -> Any:
    return x + x


def test_identities_name_the_same_object_in_any_process() -> None:
    assert pg.identity(math) == "module:math"
    assert pg.identity(math.sqrt) != pg.identity(math.exp)
    assert pg.identity(os.path.join) == pg.identity(os.path.join)
    assert pg.identity(_square) is not None
    assert pg.identity(_square) != pg.identity(_cube)  # names and code digest
    assert pg.identity(dict) == "class:builtins.dict"
    assert pg.identity({"act": "relu"}) != pg.identity({"act": "sigmoid"})
    assert pg.identity(None) == "const:NoneType:None"
    assert pg.identity(_square.__code__) == pg.identity(_square.__code__)
    assert pg.identity(_square.__code__) != pg.identity(_cube.__code__)


def test_objects_without_a_portable_name_have_no_identity() -> None:
    class Local:
        pass

    scope: dict[str, Any] = {}
    exec("def run_with_own_globals(x):\n    return x\n", scope)
    assert pg.identity(scope["run_with_own_globals"]) is None  # exec'd, globals of its own
    assert pg.identity(Local) is None
    assert pg.identity(object()) is None  # an instance
    assert pg.identity({"f": object()}) is None


def _make_aliased() -> Any:
    def aliased(x: Any, k: Any = math.sqrt) -> Any:
        return k(x)

    return aliased


#: Built in a function, held by this module under its own name (as ``boolean_dispatch``
#: builds ``torch.nn.functional.max_pool2d``).
aliased = _make_aliased()


def _with_an_object_default(x: Any, k: Any = object()) -> Any:  # noqa: B008
    return x


def test_a_function_no_name_reaches_is_what_it_does() -> None:
    """A lambda, a closure, the function a decorator wraps: its module (where its globals
    are), qualified name, code, defaults and closure; another object doing the same is the
    same identity, one doing something else is not."""

    def local(x: Any) -> Any:
        return x

    name = pg.identity(aliased)
    assert name is not None and f"{__name__}.aliased" in name  # where its module holds it
    built_again = pg.identity(_make_aliased())  # not held: labelled by what it does
    assert built_again is not None and f"{__name__}:_make_aliased.<locals>.aliased" in built_again
    assert pg.identity(local) is not None
    assert pg.identity(lambda x: x + 1) != pg.identity(lambda x: x + 2)
    # its defaults are part of what it does
    assert pg.identity(_with_an_object_default) is None


class _WithStatic:
    @staticmethod
    def expand(x: Any) -> Any:
        return x


def test_a_staticmethod_is_reached_through_its_class_dict() -> None:
    source = "dict(G['W'].__dict__)['expand'].__func__"
    func = _WithStatic.__dict__["expand"].__func__
    records = [pg.Portable(source, "CLOSURE_MATCH", pg.identity(func) or "")]
    assert records[0].identity and pg.check_for(records, {"W": _WithStatic})({})
    assert not pg.check_for(records, {"W": SimpleNamespace})({})


def test_a_dicts_key_is_reached_by_its_position() -> None:
    registry = {tuple: "t", list: "l"}
    records = [pg.Portable("list(dict.keys(G['R']))[0]", "BUILTIN_MATCH", "class:builtins.tuple")]
    assert pg.check_for(records, {"R": registry})({})
    assert not pg.check_for(records, {"R": {list: "l", tuple: "t"}})({})


def test_an_entry_keyed_by_an_object_is_reached_through_the_source_naming_its_key() -> None:
    # how Dynamo names torch's pytree registry entry of a class: the class by its position
    # among the registry's keys, then the entry under it
    source = "G['R'][list(dict.keys(G['R']))[0]].flatten"
    registry = {tuple: SimpleNamespace(flatten=math.sqrt), list: SimpleNamespace(flatten=math.exp)}
    records = [pg.Portable(source, "ID_MATCH", pg.identity(math.sqrt) or "")]
    assert records[0].identity and pg.check_for(records, {"R": registry})({})
    # another order of registration: the key names another entry, the guard fails
    swapped = {list: registry[list], tuple: registry[tuple]}
    assert not pg.check_for(records, {"R": swapped})({})
    assert not pg.check_for(records, {"R": {}})({})


class _Registry(dict[Any, Any]):
    """A dict subclass whose own ``__getitem__`` would say something else."""

    def __getitem__(self, key: Any) -> Any:
        raise KeyError(key)


def test_an_entry_of_a_dict_subclass_is_read_past_its_own_getitem() -> None:
    # how Dynamo names an entry of a dict subclass keyed by a class: ``dict.__getitem__``
    # with the key by its position among the dict's keys (transformers' output recorders)
    source = "dict.__getitem__(G['R'], list(dict.keys(G['R']))[1])['attentions']"
    registry = _Registry({list: {"attentions": tuple}, dict: {"attentions": set}})
    records = [pg.Portable(source, "CLASS_MATCH", pg.identity(set) or "")]
    assert pg.check_for(records, {"R": registry})({})
    # another class in that place, or the classes registered in another order: it fails
    assert not pg.check_for(records, {"R": _Registry({list: {}, dict: {"attentions": int}})})({})
    swapped = _Registry({dict: {"attentions": set}, list: {"attentions": tuple}})
    assert not pg.check_for(records, {"R": swapped})({})
    assert not pg.check_for(records, {"R": "not a dict"})({})
    constant = [pg.Portable("dict.__getitem__(G['R'], 'k')", "CLASS_MATCH", "class:builtins.set")]
    assert pg.check_for(constant, {"R": _Registry(k=set)})({})
    assert not pg.check_for(constant, {"R": _Registry(k=int)})({})


def _self_referring_wrapper(forward: Any) -> Any:
    """Like transformers' checkpointing layers: the wrapper refers to itself."""

    @functools.wraps(forward)
    def wrapper(*args: Any) -> Any:
        assert wrapper is not None
        return forward(*args)

    return wrapper


def test_a_wrapper_that_refers_to_itself_has_a_finite_name_that_says_what_it_wraps() -> None:
    sqrt = _self_referring_wrapper(math.sqrt)
    ident = pg.identity(sqrt)
    assert ident is not None and "ref:1" in ident
    assert ident == pg.identity(_self_referring_wrapper(math.sqrt))
    assert ident != pg.identity(_self_referring_wrapper(math.exp))
    assert pg.identity(_self_referring_wrapper(object())) is None


def test_a_wrapper_is_named_by_its_own_code_not_by_what_functools_wraps_copied() -> None:
    def deco(f: Any) -> Any:
        @functools.wraps(f)  # the wrapper now says it is json.dumps, in module json
        def wrapper(*args: Any) -> Any:
            return f(*args)

        return wrapper

    dumps, loads = deco(json.dumps), deco(json.loads)
    assert dumps.__module__ == "json" and dumps is not json.dumps
    assert pg.identity(dumps) is not None
    assert __name__ + ":" in (pg.identity(dumps) or "")
    assert pg.identity(dumps) == pg.identity(deco(json.dumps))
    assert pg.identity(dumps) != pg.identity(loads)


def test_a_module_imported_by_name_is_its_name() -> None:
    records = [pg.Portable("__import__('os').path", "ID_MATCH", pg.identity(os.path) or "")]
    assert pg.check_for(records, {})({})
    records = [pg.Portable("__import__('os').path", "ID_MATCH", pg.identity(math) or "")]
    assert not pg.check_for(records, {})({})
    missing = [pg.Portable("__import__('no_such_module_here')", "ID_MATCH", "module:x")]
    assert not pg.check_for(missing, {})({})


def test_a_closure_is_named_by_its_cells() -> None:
    def make(v: Any) -> Any:
        def inner(x: Any) -> Any:
            return v(x)

        return inner

    # the inner function is local: named by what it closes over
    assert pg.identity(make(math.sqrt)) == pg.identity(make(math.sqrt))
    assert pg.identity(make(math.sqrt)) != pg.identity(make(math.exp))
    assert pg.identity(make(object())) is None


@pytest.mark.parametrize(
    ("source", "parsed"),
    [
        ("G['ACT']", ("G", (("item", "ACT"),))),
        ("L['self'].act", ("L", (("item", "self"), ("attr", "act")))),
        ("G['CFG']['act']", ("G", (("item", "CFG"), ("item", "act")))),
        ("type(L['x'])", ("L", (("item", "x"), ("type", None)))),
        (
            "type(L['x']).__mro__[1]",
            ("L", (("item", "x"), ("type", None), ("attr", "__mro__"), ("item", 1))),
        ),
        ("type(L['x'], L['y'])", None),
        ("G['a'][L['i']]", ("G", (("item", "a"), ("item_at", ("L", (("item", "i"),)))))),
        ("G['a'][L['i'] + 1]", None),
        ("G['a'][G['b'][G['c'][G['d'][G['e']]]]]", None),  # nested deeper than MAX_NESTED
        ("G.x", None),
        ("__import__('os')", ("M", (("import", "os"),))),
        (
            "__import__('os').path.join",
            ("M", (("import", "os"), ("attr", "path"), ("attr", "join"))),
        ),
        ("__import__(L['name'])", None),
        (
            "dict(G['m'].C.__dict__)['f'].__func__",
            (
                "G",
                (
                    ("item", "m"),
                    ("attr", "C"),
                    ("dict_of", None),
                    ("item", "f"),
                    ("attr", "__func__"),
                ),
            ),
        ),
        ("dict(G['m'].C)", None),
        (
            "list(dict.keys(__import__('os').environ))[0]",
            ("M", (("import", "os"), ("attr", "environ"), ("keys", None), ("item", 0))),
        ),
        ("list(dict.values(G['d']))[0]", None),
        (
            "dict.__getitem__(G['d'], list(dict.keys(G['d']))[1])['a']",
            (
                "G",
                (
                    ("item", "d"),
                    ("dict_item_at", ("G", (("item", "d"), ("keys", None), ("item", 1)))),
                    ("item", "a"),
                ),
            ),
        ),
        ("dict.__getitem__(G['d'], 'k')", ("G", (("item", "d"), ("dict_item", "k")))),
        ("dict.__getitem__(G['d'], L['k'] + 1)", None),
        ("dict.__getitem__(G['d'])", None),
        ("__import__('os', None)", None),
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


def test_an_extension_function_bound_to_a_capsule_is_named_by_its_module() -> None:
    """pybind11 binds ``torch._C`` functions to a capsule, not to their module: still the
    object ``torch._C`` holds under that name (transformers' BERT guards on one)."""
    torch = pytest.importorskip("torch")
    fn = torch._C._get_tracing_state
    assert not isinstance(getattr(fn, "__self__", None), type(torch))
    assert pg.identity(fn) == "builtin:torch._C._get_tracing_state"


def test_a_failed_guard_says_once_which_source_and_what_it_held(
    caplog: pytest.LogCaptureFixture,
) -> None:
    records = [pg.Portable("G['ACT']", "ID_MATCH", "builtin:torch.relu\x1b[31m")]
    check = pg.check_for(records, {"ACT": math.sqrt})
    with caplog.at_level("INFO", logger="objcache.torch"):
        assert not check({}) and not check({})
    (line,) = [r.getMessage() for r in caplog.records]
    assert "ID_MATCH guard failed on G['ACT']" in line
    assert "stored builtin:torch.relu?[31m" in line  # nothing from a store reaches a terminal
    assert "here builtin:math.sqrt" in line


def _sourced(kind: str, name: str, chain: tuple[Any, ...]) -> Any:
    """A kept guard on ``name`` whose originating source passes through ``chain``'s objects
    (innermost base first), each a source of its own (how Dynamo's sources nest)."""
    base: Any = None
    for value in reversed(chain):
        base = SimpleNamespace(base=base, value=value)
    source = SimpleNamespace(base=base, value=None)
    return SimpleNamespace(
        create_fn_name=lambda: kind, name=name, guard_types=(), originating_source=source
    )


@pytest.mark.parametrize(
    ("root", "kind", "value"),
    [
        (math, "EQUALS_MATCH", 2.0),  # G['cfg'].SCALE: a module
        (SimpleNamespace, "CONSTANT_MATCH", True),  # G['Knobs'].flag: a class
        (_square, "TYPE_MATCH", 3),  # G['fn'].__defaults__[0]: a function
        (math, "LENGTH_CHECK", (1, 2)),
        (math, "DICT_KEYS_MATCH", {"act": "relu"}),
        (math, "EQUALS_MATCH", "gelu"),
    ],
)
def test_a_guard_under_an_object_saved_by_reference_carries_the_writers_value(
    root: Any, kind: str, value: Any
) -> None:
    """torch keeps such a guard, but rebuilds it on the reader from the reader's live
    module or class, comparing the reader's value with itself: the writer's value travels as
    a record of the guard's own kind, and another value on the reader fails it."""
    guard = _sourced(kind, "G['cfg'].knob", (root,))
    kept, records = pg.split([guard], lambda g: g.value if hasattr(g, "base") else value)
    assert kept == [guard]
    assert records == (pg.Portable("G['cfg'].knob", kind, pg.identity(value) or ""),)
    check = pg.check_for(records, {"cfg": SimpleNamespace(knob=value)})
    assert check({})
    other = {"cfg": SimpleNamespace(knob=[value, 1])}
    assert not pg.check_for(records, other)({})


def test_a_guard_under_an_instance_saved_by_value_gets_no_record() -> None:
    """A frame's own globals and an object torch pickles by value keep the writer's value in
    torch's own copy of the guard: nothing to add."""
    guard = _sourced("EQUALS_MATCH", "G['obj'].knob", (SimpleNamespace(knob=1),))
    kept, records = pg.split([guard], lambda g: g.value if hasattr(g, "base") else 1)
    assert kept == [guard] and records == ()


class _Slotted:
    __slots__ = ("scale",)

    def __init__(self) -> None:
        self.scale = 2.0


class _Forwarding:  # a module's submodules: found through ``__getattr__`` in its own state
    def __init__(self) -> None:
        self._held = {"inner": SimpleNamespace(scale=2.0)}

    def __getattr__(self, name: str) -> Any:
        held = self.__dict__["_held"]
        if name not in held:
            raise AttributeError(name)
        return held[name]


class _Computed:
    @property
    def scale(self) -> float:
        return 2.0


@dataclasses.dataclass
class _Fields:
    a: float = dataclasses.field(default=1.0, metadata={"scale": 2.0})


@pytest.mark.parametrize(
    ("obj", "member", "from_its_class"),
    [
        # dataclasses.fields(d): Dynamo's source is L['d'].__dataclass_fields__, which the
        # instance finds on its class (the fortieth review: served the writer's metadata)
        (_Fields(), "__dataclass_fields__", True),
        (_Computed(), "scale", True),  # a property: the class's code
        (SimpleNamespace(scale=2.0), "scale", False),  # the instance's own
        (_Slotted(), "scale", False),  # a slot: the instance's own, pickled with it
        (_Forwarding(), "inner", False),
    ],
)
def test_an_attribute_an_instance_finds_on_its_class_is_under_a_reference(
    obj: Any, member: str, from_its_class: bool
) -> None:
    """An instance is pickled by value, its class by reference: a guard below an attribute
    the instance reads from its class is rebuilt on the reader from the reader's class, so
    it carries the writer's value; one below the instance's own state needs nothing."""
    inner = SimpleNamespace(base=None, value=None)
    holder = SimpleNamespace(base=inner, member=member, value=None)
    leaf = SimpleNamespace(base=holder, index="scale", value=None)
    guard = SimpleNamespace(
        create_fn_name=lambda: "EQUALS_MATCH",
        name=f"L['d'].{member}['scale']",
        guard_types=(),
        originating_source=leaf,
    )
    values = {id(inner): obj, id(holder): {"scale": 2.0}}
    kept, records = pg.split([guard], lambda g: values.get(id(g), 2.0))
    assert kept == [guard]
    assert bool(records) is from_its_class, records
    if from_its_class:
        assert records == (pg.Portable(guard.name, "EQUALS_MATCH", pg.identity(2.0) or ""),)


class _Rebuilt:  # "a config re-reads its settings when unpickled"
    def __init__(self) -> None:
        self.mode = "a"

    def __reduce__(self) -> Any:
        return (_Rebuilt, ())


class _DropsState:
    def __init__(self) -> None:
        self.mode = "a"

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.mode = "recomputed"


class _Registered:
    def __init__(self) -> None:
        self.mode = "a"


class _Plain:
    def __init__(self) -> None:
        self.mode = "a"


def _module() -> Any:  # torch's own __getstate__/__setstate__: its state as it is
    return pytest.importorskip("torch").nn.Linear(2, 2)


def _tensor() -> Any:
    return pytest.importorskip("torch").zeros(2)


@pytest.mark.parametrize(
    ("make", "own_code"),
    [
        (_Rebuilt, True),
        (_DropsState, True),
        (_Registered, True),
        (_Plain, False),
        (_module, False),
        (_tensor, False),
        (lambda: {"mode": "a"}, False),
    ],
)
def test_an_object_that_pickles_by_its_own_code_is_under_a_reference(
    make: Any, own_code: bool
) -> None:
    """torch pickles the frame's scope with the program's own pickling methods: what a
    ``__reduce__``, a ``__getstate__`` or a copyreg entry writes, not the value the guard
    read, is what the reader rebuilds the guard from, so a guard below such an object carries
    the writer's value (the forty-first review: served the writer's branch); an object whose
    state pickles as it is needs nothing."""
    import copyreg

    obj = make()
    copyreg.pickle(_Registered, lambda o: (_Registered, ()))
    try:
        assert pg.pickled_by_its_own_code(obj) is own_code
        guard = _sourced("EQUALS_MATCH", "L['cfg'].mode", (obj,))
        kept, records = pg.split([guard], lambda g: g.value if hasattr(g, "base") else "a")
        assert kept == [guard] and bool(records) is own_code, records
    finally:
        del copyreg.dispatch_table[_Registered]


def test_a_value_under_a_reference_without_a_portable_rendering_makes_the_frame_unsaveable() -> (
    None
):
    guard = _sourced("TENSOR_MATCH", "G['cfg'].W", (math,))
    with pytest.raises(pg.Unportable) as refused:
        pg.split([guard], lambda g: g.value if hasattr(g, "base") else object())
    assert refused.value.kind == "TENSOR_MATCH"
    unreadable = _sourced("EQUALS_MATCH", "G['cfg'].knob", (math,))

    def broken(g: Any) -> Any:
        raise RuntimeError("gone")

    with pytest.raises(pg.Unportable):  # a chain that cannot be read counts as by reference
        pg.split([unreadable], broken)


def test_torch_value_types_and_enum_members_have_identities() -> None:
    import enum

    torch = pytest.importorskip("torch")
    assert pg.identity(torch.float32) == "torch.dtype:torch.float32"
    assert pg.identity(torch.float32) != pg.identity(torch.bfloat16)
    assert pg.identity(torch.device("cpu")) != pg.identity(torch.device("meta"))

    class Local(enum.Enum):
        A = 1

    assert pg.identity(Local.A) is None  # a class no name reaches
    assert pg.identity(enum.Flag.__members__.get("X")) == "const:NoneType:None"
    import signal

    assert pg.identity(signal.Signals.SIGINT) == "enum:signal.Signals.SIGINT=const:int:2"
    # the member's value, which Dynamo folds into the graph and a class body may compute at
    # start-up (``N = int(os.environ["N"])``: a new machine was served the writer's value)
    level = enum.IntEnum("Level", {"N": 3}, module=__name__)
    globals()["Level"] = level
    try:
        named = pg.identity(level.N)
        assert named is not None and named.endswith("Level.N=const:int:3")
        other = enum.IntEnum("Level", {"N": 7}, module=__name__)
        globals()["Level"] = other
        assert pg.identity(other.N) != named
    finally:
        del globals()["Level"]


def test_a_type_match_under_a_reference_on_an_unnamed_value_checks_its_class() -> None:
    """pytree's ``_LEAF_SPEC`` (an instance no name reaches) under a module: its
    ``TYPE_MATCH`` checks only the class, so the record names the class, not the value."""

    class Spec:
        pass

    guard = _sourced("TYPE_MATCH", "G['pytree']._LEAF_SPEC", (math,))
    leaf = SimpleNamespace()
    kept, records = pg.split([guard], lambda g: g.value if hasattr(g, "base") else leaf)
    assert kept == [guard]
    assert records == (
        pg.Portable("type(G['pytree']._LEAF_SPEC)", "TYPE_MATCH", "class:types.SimpleNamespace"),
    )
    assert pg.check_for(records, {"pytree": SimpleNamespace(_LEAF_SPEC=SimpleNamespace())})({})
    assert not pg.check_for(records, {"pytree": SimpleNamespace(_LEAF_SPEC=Spec())})({})
    with pytest.raises(pg.Unportable):  # another kind on such a value still cannot be saved
        pg.split(
            [_sourced("EQUALS_MATCH", "G['pytree']._LEAF_SPEC", (math,))],
            lambda g: g.value if hasattr(g, "base") else leaf,
        )


def test_a_record_is_bounded_at_save_and_its_check_at_every_call() -> None:
    """A value whose naming would visit more than MAX_NODES objects has no identity (the
    frame is unsaveable, counted); a frame over MAX_RECORDS records is unsaveable; a tuple of
    constants that passed is not looked at again (it cannot change), a dict is."""
    big = {i: tuple(range(200)) for i in range(200)}  # 40,000 objects
    assert pg.identity(big) is None
    assert pg.identity({i: (i, i + 1) for i in range(100)}) is not None
    guard = _sourced("EQUALS_MATCH", "G['cfg'].TABLE", (math,))
    with pytest.raises(pg.Unportable):
        pg.split([guard], lambda g: g.value if hasattr(g, "base") else big)
    many = [pg.Portable(f"G['x{i}']", "ID_MATCH", "const:int:1") for i in range(pg.MAX_RECORDS)]
    assert len(pg.bounded([*many, many[0]])) == pg.MAX_RECORDS
    with pytest.raises(pg.Unportable) as refused:
        pg.bounded([*many, pg.Portable("G['y']", "ID_MATCH", "const:int:1")])
    assert refused.value.kind == "RECORDS"

    class CountingTuple(tuple):  # type: ignore[type-arg]
        looks = 0

        def __iter__(self) -> Any:
            CountingTuple.looks += 1
            return super().__iter__()

    table = CountingTuple((1, 2, 3))
    records = (pg.Portable("G['T']", "EQUALS_MATCH", pg.identity(table) or ""),)
    scope: dict[str, Any] = {"T": table}
    check = pg.check_for(records, scope)
    assert check({})
    looked = CountingTuple.looks
    assert check({}) and check({})
    assert CountingTuple.looks == looked  # the same unchangeable tuple: no second look
    scope["T"] = [1, 2, 3]
    assert not check({})


def test_a_dict_of_unchanging_objects_is_checked_by_its_items_not_named_again() -> None:
    """A module's hook dict (usually empty) passes in O(1) while it holds the very same
    items; a hook added, a value replaced by an equal one of another type, a function's code
    reassigned: named again, and the guard fails."""
    hooks: dict[int, Any] = {}
    records = (pg.Portable("G['hooks']", "GLOBAL_HOOKS", pg.identity(hooks) or ""),)
    scope: dict[str, Any] = {"hooks": hooks}
    check = pg.check_for(records, scope)
    assert check({}) and check({})
    hooks[1] = _square
    assert not check({})
    del hooks[1]
    assert check({})
    knobs = {"n": 2}
    records = (pg.Portable("G['knobs']", "EQUALS_MATCH", pg.identity(knobs) or ""),)
    check = pg.check_for(records, {"knobs": knobs})
    assert check({})
    knobs["n"] = 2.0  # type: ignore[assignment]  # equal, not the same: a float where the trace read an int
    assert not check({})
    table = {"f": _square}
    records = (pg.Portable("G['table']", "EQUALS_MATCH", pg.identity(table) or ""),)
    check = pg.check_for(records, {"table": table})
    assert check({})
    original = _square.__code__
    try:
        _square.__code__ = _cube.__code__
        assert not check({})
    finally:
        _square.__code__ = original
    assert check({})


def test_a_guard_that_carries_its_own_expectation_needs_no_record() -> None:
    """DICT_CONTAINS and kin hold their key in the guard: the reader's copy checks the
    reader's object against the writer's key, so no value is recorded (a class's whole
    dict would be named at every call)."""
    guard = _sourced("DICT_NOT_CONTAINS", "dict(type(L['m']).__dict__)", (SimpleNamespace,))
    kept, records = pg.split([guard], lambda g: g.value if hasattr(g, "base") else {"a": 1})
    assert kept == [guard] and records == ()


def test_a_modules_own_hooks_are_one_record_read_through_the_module() -> None:
    """Dynamo does not guard a module's hooks: the record names the module's four hook
    dicts; a hook registered on the reader fails it, a module without hooks passes in O(1)."""

    def module() -> SimpleNamespace:
        return SimpleNamespace(**{name: {} for name in pg.MODULE_HOOKS})

    writer = module()
    guard = SimpleNamespace(
        create_fn_name=lambda: "TYPE_MATCH",
        name="L['self']",
        guard_types=(),
        originating_source=None,
    )
    _kept, records = pg.split([guard], lambda g: writer)
    assert records == (
        pg.Portable("L['self']", pg.HOOKS_KIND, pg.identity(pg.hooks_of(writer)) or ""),
    )
    reader = module()
    check = pg.check_for(records, {})
    assert check({"self": reader}) and check({"self": reader})
    reader._forward_hooks[7] = _square
    assert not check({"self": reader})


def test_an_inlined_method_of_a_frozen_module_is_named_by_a_path_that_reaches_it() -> None:
    """``Mapping.get`` (transformers' outputs inline it) lives in ``_collections_abc``, a
    frozen module whose code names no file: the record still reaches that very code, so the
    frame stays saveable, and a patched method fails it."""
    import collections.abc

    code = collections.abc.Mapping.get.__code__
    [record] = pg.inlined_code_records([_square.__code__, code])
    assert record.kind == pg.INLINED_KIND
    assert record.identity == pg.identity(collections.abc.Mapping.get)
    assert f":{pg.code_digest(code)}:" in record.identity
    original = collections.abc.Mapping.get
    try:
        collections.abc.Mapping.get = lambda self, key, default=None: default  # type: ignore[method-assign]
        assert not pg.check_for((record,), {})({})  # a reader with another method
    finally:
        collections.abc.Mapping.get = original  # type: ignore[method-assign]
    assert pg.check_for((record,), {})({})


def _scaled(x: Any, k: float = 2.0, *, shift: float = 0.0) -> Any:
    return x * k + shift


def test_an_inlined_function_s_defaults_and_closure_are_part_of_its_record() -> None:
    """Dynamo bakes an inlined function's default arguments into the graph (a constructor's
    ``k=float(os.environ["K"])``, a dataclass field's default) and guards none of them: the
    record names the function with its defaults and closure, so a reader whose defaults
    differ fails it (the thirty-fourth review: served the writer's K)."""
    [record] = pg.inlined_code_records([_square.__code__, _scaled.__code__])
    check = pg.check_for((record,), {})
    assert check({})
    defaults, kwdefaults = _scaled.__defaults__, _scaled.__kwdefaults__
    try:
        _scaled.__defaults__ = (5.0,)
        assert not pg.check_for((record,), {})({})
        _scaled.__defaults__ = defaults
        _scaled.__kwdefaults__ = {"shift": 1.0}
        assert not pg.check_for((record,), {})({})
    finally:
        _scaled.__defaults__, _scaled.__kwdefaults__ = defaults, kwdefaults
    assert pg.check_for((record,), {})({})


@dataclasses.dataclass(frozen=True)
class _Field:
    k: float = 2.0


def test_a_dataclass_s_init_made_by_exec_is_named_with_its_fields_defaults() -> None:
    """A dataclass's ``__init__`` is made by ``exec`` (its code is
    ``__create_fn__.<locals>.__init__``), with the fields' defaults as its defaults: it is
    found by the function that holds the code and named as ``_Field.__init__``, defaults
    included (the thirty-fourth review: a field default computed at start-up was served)."""
    code = _Field.__init__.__code__
    assert "<" in code.co_qualname
    [record] = pg.inlined_code_records([_square.__code__, code])
    assert record.source.endswith("._Field.__init__")
    assert pg.check_for((record,), {})({})
    defaults = _Field.__init__.__defaults__
    try:
        _Field.__init__.__defaults__ = (5.0,)
        assert not pg.check_for((record,), {})({})
    finally:
        _Field.__init__.__defaults__ = defaults


def test_what_torch_checks_only_when_it_compiles_is_checked_until_the_guard_first_holds() -> None:
    """A class's method Dynamo inlined and a module's empty hook dicts are facts torch reads
    when it compiles a frame and never guards (a method patched or a hook added after the
    compile runs the compiled code, with torch alone too: docs/torch.md): a served code
    checks them when it is first served in the process, as a compile would have read them
    then, and a module's hooks again whenever another module object sits at its source."""
    import collections.abc

    [inlined] = pg.inlined_code_records([_square.__code__, collections.abc.Mapping.get.__code__])

    def module() -> SimpleNamespace:
        return SimpleNamespace(**{name: {} for name in pg.MODULE_HOOKS})

    hooks = pg.Portable("L['self']", pg.HOOKS_KIND, pg.identity(pg.hooks_of(module())) or "")
    check = pg.check_for((inlined, hooks), {}, hooks_unguarded=True)
    served = module()
    assert check({"self": served})
    original = collections.abc.Mapping.get
    try:
        collections.abc.Mapping.get = lambda self, key, default=None: default  # type: ignore[method-assign]
        served._forward_hooks[7] = _square
        assert check({"self": served})  # as torch: not looked at again
        hooked = module()
        hooked._forward_hooks[7] = _square
        assert not check({"self": hooked})  # another module object: its hooks are read
    finally:
        collections.abc.Mapping.get = original  # type: ignore[method-assign]
    strict = pg.check_for((hooks,), {}, hooks_unguarded=False)  # torch guarding hooks
    watched = module()
    assert strict({"self": watched})
    watched._forward_hooks[7] = _square
    assert not strict({"self": watched})


def test_a_sets_order_is_a_record_checked_at_every_call() -> None:
    """Dynamo iterates a set in the order this process's hash seed gives it and guards only
    its contents: the writer's order is a record; the same contents in another order (a
    reader with another seed) fail it, as does an element that has no portable name."""
    guard = SimpleNamespace(
        create_fn_name=lambda: "EQUALS_MATCH",
        name="G['NAMES']",
        guard_types=(),
        originating_source=None,
    )
    writer = {"relu", "gelu", "tanh"}
    _kept, records = pg.split([guard], lambda g: writer)
    assert [(r.source, r.kind) for r in records] == [("G['NAMES']", pg.SET_ORDER_KIND)]
    check = pg.check_for(records, {"NAMES": writer})
    assert check({}) and check({})
    reordered = sorted(writer, key=lambda n: list(writer).index(n), reverse=True)
    assert not pg.check_for(records, {"NAMES": _set_iterating(reordered)})({})
    assert not pg.check_for(records, {"NAMES": tuple(writer)})({})  # not a set any more
    assert pg.split([guard], lambda g: {"one"}) == ([guard], ())  # one element: no order
    with pytest.raises(pg.Unportable) as refused:
        pg.split([guard], lambda g: {object(), object()})
    assert refused.value.kind == pg.SET_ORDER_KIND
    assert pg.identity(frozenset({"a", "b"})) == pg.identity(frozenset({"b", "a"}))


class Tally:
    """A running count two names of a program may share."""


def test_which_guarded_objects_are_one_object_is_a_record_checked_at_every_call() -> None:
    """torch guards each object's type and values, never which guarded objects are one
    object (``B = A``): a trace that sets ``A.n`` and reads ``B.n`` computes another result
    either way (the forty-second review: off by 7 both ways). The writer's sharing is a
    record; a reader sharing otherwise, either way, fails it."""

    def guards(*names: str) -> list[Any]:
        return [
            SimpleNamespace(
                create_fn_name=lambda: "TYPE_MATCH",
                name=name,
                guard_types=(),
                originating_source=None,
            )
            for name in names
        ]

    def aliases(records: Sequence[pg.Portable]) -> list[tuple[str, str]]:
        return [(r.source, r.identity) for r in records if r.kind == "ALIASES"]

    first, second = Tally(), Tally()
    two = {"FIRST": first, "SECOND": second}
    _kept, records = pg.split(guards("G['FIRST']", "G['SECOND']"), lambda g: two[g.name[3:-2]])
    assert aliases(records) == [("G['FIRST']", ""), ("G['SECOND']", "")]
    assert pg.check_for(records, two)({})
    assert not pg.check_for(records, {"FIRST": first, "SECOND": first})({})
    one = {"FIRST": first, "SECOND": first}
    _kept, records = pg.split(guards("G['FIRST']", "G['SECOND']"), lambda g: one[g.name[3:-2]])
    assert aliases(records) == [("G['FIRST']", ""), ("G['SECOND']", "G['FIRST']")]
    check = pg.check_for(records, one)
    assert check({}) and check({})
    one["SECOND"] = second
    assert not check({})
    # a single object, and values that are not objects of a program's, carry no record
    _kept, records = pg.split(guards("G['FIRST']"), lambda g: first)
    assert aliases(records) == []


class Slotted:
    __slots__ = ("n",)


class Tagged(tuple[int, ...]):
    """An immutable type's subclass whose instances carry state of their own."""


@pytest.mark.parametrize(
    ("kind", "make"),
    [
        ("TYPE_MATCH", dict),
        ("SEQUENCE_LENGTH", list),
        ("CONSTANT_MATCH", set),
        ("TYPE_MATCH", Slotted),
        ("TYPE_MATCH", torch.nn.Identity),
        ("TYPE_MATCH", collections.deque),
        ("TYPE_MATCH", Tagged),
    ],
)
def test_containers_slotted_objects_and_modules_shared_otherwise_fail_the_aliases_record(
    kind: str, make: Callable[[], Any]
) -> None:
    """A frame may change a ``dict``, ``list``, ``set``, ``deque``, ``__slots__`` instance
    or submodule through one name and read it through another (the forty-fifth review:
    guarded by a type, a length or a value, not only by ``TYPE_MATCH`` of an instance with a
    ``__dict__``: served the writer's code, off by 1, both ways)."""

    def guards(*names: str) -> list[Any]:
        return [
            SimpleNamespace(
                create_fn_name=lambda: kind, name=name, guard_types=(), originating_source=None
            )
            for name in names
        ]

    first, second = make(), make()
    for writer, reader in (((first, second), (first, first)), ((first, first), (first, second))):
        scope = dict(zip(("A", "B"), writer, strict=True))
        _kept, records = pg.split(
            guards("G['A']", "G['B']"), lambda g, scope=scope: scope[g.name[3:-2]]
        )
        assert [r.kind for r in records].count("ALIASES") == 2, records
        assert pg.check_for(records, scope)({})
        assert not pg.check_for(records, dict(zip(("A", "B"), reader, strict=True)))({})


def test_immutable_values_and_a_modules_own_bookkeeping_carry_no_aliases_record() -> None:
    """One object or two, an immutable value reads the same; a module's own dicts
    (``_modules``, ``_parameters``) are read with the module."""
    module = torch.nn.Linear(2, 2)
    values = {
        "G['A']": 5,
        "G['B']": 5,
        "G['C']": ("x",),
        "G['D']": ("x",),
        "G['M']": module,
        "G['M']._modules": module._modules,
        "G['M']._parameters": module._parameters,
    }
    guards = [
        SimpleNamespace(
            create_fn_name=lambda: "TYPE_MATCH", name=n, guard_types=(), originating_source=None
        )
        for n in values
    ]
    _kept, records = pg.split(guards, lambda g: values[g.name])
    assert [r.source for r in records if r.kind == "ALIASES"] == []  # one module: no pair


def _set_iterating(order: list[str]) -> set[str]:
    """A set whose iteration order is ``order`` (what another hash seed would give)."""

    class Ordered(set[str]):
        def __iter__(self) -> Any:
            return iter(order)

    return Ordered(order)


class _Weird:
    pass


def test_the_fast_reader_reads_what_the_one_by_one_reader_reads() -> None:
    """Every record's path read at once, shared prefixes once, gives each path's object as
    :func:`resolve` does; an absent one raises (the check then reads one by one, which says
    which); a name that is not a plain identifier is never written into its code."""
    weird = _Weird()
    setattr(weird, "not an identifier", 5)
    setattr(weird, "class", 6)
    inner = SimpleNamespace(act=math.sqrt, d={"k": [1, 2], 3: "x"})
    scope = {"m": SimpleNamespace(inner=inner, weird=weird), "os": math, "d": {"a": {"a": 1}}}
    sources = [
        "G['m'].inner.act",
        "G['m'].inner.d['k'][1]",
        "dict.__getitem__(G['m'].inner.d, 3)",
        "type(G['m'].inner)",
        "dict(G['m'].__dict__)['inner']",
        "list(dict.keys(G['d']))[0]",
        "dict.__getitem__(G['d'], list(dict.keys(G['d']))[0])['a']",
        "__import__('math').sqrt",
        "L['self'].inner.act",
    ]
    parsed = [pg.parse_source(s) for s in sources]
    paths = [p for p in parsed if p is not None]
    assert len(paths) == len(sources)
    paths += [
        ("G", (("item", "m"), ("attr", "weird"), ("attr", n)))
        for n in ("not an identifier", "class")
    ]
    fast = pg.fast_resolver(paths)
    assert fast is not None
    f_locals = {"self": scope["m"]}
    expected = tuple(pg.resolve(root, steps, f_locals, scope) for root, steps in paths)
    assert fast(f_locals, scope) == expected
    assert expected[-2:] == (5, 6) and expected[0] is math.sqrt
    with pytest.raises(KeyError):  # L["self"] is absent
        fast({}, scope)
    assert pg.resolve("L", paths[-3][1], {}, scope) is pg._MISSING


def test_a_tuple_rebuilt_at_every_call_passes_while_it_holds_the_same_items() -> None:
    """A container of unchanging items (a mask function, a dtype, flags: what transformers
    passes down a model) is compared item by item, not named again, at every call; another
    function, another dtype or -0.0 for 0.0 fails."""
    counted: list[int] = []
    real = pg.identity

    def items(fn: Any, zero: float) -> tuple[Any, ...]:
        return (0, fn, None, "f32", zero, True)

    record = pg.Portable("L['args']", "EQUALS_MATCH", real(items(_square, 0.0)) or "")
    check = pg.check_for([record], {})
    assert check({"args": items(_square, 0.0)})
    pg.identity = lambda v, *a: counted.append(1) or real(v, *a)  # type: ignore[assignment]
    try:
        assert check({"args": items(_square, 0.0)}) and not counted
        assert not check({"args": items(_cube, 0.0)})
    finally:
        pg.identity = real  # type: ignore[assignment]
    check = pg.check_for([record], {})
    assert check({"args": items(_square, 0.0)})
    assert not check({"args": items(_square, -0.0)})


def test_a_method_a_closure_wraps_is_named_through_the_closure() -> None:
    """Dynamo replaces ``nn.Module.__init__`` by a function that calls the original from
    its closure: an inlined original ``__init__`` is named through that cell."""
    import torch

    init = torch.nn.Module.__init__
    original = init
    for cell in getattr(init, "__closure__", None) or ():
        if getattr(cell.cell_contents, "__qualname__", "") == "Module.__init__":
            original = cell.cell_contents
    if original is init:  # Dynamo has not patched it in this process yet
        torch._dynamo.mutation_guard.install_generation_tagging_init()
        init = torch.nn.Module.__init__
        original = next(c.cell_contents for c in init.__closure__ if callable(c.cell_contents))
    (record,) = pg.inlined_code_records([_square.__code__, original.__code__])
    assert ".__closure__[" in record.source and record.source.endswith(".cell_contents")
    check = pg.check_for([record], {})
    assert check({})
    root, steps = pg.parse_source(record.source) or ("", ())
    assert pg.resolve(root, steps, {}, {}) is original


def test_records_that_passed_as_the_same_objects_are_compared_at_once_the_rest_one_by_one() -> None:
    """Once the stable records (objects named by what they are) passed, a call compares all
    of them with the objects that passed in one pass; a container is still read by content
    at every call, and a rebound name still fails."""
    cfg = {"act": "relu"}
    scope = {"ACT": math.sqrt, "CFG": cfg, "torch": math}
    records = [
        pg.Portable("G['ACT']", "BUILTIN_MATCH", pg.identity(math.sqrt) or ""),
        pg.Portable("G['CFG']", "DICT_VERSION", pg.identity(cfg) or ""),
        pg.Portable("G['torch']", "MODULE_MATCH", pg.identity(math) or ""),
    ]
    check = pg.check_for(records, scope)
    assert check({}) and check({}) and check({})
    cfg["act"] = "gelu"
    assert not check({})
    cfg["act"] = "relu"
    assert check({})
    scope["torch"] = json
    assert not check({})
    scope["torch"] = math
    assert check({})
    scope["ACT"] = math.exp
    assert not check({})


def test_a_container_that_passed_as_it_is_is_known_unchanged_until_it_changes() -> None:
    """A dict of unchanging values that passed is compared by its version tag and its
    functions' code (no second naming at each call); each way it can change still fails:
    a key rebound, a function's code swapped, an ``OrderedDict`` reordered. A tuple of
    strings rebuilt at each call passes while equal."""
    import collections

    registry = {"sq": _double, "n": 1}
    ordered = collections.OrderedDict(a=_square, b=_cube)
    names = ["x", "y"]
    records = (
        pg.Portable("G['REG']", "TYPE_MATCH", pg.identity(registry) or ""),
        pg.Portable("G['ORD']", "TYPE_MATCH", pg.identity(ordered) or ""),
        pg.Portable("G['holder'].names", "SEQUENCE_LENGTH", pg.identity(tuple(names)) or ""),
    )

    class Holder:
        @property
        def names(self) -> tuple[str, ...]:
            return tuple(names)  # a new tuple at each read, as a code's co_varnames

    scope: dict[str, Any] = {"REG": registry, "ORD": ordered, "holder": Holder()}
    check = pg.check_for(records, scope)
    assert check({}) and check({}) and check({})
    registry["sq"] = _cube
    assert not check({})
    registry["sq"] = _double
    assert check({})
    original = _double.__code__
    try:
        _double.__code__ = _cube.__code__
        assert not check({})
    finally:
        _double.__code__ = original
    assert check({})
    ordered.move_to_end("a")
    assert not check({})
    ordered.move_to_end("b")
    assert check({})
    names[1] = "z"
    assert not check({})
    names[1] = "y"
    assert check({})


def test_a_dict_of_dicts_is_sealed_with_the_dicts_inside_it() -> None:
    """A registry of per-model dicts (transformers' ``_CAN_RECORD_REGISTRY``) passes without
    being named again while neither it nor a dict in it changed; a change inside fails."""

    class Registry(dict):  # type: ignore[type-arg]
        pass

    inner = {"attentions": _double, "hidden": 1}
    registry = Registry(model=inner)
    record = pg.Portable("G['R']", "TYPE_MATCH", pg.identity(registry) or "")
    assert record.identity
    check = pg.check_for((record,), {"R": registry})
    assert check({}) and check({}) and check({})
    inner["hidden"] = 2
    assert not check({})
    inner["hidden"] = 1
    assert check({})
    inner["attentions"] = _cube
    assert not check({})
    inner["attentions"] = _double
    assert check({}) and check({})


#: A C class's method chosen by name, read by :func:`_act` (module global).
ACT: Any = None


def _act(x: Any) -> Any:
    return ACT(x)


def test_a_c_class_method_read_where_dynamo_guards_nothing_is_a_record() -> None:
    """``ACT = getattr(torch.Tensor, name)`` in a module's globals and ``self.act =
    torch.Tensor.relu`` on a module: Dynamo calls the method by name and guards nothing on
    the value, so each is a record of what it held; a reader that chose another method
    fails it."""
    import torch

    global ACT
    ACT = torch.Tensor.relu

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Module()
            self.inner.act = torch.Tensor.relu

    net = Net()
    records = pg.unguarded_value_records([_act.__code__], {"self": net})
    assert sorted(r.source for r in records) == [
        "L['self'].inner.act",
        "__import__('tests').integrations.torch.precompile.test_portable_guards.ACT",
    ], records
    assert {r.kind for r in records} == {pg.UNGUARDED_KIND}
    assert pg.check_for(records, {})({"self": net})
    try:
        ACT = torch.Tensor.sigmoid
        assert not pg.check_for(records, {})({"self": net})
    finally:
        ACT = torch.Tensor.relu
    net.inner.act = torch.Tensor.sigmoid
    assert not pg.check_for(records, {})({"self": net})


class _Doubles:
    def act(self, x: Any) -> Any:
        return x * 2


class _Shifts:
    def act(self, x: Any) -> Any:
        return x + 1


def _fast_act(self: Any, x: Any) -> Any:
    return x * 3


def test_a_class_is_named_with_its_bases_and_the_methods_they_hold() -> None:
    """Dynamo finds a method through ``type(obj).__mro__`` and guards the class by name only:
    a class of the same name on another base, or whose method the program replaced, names
    another layout; the same class names the same, and a base with code and no portable
    name makes the class unnamed (its frame is not saved)."""

    def made(base: type, name: str = "Chosen") -> type:
        cls = type(name, (base,), {"__module__": __name__, "__qualname__": name})
        globals()[name] = cls  # reachable by its name, as a module-level class is
        return cls

    try:
        on_doubles, again = pg.identity(made(_Doubles)), pg.identity(made(_Doubles))
        on_shifts = pg.identity(made(_Shifts))
        assert on_doubles is not None and on_doubles.startswith(f"class:{__name__}.Chosen@")
        assert on_doubles == again and on_shifts != on_doubles
        original = _Doubles.act
        try:
            _Doubles.act = _fast_act  # type: ignore[method-assign]
            assert pg.identity(made(_Doubles)) != on_doubles
        finally:
            _Doubles.act = original  # type: ignore[method-assign]
        assert pg.identity(made(_Doubles)) == on_doubles
        local = type("Local", (), {"__qualname__": "f.<locals>.Local", "act": _fast_act})
        assert pg.identity(made(local)) is None
        # classes with no Python code of their own (C's, pybind11's) are named as before
        assert pg.identity(int) == "class:builtins.int"
        guards = pytest.importorskip("torch._C._dynamo.guards")
        manager = guards.RootGuardManager
        assert pg.identity(manager) == "class:torch._C._dynamo.guards.RootGuardManager"
    finally:
        globals().pop("Chosen", None)


def test_names_a_trace_looked_up_in_vain_must_be_absent_on_the_reader() -> None:
    """An attribute ``hasattr`` found absent (``G['lib'].fast``) and a builtin reached past a
    module's globals: the reader's check fails where the object has the name, and a source
    no other machine can read makes the frame unsaveable."""
    records = pg.absent_records({"G['lib']": {"fast"}, "__import__('math')": {"abs"}})
    assert [r.kind for r in records] == [pg.ABSENT_KIND] * 2
    assert pg.check_for(records, {"lib": SimpleNamespace(slow=_square)})({})
    assert not pg.check_for(records, {"lib": SimpleNamespace(fast=_square)})({})
    assert not pg.check_for(pg.absent_records({"__import__('math')": {"sqrt"}}), {})({})
    with pytest.raises(pg.Unportable):
        pg.absent_records({"a name made in the frame": {"fast"}})


def test_keys_a_trace_looked_up_in_vain_must_be_absent_from_the_readers_dict() -> None:
    """A key a dict lacked on the writer (``G['OPTIONS']["k"]``, ``1``): the reader's check
    fails where its dict holds one of them or the object is no dict; a key of another type
    (``True`` equals ``1``, as the lookup would find it) is compared as the dict compares."""
    records = pg.absent_records({}, {"G['OPTIONS']": {"k", 1}})
    assert [r.kind for r in records] == [pg.ABSENT_KEYS_KIND]
    assert pg.check_for(records, {"OPTIONS": {"j": 1.0}})({})
    assert not pg.check_for(records, {"OPTIONS": {"k": 5.0}})({})
    assert not pg.check_for(records, {"OPTIONS": {True: 5.0}})({})
    assert not pg.check_for(records, {"OPTIONS": SimpleNamespace(j=1.0)})({})
    assert not pg.check_for(records, {})({})
    with pytest.raises(pg.Unportable):
        pg.absent_records({}, {"a dict made in the frame": {"k"}})


def test_keys_an_instance_dict_held_when_asked_must_be_there_on_the_reader() -> None:
    """``"k" in obj.__dict__`` answered True on the writer: a reader whose object lacks the
    attribute fails the record."""
    records = pg.absent_records({}, None, {"G['CFG'].__dict__": {"k"}})
    assert [r.kind for r in records] == [pg.PRESENT_KEYS_KIND]
    assert pg.check_for(records, {"CFG": SimpleNamespace(k=5.0, j=1.0)})({})
    assert not pg.check_for(records, {"CFG": SimpleNamespace(j=1.0)})({})


def _leafy(x: Any) -> Any:
    return x * 2 if x.is_leaf else x


def _graded(x: Any) -> Any:
    return x if x.grad_fn is None else x * 3


def test_tensor_facts_torch_does_not_guard_are_found_in_the_traced_code() -> None:
    """Whether an input is a leaf of autograd's graph: Dynamo folds ``is_leaf`` and
    ``grad_fn`` and guards only ``requires_grad``."""
    assert pg.unguarded_tensor_read([_leafy.__code__]) == "is_leaf"
    assert pg.unguarded_tensor_read([_square.__code__, _graded.__code__]) == "grad_fn"
    assert pg.unguarded_tensor_read([_square.__code__]) is None
