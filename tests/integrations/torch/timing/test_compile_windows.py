"""Compile windows (:mod:`objcache.integrations.torch.timing.compile_windows`): the
program's registrations and edits are read once per outermost window and shared by the keys
computed in it; the next window (a lazy backward's, compiled under its forward's compile id)
reads them again."""

from __future__ import annotations

from typing import Any

import pytest

from objcache.integrations.torch.precompile import op_overrides, torch_edits
from objcache.integrations.torch.timing import compile_windows

torch = pytest.importorskip("torch")


@pytest.fixture
def fast_exp() -> Any:
    """A "fast math" library's ``CppOverrides.exp``, put in place and taken out by the test."""
    import torch._inductor.codegen.cpp as cpp

    original = cpp.CppOverrides.__dict__["exp"]

    def put() -> None:
        cpp.CppOverrides.exp = staticmethod(lambda x: f"(1 + {x})")  # type: ignore[method-assign,assignment]

    yield put
    cpp.CppOverrides.exp = original  # type: ignore[method-assign]


def _names_exp() -> bool:
    return any("CppOverrides.exp" in label for label, _ in op_overrides.torch_overrides())


def test_one_window_shares_one_reading_and_the_next_reads_again(fast_exp: Any) -> None:
    """Keys computed inside one window name what the program had done as it opened; a window
    nested in it (a graph compile in a frame compile) shares that reading; the next outermost
    window, and any reading outside every window, sees the change."""
    torch_edits.compile_started()  # a forward's frame compile
    try:
        assert not _names_exp()
        fast_exp()  # what a callback could do mid-compile: not read again in this window
        torch_edits.compile_started()  # its graph compile
        try:
            assert not _names_exp()
        finally:
            torch_edits.compile_ended()
        assert compile_windows.open_now()
    finally:
        torch_edits.compile_ended()
    assert not compile_windows.open_now()
    torch_edits.compile_started()  # the lazy backward
    try:
        assert _names_exp()
    finally:
        torch_edits.compile_ended()
    assert _names_exp()  # outside every window: read afresh


def test_another_thread_inside_the_same_window_reads_for_itself(fast_exp: Any) -> None:
    """Two threads compiling at once share the window count but not a reading."""
    from concurrent.futures import ThreadPoolExecutor

    torch_edits.compile_started()
    try:
        assert not _names_exp()
        fast_exp()
        with ThreadPoolExecutor(max_workers=1) as pool:
            assert pool.submit(_names_exp).result()
    finally:
        torch_edits.compile_ended()
