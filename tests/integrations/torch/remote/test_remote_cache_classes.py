"""torch's remote cache classes as objcache installs them
(:mod:`objcache.integrations.torch.remote.remote_cache_classes`): an error of objcache's is counted,
never raised into torch."""

from __future__ import annotations

import base64
import pickle
from pathlib import Path
from typing import Any

import pytest

from tests.support.torch_cache import remote_cache

torch = pytest.importorskip("torch")


def test_hooks_never_raise_into_torch(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objcache.integrations import cache_client
    from objcache.integrations.install import hooks

    def broken() -> Any:
        raise RuntimeError("client exploded")

    monkeypatch.setattr(cache_client, "get_client", broken)
    cache = remote_cache("RemoteAOTAutogradCache", "autograd-experimental")
    cache.put("k", {"data": base64.b64encode(pickle.dumps(1)).decode(), "time_taken_ms": 1})
    assert cache.get("k") is None
    assert cache.backend.get("pt2:x") is None
    cache.backend.put("pt2:x", b"{}")
    assert hooks.counters["errors:put (aot-autograd)"] >= 1
    assert hooks.counters["errors:get (aot-autograd)"] >= 1
