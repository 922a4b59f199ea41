"""Where the names a trace looked up in vain are checked: the module whose globals a code
runs in, the class of an object the frame made (no compile)."""

from __future__ import annotations

import _collections_abc
import collections

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
