"""What a precompile entry was compiled with: the wrapper's compiler and the compiler
settings, portable across processes (docs/torch.md, "Precompile entries: what a served entry
still checks")."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from objcache.integrations.torch.precompile import compile_settings as cs  # noqa: E402
from objcache.integrations.torch.precompile.unguarded import hash_order  # noqa: E402


def _identity(fn: Any, **kwargs: Any) -> str | None:
    """The identity of the context ``torch.compile(fn, **kwargs)`` builds (the same
    backend wrappers, through ``torch._dynamo.optimize``)."""
    import torch._dynamo.eval_frame as ef

    mode, options, dynamic = kwargs.get("mode"), kwargs.get("options"), kwargs.get("dynamic")
    backend = kwargs.get("backend", "inductor")
    wrapper = (
        torch._TorchCompileInductorWrapper(mode, options, dynamic)
        if backend == "inductor"
        else torch._TorchCompileWrapper(backend, mode, options, dynamic)
    )
    context = torch._dynamo.optimize(backend=wrapper, dynamic=dynamic)
    assert isinstance(context, ef._TorchDynamoContext)
    return cs.compiler_identity(context)


def my_backend(gm: Any, example_inputs: Any) -> Any:
    return gm.forward


def test_each_compiler_choice_is_its_own_identity() -> None:
    def f(x: Any) -> Any:
        return x + 1

    default = _identity(f)
    assert default is not None and default == _identity(f)
    others = [
        _identity(f, mode="max-autotune-no-cudagraphs"),
        _identity(f, options={"fallback_random": True}),
        _identity(f, dynamic=True),
        _identity(f, backend="eager"),
        _identity(f, backend="aot_eager"),
        _identity(f, backend=my_backend),
    ]
    assert None not in others
    assert len({default, *others}) == 1 + len(others)


class _CallableBackend:
    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        return gm.forward


def test_a_backend_is_named_by_what_it_does_or_has_no_identity() -> None:
    """A lambda backend is its code; an object with ``__call__`` has no portable name."""
    first = _identity(lambda x: x, backend=lambda gm, ex: gm.forward)
    other = _identity(lambda x: x, backend=lambda gm, ex: gm.forward if ex else None)
    assert first is not None and other is not None and first != other
    assert _identity(lambda x: x, backend=_CallableBackend()) is None


class _PassWithoutUuid:
    def __call__(self, graph: Any) -> None:
        return None


def test_the_settings_digest_follows_settings_that_change_code() -> None:
    import torch._inductor.config as inductor_config

    before = cs.settings_digest()
    assert before is not None
    with inductor_config.patch(fallback_random=not inductor_config.fallback_random):
        assert cs.settings_digest() not in (None, before)
    with inductor_config.patch(compile_threads=1):  # how, not what: torch's own cache key
        assert cs.settings_digest() == before
    with torch._dynamo.config.patch(caching_precompile=True):
        assert cs.settings_digest() == before
    with inductor_config.patch(post_grad_custom_post_pass=_PassWithoutUuid()):
        assert cs.settings_digest() is None  # a custom pass without uuid(): no entry


def test_the_settings_digest_is_the_same_in_another_process() -> None:
    """Another (random) hash seed, another compile thread count: the same digest (sets
    inside the configs are ordered by the seed; a fixed PYTHONHASHSEED is a setting of its
    own, below)."""
    code = (
        "from objcache.integrations.torch.precompile import compile_settings as cs\n"
        "print(cs.settings_digest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={
                **{k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"},
                "TORCHINDUCTOR_COMPILE_THREADS": threads,
            },
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for threads in ("1", "2")
    }
    assert len(digests) == 1 and "None" not in digests


def test_the_settings_digest_covers_what_dynamo_folds_without_a_guard(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """torch.distributed's backend, world size and rank (constant-folded while tracing), a
    fixed PYTHONHASHSEED, the attention backends turned off and the autocast dtype: another
    value on the reader is another digest, so a served frame's settings guard fails and
    Dynamo compiles it."""
    import torch.distributed as dist

    before = cs.settings_digest()
    monkeypatch.setattr(hash_order, "fixed_seed", lambda: "1")
    seeded = cs.settings_digest()
    assert seeded not in (None, before)
    monkeypatch.setattr(hash_order, "fixed_seed", lambda: "2")
    assert cs.settings_digest() not in (None, before, seeded)
    monkeypatch.undo()
    assert cs.settings_digest() == before
    monkeypatch.setattr(os, "cpu_count", lambda: 4096)  # C++ kernels' OpenMP regions fixed
    assert cs.settings_digest() not in (None, before)
    monkeypatch.undo()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "zvector")  # set after torch started: another ISA
    assert cs.settings_digest() not in (None, before)
    monkeypatch.undo()
    assert cs.settings_digest() == before
    tf32 = torch._C._get_cublas_allow_tf32()
    torch._C._set_cublas_allow_tf32(not tf32)
    try:
        assert cs.settings_digest() not in (None, before)
    finally:
        torch._C._set_cublas_allow_tf32(tf32)
    assert cs.settings_digest() == before
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):  # the attention kernel a graph lowers to
        assert cs.settings_digest() not in (None, before)
    autocast = torch.get_autocast_dtype("cpu")  # folded by get_autocast_dtype, autocast off
    torch.set_autocast_dtype("cpu", torch.float16)
    try:
        assert cs.settings_digest() not in (None, before)
    finally:
        torch.set_autocast_dtype("cpu", autocast)
    assert cs.settings_digest() == before
    if not dist.is_available():
        pytest.skip("torch without torch.distributed")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        one_rank = cs.settings_digest()
        assert "dist=gloo:1:0" in cs.process_facts()
        assert one_rank not in (None, before)
    finally:
        dist.destroy_process_group()
    assert cs.settings_digest() == before


@pytest.mark.filterwarnings("ignore:Warning only once for all operators")
def test_the_settings_digest_follows_the_programs_kernels_of_torchs_ops() -> None:
    """A Python kernel of one of torch's own ops (what a kernel-patching library registers)
    is traced by AOTAutograd with no guard: registered, it is another digest; its library
    removed, the digest is the one before (found again when torch's registry changes)."""
    before = cs.settings_digest()
    assert before is not None
    lib = torch.library.Library("aten", "IMPL")
    try:

        def linear(x: Any, w: Any, b: Any = None) -> Any:
            return torch.matmul(x, w.t()) * 0 + 7.0

        lib.impl("linear", linear, "CompositeImplicitAutograd")
        assert cs.settings_digest() not in (None, before)
    finally:
        lib._destroy()
    assert cs.settings_digest() == before


@pytest.mark.parametrize(
    "name",
    ["debug_backend_override", "debug_inductor_config_override", "debug_dynamo_config_override"],
)
def test_dynamos_debug_overrides_leave_no_settings_to_serve(name: str) -> None:
    """Dynamo's debug overrides (``TORCH_COMPILE_OVERRIDE_BACKENDS``...) choose another
    backend or settings by a graph's number in one process, and torch leaves them out of its
    config hash: while one is set there is no digest (nothing saved, nothing served)."""
    if not hasattr(torch._dynamo.config, name):
        pytest.skip(f"torch has no {name}")
    before = cs.settings_digest()
    assert before is not None and cs.debug_overrides() == ()
    with torch._dynamo.config.patch(**{name: ">=0:eager"}):
        assert cs.debug_overrides() == (name,)
        assert cs.settings_digest() is None
    assert cs.settings_digest() == before
