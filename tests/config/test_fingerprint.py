"""The environment fingerprint's per-machine cache: a CLI run gets torch's answers without
importing torch, and any input that could change those answers makes it ask torch again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from objcache.config import fingerprint as fp
from tests.support.isa import lower_isa

pytest.importorskip("torch")

PROBE = (
    "import json, sys\n"
    "from objcache.config.fingerprint import env_id, fingerprint\n"
    "print(json.dumps({'env': env_id(), 'fields': fingerprint(),"
    " 'imported_torch': 'torch' in sys.modules}))\n"
)


def probe(cache_home: Path, **env: str) -> dict[str, Any]:
    """env_id and fields of a fresh process whose user cache directory is ``cache_home``."""
    run_env = {**os.environ, "XDG_CACHE_HOME": str(cache_home), **env}
    for var in fp.TORCH_ENV:
        if var not in env:
            run_env.pop(var, None)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=run_env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def cache_files(cache_home: Path) -> list[Path]:
    return sorted((cache_home / "objcache" / "fingerprint").glob("*.json"))


def test_second_run_answers_without_torch_and_identically(tmp_path: Path) -> None:
    first = probe(tmp_path)
    assert first["imported_torch"], "nothing cached yet: torch is asked"
    assert len(cache_files(tmp_path)) == 1
    second = probe(tmp_path)
    assert not second["imported_torch"], "the cached answer is used"
    assert second["env"] == first["env"]
    assert second["fields"] == first["fields"]


def test_an_input_torch_reads_changes_the_key(tmp_path: Path) -> None:
    default = probe(tmp_path)
    other = lower_isa(default["fields"]["cpu_isa"])  # one ATen accepts on any host
    if other is None:
        pytest.skip("this machine's ISA is ATen's lowest (default): no other level to force")
    forced = probe(tmp_path, ATEN_CPU_CAPABILITY=other)
    assert forced["imported_torch"], "a new ISA setting is a miss: torch is asked again"
    assert forced["fields"]["cpu_isa"] == other
    assert forced["env"] != default["env"]
    assert len(cache_files(tmp_path)) == 2
    again = probe(tmp_path)
    assert not again["imported_torch"] and again["env"] == default["env"]


def test_unreadable_cache_is_recomputed(tmp_path: Path) -> None:
    good = probe(tmp_path)
    (path,) = cache_files(tmp_path)
    for junk in ("{not json", json.dumps({"torch": "2.0"}), json.dumps([1, 2])):
        path.write_text(junk)
        again = probe(tmp_path)
        assert again["imported_torch"]
        assert again["fields"] == good["fields"]
        assert json.loads(path.read_text()) == {k: good["fields"][k] for k in fp.TORCH_FIELDS}


def test_the_cache_can_be_turned_off(tmp_path: Path) -> None:
    probe(tmp_path)
    off = probe(tmp_path, OBJCACHE_FINGERPRINT_CACHE="0")
    assert off["imported_torch"]


def test_inputs_key_follows_torchs_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in fp.TORCH_ENV:
        monkeypatch.delenv(var, raising=False)
    base = fp.torch_inputs_key()
    assert base is not None and base == fp.torch_inputs_key()
    for var in fp.TORCH_ENV:
        monkeypatch.setenv(var, "1")
        assert fp.torch_inputs_key() != base, var
        monkeypatch.delenv(var)
    monkeypatch.setattr(fp, "_cpu_flags", lambda: b"flags : sse2")
    assert fp.torch_inputs_key() != base, "another CPU"
    monkeypatch.undo()
    monkeypatch.setattr(fp, "_gpu_inventory", lambda: b"Model: NVIDIA H100")
    assert fp.torch_inputs_key() != base, "another GPU"


def test_the_cache_is_never_written_through_a_linked_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "home" / "objcache").mkdir(parents=True)
    (tmp_path / "home" / "objcache" / "fingerprint").symlink_to(elsewhere)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    fields = {k: "x" for k in fp.TORCH_FIELDS}
    fp._store_torch_fields("k", fields)  # refused quietly: the next run asks torch
    assert list(elsewhere.iterdir()) == []
    (tmp_path / "home" / "objcache" / "fingerprint").unlink()
    fp._store_torch_fields("k", fields)
    assert fp._cached_torch_fields("k") == fields
    cached = tmp_path / "home" / "objcache" / "fingerprint" / "k.json"
    assert cached.stat().st_mode & 0o777 == 0o600


def test_the_cpu_isa_names_the_extensions_inductor_picks_its_kernels_by(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ATen's level is "avx512" on every AVX-512 CPU; Inductor picks finer vector classes on it
    (VNNI, AMX: its CPU GEMM templates write AMX tile intrinsics for bf16 that no other CPU
    builds, and only where the OS grants the process AMX tiles): two such machines are two
    environments. Below AVX-512 nothing is added."""
    import platform
    from types import SimpleNamespace

    from objcache.config import fingerprint as fp

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")

    def fake(level: str, permitted: bool = True, **caps: object) -> object:
        return SimpleNamespace(
            backends=SimpleNamespace(cpu=SimpleNamespace(get_cpu_capability=lambda: level)),
            cpu=SimpleNamespace(
                get_capabilities=lambda: {"avx512_vnni": False, **caps},
                _init_amx=lambda: permitted,
            ),
        )

    plain = fp._cpu_isa(fake("AVX512"))
    amx = fp._cpu_isa(fake("AVX512", avx512_vnni=True, amx_tile=True, amx_bf16=True))
    assert plain == "avx512"
    assert amx == "avx512 avx512_vnni amx_tile amx_bf16"
    # the same CPU where the kernel refuses AMX tiles (Inductor then writes no AMX kernel)
    refused = fp._cpu_isa(fake("AVX512", False, avx512_vnni=True, amx_tile=True, amx_bf16=True))
    assert refused == "avx512 avx512_vnni amx_tile=unpermitted amx_bf16=unpermitted"
    assert fp._cpu_isa(fake("AVX2", avx512_vnni=True, amx_tile=True)) == "avx2"
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert (
        fp._cpu_isa(fake("SVE256", sve=True, sve_max_length=256)) == "sve256 sve sve_max_length=256"
    )


@pytest.mark.parametrize(("package", "other_release"), [("sympy", "1.13.3"), ("networkx", "2.5.1")])
def test_a_release_torch_s_code_generation_depends_on_is_an_environment(
    monkeypatch: pytest.MonkeyPatch, package: str, other_release: str
) -> None:
    """Inductor writes its code's index expressions through sympy, and AOTAutograd's
    partitioner cuts a training graph with networkx; no torch key names either release: a
    machine with another one is another environment (read from the installed metadata,
    without importing the package)."""
    from importlib.metadata import version

    fp.fingerprint.cache_clear()
    here = fp.fingerprint()
    assert here[package] == version(package)
    monkeypatch.setattr(
        fp, "_installed_version", lambda name: other_release if name == package else version(name)
    )
    fp.fingerprint.cache_clear()
    try:
        other = fp.fingerprint()
    finally:
        fp.fingerprint.cache_clear()
    assert fp.env_id(other) != fp.env_id(here)
    assert fp.differences(here, other) == [
        f"{package}: {other_release} (stored) != {here[package]} (here)"
    ]
