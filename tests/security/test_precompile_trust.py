"""Precompile entries hold bytecode: never unpickled unverified, bad ones are counted misses
(docs/torch.md, "Precompile entries"; docs/security.md)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

KEY = "precompile-trust-signing-key-of-at-least-32-bytes"


def compiled_function(x: Any) -> Any:
    return x + 1


def _client(store: Path, local: Path, environ: dict[str, str]) -> Any:
    from objcache.client import Client
    from objcache.config.settings import Config

    cfg = Config.from_env(environ, tiers=f"file://{store}", local_dir=local, prefetch=False)
    return Client(cfg)


def test_an_unsigned_entry_is_refused_where_keys_are_configured(tmp_path: Path) -> None:
    store = tmp_path / "store"
    unsigned = _client(store, tmp_path / "w", {})
    try:
        unsigned.put("precompile", "k", pickle.dumps({"bytecode": b"x"}))
        assert unsigned.flush() == 0
    finally:
        unsigned.close()
    keyed = _client(store, tmp_path / "r", {"OBJCACHE_SIGNING_KEY": KEY})
    try:
        assert keyed.get("precompile", "k") is None
    finally:
        keyed.close()


class _Stub:
    job = "trust"

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def get(self, kind: str, key: str) -> bytes:
        assert kind == "precompile"
        return self.payload


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"\x00not a pickle", "unreadable"),
        (pickle.dumps({"not": "an entry"}), "format"),
        (pickle.dumps({"format": "objcache-precompile-v3", "entry": None}), "unreadable"),
        (pickle.dumps(None)[:-1], "unreadable"),
    ],
    ids=["corrupt", "foreign", "no-entry", "truncated"],
)
def test_a_bad_payload_is_a_counted_miss(
    monkeypatch: pytest.MonkeyPatch, payload: bytes, why: str
) -> None:
    from objcache.integrations import cache_client
    from objcache.integrations.torch.precompile import precompile_entry, precompile_serve

    monkeypatch.setattr(cache_client, "get_client", lambda: _Stub(payload))
    before = precompile_entry.counters[f"rejected:{why}"]
    token = precompile_serve.current_compiler.set("inductor:trust")  # as torch.compile() does
    try:
        assert precompile_serve.load(compiled_function) is None
    finally:
        precompile_serve.current_compiler.reset(token)
    assert precompile_entry.counters[f"rejected:{why}"] == before + 1


def test_no_entry_is_looked_up_outside_a_known_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch loading an entry where no ``torch.compile()`` wrapper named its compiler, or
    for a backend without a portable name: never looked up, counted."""
    from objcache.integrations import cache_client
    from objcache.integrations.torch.precompile import precompile_entry, precompile_serve

    monkeypatch.setattr(cache_client, "get_client", lambda: _Stub(b"never read"))
    before = dict(precompile_entry.counters)
    assert precompile_serve.load(compiled_function) is None
    token = precompile_serve.current_compiler.set(None)
    try:
        assert precompile_serve.load(compiled_function) is None
    finally:
        precompile_serve.current_compiler.reset(token)
    after = precompile_entry.counters
    assert after["skipped:unknown_compiler"] == before.get("skipped:unknown_compiler", 0) + 1
    assert after["skipped:unportable_compiler"] == before.get("skipped:unportable_compiler", 0) + 1
    assert after["lookups"] == before.get("lookups", 0)


def test_the_key_follows_the_source_not_only_the_qualname() -> None:
    from objcache.integrations.torch.precompile import precompile_entry

    def f(x: Any) -> Any:
        return x + 1

    g_source = "def f(x):\n    return x + 2\n"
    scope: dict[str, Any] = {}
    exec(compile("\n" * (f.__code__.co_firstlineno - 1) + g_source, __file__, "exec"), scope)
    g = scope["f"]
    g.__qualname__ = f.__qualname__
    torch_f, key_f = precompile_entry.entry_key(f, "job", "inductor")
    torch_g, key_g = precompile_entry.entry_key(g, "job", "inductor")
    assert torch_f == torch_g  # torch's own key: qualname and first line only
    assert key_f != key_g
    assert precompile_entry.entry_key(f, "other-job", "inductor")[1] != key_f
    assert precompile_entry.entry_key(f, "job", "backend:eager")[1] != key_f
