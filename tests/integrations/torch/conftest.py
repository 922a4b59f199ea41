"""Fixtures of the torch integration tests that share a store: an installed objcache on a
real file:// store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


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
