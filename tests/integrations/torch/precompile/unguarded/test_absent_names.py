"""Where the names a trace looked up in vain are checked: the module whose globals a code
runs in, the class of an object the frame made (no compile)."""

from __future__ import annotations

import _collections_abc
import collections
import types

from objcache.integrations.torch.precompile import portable_guards
from objcache.integrations.torch.precompile.unguarded import absent_names


def test_a_codes_module_is_found_by_its_globals_even_where_it_names_itself_otherwise() -> None:
    """``_collections_abc`` calls itself ``collections.abc`` (its ``__name__``), whose module
    is another object: the source names the module that holds the globals."""
    assert _collections_abc.__name__ == "collections.abc"
    source = absent_names.module_source(vars(_collections_abc))
    assert source == "__import__('_collections_abc')"
    assert absent_names.module_source(vars(collections)) == "__import__('collections')"
    records = portable_guards.absent_records({source: {"IndexError"}})
    assert portable_guards.check_for(records, {})({})
    assert absent_names.module_source({"__name__": "exec'd"}) is None
    assert absent_names.module_source({}) is None


class _Made:
    pass


def test_an_object_the_frame_made_is_looked_up_through_its_class() -> None:
    def local() -> type:
        class Inner:
            pass

        return Inner

    source = absent_names.class_source(_Made)
    assert source == f"__import__({__name__.split('.')[0]!r})" + "".join(
        f".{part}" for part in [*__name__.split(".")[1:], "_Made"]
    )
    records = portable_guards.absent_records({source: {"fast"}})
    assert portable_guards.check_for(records, {})({})
    _Made.fast = True  # type: ignore[attr-defined]
    try:
        assert not portable_guards.check_for(records, {})({})
    finally:
        del _Made.fast  # type: ignore[attr-defined]
    assert absent_names.class_source(local()) is None


class _Source:
    def __init__(self, text: str) -> None:
        self.text = text

    def name(self) -> str:
        return self.text


class _Constant:
    def __init__(self, value: object) -> None:
        self.value = value

    def is_python_constant(self) -> bool:
        return True

    def as_python_constant(self) -> object:
        return self.value


class _KeyError:
    def __init__(self, *args: object) -> None:
        self.args = args


def _look_up(dict_source: _Source | None, key: object) -> tuple[dict[str, set[object]], object]:
    """A dict lookup that raises Dynamo's ``KeyError`` the way torch's does, through the
    wrappers: what the frame collected, and why the trace was marked unsaveable (or None)."""
    import torch
    from torch._guards import TracingContext, tracing

    error_init = absent_names.wrap_observed_key_error(_KeyError.__init__)

    def getitem(self: object, tx: object, arg: object) -> object:
        error = _KeyError.__new__(_KeyError)
        error_init(error, "raised exception KeyError")
        return error

    output = types.SimpleNamespace(package=object())
    tx = types.SimpleNamespace(output=output)
    context = TracingContext(torch._subclasses.FakeTensorMode())
    with tracing(context):
        absent_names.wrap_dict_getitem(getitem)(
            types.SimpleNamespace(source=dict_source), tx, _Constant(key)
        )
    return absent_names.collected_keys(output), context.__dict__.get("_objcache_unsaveable")


def test_a_key_a_named_dict_lacked_is_kept_for_a_record_and_others_make_the_frame_unsaved() -> None:
    """A plain key missing from a dict a guard's source names: collected at that source (an
    ``ABSENT_KEYS`` record), the frame saved; from a dict the frame made: nothing to carry;
    a ``bytes`` key (``os.environ``'s) or a ``KeyError`` raised outside a dict lookup: the
    frame is not saved."""
    assert _look_up(_Source("G['OPTIONS']"), "k") == ({"G['OPTIONS']": {"k"}}, None)
    assert _look_up(None, "k") == ({}, None)
    assert _look_up(_Source("G['OPTIONS']"), b"k") == ({}, absent_names.KEY_UNSAVED)
    import torch
    from torch._guards import TracingContext, tracing

    context = TracingContext(torch._subclasses.FakeTensorMode())
    with tracing(context):
        absent_names.wrap_observed_key_error(_KeyError.__init__)(
            _KeyError.__new__(_KeyError), "raised exception KeyError"
        )
    assert context.__dict__.get("_objcache_unsaveable") == absent_names.KEY_UNSAVED


class _InstanceDict:
    """What Dynamo's ``DunderDictVariable`` answers: whether it holds a key."""

    def __init__(self, source: _Source | None, keys: set[object]) -> None:
        self.source = source
        self.keys = keys

    def __contains__(self, arg: _Constant) -> bool:
        return arg.value in self.keys


def test_what_a_trace_asked_of_an_instance_dict_is_kept_and_its_key_set_is_not() -> None:
    """``"k" in obj.__dict__`` (torch installs nothing): an absent key is an ``ABSENT_KEYS``
    record, a present one a ``PRESENT_KEYS`` record, at the dict's source; an object the
    frame made: nothing; ``len(obj.__dict__)``: the frame is not saved."""
    import torch
    from torch._guards import TracingContext, tracing

    def contains(self: object, tx: object, args: object) -> None:
        return None

    output = types.SimpleNamespace(package=object())
    tx = types.SimpleNamespace(output=output)
    wrapped = absent_names.wrap_instance_dict_contains(contains)
    source = _Source("G['CFG'].__dict__")
    wrapped(_InstanceDict(source, {"k"}), tx, [_Constant("k")])
    wrapped(_InstanceDict(source, {"k"}), tx, [_Constant("j")])
    wrapped(_InstanceDict(None, set()), tx, [_Constant("m")])
    assert absent_names.collected_present_keys(output) == {"G['CFG'].__dict__": {"k"}}
    assert absent_names.collected_keys(output) == {"G['CFG'].__dict__": {"j"}}
    context = TracingContext(torch._subclasses.FakeTensorMode())
    with tracing(context):
        absent_names.wrap_instance_dict_keys(lambda self: None)(_InstanceDict(None, set()))
        assert "_objcache_unsaveable" not in context.__dict__
        absent_names.wrap_instance_dict_keys(lambda self: None)(_InstanceDict(source, set()))
    assert context.__dict__["_objcache_unsaveable"] == absent_names.INSTANCE_DICT_UNSAVED
