"""Write-through (:mod:`objcache.integrations.torch.remote.writethrough`): a hit from objcache
lands in torch's own local caches, through torch's own writers, against a real file:// store."""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from tests.support.torch_cache import new_machine, remote_cache

torch = pytest.importorskip("torch")


def test_graph_entries_are_raw_in_the_store_and_written_through_on_a_hit(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objcache.client import get_client, reset_client
    from objcache.integrations.torch.remote import writethrough

    # torch's single-value path; guarded candidates:
    # tests/integrations/torch/remote/test_guarded_candidates.py
    monkeypatch.setenv("OBJCACHE_GUARDED_CANDIDATES", "0")
    reset_client()
    raw = pickle.dumps({"compiled": "graph"})
    envelope = {"data": base64.b64encode(raw).decode("ascii"), "time_taken_ms": 7}
    remote_cache("RemoteFxGraphCache", "fx-graph-v1").put("fkey123", envelope)
    aot = remote_cache("RemoteAOTAutogradCache", "autograd-experimental")
    assert aot.get("akey456") is None  # torch looks a key up before it saves its entry
    aot.put("akey456", envelope)
    pgo_raw = pickle.dumps({"code": "state"})
    pgo_value = {"data": base64.b64encode(pgo_raw).decode("ascii")}
    remote_cache("RemoteDynamoPGOCache", "dynamo-pgo").put("job:None:", pgo_value)
    assert get_client().get("fx-graph", "pt2:fx-graph-v1::fkey123:c1") == raw

    inductor = new_machine(installed_file_store, monkeypatch, "b")
    before = dict(writethrough.counters)
    got = remote_cache("RemoteFxGraphCache", "fx-graph-v1").get("fkey123")
    assert got == {"data": envelope["data"], "time_taken_ms": 0}
    assert remote_cache("RemoteAOTAutogradCache", "autograd-experimental").get("akey456")["data"]
    assert remote_cache("RemoteDynamoPGOCache", "dynamo-pgo").get("job:None:") == pgo_value
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
    inductor = new_machine(installed_file_store, monkeypatch, "b")
    second = create(inductor)
    local_path = Path(second.local_cache[1])
    assert not local_path.exists()
    assert second._read() == best
    assert json.loads(local_path.read_text()) == best
