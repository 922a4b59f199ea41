"""The torch integration without compiling a model: serde, install/uninstall, the cache classes
and write-through against a real file:// store, the kernel layer on tiny g++ builds, bundles,
and the zero-code gate."""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from objcache.integrations.torch import autoload, serde
from tests.support import torch_runs
from tests.support.isa import other_isa

torch = pytest.importorskip("torch")


# --- serde ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fx-graph", "aot-autograd"])
def test_graph_envelope_is_stored_as_raw_pickle(kind: str) -> None:
    raw = pickle.dumps({"graph": list(range(100))})
    value = {"data": base64.b64encode(raw).decode("ascii"), "time_taken_ms": 1234}
    stored = serde.pack(kind, value)
    assert stored == raw
    back, raw_back = serde.unpack(kind, stored)
    assert raw_back == raw
    assert back == {"data": value["data"], "time_taken_ms": 0}
    assert isinstance(back["data"], str)


def test_pgo_envelope_has_only_data() -> None:
    raw = pickle.dumps({"state": 1})
    stored = serde.pack("pgo", {"data": base64.b64encode(raw).decode("ascii")})
    assert stored == raw
    value, _ = serde.unpack("pgo", stored)
    assert set(value) == {"data"} and isinstance(value["data"], str)


def test_autotune_values_are_compact_json() -> None:
    best = {"XBLOCK": 128, "num_warps": 4, "num_stages": 1, "configs_hash": "abc"}
    stored = serde.pack("autotune", best)
    assert stored == b'{"XBLOCK":128,"num_warps":4,"num_stages":1,"configs_hash":"abc"}'
    assert serde.unpack("autotune", stored) == (best, None)
    bundle = {"c1.best_config": best}
    assert serde.unpack("bundled-autotune", serde.pack("bundled-autotune", bundle))[0] == bundle


def test_unexpected_envelopes_round_trip_unchanged() -> None:
    odd = {"data": base64.b64encode(pickle.dumps(1)).decode(), "extra": [1, 2]}
    assert serde.unpack("fx-graph", serde.pack("fx-graph", odd))[0] == odd
    not_b64 = {"data": "%%%", "time_taken_ms": 1}
    assert serde.unpack("fx-graph", serde.pack("fx-graph", not_b64))[0] == not_b64
    with pytest.raises(serde.SerdeError):
        serde.unpack("fx-graph", b"\x01garbage")


# --- install / uninstall ----------------------------------------------------------------------


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
    return snap


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*(f[2] for f in _flags()), "TORCH_COMPILE_JOB_ID", "TORCH_COMPILE_STICKY_PGO_KEY"):
        monkeypatch.delenv(var, raising=False)


def _flags() -> tuple[tuple[str, str, str], ...]:
    from objcache.integrations.torch import hooks

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
    finally:
        objcache.uninstall()
    after = _snapshot()
    assert "OBJCACHE_ENABLE" not in os.environ
    assert after == before
    for key in ("RemoteFxGraphCache", "_read", "begin_compile", "build", "__init__"):
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
    from objcache.integrations.torch import hooks

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
    from objcache.integrations.torch import hooks

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


def test_a_config_entry_holding_its_override_as_a_value_is_set_and_restored() -> None:
    """torch < 2.13 keeps a config override as the value itself (a bare sentinel object
    when unset), not a holder with get/set: install() set its flags through it (it failed
    and left every torch part off on 2.11) and uninstall() puts the attribute back."""
    from types import SimpleNamespace

    from objcache.integrations.torch import patch_ledger

    module = SimpleNamespace(
        __name__="fake_config", flag=None, _config={"flag": SimpleNamespace(user_override=object())}
    )
    saved_before = dict(patch_ledger.saved)
    patch_ledger.set_config(module, "flag", True)
    try:
        assert module.flag is True
        assert patch_ledger.saved[("fake_config", "flag")] is None
    finally:
        patch_ledger.saved.clear()
        patch_ledger.saved.update(saved_before)


# --- the cache classes against a real store -------------------------------------------------


@pytest.fixture
def installed_file_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A file:// store, a fresh objcache local dir and TORCHINDUCTOR_CACHE_DIR; installed."""
    import objcache
    from objcache.client import reset_client

    monkeypatch.setenv("OBJCACHE_TIERS", f"file://{tmp_path / 'store'}")
    monkeypatch.setenv("OBJCACHE_LOCAL_DIR", str(tmp_path / "local"))
    monkeypatch.setenv("OBJCACHE_PREFETCH", "0")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.delenv("OBJCACHE_SIGNING_KEY", raising=False)
    reset_client()
    objcache.install()
    yield tmp_path
    objcache.uninstall()
    reset_client()


def _new_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Path:
    """Forget everything local: a fresh objcache local dir and Inductor dir, same store."""
    from objcache.client import get_client, reset_client

    get_client().flush()
    reset_client()
    monkeypatch.setenv("OBJCACHE_LOCAL_DIR", str(tmp_path / f"local-{name}"))
    inductor = tmp_path / f"inductor-{name}"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    return inductor


def _cache(name: str, cache_id: str) -> Any:
    from torch._inductor import remote_cache

    cache = remote_cache.create_cache(cache_id, False, "Fb" + name, name)
    assert cache is not None
    return cache


def test_graph_entries_are_raw_in_the_store_and_written_through_on_a_hit(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objcache.client import get_client, reset_client
    from objcache.integrations.torch import writethrough

    # torch's single-value path; guarded candidates: tests/integrations/torch/test_candidates.py
    monkeypatch.setenv("OBJCACHE_GUARDED_CANDIDATES", "0")
    reset_client()
    raw = pickle.dumps({"compiled": "graph"})
    envelope = {"data": base64.b64encode(raw).decode("ascii"), "time_taken_ms": 7}
    _cache("RemoteFxGraphCache", "fx-graph-v1").put("fkey123", envelope)
    _cache("RemoteAOTAutogradCache", "autograd-experimental").put("akey456", envelope)
    pgo_raw = pickle.dumps({"code": "state"})
    pgo_value = {"data": base64.b64encode(pgo_raw).decode("ascii")}
    _cache("RemoteDynamoPGOCache", "dynamo-pgo").put("job:None:", pgo_value)
    assert get_client().get("fx-graph", "pt2:fx-graph-v1::fkey123:c1") == raw

    inductor = _new_machine(installed_file_store, monkeypatch, "b")
    before = dict(writethrough.counters)
    got = _cache("RemoteFxGraphCache", "fx-graph-v1").get("fkey123")
    assert got == {"data": envelope["data"], "time_taken_ms": 0}
    assert _cache("RemoteAOTAutogradCache", "autograd-experimental").get("akey456")["data"]
    assert _cache("RemoteDynamoPGOCache", "dynamo-pgo").get("job:None:") == pgo_value
    assert get_client().stats()["cache"]["hits"] == {"fx-graph": 1, "aot-autograd": 1, "pgo": 1}
    # torch's own layout, via torch's own writers
    fx_dir = inductor / "fxgraph" / "ke" / "fkey123"
    assert [p.read_bytes() for p in fx_dir.iterdir()] == [raw]
    assert [p.read_bytes() for p in (inductor / "aotautograd" / "akey456").iterdir()] == [raw]
    assert (inductor / "dynamo" / "code_state_job_None_.pkl").read_bytes() == pgo_raw
    for kind in ("fx-graph", "aot-autograd", "pgo"):
        key = f"writethrough:{kind}"
        assert writethrough.counters[key] == before.get(key, 0) + 1


def test_autotune_hit_lands_in_the_local_autotune_cache(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    meta = {"autotune_remote_cache": True, "autotune_local_cache": True, "backend_hash": "bh"}
    best = {"XBLOCK": 64, "num_warps": 4, "num_stages": 1, "configs_hash": "ch"}

    def create(inductor: Path) -> Any:
        kernel = inductor / "ab" / "cabcdef.py"
        kernel.parent.mkdir(parents=True, exist_ok=True)
        cache = AutotuneCache.create(meta, str(kernel), "ch")
        assert cache is not None and cache.remote_cache is not None
        return cache

    first = create(installed_file_store / "inductor")
    first.remote_cache[0].put(first.remote_cache[1], best)
    inductor = _new_machine(installed_file_store, monkeypatch, "b")
    second = create(inductor)
    local_path = Path(second.local_cache[1])
    assert not local_path.exists()
    assert second._read() == best
    assert json.loads(local_path.read_text()) == best


def test_hooks_never_raise_into_torch(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import objcache
    from objcache.integrations.torch import hooks

    def broken() -> Any:
        raise RuntimeError("client exploded")

    monkeypatch.setattr(objcache, "get_client", broken)
    cache = _cache("RemoteAOTAutogradCache", "autograd-experimental")
    cache.put("k", {"data": base64.b64encode(pickle.dumps(1)).decode(), "time_taken_ms": 1})
    assert cache.get("k") is None
    assert cache.backend.get("pt2:x") is None
    cache.backend.put("pt2:x", b"{}")
    assert hooks.counters["errors:put (aot-autograd)"] >= 1
    assert hooks.counters["errors:get (aot-autograd)"] >= 1


# --- kernels -----------------------------------------------------------------------------------


@given(
    st.lists(
        st.text(alphabet=st.sampled_from(list("ab-=/. \t\n\r\x0b\"'\\")), max_size=12),
        max_size=6,
    ).map(" ".join)
)
def test_a_compile_command_splits_as_shlex_splits_it(command: str) -> None:
    """The kernel key's tokens: shlex's, with its tokenizer skipped where nothing is quoted."""
    import shlex

    from objcache.integrations.torch.kernels import split_command

    try:
        expected = shlex.split(command)
    except ValueError:  # an unclosed quote: shlex refuses, and so does the key
        with pytest.raises(ValueError):
            split_command(command)
        return
    assert split_command(command) == expected


def _builder(src: Path, out_dir: Path | None, **options: Any) -> Any:
    from torch._inductor.cpp_builder import CppBuilder, CppOptions

    header = options.pop("precompiled_header", None)
    opts = CppOptions(**options)
    opts.precompiled_header = header
    if out_dir is None:  # how _precompile_header names its builder: the header's full path
        return CppBuilder(str(src), str(src), opts)
    return CppBuilder(src.stem, [str(src)], opts, str(out_dir))


def test_kernel_keys_follow_content_and_flags_not_paths(tmp_path: Path) -> None:
    from objcache.integrations.torch import kernels

    code = 'extern "C" int answer() { return 42; }\n'
    a, b = tmp_path / "a" / "k1.cpp", tmp_path / "b" / "zz" / "k2.cpp"
    for path in (a, b):
        path.parent.mkdir(parents=True)
        path.write_text(code)
    pa, pb = kernels.plan(_builder(a, a.parent)), kernels.plan(_builder(b, b.parent))
    assert pa is not None and pb is not None
    assert pa.key == pb.key  # same source and flags in other dirs: same entry
    assert pa.target.endswith(".so") and pa.key.endswith(".so")
    assert kernels.plan(_builder(a, a.parent, compile_only=True)).key != pa.key  # type: ignore[union-attr]
    b.write_text(code.replace("42", "43"))
    assert kernels.plan(_builder(b, b.parent)).key != pa.key  # type: ignore[union-attr]
    assert kernels.plan(_builder(a, a.parent, preprocessing=True)) is None


def test_a_fetched_kernel_is_never_written_through_a_link_in_torchs_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below torch's cache directory a kernel is placed only through folders of this user's
    that nobody else can write (docs/security.md, "Files objcache places outside a store")."""
    from objcache.errors import UnsafeFolder
    from objcache.integrations.torch import kernels

    cache, elsewhere = tmp_path / "inductor", tmp_path / "elsewhere"
    cache.mkdir(mode=0o700)
    elsewhere.mkdir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    (cache / "ab").symlink_to(elsewhere)
    with pytest.raises(UnsafeFolder):
        kernels._atomic_write(str(cache / "ab" / "cab.so"), b"\x7fELF")
    assert list(elsewhere.iterdir()) == []
    (cache / "cd").mkdir(mode=0o777)
    (cache / "cd").chmod(0o777)
    with pytest.raises(UnsafeFolder):
        kernels._atomic_write(str(cache / "cd" / "ccd.so"), b"\x7fELF")
    kernels._atomic_write(str(cache / "ef" / "cef.so"), b"\x7fELF")
    assert (cache / "ef" / "cef.so").read_bytes() == b"\x7fELF"
    assert (cache / "ef" / "cef.so").stat().st_mode & 0o777 == 0o755


def test_kernels_are_fetched_instead_of_built_and_headers_wait_until_needed(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objcache.integrations.torch import kernels

    header = installed_file_store / "pch" / "prefix.h"
    header.parent.mkdir()
    header.write_text("#include <vector>\n")
    src = installed_file_store / "src" / "k.cpp"
    src.parent.mkdir()
    src.write_text('#include <vector>\nextern "C" int n() { return std::vector<int>(3).size(); }\n')

    def counted() -> dict[str, int]:
        return kernels.counters()

    start = counted()
    pch = _builder(header, None, precompiling=True)
    pch.build()  # deferred: no kernel needs it yet
    gch = Path(pch.get_target_file_path())
    assert not gch.exists()
    kernel = _builder(src, installed_file_store / "out-a", precompiled_header=str(header))
    kernel.build()  # a miss: the header is built first, then the kernel
    assert gch.exists() and Path(kernel.get_target_file_path()).exists()
    kernels.wait_stored(60)
    after_cold = counted()
    assert after_cold.get("pch_built", 0) == start.get("pch_built", 0) + 1
    assert after_cold.get("builds", 0) == start.get("builds", 0) + 2

    _new_machine(installed_file_store, monkeypatch, "b")
    gch.unlink()
    pch.build()
    again = _builder(src, installed_file_store / "out-b", precompiled_header=str(header))
    again.build()
    fetched = Path(again.get_target_file_path())
    assert fetched.read_bytes() == Path(kernel.get_target_file_path()).read_bytes()
    assert os.access(fetched, os.X_OK)
    assert not gch.exists()  # never needed: every kernel came from the cache
    after_warm = counted()
    assert after_warm.get("builds", 0) == after_cold.get("builds", 0)
    assert after_warm.get("fetched", 0) == after_cold.get("fetched", 0) + 1


def test_a_fetched_isa_probe_skips_the_dlopen_child_only_if_its_probe_passed_where_built(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch dlopens every ISA probe library in a child Python unless it has seen that
    library load (2.14+: a ``.load_ok`` marker beside it). A probe objcache brings to a new
    machine carries the verdict torch reached where it was built; no verdict, the child runs."""
    from torch._inductor import cpu_vec_isa

    from objcache.integrations.torch import kernels

    isa = cpu_vec_isa.pick_vec_isa()
    if not isa or not hasattr(cpu_vec_isa.VecISA, "_probe_load"):
        pytest.skip("no vector ISA probe on this machine or torch")
    children: list[str] = []
    fail_children = False
    real_run = subprocess.run

    def run(cmd: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(cmd, list) and any("LoadLibrary" in str(c) for c in cmd):
            children.append(str(cmd[-1]))
            if fail_children:
                raise subprocess.CalledProcessError(1, cmd)
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(cpu_vec_isa.subprocess, "run", run)
    passes = 'extern "C" int objcache_probe_ok() { return 1; }\n'
    refused = 'extern "C" int objcache_probe_refused() { return 2; }\n'
    assert isa.check_build(passes)  # built here, the child dlopened it
    fail_children = True
    assert not isa.check_build(refused)  # built here, the child failed
    fail_children = False
    assert len(children) == 2
    kernels.wait_stored(60)
    before = kernels.counters()

    inductor = _new_machine(installed_file_store, monkeypatch, "b")
    assert isa.check_build(passes)
    assert len(children) == 2  # the library came from objcache with its verdict: no child
    after = kernels.counters()
    assert after.get("fetched", 0) == before.get("fetched", 0) + 1
    assert after.get("probes_skipped", 0) == before.get("probes_skipped", 0) + 1
    if any(p.name.endswith(".so.load_ok") for p in (installed_file_store / "inductor").rglob("*")):
        # this torch keeps a marker: it is where torch itself would have left it
        assert [p.name for p in inductor.rglob("*.so.load_ok")]
    assert isa.check_build(refused)  # fetched, but its probe never passed: the child runs
    assert len(children) == 3
    assert kernels.counters().get("builds", 0) == before.get("builds", 0)


# --- bundles ------------------------------------------------------------------------------------


def test_bundle_bytes_are_verified_before_anything_else() -> None:
    from objcache.integrations.torch import mega

    fp = {"torch": "2.13", "cpu_isa": "avx2"}
    bundle = mega.Bundle("b", fp, b"torch-bytes", [("k1-x.so", b"\x7fELF")])
    data = bundle.to_bytes()
    back = mega.Bundle.from_bytes(data)
    assert (back.torch_bytes, back.kernels, back.fingerprint, back.skipped) == (
        b"torch-bytes",
        [("k1-x.so", b"\x7fELF")],
        fp,
        [],
    )
    torch_at = data.index(b"torch-bytes")
    tampered = data[:torch_at] + b"X" + data[torch_at + 1 :]
    with pytest.raises(mega.BundleError, match="digest mismatch in torch"):
        mega.Bundle.from_bytes(tampered)
    with pytest.raises(mega.BundleError, match="truncated"):
        mega.Bundle.from_bytes(data[: torch_at + 3])
    with pytest.raises(mega.BundleError, match="bad magic"):
        mega.Bundle.from_bytes(b"XXXX" + data[4:])


def test_a_bad_kernel_part_is_skipped_and_named_never_loaded() -> None:
    from objcache.integrations.torch import mega

    fp = {"torch": "2.13", "cpu_isa": "avx2"}
    kernels = [("k1-a.so", b"\x7fELF-a"), ("k1-b.so", b"\x7fELF-b"), ("k1-c.so", b"\x7fELF-c")]
    data = mega.Bundle("b", fp, b"torch-bytes", kernels).to_bytes()
    at = data.index(b"\x7fELF-b")
    flipped = mega.Bundle.from_bytes(data[:at] + b"X" + data[at + 1 :])
    assert flipped.torch_bytes == b"torch-bytes"
    assert flipped.kernels == [kernels[0], kernels[2]]
    assert flipped.skipped == ["kernel k1-b.so (digest mismatch)"]
    cut = mega.Bundle.from_bytes(data[:-3])
    assert cut.kernels == kernels[:2] and cut.skipped == ["1 truncated kernels"]
    # a kernel part stamped with another CPU's ISA is never installed, whatever its digests say
    foreign = data.replace(b'"kernel_isa": "avx2"', b'"kernel_isa": "neon"')  # same length
    assert foreign != data
    other = mega.Bundle.from_bytes(foreign)
    assert other.kernels == [] and other.skipped == ["3 kernels built for CPU ISA 'neon'"]


def test_loading_a_bundle_with_a_bad_kernel_installs_only_what_verifies(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objcache.client import get_client
    from objcache.config.fingerprint import fingerprint
    from objcache.integrations.torch import kernels, mega

    client = get_client()
    good, bad = ("k1-good.so", b"\x7fELF-good"), ("k1-bad.so", b"\x7fELF-bad")
    data = mega.Bundle("part", dict(fingerprint()), b"", [good, bad]).to_bytes()
    at = data.index(b"\x7fELF-bad")
    okey = client.object_key("mega", "part")
    blob = data[:at] + b"X" + data[at + 1 :]
    mega.write_overwrite(client, okey, blob)
    line = mega.load("part")
    assert "\n" not in line
    assert "1 kernels" in line and "skipped kernel k1-bad.so (digest mismatch)" in line
    assert client.get(kernels.KIND, "k1-good.so") == b"\x7fELF-good"
    assert client.get(kernels.KIND, "k1-bad.so") is None


def test_mega_ls_shows_what_each_bundle_holds(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objcache.config.fingerprint import fingerprint
    from objcache.integrations.torch import mega

    def fake(name: str, kernels: list[tuple[str, bytes]], missing: int = 0) -> mega.Collected:
        artifacts = {"inductor": 4, "aot_autograd": 2, "pgo": 2}
        bundle = mega.Bundle(name, dict(fingerprint()), b"t", kernels, artifacts)
        bundle.missing_kernels = missing
        return mega.Collected(bundle, f"{missing} kernels gone" if missing else "")

    made = {
        "full": fake("full", [("k1-a.so", b"a"), ("k1-b.so", b"b")]),
        "bare": fake("bare", []),
        "gaps": fake("gaps", [("k1-a.so", b"a")], missing=3),
    }
    monkeypatch.setattr(mega, "collect", lambda name: made[name])
    for name in made:
        saved = mega.save(name)
        assert ("incomplete: 3 kernels gone" in saved) == (name == "gaps"), saved
    lines = {line.split()[0]: line for line in mega.list_bundles()}
    assert "2 aot_autograd, 4 inductor, 2 pgo artifacts, 2 kernels" in lines["full"]
    assert "no kernels: a load compiles every CPU kernel" in lines["bare"]
    assert "1 kernels; 3 kernels missing" in lines["gaps"]
    assert "no kernels" not in lines["full"] and "missing" not in lines["full"]


def test_loading_a_bundle_of_another_environment_lists_what_differs(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objcache.client import get_client
    from objcache.config.fingerprint import fingerprint
    from objcache.entry.layout import Namespace
    from objcache.integrations.torch import mega

    client = get_client()
    ours = fingerprint()
    theirs = {**ours, "torch": "2.99.0", "cpu_isa": other_isa(ours["cpu_isa"])}
    other_env = Namespace("0123456789abcdef")
    blob = mega.Bundle("nightly", theirs, b"x").to_bytes()
    pointer = json.dumps({"env": other_env.env, "fingerprint": theirs}).encode()

    mega.write_overwrite(client, other_env.object_key("mega", "nightly"), blob)
    mega.write_overwrite(client, mega.pointer_key("nightly"), pointer)
    with pytest.raises(mega.BundleError) as info:
        mega.load("nightly")
    message = str(info.value)
    assert "\n" not in message
    assert "torch: 2.99.0 (stored) != " in message
    assert f"cpu_isa: {theirs['cpu_isa']} (stored) != {ours['cpu_isa']}" in message
    with pytest.raises(mega.BundleError, match="no bundle named 'absent'"):
        mega.load("absent")


def test_a_corrupt_bundle_is_refused_before_torch_sees_it(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.compiler._cache import CacheArtifactManager

    from objcache.client import get_client
    from objcache.config.fingerprint import fingerprint
    from objcache.integrations.torch import mega

    client = get_client()
    blob = bytearray(mega.Bundle("bad", dict(fingerprint()), b"torch artifacts").to_bytes())
    blob[-3] ^= 0xFF  # inside the torch part: the entry codec is fine, the bundle digest is not
    okey = client.object_key("mega", "bad")
    mega.write_overwrite(client, okey, bytes(blob))

    def never(*_: Any) -> None:
        raise AssertionError("torch saw the bundle")

    monkeypatch.setattr(CacheArtifactManager, "deserialize", never)
    monkeypatch.setattr(CacheArtifactManager, "populate_caches", never)
    with pytest.raises(mega.BundleError, match="corrupt"):
        mega.load("bad")
    assert "bad" in "\n".join(mega.list_bundles())


# --- zero-code path ------------------------------------------------------------------------------


def test_autoload_gate() -> None:
    assert not autoload.enabled({})
    assert not autoload.enabled({"OBJCACHE_TIERS": " "})
    assert autoload.enabled({"OBJCACHE_TIERS": "file:///x"})
    assert autoload.enabled({"OBJCACHE_ENABLE": "1"})
    assert not autoload.enabled({"OBJCACHE_ENABLE": "0", "OBJCACHE_TIERS": "file:///x"})


def test_every_watched_module_has_a_part_that_applies_it() -> None:
    from objcache.integrations.torch import hooks, watched

    assert set(hooks.APPLY) == set(get_args(watched.Part))
    assert set(watched.WATCHED.values()) == set(hooks.APPLY)


def test_importing_the_torch_layer_has_no_side_effects_and_no_import_circle() -> None:
    """Importing autoload activates nothing; hooks never imports autoload (uninstall
    included). ``-S``: no site-packages, so no installed ``.pth`` runs first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJCACHE_")}
    env.update(PYTHONPATH=str(torch_runs.ROOT), OBJCACHE_ENABLE="1")
    code = (
        "import sys\n"
        "from objcache.integrations.torch import hooks\n"
        "hooks.uninstall()\n"
        "assert 'objcache.integrations.torch.autoload' not in sys.modules\n"
        "from objcache.integrations.torch import autoload\n"
        "finders = lambda: [type(f).__name__ for f in sys.meta_path]\n"
        "assert '_PostImportFinder' not in finders()\n"
        "assert autoload.activate()\n"
        "assert '_PostImportFinder' in finders()\n"
        "hooks.uninstall()\n"
        "assert '_PostImportFinder' not in finders()\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"


def _python(code: str, env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_pth_imports_nothing_when_unset_and_hooks_torch_when_set(tmp_path: Path) -> None:
    site_dir = torch_runs.make_site_dir(tmp_path / "site")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJCACHE_")}
    env["PYTHONPATH"] = str(torch_runs.ROOT)
    probe = (
        f"import site, sys; site.addsitedir({str(site_dir)!r}); "
        "print(sorted(m for m in sys.modules if m.startswith('objcache')))"
    )
    assert _python(probe, env).strip() == "[]"
    env["OBJCACHE_ENABLE"] = "1"
    env["OBJCACHE_LOCAL_DIR"] = str(tmp_path / "local")
    code = (
        f"import site, sys; site.addsitedir({str(site_dir)!r}); "
        "import torch; assert 'torch._inductor.remote_cache' not in sys.modules; "
        "import torch._inductor.config as c, torch._inductor.remote_cache as rc; "
        "print(c.fx_graph_remote_cache, rc.RemoteFxGraphCache.objcache_kind)"
    )
    assert _python(code, env).split() == ["True", "fx-graph"]


def test_a_process_that_exits_right_after_writing_still_uploads(tmp_path: Path) -> None:
    """Exit-time flushes must run before thread pools stop (they need asyncio.to_thread)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJCACHE_")}
    env.update(
        PYTHONPATH=str(torch_runs.ROOT),
        OBJCACHE_TIERS=f"file://{tmp_path / 'store'}",
        OBJCACHE_LOCAL_DIR=str(tmp_path / "local"),
        OBJCACHE_JOB="exit-test",
    )
    code = (
        "from objcache.client import get_client\n"
        "get_client().put('kernel', 'k1-exit.so', b'x' * 5000)\n"  # no flush: exit at once
    )
    _python(code, env)
    stored = {p.parent.parent.name for p in (tmp_path / "store").rglob("*") if p.is_file()}
    assert {"kernel", "manifest"} <= stored


def test_demo_runs_cold_then_a_new_machine_twice_and_prints_the_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from objcache.integrations.torch import demo, demo_jobs

    machines: list[str] = []

    def fake_run_job(args: Any, env: Any, **kw: Any) -> demo_jobs.Job:
        machines.append(env["TORCHINDUCTOR_CACHE_DIR"])
        assert env["TMPDIR"].startswith(os.path.dirname(env["TORCHINDUCTOR_CACHE_DIR"]))
        kw["on_stage"]("compile")
        n = len(machines) - 1
        result = {
            "ok": True,
            "match": True,
            "first_step_s": (40.0, 5.0, 4.0)[n],
            "torch": {"fxgraph_cache_miss": 2} if n == 0 else {"fxgraph_cache_hit": 2},
            "stats": {
                "cache": {"gets": {"fx-graph": 2}, "hits": {"fx-graph": 2 if n == 1 else 0}},
                "tiers": [{"local": False, "bytes_read": 2048 * n, "bytes_written": 0}],
            },
            "integration": {"kernels": {"builds": (10, 0, 0)[n]}},
        }
        return demo_jobs.Job(result, 1.0, 0)

    monkeypatch.setattr(demo, "run_job", fake_run_job)
    monkeypatch.setenv("COLUMNS", "200")
    assert demo.main() == 0  # what `objcache demo` calls: no arguments
    out = capsys.readouterr().out
    assert machines[0] != machines[1] == machines[2]
    for text in ("cold", "new machine", "warm", "objcache fx-graph", "8.0x", "0 kernel builds"):
        assert text in out, text


def test_seed_imports_inductor_dirs_and_mega_cache_files_under_the_hook_keys(
    installed_file_store: Path,
) -> None:
    from torch.compiler._cache import CacheArtifactManager

    from objcache.client import get_client
    from objcache.integrations.torch import seed

    inductor = installed_file_store / "seed-inductor"
    (inductor / "fxgraph" / "ab" / "fabc1").mkdir(parents=True)
    (inductor / "fxgraph" / "ab" / "fabc1" / "entry").write_bytes(b"\x80fx")
    (inductor / "aotautograd" / "aqq2").mkdir(parents=True)
    (inductor / "aotautograd" / "aqq2" / "entry").write_bytes(b"\x80aot")
    CacheArtifactManager._ensure_cache_artifacts_registered()
    with CacheArtifactManager.with_fresh_cache():
        CacheArtifactManager.record_artifact("inductor", "fmega3", b"\x80mega")
        CacheArtifactManager.record_artifact("pgo", "job:None:", b"\x80pgo")
        serialized = CacheArtifactManager.serialize()
    assert serialized is not None
    bundle = installed_file_store / "artifacts.bin"
    bundle.write_bytes(serialized[0])

    assert seed.import_local(inductor_dir=inductor, bundles=[bundle]) == 4
    client = get_client()
    assert client.get("fx-graph", "pt2:fx-graph-v1::fabc1:c1") == b"\x80fx"
    assert client.get("aot-autograd", "pt2:autograd-experimental::aqq2:c1") == b"\x80aot"
    assert client.get("fx-graph", "pt2:fx-graph-v1::fmega3:c1") == b"\x80mega"
    assert client.get("pgo", "pt2:dynamo-pgo::job:None::c1") == b"\x80pgo"


def test_demo_models_are_built_in_or_from_a_library() -> None:
    """``--model`` takes tiny, block, torchvision:<name>, timm:<name>,
    transformers:<model type> or torch's stock modules; anything else is a
    one-line usage error, before torch is imported."""
    import argparse

    from objcache.integrations.torch.demo_worker import model_name

    for ok in (
        "tiny",
        "block",
        "torchvision:resnet18",
        "timm:vit_tiny_patch16_224",
        "transformers:bert",
        "torch:transformer",
        "torch:convnet",
    ):
        assert model_name(ok) == ok
    for bad in ("resnet18", "torchvision:", "hub:resnet18", ":x", "", "torch:resnet"):
        with pytest.raises(argparse.ArgumentTypeError, match="unknown model"):
            model_name(bad)


def test_torch_stock_models_compile_and_infer_like_eager(tmp_path: Path) -> None:
    """The matrix bench's torch-family models, training and inference steps (the worker's
    --inference), built and stepped eagerly: shapes and gradients as the bench needs."""
    import argparse

    from objcache.integrations.torch import demo_worker

    for name in demo_worker.TORCH_MODELS:
        model, x = demo_worker.build_model(f"torch:{name}", 1.0)
        out, grads = demo_worker._step(model, x)
        assert out.shape[0] == x.shape[0] and len(grads) == len(list(model.parameters()))
        out, grads = demo_worker._infer(model, demo_worker.make_input(f"torch:{name}", 3))
        assert out.shape[0] == 3 and grads == [] and not out.requires_grad
    args = demo_worker.worker_parser().parse_args(["--worker", "--inference"])
    assert isinstance(args, argparse.Namespace) and args.inference


def test_seed_reads_only_what_this_user_put_in_the_inductor_dir(
    installed_file_store: Path, tmp_path: Path
) -> None:
    """``push --inductor-dir``: a symlinked or shared (group/other-writable, foreign-owned)
    directory is refused whole; below it, symlinks and entries others could have written are
    left out and counted; this user's own entries are imported."""
    from objcache.client import get_client
    from objcache.integrations.torch import seed

    outside = tmp_path / "elsewhere"
    (outside / "fxgraph" / "ab" / "fevil").mkdir(parents=True)
    (outside / "fxgraph" / "ab" / "fevil" / "entry").write_bytes(b"\x80planted")
    root = installed_file_store / "inductor-own"
    (root / "fxgraph" / "ab" / "fgood").mkdir(parents=True)
    (root / "fxgraph" / "ab" / "fgood" / "entry").write_bytes(b"\x80good")
    (root / "fxgraph" / "ab" / "flink").symlink_to(outside / "fxgraph" / "ab" / "fevil")
    (root / "fxgraph" / "cd").symlink_to(outside / "fxgraph" / "ab")
    (root / "fxgraph" / "ab" / "fshared").mkdir()
    shared = root / "fxgraph" / "ab" / "fshared" / "entry"
    shared.write_bytes(b"\x80shared")
    shared.chmod(0o666)
    (root / "aotautograd" / "afile").mkdir(parents=True)
    (root / "aotautograd" / "afile" / "entry").symlink_to(
        outside / "fxgraph" / "ab" / "fevil" / "entry"
    )

    skipped: Counter[str] = Counter()
    assert seed.import_local(inductor_dir=root, skipped=skipped) == 1
    assert get_client().get("fx-graph", "pt2:fx-graph-v1::fgood:c1") == b"\x80good"
    for key in ("flink", "fevil", "fshared"):
        assert get_client().get("fx-graph", f"pt2:fx-graph-v1::{key}:c1") is None
    assert skipped == {"symlink": 3, "untrusted": 1}, skipped

    link = installed_file_store / "inductor-link"
    link.symlink_to(root)
    with pytest.raises(seed.UnsafeDir, match="symlink"):
        seed.import_local(inductor_dir=link)
    root.chmod(0o777)
    with pytest.raises(seed.UnsafeDir, match="writable by group or others"):
        seed.import_local(inductor_dir=root)
    root.chmod(0o700)
    if os.getuid() == 0:  # only root can give the directory to someone else
        os.chown(root, 12345, -1)
        with pytest.raises(seed.UnsafeDir, match="owned by uid 12345"):
            seed.import_local(inductor_dir=root)


def _kernel_built(src: Path, answer: int) -> Any:
    """A kernel built (and stored, with its place record) from ``src``; returns its plan."""
    from objcache.integrations.torch import kernels

    src.parent.mkdir(parents=True)
    src.write_text(f'extern "C" int answer() {{ return {answer}; }}\n')
    built = _builder(src, src.parent)
    built.build()
    p = kernels.plan(built)
    assert p is not None
    kernels.wait_stored(60)
    return p


def test_a_new_machine_finds_its_kernels_placed_before_torch_asks(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel built on one machine is put where torch's loader looks on the next, from
    the prefetch's local entries, before any build runs there; only a record of this
    machine's, in the form torch names a kernel, naming the binary's own key, is placed, and
    never over a file already there (docs/architecture.md, "Kernels placed before the
    compile")."""
    from objcache.client import get_client
    from objcache.integrations.torch import kernel_places, kernels

    p = _kernel_built(installed_file_store / "inductor" / "ab" / "cabxyz.cpp", 42)
    assert Path(p.target).name == "cabxyz.so"
    record = f"{kernel_places.machine()}-{p.key}"
    assert get_client().get(kernel_places.KIND, record) == b"ab/cabxyz.so"

    inductor = _new_machine(installed_file_store, monkeypatch, "b")
    client = get_client()
    # the prefetch brings the entries into the local tier (here: read through once)
    assert client.get(kernels.KIND, p.key) is not None
    assert client.get(kernel_places.KIND, record) is not None
    deadline = time.monotonic() + 10  # the local write-through of a remote hit is behind
    while client.get_local(kernels.KIND, p.key) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    while client.get_local(kernel_places.KIND, record) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    placer = kernel_places.Placer(client, str(inductor))
    before = kernels.counters()
    assert placer.place(p.key)
    placed = inductor / "ab" / "cabxyz.so"
    assert placed.read_bytes() == Path(p.target).read_bytes() and os.access(placed, os.X_OK)
    assert placer.place(p.key) is False  # once
    # torch's own loader now finds it: the build is skipped, nothing is fetched
    again = _builder(inductor / "ab" / "cabxyz.cpp", inductor / "ab")
    assert again.get_target_file_path() == str(placed)
    assert kernels.counters().get("placed", 0) == before.get("placed", 0) + 1

    # refused: another machine's record, a path not torch's, a path with another suffix, a
    # file already there (left as it is)
    other = kernel_places.Placer(client, str(inductor))
    other.prefix = "0" * 20 + "-"
    assert other.place(p.key) is None  # not local: tried again later, never placed
    for bad in (b"../ab/cabxyz.so", b"ab/cdexyz.so", b"/ab/cabxyz.so", b"ab/cabxyz.o", b"ab"):
        assert not kernel_places.Placer(client, str(inductor)).place(p.key, record=bad)
    placed.unlink()
    placed.write_bytes(b"torch's own")
    assert not kernel_places.Placer(client, str(inductor)).place(p.key)
    assert placed.read_bytes() == b"torch's own"
    placed.unlink()
    placed.symlink_to(installed_file_store / "elsewhere")
    assert not kernel_places.Placer(client, str(inductor)).place(p.key)
    assert not (installed_file_store / "elsewhere").exists()
    after = kernels.counters()
    assert after.get("place_refused", 0) - before.get("place_refused", 0) == 5
    assert after.get("place_present", 0) - before.get("place_present", 0) >= 2


def test_kernels_are_placed_beside_the_prefetch_of_a_client_built_by_a_first_lookup(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Placement starts with whichever client the process builds, not only with the one
    ``install()`` builds up front: the zero-code path builds it at its first lookup
    (objcache.client.client_listeners)."""
    from objcache.client import get_client, reset_client
    from objcache.integrations.torch import kernel_places, kernels

    p = _kernel_built(installed_file_store / "inductor" / "cd" / "ccdxyz.cpp", 7)
    get_client().flush()
    reset_client()  # the run's manifest lists the kernel and its place record
    inductor = _new_machine(installed_file_store, monkeypatch, "b")
    monkeypatch.setenv("OBJCACHE_PREFETCH", "1")
    before = kernels.counters()
    client = get_client()  # as a first lookup would: no start_client()
    assert client.prefetch_result is not None
    client.prefetch_result.result(30)
    placed = inductor / "cd" / "ccdxyz.so"
    deadline = time.monotonic() + 10
    while not placed.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    after = kernels.counters()
    assert placed.exists(), (before, after)
    assert placed.read_bytes() == Path(p.target).read_bytes()
    # (a background store of an earlier test may build a client too: at least ours)
    assert after.get("place_started", 0) >= before.get("place_started", 0) + 1
    assert after.get("placed", 0) >= before.get("placed", 0) + 1
    assert kernel_places.start(client) is not None  # the same placer: started once
    assert kernels.counters().get("place_started", 0) == after.get("place_started", 0)
