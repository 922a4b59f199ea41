"""Compile time saved by hits: torch's own per-hit figure, added up per kind."""

from __future__ import annotations

import types
from collections.abc import Iterator

import pytest

from objcache.integrations.torch.timing import time_saved


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    time_saved.reset()
    yield
    time_saved.uninstall()
    time_saved.reset()


def torch_like(name: str) -> types.ModuleType:
    """A module named like one of torch's whose code calls the function by its global name."""
    module = types.ModuleType(name)
    calls: list[int] = []
    module.calls = calls  # type: ignore[attr-defined]

    def add_ephemeral_timeout_increase_for_distributed(ns: int) -> int:
        calls.append(ns)
        return 0

    module.add_ephemeral_timeout_increase_for_distributed = (  # type: ignore[attr-defined]
        add_ephemeral_timeout_increase_for_distributed
    )
    exec("def hit(ns):\n    return add_ephemeral_timeout_increase_for_distributed(ns)\n",
         module.__dict__)  # fmt: skip
    return module


def test_each_caller_counts_under_its_kind_and_torch_still_runs() -> None:
    fx = torch_like("torch._inductor.codecache")
    aot = torch_like("torch._functorch._aot_autograd.autograd_cache")
    assert time_saved.apply(fx) and time_saved.apply(aot)
    assert time_saved.apply(fx), "applying twice wraps once"
    fx.hit(2_000_000_000)
    fx.hit(500_000_000)
    aot.hit(3_000_000_000)
    assert time_saved.snapshot() == {"fx-graph": 2.5, "aot-autograd": 3.0}
    assert fx.calls == [2_000_000_000, 500_000_000] and aot.calls == [3_000_000_000]
    time_saved.uninstall()
    fx.hit(1_000_000_000)
    assert time_saved.snapshot()["fx-graph"] == 2.5, "uninstalled: torch's function is back"


def test_a_torch_without_the_function_is_left_alone() -> None:
    assert time_saved.apply(types.ModuleType("torch._inductor.codecache")) is False


def test_fx_hits_inside_aot_hits_are_not_counted_twice() -> None:
    assert time_saved.total_s({"fx-graph": 2.0, "aot-autograd": 3.0, "autotune": 0.5}) == 3.5
    assert time_saved.total_s({"fx-graph": 2.0}) == 2.0
    assert time_saved.total_s({}) == 0.0


def test_summaries_carry_it_and_old_or_hostile_ones_are_handled() -> None:
    from objcache.cli.report import Row
    from objcache.observe import run_summary as summary

    body = summary.build(
        {"cache": {"gets": {"fx-graph": 2}, "hits": {"fx-graph": 2}}, "tiers": []},
        job="j", run="run-1-1-aa", started=1.0, ended=2.0, host="h",
        time_saved={"fx-graph": 1.5, "aot-autograd": 4.0},
    )  # fmt: skip
    parsed = summary.parse(summary.encode(body))
    assert parsed["time_saved_s"] == {"fx-graph": 1.5, "aot-autograd": 4.0}
    assert Row.from_summary(parsed).saved_s == 4.0
    older = {k: v for k, v in body.items() if k != "time_saved_s"}
    assert summary.parse(summary.encode(older))["time_saved_s"] == {}
    with pytest.raises(summary.SummaryError):
        summary.parse(summary.encode({**body, "time_saved_s": {"fx-graph": -1}}))
    with pytest.raises(summary.SummaryError):
        summary.parse(summary.encode({**body, "time_saved_s": {"fx-graph": float("inf")}}))
