"""A cache hit whose kernels this machine's compiler refuses is torch's own miss: the graph
is compiled here (objcache/integrations/torch/remote/unbuildable_hits.py)."""

from __future__ import annotations

from typing import Any

import pytest
from torch._inductor.codecache import FxGraphCache
from torch._inductor.exc import CppCompileError
from torch._inductor.output_code import CompiledFxGraph

from objcache.integrations.torch.remote import unbuildable_hits
from objcache.integrations.torch.remote.remote_cache_classes import counters


class Refused(CompiledFxGraph):
    """A served graph whose kernel source needs a CPU feature this machine lacks."""

    raised: BaseException = CppCompileError(["g++"], "amxtileintrin.h:54: error: inlining failed")

    def after_deserialization(self, constants: Any) -> str:
        raise self.raised


@pytest.fixture
def refused() -> Any:
    unbuildable_hits.apply(Refused)
    graph = object.__new__(Refused)
    graph._triton_bundle = None
    graph.compiled_fn_runner = None  # what torch's __del__ reads
    yield graph
    unbuildable_hits.uninstall()
    Refused.raised = CppCompileError(["g++"], "amxtileintrin.h:54: error: inlining failed")


def test_a_hit_whose_kernels_do_not_build_here_is_torchs_miss(refused: Any) -> None:
    before = counters["unbuildable_hits"]
    info: dict[str, Any] = {}
    assert FxGraphCache.cache_hit_post_compile(refused, info, None) == (None, info)  # type: ignore[arg-type]
    assert counters["unbuildable_hits"] == before + 1


def test_any_other_error_is_left_as_torch_raises_it(refused: Any) -> None:
    Refused.raised = ValueError("not a build")
    with pytest.raises(ValueError, match="not a build"):
        FxGraphCache.cache_hit_post_compile(refused, {}, None)  # type: ignore[arg-type]


def test_uninstall_puts_torchs_method_back() -> None:
    original = Refused.__dict__["after_deserialization"]
    unbuildable_hits.apply(Refused)
    unbuildable_hits.apply(Refused)  # once only
    assert Refused.__dict__["after_deserialization"].__wrapped__ is original
    unbuildable_hits.uninstall()
    assert Refused.__dict__["after_deserialization"] is original
