"""Install and uninstall (:mod:`objcache.integrations.install.hooks`): installing twice wraps
once, uninstall restores torch exactly, flags set by the environment or code are respected,
and the autotune bundler's hook never fails a compile."""

from __future__ import annotations

import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")


def _snapshot() -> dict[str, Any]:
    import torch._dynamo.config as dconf
    import torch._functorch.config as fconf
    import torch._inductor.config as iconf
    import torch.compiler.config as cconf
    from torch._inductor import cpp_builder, remote_cache
    from torch._inductor.runtime import autotune_cache

    snap: dict[str, Any] = {name: getattr(remote_cache, name) for name in ("RemoteFxGraphCache",
        "RemoteAOTAutogradCache", "RemoteAutotuneCache", "RemoteBundledAutotuneCache",
        "RemoteDynamoPGOCache")}  # fmt: skip
    for mod, attr in (
        (iconf, "fx_graph_remote_cache"),
        (iconf, "autotune_remote_cache"),
        (iconf, "bundled_autotune_remote_cache"),
        (fconf, "enable_remote_autograd_cache"),
        (dconf, "automatic_dynamic_remote_pgo"),
        (cconf, "job_id"),
    ):
        snap[f"{mod.__name__}.{attr}"] = mod._config[attr].user_override.get()
    snap["_read"] = autotune_cache.AutotuneCache._read
    snap["begin_compile"] = autotune_cache.AutotuneCacheBundler.__dict__["begin_compile"]
    snap["build"] = cpp_builder.CppBuilder.build
    snap["__init__"] = cpp_builder.CppBuilder.__init__
    snap["has_backend"] = hasattr(remote_cache, "ObjcacheBackend")
    from torch._dynamo import pgo, symbolic_convert

    snap["update_automatic_dynamic"] = pgo.update_automatic_dynamic
    snap["run"] = symbolic_convert.InstructionTranslator.run  # inherited: deleted back
    snap["run_own"] = "run" in vars(symbolic_convert.InstructionTranslator)
    return snap


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*(f[2] for f in _flags()), "TORCH_COMPILE_JOB_ID", "TORCH_COMPILE_STICKY_PGO_KEY"):
        monkeypatch.delenv(var, raising=False)


def _flags() -> tuple[tuple[str, str, str], ...]:
    from objcache.integrations.install import hooks

    return hooks.FLAGS


def test_install_is_idempotent_and_uninstall_restores_torch_exactly(
    clean_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch._inductor.config as iconf
    import torch.compiler.config as cconf
    from torch._inductor import remote_cache

    import objcache

    monkeypatch.setenv("OBJCACHE_JOB", "unit-job")
    monkeypatch.delenv("OBJCACHE_ENABLE", raising=False)
    monkeypatch.delenv("OBJCACHE_TIERS", raising=False)
    before = _snapshot()
    objcache.install()
    objcache.install()
    try:
        assert os.environ["OBJCACHE_ENABLE"] == "1"  # compile workers install it too
        assert objcache.integrations.torch.installed()  # type: ignore[attr-defined]
        for name, kind in (("RemoteFxGraphCache", "fx-graph"), ("RemoteDynamoPGOCache", "pgo")):
            cls = getattr(remote_cache, name)
            assert cls.objcache_kind == kind
            assert cls.__name__ == name  # torch's cache stats keep their names
            assert issubclass(cls, before[name])  # one level: installing twice wraps once
            assert cls.__mro__[1] is before[name]
        assert iconf.fx_graph_remote_cache is True
        assert iconf.bundled_autotune_remote_cache is True
        assert cconf.job_id == "unit-job"
        cache = remote_cache.create_cache("fx-graph-v1", False, "X", "RemoteFxGraphCache")
        assert cache is not None and type(cache).objcache_kind == "fx-graph"
        assert cache._get_key("fabc") == "pt2:fx-graph-v1::fabc:c1"
        now = _snapshot()  # the PGO part's hooks on torch's profile and on Dynamo's tracer
        assert now["run"] is not before["run"] and now["run"].__wrapped__ is before["run"]
        assert now["update_automatic_dynamic"].__wrapped__ is before["update_automatic_dynamic"]
    finally:
        objcache.uninstall()
    after = _snapshot()
    assert "OBJCACHE_ENABLE" not in os.environ
    assert after == before
    for key in ("RemoteFxGraphCache", "_read", "begin_compile", "build", "__init__", "run"):
        assert after[key] is before[key]
    assert not objcache.integrations.torch.installed()  # type: ignore[attr-defined]


def test_flags_set_by_env_or_code_are_respected(
    clean_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch._functorch.config as fconf
    import torch._inductor.config as iconf

    import objcache

    monkeypatch.setenv("TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE", "0")
    before = fconf._config["enable_remote_autograd_cache"].user_override.get()
    fconf.enable_remote_autograd_cache = False
    try:
        objcache.install()
        assert fconf.enable_remote_autograd_cache is False
        assert iconf.autotune_remote_cache is None  # env var present: not touched
        assert iconf.fx_graph_remote_cache is True
    finally:
        objcache.uninstall()
        fconf._config["enable_remote_autograd_cache"].user_override.set(before)


def test_bundled_autotune_is_skipped_where_torch_cannot_key_it() -> None:
    from torch._inductor.runtime.autotune_cache import AutotuneCacheBundler

    import objcache
    from objcache.integrations.install import hooks

    objcache.install()
    try:
        meta = {"bundled_autotune_remote_cache": True, "backend_hash": None}
        AutotuneCacheBundler.begin_compile(meta, code="x = 1")  # torch asserts here
        assert hooks.counters["bundled_autotune_skipped"] >= 1
    finally:
        objcache.uninstall()


def test_a_stale_open_bundle_never_fails_the_next_compile() -> None:
    """torch 2.11 (CUDA) left a bundle open after a Mega-Cache load: the next compile's
    ``begin_compile`` asserted. objcache drops the unsaved bundle and begins a new one."""
    from torch._inductor.runtime.autotune_cache import AutotuneCacheBundler

    import objcache
    from objcache.integrations.install import hooks

    objcache.install()
    stale = object()
    before = hooks.counters["bundled_autotune_stale_dropped"]
    try:
        AutotuneCacheBundler._bundler = stale  # type: ignore[assignment]
        meta = {"bundled_autotune_remote_cache": False, "backend_hash": "h"}
        AutotuneCacheBundler.begin_compile(meta, code="x = 1")
        assert AutotuneCacheBundler._bundler is not stale
        assert hooks.counters["bundled_autotune_stale_dropped"] == before + 1
    finally:
        AutotuneCacheBundler._bundler = None
        objcache.uninstall()
