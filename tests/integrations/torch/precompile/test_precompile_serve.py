"""Serving a precompile entry (:mod:`objcache.integrations.torch.precompile.precompile_serve`),
the parts that need no compile: what an entry's install would re-bind in the program's
module. The served path itself is tested with real compiles in test_precompile.py."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from objcache.integrations.torch.precompile import precompile_serve

pytest.importorskip("torch")


def _resumes_at_one(x: Any) -> Any:  # the entry's resume function
    return x - 1.0


def _resumes_at_seven(x: Any) -> Any:  # this process's own, under the same name
    return x - 7.0


def _package(code: Any, name: str, install_to_global: bool = True) -> Any:
    entry = SimpleNamespace(
        python_module=__name__, function_names=[name], install_to_global=install_to_global
    )
    return SimpleNamespace(_codes={code: entry})


def test_a_resume_name_this_process_bound_to_other_code_is_taken() -> None:
    """Dynamo names a resume function by its offset and a counter of the compiling process
    (``__resume_at_70_3``): the new machine's own compile of another function may hold the
    name the entry would bind, and torch's ``install`` would re-bind it (that function's
    next call ran the entry's code). Taken: the entry is refused (``rejected:name_taken``)
    and the frame compiles. The same code under the name (this process compiled the same
    function), a name nobody holds, and the frame's own function are free."""
    module = vars(sys.modules[__name__])
    name = "__resume_at_70_3"
    try:
        module[name] = _resumes_at_seven
        taken = precompile_serve._name_taken(_package(_resumes_at_one.__code__, name))
        assert taken == f"{__name__}.{name}"
        module[name] = _resumes_at_one
        assert precompile_serve._name_taken(_package(_resumes_at_one.__code__, name)) is None

        def factory(closure: Any, _code: Any = _resumes_at_one.__code__) -> Any:
            return closure  # Dynamo's binding for a resume function with free variables

        module[name] = factory
        assert precompile_serve._name_taken(_package(_resumes_at_one.__code__, name)) is None
    finally:
        module.pop(name, None)
    assert precompile_serve._name_taken(_package(_resumes_at_one.__code__, name)) is None
    own = _package(_resumes_at_seven.__code__, "_resumes_at_one", install_to_global=False)
    assert precompile_serve._name_taken(own) is None
