"""torch's remote cache classes, replaced at the value level by objcache's (docs/torch.md,
"How torch is hooked").

:mod:`...install.hooks` swaps torch's ``RemoteFxGraphCache`` and the other four module attributes
for subclasses made here, one per kind (:data:`CACHE_CLASSES`). They work at the *value* level
(``RedisRemoteCache._get`` / ``_put``): torch's JSON/base64 envelope is never built on a put,
the raw pickle is stored (:mod:`.serde`), and a hit is written through to Inductor's local
cache (:mod:`.writethrough`). Their ``backend`` is an ``ObjcacheBackend`` (a real
``RemoteCacheBackend[bytes]``) for code that talks to the backend directly, and a
``backend_override_cls`` set on them (torch's own test mocks) still wins.

Nothing here raises into torch: a raising ``_put`` breaks AOTAutograd (the error escapes
``loss.backward()``: the ``remote_cache.put`` in ``AOTAutogradCache.save`` is outside any
try) and PGO. Every failure is a counted miss (:data:`counters`), logged once.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from objcache.integrations import cache_client
from objcache.integrations.torch.remote import guarded_candidates as candidates
from objcache.integrations.torch.remote import (
    keycard_capture,
    pgo_join,
    process_keys,
    serde,
    writethrough,
)
from objcache.observe import keycards as cards
from objcache.observe.metrics import FailureLog

log = logging.getLogger("objcache.torch")

#: torch class name -> objcache kind.
CACHE_CLASSES: dict[str, str] = {
    "RemoteFxGraphCache": "fx-graph",
    "RemoteAOTAutogradCache": "aot-autograd",
    "RemoteAutotuneCache": "autotune",
    "RemoteBundledAutotuneCache": "bundled-autotune",
    "RemoteDynamoPGOCache": "pgo",
}

#: objcache kind -> torch's cache_id, for the kinds with a fixed one (the autotune cache id
#: is a per-kernel hash). Sources: ``FxGraphCache.get_remote_cache``,
#: ``AOTAutogradCache.get_remote_cache``, ``torch._dynamo.pgo.get_remote_cache``,
#: ``AutotuneCacheBundler.begin_compile``.
CACHE_IDS: dict[str, str] = {
    "fx-graph": "fx-graph-v1",
    "aot-autograd": "autograd-experimental",
    "pgo": "dynamo-pgo",
    "bundled-autotune": "bundled-autotune-v1",
}

#: Hook counters: ``errors:<where>``, ``gets:<kind>``, ``hits:<kind>``, ``puts:<kind>``...
#: (:mod:`...install.hooks` counts and logs its own failures here too: ``stats()["hooks"]``).
counters: Counter[str] = Counter()
failed = FailureLog(
    log,
    "torch",
    counters,
    "errors:",
    "objcache: %s failed; torch goes on without objcache there: %r",
)


def make_backend_class(base: type) -> type:
    class ObjcacheBackend(base):  # type: ignore[misc]
        """``RemoteCacheBackend[bytes]`` speaking torch's JSON envelope on top of objcache."""

        def __init__(self, kind: str = "blob") -> None:
            super().__init__()
            self.kind = kind

        def _get(self, key: str) -> bytes | None:
            try:
                payload = cache_client.get_client().get(self.kind, key)
                return None if payload is None else serde.envelope_bytes(self.kind, payload)
            except Exception as exc:
                failed(f"backend get ({self.kind})", exc)
                return None

        def _put(self, key: str, data: bytes) -> None:
            try:
                cache_client.get_client().put(
                    self.kind, key, serde.pack_envelope_bytes(self.kind, data)
                )
            except Exception as exc:
                failed(f"backend put ({self.kind})", exc)

    return ObjcacheBackend


def make_cache_class(original: type, kind: str, backend_cls: type, json_serde: type) -> type:
    from torch._inductor.remote_cache import RemoteCache

    class ObjcacheRemoteCache(original):  # type: ignore[misc]
        objcache_kind = kind

        def __init__(self, cache_id: str) -> None:
            # RedisRemoteCache.__init__ would insist on the redis package; objcache does not
            # need it. Same key format as RedisRemoteCache.__init__.
            RemoteCache.__init__(self, backend_cls(kind), json_serde())
            self._key_fmt = f"pt2:{cache_id}::{{key}}:c1"

        def _get(self, key: str, sample: Any) -> Any:
            if type(self).backend_override_cls is not None:
                return super()._get(key, sample)
            counters[f"gets:{kind}"] += 1
            try:
                process_keys.looked_up(kind, key)
                if kind in pgo_join.RECORD_KINDS:
                    payload = cache_client.get_client().get_record(kind, self._get_key(key))
                else:
                    payload = cache_client.get_client().get(kind, self._get_key(key))
                if payload is None:
                    return None
                value, raw = serde.unpack(kind, payload)
            except Exception as exc:
                failed(f"get ({kind})", exc)
                return None
            counters[f"hits:{kind}"] += 1
            if raw is not None:
                writethrough.write_through(kind, key, raw)
            return value

        def _put(self, key: str, value: Any, sample: Any) -> None:
            if type(self).backend_override_cls is not None:
                super()._put(key, value, sample)
                return
            try:
                client = cache_client.get_client()
                payload = serde.pack(kind, value)
                if kind in pgo_join.RECORD_KINDS:
                    # a join with every other writer's profile, never last-writer-wins
                    client.update_record(kind, self._get_key(key), pgo_join.change_for(payload))
                elif process_keys.is_nonce_key(kind, key):
                    client.put_local(kind, self._get_key(key), payload)
                    process_keys.counters["local_only:nonce_key"] += 1
                elif process_keys.changed_since_lookup(kind, key):
                    client.put_local(kind, self._get_key(key), payload)
                    process_keys.counters["local_only:changed_since_key"] += 1
                elif kind in candidates.GUARDED_KINDS and client.config.guarded_candidates:
                    client.put_candidate(kind, self._get_key(key), payload)
                else:
                    client.put(kind, self._get_key(key), payload)
                counters[f"puts:{kind}"] += 1
                if kind in cards.CARD_KIND:
                    keycard_capture.published(client, kind, key)
            except Exception as exc:
                failed(f"put ({kind})", exc)

    # torch reports cache stats under type(self).__name__: keep torch's names there.
    ObjcacheRemoteCache.__name__ = original.__name__
    ObjcacheRemoteCache.__qualname__ = original.__qualname__
    ObjcacheRemoteCache.__module__ = __name__
    ObjcacheRemoteCache.__doc__ = f"torch's {original.__name__}, stored in objcache ({kind})."
    return ObjcacheRemoteCache
