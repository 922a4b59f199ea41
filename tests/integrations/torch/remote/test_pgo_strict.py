"""A frame that must be one graph starts static whatever dynamic-shape profile the process
loaded (objcache/integrations/torch/remote/pgo_strict.py); other frames keep the profile."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator

import pytest
import torch
import torch._dynamo.convert_frame
import torch._dynamo.pgo as pgo
import torch._dynamo.symbolic_convert
import torch.utils.checkpoint

from objcache.integrations.torch.remote import pgo_strict


def scaled(x: torch.Tensor) -> torch.Tensor:
    return x * math.gcd(x.shape[0], 12) + 1  # a size folded into a constant: static only


@pytest.fixture
def loaded_profile(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A process that loaded, at start, the profile a writer left after running ``scaled``
    at sizes 8 and 10 (dim 0 dynamic), with objcache's wrapper on torch's update."""
    torch._dynamo.reset()
    compiled = torch.compile(scaled, backend="eager")
    compiled(torch.ones(8))
    compiled(torch.ones(10))  # a recompile: automatic dynamic marks dim 0
    learned = copy.deepcopy(pgo.get_code_state())
    assert learned, "the writer learned no profile"
    torch._dynamo.reset()

    def read_at_first_use() -> object:  # as torch reads the store's profile: at first use
        if pgo._CODE_STATE is None:
            pgo._CODE_STATE = copy.deepcopy(learned)
            pgo._INIT_CODE_STATE = copy.deepcopy(learned)
        return pgo._CODE_STATE

    monkeypatch.setattr(pgo, "_CODE_STATE", None)
    monkeypatch.setattr(pgo, "_INIT_CODE_STATE", None)
    monkeypatch.setattr(pgo, "get_code_state", read_at_first_use)
    monkeypatch.setattr(
        pgo,
        "update_automatic_dynamic",
        pgo_strict.wrap_update_automatic_dynamic(pgo.update_automatic_dynamic),
    )
    translator = torch._dynamo.symbolic_convert.InstructionTranslator
    monkeypatch.setattr(translator, "run", pgo_strict.wrap_run(translator.run))
    output = torch._dynamo.output_graph.OutputGraph
    compile_graph = pgo_strict.wrap_compile_graph(output.compile_and_call_fx_graph)
    monkeypatch.setattr(output, "compile_and_call_fx_graph", compile_graph)
    frames = torch._dynamo.convert_frame
    monkeypatch.setattr(frames, "_compile", pgo_strict.wrap_compile(frames._compile))
    monkeypatch.setattr(pgo_strict, "_decided", set())
    monkeypatch.setattr(pgo_strict, "_dropped", set())
    monkeypatch.setattr(pgo_strict, "_decided_in", [None])
    yield
    torch._dynamo.reset()


def test_a_fullgraph_frame_compiles_as_on_a_machine_without_the_profile(
    loaded_profile: None,
) -> None:
    before = pgo_strict.counters["strict_frames_started_static"]
    strict = torch.compile(scaled, backend="eager", fullgraph=True)
    x = torch.arange(8.0)
    assert torch.equal(strict(x), scaled(x))  # with the profile taken: Unsupported (gcd)
    assert pgo_strict.counters["strict_frames_started_static"] == before + 1
    from objcache.integrations.install import hooks  # what a run summary reports

    assert hooks.stats()["hooks"]["strict_frames_started_static"] == before + 1
    # decided once a frame: what the process learns from here on is torch's own
    assert torch.equal(strict(x + 1), scaled(x + 1))
    assert pgo_strict.counters["strict_frames_started_static"] == before + 1


def test_a_frame_that_may_break_keeps_the_loaded_profile(loaded_profile: None) -> None:
    code_id = pgo.CodeId.make(scaled.__code__, None)
    kept = pgo.get_code_state()[code_id]
    before = pgo_strict.counters["strict_frames_started_static"]
    restarts = pgo_strict.counters["size_arithmetic_restarted_static"]
    lenient = torch.compile(scaled, backend="eager")
    x = torch.arange(8.0)
    assert torch.equal(lenient(x), scaled(x))
    assert pgo.get_code_state()[code_id] is kept
    assert pgo_strict.counters["strict_frames_started_static"] == before
    assert pgo_strict.counters["size_arithmetic_restarted_static"] == restarts


def test_after_a_reset_the_profile_read_again_is_decided_again(loaded_profile: None) -> None:
    """``torch._dynamo.reset()`` drops torch's profile; the next compile reads it again, and
    a strict frame must not take it then either."""
    before = pgo_strict.counters["strict_frames_started_static"]
    x = torch.arange(8.0)
    assert torch.equal(torch.compile(scaled, backend="eager", fullgraph=True)(x), scaled(x))
    torch._dynamo.reset()
    assert torch.equal(torch.compile(scaled, backend="eager", fullgraph=True)(x), scaled(x))
    assert pgo_strict.counters["strict_frames_started_static"] == before + 2


@torch._dynamo.error_on_graph_break(True)
def _groups(n: int) -> int:
    return math.gcd(n, 12)  # a size folded into a constant: static only


def turns_strict(x: torch.Tensor) -> torch.Tensor:
    return x * _groups(x.shape[0]) + 1  # strict only from the helper's call on


def test_a_frame_that_turns_strict_inside_is_traced_again_without_the_profile(
    loaded_profile: None,
) -> None:
    """``error_on_graph_break`` on a helper the frame calls: the frame's inputs were read
    (dynamic, from the loaded profile) before the helper made it strict, so its trace fails
    where a machine without the profile compiles static: traced again without the entry."""
    code_id = pgo.CodeId.make(scaled.__code__, None)
    learned = pgo.get_code_state()[code_id]
    # the writer's profile, as if it had been learned for this frame
    pgo._CODE_STATE[pgo.CodeId.make(turns_strict.__code__, None)] = copy.deepcopy(learned)
    pgo._INIT_CODE_STATE[pgo.CodeId.make(turns_strict.__code__, None)] = copy.deepcopy(learned)
    before = pgo_strict.counters["failed_frames_restarted_static"]
    x = torch.arange(8.0)
    assert torch.equal(torch.compile(turns_strict, backend="eager")(x), turns_strict(x))
    assert pgo_strict.counters["failed_frames_restarted_static"] == before + 1


def with_count(x: torch.Tensor, n: int) -> torch.Tensor:
    return x + n * n * n * n * n  # exact in Python; 64-bit in a kernel where n is a symbol


def test_a_scalar_the_loaded_profile_marks_dynamic_starts_static(
    loaded_profile: None,
) -> None:
    """A writer called the frame with n=2 then n=3 (the profile marks ``n`` dynamic); a new
    machine's first call traces ``n`` as a constant, as a machine without the profile does
    (a symbol's arithmetic runs in 64 bits in Inductor's kernels: at n=7000 it wraps
    around); a second value in the process makes it dynamic, torch's own way."""
    from torch._dynamo.pgo import FrameStateSizeEntry, auto_dynamic

    code_id = pgo.CodeId.make(with_count.__code__, None)
    pgo.get_code_state()  # the profile read at first use, as torch reads the store's
    for state in (pgo._CODE_STATE, pgo._INIT_CODE_STATE):
        state[code_id] = pgo.CodeState()
        state[code_id].automatic_dynamic["L['n']"] = FrameStateSizeEntry(scalar=auto_dynamic)
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, inputs: object) -> object:
        graphs.append(gm)
        return gm.forward

    before = pgo_strict.counters["loaded_scalars_started_static"]
    compiled = torch.compile(with_count, backend=backend)
    x = torch.ones(2)
    assert torch.equal(compiled(x, 7000), with_count(x, 7000))
    placeholders = [n for n in graphs[0].graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 1  # n folded into the graph: a constant, not an input
    assert pgo_strict.counters["loaded_scalars_started_static"] == before + 1
    assert torch.equal(compiled(x, 3), with_count(x, 3))  # a second value: torch's own way
    assert len(graphs) == 2


def share(x: torch.Tensor) -> torch.Tensor:
    k = int(x.shape[0] * 0.7 * 3) // 3  # Python: (10 * 0.7) * 3 = 21.0; sympy: 2.1 * 10 < 21
    return x[:k] * 2.0


def power(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    return x + n * n * n * n * n  # exact in Python; 64 bits in a kernel, past them at 7000


def _scaled_rows(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0, keepdim=True) * int(x.shape[0] * 0.9 * 0.7)  # Python: 62; sympy: 63 at 100


def checkpointed(x: torch.Tensor) -> torch.Tensor:
    """The size arithmetic in a subgraph's body: only a (1,) tensor reaches the frame's graph."""
    return torch.utils.checkpoint.checkpoint(_scaled_rows, x, use_reentrant=False) * 2


@pytest.mark.parametrize(
    ("frame", "size"),
    [(share, 10), (power, 7000), (checkpointed, 100)],
    ids=["a float of a size", "past 64 bits", "in a subgraph's body"],
)
def test_a_frame_whose_size_arithmetic_python_does_is_traced_again_without_the_profile(
    loaded_profile: None, frame: object, size: int
) -> None:
    """The loaded profile marks dim 0 dynamic. A trace that multiplies the size by floats
    hands them to sympy, which re-associates them (Inductor then computes ``2.1 * n``, one
    row short at n=10, and Dynamo's own guard on it can fail); one whose integer of sizes
    passes 64 bits at this call has a kernel wrap it around. Either is traced again static,
    before its graph is compiled, as a machine without the profile traces it."""
    assert callable(frame)
    code_id = pgo.CodeId.make(scaled.__code__, None)
    learned = pgo.get_code_state()[code_id]
    for state in (pgo._CODE_STATE, pgo._INIT_CODE_STATE):
        state[pgo.CodeId.make(frame.__code__, None)] = copy.deepcopy(learned)
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, inputs: object) -> object:
        graphs.append(gm)
        return gm.forward

    before = pgo_strict.counters["size_arithmetic_restarted_static"]
    x = torch.arange(float(size))
    assert torch.equal(torch.compile(frame, backend=backend)(x), frame(x))
    assert pgo_strict.counters["size_arithmetic_restarted_static"] == before + 1
    (graph,) = graphs  # compiled once: after the restart
    sizes = [
        d
        for n in graph.graph.nodes
        if n.op == "placeholder"
        for d in getattr(n.meta.get("example_value"), "shape", ())
    ]
    assert sizes == [size], "static: the size is a constant"


def doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0


def static_only(gm: torch.fx.GraphModule, inputs: list[object]) -> object:
    """A compiler that fails on a dynamic graph (as Dynamo, AOTAutograd or Inductor can fail
    for a dynamic trace only)."""
    for value in inputs:
        sizes = value.shape if isinstance(value, torch.Tensor) else (value,)
        if any(isinstance(size, torch.SymInt) for size in sizes):
            raise RuntimeError("a dynamic graph")
    return gm.forward


def test_a_frame_whose_compile_fails_holding_the_profile_compiles_again_without_it(
    loaded_profile: None,
) -> None:
    """Whatever fails in a frame's compile while the loaded profile made it dynamic, a
    machine without the profile compiles it static: compiled once more without the entry."""
    code_id = pgo.CodeId.make(scaled.__code__, None)
    learned = pgo.get_code_state()[code_id]
    for state in (pgo._CODE_STATE, pgo._INIT_CODE_STATE):
        state[pgo.CodeId.make(doubled.__code__, None)] = copy.deepcopy(learned)
    before = pgo_strict.counters["failed_compiles_retried_static"]
    x = torch.arange(8.0)
    assert torch.equal(torch.compile(doubled, backend=static_only)(x), doubled(x))
    assert pgo_strict.counters["failed_compiles_retried_static"] == before + 1


def test_a_compile_that_fails_without_a_loaded_entry_raises_its_own_error(
    loaded_profile: None,
) -> None:
    """No loaded entry for the frame: the error is torch's, raised once, never retried."""

    def failing(gm: torch.fx.GraphModule, inputs: list[object]) -> object:
        calls.append(gm)
        raise RuntimeError("the compiler's own error")

    calls: list[torch.fx.GraphModule] = []
    before = pgo_strict.counters["failed_compiles_retried_static"]
    with pytest.raises(Exception, match="the compiler's own error"):
        torch.compile(doubled, backend=failing)(torch.arange(8.0))
    assert len(calls) == 1
    assert pgo_strict.counters["failed_compiles_retried_static"] == before
