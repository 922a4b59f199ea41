"""The zero-code path's one switch (:mod:`objcache.integrations.install.zero_code_switch`, read
through :mod:`.autoload`)."""

from __future__ import annotations

import pytest

from objcache.integrations.install import autoload

torch = pytest.importorskip("torch")


def test_autoload_gate() -> None:
    assert not autoload.enabled({})
    assert not autoload.enabled({"OBJCACHE_TIERS": " "})
    assert autoload.enabled({"OBJCACHE_TIERS": "file:///x"})
    assert autoload.enabled({"OBJCACHE_ENABLE": "1"})
    assert not autoload.enabled({"OBJCACHE_ENABLE": "0", "OBJCACHE_TIERS": "file:///x"})
