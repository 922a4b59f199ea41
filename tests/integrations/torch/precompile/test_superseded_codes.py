"""Which static variants of a precompile entry a later dynamic one covers (docs/torch.md,
"Variants a dynamic one replaces"). Pure: the shapes and torch's entry types stand in as
plain dataclasses; the real compile is in tests/integrations/torch/precompile/test_precompile.py."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import pytest

from objcache.integrations.torch.precompile import superseded_codes as sc

STATIC_2: sc.Shapes = {"L['x']": (2, 8), "W": (4, 8)}
DYNAMIC: sc.Shapes = {"L['x']": (None, 8), "W": (4, 8)}


@pytest.mark.parametrize(
    ("static", "covered"),
    [
        (STATIC_2, True),
        ({"L['x']": (7, 8), "W": (4, 8)}, True),
        ({"L['x']": (1, 8), "W": (4, 8)}, False),  # Dynamo specializes 0 and 1
        ({"L['x']": (0, 8), "W": (4, 8)}, False),
        ({"L['x']": (2, 16), "W": (4, 8)}, False),  # a size the later one keeps static
        ({"L['x']": (2, 8, 1), "W": (4, 8)}, False),  # another rank
        ({"L['x']": (2, 8)}, False),  # another set of inputs
        ({"L['x']": (2, 8), "W": (4, 8), "y": (3,)}, False),
    ],
)
def test_a_dynamic_variant_covers_only_static_inputs_its_guards_can_accept(
    static: sc.Shapes, covered: bool
) -> None:
    assert sc.covers(DYNAMIC, static) is covered


def test_only_a_dynamic_variant_covers_and_only_a_static_one_is_covered() -> None:
    assert not sc.covers(STATIC_2, STATIC_2)
    assert not sc.covers(DYNAMIC, DYNAMIC)


@dataclasses.dataclass
class Guarded:
    guards_state: bytes
    dynamo_code: Any


@dataclasses.dataclass
class CodeEntry:
    guarded_codes: list[Guarded]
    backend_ids: list[str]


def _guarded(state: bytes, backend: str) -> Guarded:
    return Guarded(state, types.SimpleNamespace(co_names=("torch", backend)))


def test_the_covered_variant_and_only_its_backend_are_left_out() -> None:
    sc.forget()
    static, dynamic, other = (
        _guarded(b"s", "__compiled_fn_1"),
        _guarded(b"d", "__compiled_fn_3"),
        _guarded(b"o", "__compiled_fn_5"),
    )
    sc.record(b"s", STATIC_2)
    sc.record(b"d", DYNAMIC)
    sc.record(b"o", {"L['x']": (1, 8), "W": (4, 8)})  # after the dynamic one: kept
    entry = CodeEntry(
        [static, dynamic, other], ["__compiled_fn_1", "__compiled_fn_3", "__compiled_fn_5"]
    )
    kept, left_out = sc.without_superseded(entry)
    assert left_out == 1
    # the static variant stays: a new machine's first call at its size runs the kernels a
    # compile of that call makes (a dynamic variant's reduce in another order)
    assert kept.guarded_codes == [static, other]
    assert kept.backend_ids == ["__compiled_fn_1", "__compiled_fn_5"]
    assert len(entry.guarded_codes) == 3  # the live package is never changed
    sc.forget()


def test_a_variant_without_a_recorded_view_is_kept_and_covers_nothing() -> None:
    sc.forget()
    sc.record(b"d", DYNAMIC)
    entry = CodeEntry(
        [_guarded(b"unknown", "__compiled_fn_1"), _guarded(b"d", "__compiled_fn_3")],
        ["__compiled_fn_1", "__compiled_fn_3"],
    )
    kept, left_out = sc.without_superseded(entry)
    assert left_out == 0 and kept == entry and kept is not entry
    sc.record(b"s", STATIC_2)
    sc.record(b"s2", None)  # a frame whose shapes could not be read: never recorded
    later_unknown = CodeEntry(
        [_guarded(b"s", "__compiled_fn_1"), _guarded(b"s2", "__compiled_fn_3")], []
    )
    assert sc.without_superseded(later_unknown)[1] == 0
    sc.forget()


def test_a_backend_a_kept_variant_also_calls_stays() -> None:
    sc.forget()
    sc.record(b"s", STATIC_2)
    sc.record(b"d", DYNAMIC)
    shared = CodeEntry(
        [_guarded(b"s", "__compiled_fn_1"), _guarded(b"d", "__compiled_fn_1")],
        ["__compiled_fn_1"],
    )
    kept, left_out = sc.without_superseded(shared)
    assert left_out == 1 and kept.backend_ids == ["__compiled_fn_1"]
    sc.forget()


def test_shapes_that_cannot_be_read_are_none() -> None:
    assert sc.shapes_of(object()) is None
    torch = pytest.importorskip("torch")
    fakes = [
        types.SimpleNamespace(fake=torch.empty(2, 3), source=types.SimpleNamespace(name="x")),
        types.SimpleNamespace(fake=5, source=types.SimpleNamespace(name=lambda: "n")),
    ]
    x = "x torch.float32 cpu grad=False"
    assert sc.shapes_of(types.SimpleNamespace(tracked_fakes=fakes)) == {x: (2, 3), "n": (5,)}
    clash = [*fakes, types.SimpleNamespace(fake=torch.empty(4), source=fakes[0].source)]
    assert sc.shapes_of(types.SimpleNamespace(tracked_fakes=clash)) is None


def test_another_dtype_or_requires_grad_is_never_covered() -> None:
    torch = pytest.importorskip("torch")

    def view(t: Any) -> sc.Shapes:
        source = types.SimpleNamespace(name="L['x']")
        shapes = sc.shapes_of(
            types.SimpleNamespace(tracked_fakes=[types.SimpleNamespace(fake=t, source=source)])
        )
        assert shapes is not None
        return shapes

    static = view(torch.empty(2, 8))

    def dynamic_of(shapes: sc.Shapes) -> sc.Shapes:
        return {name: (None, 8) for name in shapes}

    assert sc.covers(dynamic_of(static), static)
    for other in (torch.empty(2, 8, dtype=torch.float16), torch.empty(2, 8, requires_grad=True)):
        assert not sc.covers(dynamic_of(view(other)), static)
