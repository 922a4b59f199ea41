"""How torch's cache values are stored (:mod:`objcache.integrations.torch.remote.serde`): graph
envelopes as their raw pickle, autotune values as compact JSON, anything unexpected unchanged."""

from __future__ import annotations

import base64
import pickle

import pytest

from objcache.integrations.torch.remote import serde

torch = pytest.importorskip("torch")


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
