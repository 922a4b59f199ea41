"""Helpers for the torch integration tests that run torch's cache classes in this process
against a real file:// store (the ``installed_file_store`` fixture of
tests/integrations/torch/conftest.py): a new machine, one of torch's remote caches, and
torch's C++ builder for a kernel source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def new_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Path:
    """Forget everything local: a fresh objcache local dir and Inductor dir, same store."""
    from objcache.client import get_client, reset_client
    from objcache.integrations.torch.kernels import kernel_headers

    get_client().flush()
    reset_client()
    kernel_headers.forget()  # what the compiler's search found here is another process's
    monkeypatch.setenv("OBJCACHE_LOCAL_DIR", str(tmp_path / f"local-{name}"))
    inductor = tmp_path / f"inductor-{name}"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    return inductor


def remote_cache(name: str, cache_id: str) -> Any:
    """torch's remote cache class ``name`` (as installed) for ``cache_id``."""
    from torch._inductor import remote_cache

    cache = remote_cache.create_cache(cache_id, False, "Fb" + name, name)
    assert cache is not None
    return cache


def kernel_builder(src: Path, out_dir: Path | None, **options: Any) -> Any:
    """torch's ``CppBuilder`` for ``src`` into ``out_dir`` (None: as ``_precompile_header``
    names its builder, by the header's full path)."""
    from torch._inductor.cpp_builder import CppBuilder, CppOptions

    header = options.pop("precompiled_header", None)
    opts = CppOptions(**options)
    opts.precompiled_header = header
    if out_dir is None:
        return CppBuilder(str(src), str(src), opts)
    return CppBuilder(src.stem, [str(src)], opts, str(out_dir))


def header_record(src: Path, code: str) -> tuple[str, bytes] | None:
    """``(key, record)`` of the headers g++ reads building ``code`` written at ``src`` into a
    shared object beside it (:func:`objcache.integrations.torch.kernels.kernel_headers.record`)."""
    import shutil

    from objcache.integrations.torch.kernels import kernel_headers, kernels

    compiler = shutil.which("g++")
    assert compiler is not None
    src.write_text(code)
    target = str(src.with_suffix(".so"))
    tokens = [compiler, str(src), "-shared", "-fPIC", "-o", target]
    return kernel_headers.record(tokens, target, [str(src)], kernels.normalize)


def kernel_built(src: Path, answer: int) -> Any:
    """A kernel built (and stored, with its place record) from a source at ``src`` that
    returns ``answer``; returns its plan."""
    from objcache.integrations.torch.kernels import kernels

    src.parent.mkdir(parents=True)
    src.write_text(f'extern "C" int answer() {{ return {answer}; }}\n')
    built = kernel_builder(src, src.parent)
    built.build()
    p = kernels.plan(built)
    assert p is not None
    kernels.wait_stored(60)
    return p
