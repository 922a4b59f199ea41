"""Facts about a graph's own values that torch's keys leave out (docs/torch.md, "What a
served entry depends on"): the 0-d frozen parameters Inductor writes into the code, and which
inputs share memory. Each keys the graph where present and is absent otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from objcache.integrations.torch.remote import custom_ops, graph_facts

torch = pytest.importorskip("torch")


class Details:
    def __init__(self, gm: Any, example_inputs: Any) -> None:
        self.gm = gm


def _field(gm: Any, inputs: Any) -> Any:
    init = custom_ops._wrap_details_init(Details.__init__)
    made = Details.__new__(Details)
    init(made, gm, inputs)
    return made.__dict__.get(custom_ops.FIELD)


def _frozen_graph(temperature: float) -> Any:
    import torch._inductor.freezing_utils  # what objcache reads it through

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.temperature = torch.nn.Parameter(torch.tensor(temperature))
            self.weight = torch.nn.Parameter(torch.ones(16))

        def forward(self, x: Any) -> Any:
            return x * self.weight / self.temperature

    gm = torch.fx.symbolic_trace(M())
    for value in (gm.temperature, gm.weight):
        value._is_frozen_param = True  # what freezing marks
    return gm


def test_a_frozen_scalar_inductor_inlines_is_named_by_its_value() -> None:
    """Another checkpoint's temperature is another key (torch names a 0-d frozen parameter by
    its shape alone); the 16-element weight stays a buffer the reader loads, unnamed."""
    x = torch.ones(16)
    one, two = _field(_frozen_graph(0.5), [x]), _field(_frozen_graph(0.75), [x])
    assert one == (("frozen_scalars", "temperature=0.5:torch.float32"),)
    assert two == (("frozen_scalars", "temperature=0.75:torch.float32"),)
    unfrozen = _frozen_graph(0.5)
    del unfrozen.temperature._is_frozen_param  # not frozen: torch keys it by value itself
    assert _field(unfrozen, [x]) is None


def test_inputs_sharing_memory_are_in_the_key() -> None:
    """Overlapping views (AOTAutograd compiles them to another graph), views of one storage
    apart, and separate tensors (torch's key alone) are three keys."""
    gm = torch.fx.symbolic_trace(lambda a, b: a * 2 + b)
    base = torch.randn(9)
    overlapping = _field(gm, [base[:8], base[1:]])
    apart = _field(gm, [base[:4], base[5:]])
    separate = _field(gm, [torch.randn(8), torch.randn(8)])
    assert overlapping == (("input_aliasing", "0~1"),)
    assert apart == (("input_aliasing", "0=1"),)
    assert separate is None
    same = torch.randn(4)
    assert graph_facts.input_aliasing([same, 1, same.t()]) == "0~2"


def test_how_einsum_contracts_keys_a_graph_that_calls_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.einsum`` asks ``torch.backends.opt_einsum`` for its contraction order while
    AOTAutograd traces (the eleventh review: a machine with the package installed, or with it
    turned off, was served the writer's order, off by an overflow in float16): the package,
    ``enabled`` and ``strategy`` key a graph that calls it; a graph that does not keeps
    torch's key."""
    import torch.backends.opt_einsum as opt_einsum

    gm = torch.fx.symbolic_trace(lambda a, b, c: torch.einsum("ab,bc,cd->ad", a, b, c))
    inputs = [torch.randn(2, 2)] * 3
    here = _field(gm, inputs)
    assert here is not None and here[-1][0] == "einsum_paths"
    installed = type("opt_einsum", (), {"__version__": "3.4.0"})
    monkeypatch.setattr(opt_einsum, "get_opt_einsum", lambda: installed)
    with_package = _field(gm, inputs)
    assert with_package is not None and "package=3.4.0" in with_package[-1][1]
    assert with_package != here
    monkeypatch.setattr(opt_einsum, "enabled", not opt_einsum.enabled)
    assert _field(gm, inputs) not in (here, with_package)
    assert _field(torch.fx.symbolic_trace(lambda a: a.sin()), inputs[:1]) is None
    # in a subgraph (a checkpointed block's, the same review): read there too
    outer = torch.fx.symbolic_trace(lambda a: a.sin())
    outer.add_submodule("checkpointed", gm)
    assert _field(outer, inputs[:1]) == (_field(gm, inputs)[-1],)


def _two_linear_weights(tied: bool, scale: float = 1.0) -> Any:
    """A graph reading two frozen 4x4 weights: two parameters of one storage (tied, as a
    checkpoint loaded with ``assign=True`` leaves them) or of two."""
    import torch._inductor.freezing_utils  # what objcache reads it through

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Parameter(torch.full((4, 4), scale))
            b = self.a.data if tied else torch.full((4, 4), scale)
            self.b = torch.nn.Parameter(b)

        def forward(self, x: Any) -> Any:
            return x @ self.a + x @ self.b

    gm = torch.fx.symbolic_trace(M())
    for name in ("a", "b"):
        getattr(gm, name)._is_frozen_param = True
    return gm


def test_frozen_parameters_sharing_memory_are_in_the_key() -> None:
    """Inductor merges frozen constants that share a storage after the key is read (the
    twenty-seventh review: a tied writer served one constant for both to an untied machine,
    off by 3.97): tied and untied are two keys; no frozen parameter shares, torch's key."""
    x = torch.ones(4, 4)
    assert _field(_two_linear_weights(True), [x]) == (("frozen_sharing", "a~b"),)
    assert _field(_two_linear_weights(False), [x]) is None


def test_frozen_weights_a_cpp_gemm_template_packs_are_named_by_their_bytes() -> None:
    """With freezing and a C++ GEMM template among max-autotune's choices, the template packs a
    frozen weight into a constant stored with the entry (the same review: another checkpoint
    was served the writer's weights, off by 68.6): the frozen parameters' bytes key the graph
    there, and only there."""
    import torch._inductor.config as inductor_config

    x = torch.ones(4, 4)

    def values(scale: float) -> str:
        field = dict(_field(_two_linear_weights(False, scale), [x]) or ())
        return str(field.get("frozen_values", ""))

    with inductor_config.patch(freezing=True):
        assert values(1.0) == ""  # no template: torch's key
    template = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}
    with inductor_config.patch(freezing=True, **template):
        assert values(1.0) and values(1.0) == values(1.0)
        assert values(2.0) != values(1.0)
    with inductor_config.patch(freezing=True, max_autotune=True, max_autotune_gemm_backends="ATEN"):
        assert values(2.0) == "" == values(1.0)
    with inductor_config.patch(freezing=False, **template):
        assert values(2.0) == "" == values(1.0)


def test_a_frozen_tensor_subclass_makes_the_key_unreadable_not_a_crash() -> None:
    """A wrapper subclass has no memory of its own (``data_ptr() == 0``): its bytes are never
    read in place (that crashed the process); the key is the unreadable one, a miss."""
    import torch._inductor.config as inductor_config
    import torch._inductor.freezing_utils  # what objcache reads it through

    class Wrapper(torch.Tensor):
        @staticmethod
        def __new__(cls, inner: Any) -> Any:
            return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        @classmethod
        def __torch_dispatch__(
            cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            unwrap = [a.inner if isinstance(a, Wrapper) else a for a in args]
            out = func(*unwrap, **(kwargs or {}))
            return Wrapper(out) if isinstance(out, torch.Tensor) else out

    root = torch.nn.Module()
    root.w = Wrapper(torch.randn(8, 8))
    root.w._is_frozen_param = True
    graph = torch.fx.Graph()
    graph.output(graph.get_attr("w"))
    gm = torch.fx.GraphModule(root, graph)
    with pytest.raises(ValueError):
        graph_facts.frozen_values(graph_facts.frozen_params(gm))
    with inductor_config.patch(
        freezing=True, max_autotune=True, max_autotune_gemm_backends="CPP,ATEN"
    ):
        field = _field(gm, [])
    assert field is not None and field[0][0] == "<unreadable>"


def test_a_fixed_openmp_thread_count_is_in_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor writes ``#pragma omp parallel`` where the thread count it generates C++
    kernels for equals ``os.cpu_count()`` and ``num_threads(N)`` where it does not: torch's
    own key details (their real class) name the count, objcache which of the two regions."""
    import os

    from torch._inductor.codecache import FxGraphHashDetails

    gm = torch.fx.symbolic_trace(lambda x: (x * 2).sin().sum())
    inputs = [torch.randn(64)]

    def field() -> dict[str, str]:
        init = custom_ops._wrap_details_init(FxGraphHashDetails.__init__)
        made = FxGraphHashDetails.__new__(FxGraphHashDetails)
        init(made, gm, inputs, {}, [])
        assert made.__dict__.get("cpp_runtime_thread_count") == torch.get_num_threads()
        return dict(made.__dict__.get(custom_ops.FIELD) or ())

    threads = torch.get_num_threads()
    monkeypatch.setattr(os, "cpu_count", lambda: threads)  # a machine without hyperthreads
    assert "cpp_threads" not in field()
    monkeypatch.setattr(os, "cpu_count", lambda: threads * 2)  # one with: its cores' threads
    assert field()["cpp_threads"] == "fixed"


def test_the_vector_isa_the_program_asked_for_is_in_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inductor reads ``ATEN_CPU_CAPABILITY`` at each compile; the environment's namespace
    names ATen's level, fixed as torch started: a program that sets the variable after
    ``import torch`` gets AVX2 or scalar kernels, and their keys say so; the level torch
    started at adds nothing."""
    gm = torch.fx.symbolic_trace(lambda x: (x * 1.5).sin().sum())
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert "aten_cpu_capability" not in dict(_field(gm, [torch.randn(8)]) or ())
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "zvector")  # no x86 ATen runs at that level
    assert dict(_field(gm, [torch.randn(8)]) or ())["aten_cpu_capability"] == "zvector"
    level = torch.backends.cpu.get_cpu_capability().lower()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", level)  # what the environment already names
    assert "aten_cpu_capability" not in dict(_field(gm, [torch.randn(8)]) or ())
