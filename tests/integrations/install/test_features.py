"""Every torch release: parts of the integration switched on by feature, not by version.

A torch whose internals moved is simulated by removing one hooked attribute: that part stays
off (one log line, torch's own flag of that part untouched), the others stay on, a compile
is still correct, and ``objcache doctor`` names the missing hook.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from objcache.integrations.install import features
from tests.support.paths import ROOT

torch = pytest.importorskip("torch")


def test_every_part_is_on_with_the_torch_ci_runs() -> None:
    states = {s.part: s for s in features.report(environ={})}
    assert list(states) == [
        "FX",
        "AOTAutograd",
        "PGO",
        "autotune",
        "bundled autotune",
        "kernels",
        "Mega-Cache",
        "precompile",
        "guarded candidates",
        "key cards",
        "vLLM model info",
        "vLLM AOT artifact",
        "Triton host modules",
        "Triton",
    ]
    # Triton is a dependency of the CI runs: its host modules are carried by default
    assert states["Triton host modules"].active, states["Triton host modules"].why
    off = {s.part: s for s in features.report(environ={"OBJCACHE_TRITON_HOST": "0"})}
    assert off["Triton host modules"].why == "OBJCACHE_TRITON_HOST=0"
    for part in features.TORCH_PARTS:
        if part != "precompile":
            assert states[part].active, f"{part}: {states[part].why}"
    # off by default on every release, and doctor says why; on with OBJCACHE_PRECOMPILE=1
    # wherever torch has the hooks
    from objcache.integrations.torch.precompile import precompile

    assert not states["precompile"].active
    assert states["precompile"].why == precompile.OFF_BY_DEFAULT
    assert states["precompile"].why.startswith("opt-in: OBJCACHE_PRECOMPILE=1 turns it on")
    opted = {s.part: s for s in features.report(environ={"OBJCACHE_PRECOMPILE": "1"})}
    assert opted["precompile"].active, opted["precompile"].why
    # vLLM is not a dependency: its part says so in one line (docs/vllm.md)
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        assert states["vLLM model info"].why == "vllm is not installed"
        assert states["vLLM AOT artifact"].why == "vllm is not installed"


def test_precompile_is_off_by_default_on_every_release_and_one_turns_it_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No torch release has precompile entries on unless OBJCACHE_PRECOMPILE=1 asks for them:
    an entry is only as safe as the facts it is checked against (docs/torch.md)."""
    import torch

    from objcache.integrations.torch.precompile import precompile

    for release in ("2.13.0", "2.14.1", "2.15.0", "9.9.9"):
        monkeypatch.setattr(torch, "__version__", release)
        assert not precompile.wanted({}), release
        assert not precompile.wanted({"OBJCACHE_PRECOMPILE": ""}), release
        assert not precompile.wanted({"OBJCACHE_PRECOMPILE": "0"}), release
        assert precompile.wanted({"OBJCACHE_PRECOMPILE": "1"}), release
        assert precompile.wanted({"OBJCACHE_PRECOMPILE": "yes"}), release
        states = {s.part: s for s in features.report(environ={})}
        assert not states["precompile"].active, release
    off = {s.part: s for s in features.report(environ={"OBJCACHE_PRECOMPILE": "0"})}
    assert off["precompile"].why == "OBJCACHE_PRECOMPILE=0"


def test_doctor_says_why_a_part_is_switched_off_by_the_environment() -> None:
    states = {s.part: s for s in features.report(environ={"OBJCACHE_GUARDED_CANDIDATES": "0"})}
    assert not states["guarded candidates"].active
    assert states["guarded candidates"].why == "OBJCACHE_GUARDED_CANDIDATES=0"


# --- a hooked attribute that moved --------------------------------------------------------


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    from objcache.client import reset_client
    from objcache.integrations.install import hooks

    for var in (*(f[2] for f in hooks.FLAGS), "OBJCACHE_ENABLE", "OBJCACHE_TIERS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OBJCACHE_LOCAL_DIR", str(tmp_path / "local"))
    monkeypatch.setenv("OBJCACHE_PREFETCH", "0")
    features._logged.clear()
    reset_client()
    yield
    hooks.uninstall()
    features._logged.clear()
    reset_client()


def _flag(module: Any, attr: str) -> Any:
    return module._config[attr].user_override.get()


def _remove(monkeypatch: pytest.MonkeyPatch, hook: str) -> None:
    """Remove one hooked attribute (``module:Class.attr`` or ``module:flag``), like a torch
    release that moved it."""
    import importlib

    mod_name, attr = hook.split(":")
    owner: Any = importlib.import_module(mod_name)
    *path, last = attr.split(".")
    for name in path:
        owner = getattr(owner, name)
    if isinstance(getattr(owner, "_config", None), dict) and last in owner._config:
        monkeypatch.delitem(owner._config, last)
    else:
        monkeypatch.delattr(owner, last)


@pytest.mark.parametrize(
    ("hook", "part"),
    [
        ("torch._inductor.remote_cache:RemoteDynamoPGOCache", "PGO"),
        ("torch._inductor.runtime.autotune_cache:AutotuneCache._read", "autotune"),
        ("torch._inductor.config:fx_graph_remote_cache", "FX"),
        ("torch._inductor.cpp_builder:CppBuilder.build", "kernels"),
        ("torch._inductor.codecache:FxGraphCache._write_to_local_cache", "FX"),
    ],
)
def test_a_moved_hook_keeps_its_part_off_and_the_others_on(
    clean: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    hook: str,
    part: str,
) -> None:
    import torch._dynamo.config as dconf
    import torch._inductor.config as iconf
    from torch._inductor import cpp_builder, remote_cache
    from torch._inductor.runtime import autotune_cache

    import objcache

    _remove(monkeypatch, hook)
    before_flags = {
        "FX": None if "fx_graph_remote_cache" in hook else _flag(iconf, "fx_graph_remote_cache"),
        "PGO": _flag(dconf, "automatic_dynamic_remote_pgo"),
        "autotune": _flag(iconf, "autotune_remote_cache"),
    }
    before_init = cpp_builder.CppBuilder.__init__
    with caplog.at_level(logging.WARNING, logger="objcache.torch"):
        objcache.install()
        objcache.install()
    name = hook.replace(":", ".")
    off_lines = [r.getMessage() for r in caplog.records if "stays off" in r.getMessage()]
    assert off_lines == [f"objcache: torch part {part} stays off: missing {name}"]

    swapped = {
        p: bool(getattr(getattr(remote_cache, cls, None), "objcache_kind", None))
        for cls, p in (
            ("RemoteFxGraphCache", "FX"),
            ("RemoteDynamoPGOCache", "PGO"),
            ("RemoteAutotuneCache", "autotune"),
            ("RemoteAOTAutogradCache", "AOTAutograd"),
        )
    }
    for p, on in swapped.items():
        assert on == (p != part), p
    # torch's own remote-cache flag of the part that is off is left as it was
    if part == "PGO":
        assert _flag(dconf, "automatic_dynamic_remote_pgo") == before_flags["PGO"]
        assert iconf.fx_graph_remote_cache is True
    if part == "autotune":
        assert _flag(iconf, "autotune_remote_cache") == before_flags["autotune"]
        assert not hasattr(autotune_cache.AutotuneCache, "_read")  # nothing put in its place
        assert dconf.automatic_dynamic_remote_pgo is True
    if part == "kernels":
        assert cpp_builder.CppBuilder.__init__ is before_init  # no kernel hook at all
        assert iconf.fx_graph_remote_cache is True
    if part == "FX" and "fx_graph_remote_cache" not in hook:
        assert _flag(iconf, "fx_graph_remote_cache") == before_flags["FX"]
    if part != "kernels":
        assert getattr(cpp_builder.CppBuilder.build, "__objcache__", False)

    states = {s.part: s for s in features.report(environ={"OBJCACHE_PRECOMPILE": "1"})}
    assert not states[part].active and name in states[part].why
    assert [p for p in features.TORCH_PARTS if not states[p].active] == [part]


def test_a_flag_waits_for_the_class_swap_and_stays_off_when_its_part_is_off(
    clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The zero-code path meets torch's config modules before the module holding the cache
    classes: their flags wait for the swap, and a part whose class is missing never gets
    its flag (docs/security.md: no flag without objcache's class behind it)."""
    import torch._dynamo.config as dconf
    from torch._inductor import remote_cache

    from objcache.integrations.install import hooks

    before = _flag(dconf, "automatic_dynamic_remote_pgo")
    monkeypatch.delitem(sys.modules, "torch._inductor.remote_cache")  # not imported yet
    hooks.apply_part("torch._dynamo.config", dconf)
    assert _flag(dconf, "automatic_dynamic_remote_pgo") == before, "waiting for the swap"

    monkeypatch.setitem(sys.modules, "torch._inductor.remote_cache", remote_cache)
    monkeypatch.delattr(remote_cache, "RemoteDynamoPGOCache")
    hooks.apply_part("torch._inductor.remote_cache", remote_cache)
    assert _flag(dconf, "automatic_dynamic_remote_pgo") == before
    assert remote_cache.RemoteFxGraphCache.objcache_kind == "fx-graph"


def test_a_module_still_being_imported_is_not_taken_for_a_moved_hook(
    clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The zero-code path applies parts while torch is half-way through importing other
    hooked modules (``codecache`` imports ``cpp_builder``): their hooks are unknown yet."""
    import types
    from importlib.machinery import ModuleSpec

    half = types.ModuleType("torch._inductor.codecache")
    half.__spec__ = ModuleSpec("torch._inductor.codecache", None)
    half.__spec__._initializing = True  # what importlib sets while the body runs
    monkeypatch.setitem(sys.modules, "torch._inductor.codecache", half)
    monkeypatch.setattr(features, "_executed", set())
    assert features.missing("FX") == []
    assert features.missing("guarded candidates") == []
    features.executed("torch._inductor.codecache")  # its body ran: now it is checked
    assert "torch._inductor.codecache.FxGraphCache._write_to_local_cache" in (
        features.missing("FX")
    )


# --- a whole process: a tiny compile, and the doctor ---------------------------------------

_COMPILE = textwrap.dedent(
    """
    import json, logging, sys
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    import torch
    from torch._inductor import remote_cache
    del remote_cache.RemoteDynamoPGOCache  # a torch whose PGO cache class moved
    import objcache
    from objcache.integrations.torch import stats

    objcache.install()
    import torch._dynamo.config as dconf

    def f(x):
        return torch.nn.functional.gelu(x) * 2 + x.sum()

    x = torch.randn(8, 16)
    out = torch.compile(f)(x)
    objcache.get_client().flush()
    print(json.dumps({
        "match": bool(torch.allclose(out, f(x), atol=1e-5)),
        "pgo_flag": dconf.automatic_dynamic_remote_pgo,
        "hooks": stats()["hooks"],
    }))
    """
)


@pytest.mark.compile
def test_a_compile_with_a_moved_hook_is_correct_and_the_other_parts_work(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OBJCACHE_TIERS": f"file://{tmp_path / 'store'}",
        "OBJCACHE_LOCAL_DIR": str(tmp_path / "local"),
        "OBJCACHE_PREFETCH": "0",
        "OBJCACHE_JOB": "moved-hook",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }
    env.pop("TORCH_DYNAMO_AUTOMATIC_DYNAMIC_REMOTE_PGO", None)
    env["OBJCACHE_ENABLE"] = "0"  # no .pth install at `import torch`: the attribute goes first
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["match"] is True
    assert result["pgo_flag"] is not True  # torch never asked for the class that is gone
    puts = {k: n for k, n in result["hooks"].items() if k.startswith("puts:")}
    assert puts and "puts:pgo" not in puts, result["hooks"]  # the other parts still store
    assert not any(k.startswith("errors:") for k in result["hooks"]), result["hooks"]
    off = [line for line in proc.stderr.splitlines() if "stays off" in line]
    assert off == [
        "objcache: torch part PGO stays off: missing "
        "torch._inductor.remote_cache.RemoteDynamoPGOCache"
    ]


_DOCTOR = textwrap.dedent(
    """
    import sys
    from torch._inductor.runtime import autotune_cache
    del autotune_cache.AutotuneCacheBundler.begin_compile
    from objcache.cli.main import main
    sys.argv = ["objcache", "doctor"]
    main()
    """
)


def test_doctor_names_the_missing_hook(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OBJCACHE_TIERS": f"file://{tmp_path / 'store'}",
        "OBJCACHE_LOCAL_DIR": str(tmp_path / "local"),
        "COLUMNS": "200",
    }
    proc = subprocess.run(
        [sys.executable, "-c", _DOCTOR], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    active = next(line for line in lines if line.startswith("torch parts active: "))
    assert "FX, AOTAutograd, PGO, autotune, kernels" in active
    assert "bundled autotune" not in active
    assert (
        "torch part off: bundled autotune: missing "
        "torch._inductor.runtime.autotune_cache.AutotuneCacheBundler.begin_compile"
    ) in lines
