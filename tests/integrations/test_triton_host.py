"""Triton's host-side modules through objcache (objcache/integrations/triton_host.py).

Real processes, the zero-code path, Triton's own ``compile_module_from_src`` and a real C
compiler behind a counting ``CC`` shim; no GPU needed: the module built is a tiny Python
extension, built and loaded exactly as Triton builds and loads its driver's utilities.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")
build = pytest.importorskip("triton.runtime.build")

from objcache.integrations import triton_host  # noqa: E402

SOURCE = r"""
#include <Python.h>
static PyObject* answer(PyObject* self, PyObject* args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "tiny_host", NULL, -1, methods};
PyMODINIT_FUNC PyInit_tiny_host(void) { return PyModule_Create(&def); }
"""

CHILD = r"""
import json, sys
import triton  # the zero-code path applies the part when Triton's build module is imported
from triton.runtime.build import compile_module_from_src
mod = compile_module_from_src(sys.argv[1], "tiny_host")
from objcache.integrations import triton_host
print(json.dumps({"answer": mod.answer(), "counters": dict(triton_host.counters),
                  "installed": triton_host.installed()}))
"""


def machine(tmp_path: Path, name: str, **env: str) -> dict[str, Any]:
    """One process on machine ``name`` (its own Triton cache and local tier), sharing the
    store; returns the child's report and how many times the C compiler ran."""
    shim = tmp_path / "cc"
    log = tmp_path / f"cc-{name}.log"
    if not shim.exists():
        # builds are counted; objcache's identity probe (--version) is not a build
        shim.write_text('#!/bin/sh\n[ "$1" = --version ] || echo run >> "$CC_LOG"\nexec gcc "$@"\n')
        shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("OBJCACHE_", "TRITON_"))}
    full.update(
        OBJCACHE_TIERS=f"file://{tmp_path / 'store'}",
        OBJCACHE_LOCAL_DIR=str(tmp_path / f"local-{name}"),
        OBJCACHE_PREFETCH="0",
        TRITON_CACHE_DIR=str(tmp_path / f"triton-{name}"),
        CC=str(shim),
        CC_LOG=str(log),
        **env,
    )
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, SOURCE],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    report["cc_runs"] = len(log.read_text().splitlines()) if log.exists() else 0
    return report


def stored(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "store").rglob("*") if p.is_file() and "triton-host" in str(p)]


def test_a_new_machine_loads_the_module_a_first_one_built_and_runs_no_compiler(
    tmp_path: Path,
) -> None:
    a = machine(tmp_path, "a")
    assert a["installed"] is True
    assert a["answer"] == 42 and a["cc_runs"] == 1
    assert a["counters"] == {"misses": 1, "stored": 1}
    assert len(stored(tmp_path)) == 1

    b = machine(tmp_path, "b")
    assert b["answer"] == 42
    assert b["cc_runs"] == 0
    assert b["counters"] == {"hits": 1}
    # the next process on that machine finds it in Triton's own directory
    again = machine(tmp_path, "b")
    assert again["cc_runs"] == 0 and again["counters"] == {"local": 1}


def test_a_tampered_module_is_never_loaded_and_triton_builds_its_own(tmp_path: Path) -> None:
    machine(tmp_path, "a")
    (entry,) = stored(tmp_path)
    data = bytearray(entry.read_bytes())
    data[-10] ^= 0xFF
    entry.write_bytes(bytes(data))

    c = machine(tmp_path, "c")
    assert c["answer"] == 42
    assert c["cc_runs"] == 1
    assert "hits" not in c["counters"]


def test_switched_off_triton_builds_and_nothing_is_stored(tmp_path: Path) -> None:
    off = machine(tmp_path, "a", OBJCACHE_TRITON_HOST="0")
    assert off["answer"] == 42 and off["cc_runs"] == 1
    assert off["counters"] == {}
    assert stored(tmp_path) == []


def test_only_the_default_manager_with_the_c_compiler_is_wrapped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from triton import knobs
    from triton.runtime.cache import FileCacheManager

    class Another(FileCacheManager):  # any manager but Triton's default: left alone
        pass

    monkeypatch.setattr(triton_host, "_on", lambda: True)
    assert triton_host.apply(build)
    try:
        key = "0" * 64
        wrapped = build.get_cache_manager(key)
        assert isinstance(wrapped, triton_host._HostModules)
        assert isinstance(wrapped._inner, FileCacheManager)
        with knobs.cache.scope():
            knobs.cache.manager_class = Another
            assert type(build.get_cache_manager(key)) is Another
        with knobs.build.scope():
            knobs.build.impl = lambda *a: "x"
            assert type(build.get_cache_manager(key)) is FileCacheManager
    finally:
        triton_host.uninstall()
    assert not getattr(build.get_cache_manager, "__objcache__", False)
