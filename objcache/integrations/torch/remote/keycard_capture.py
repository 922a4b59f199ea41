"""Key cards from torch: captured where torch computed an FX graph key, stored beside the
entry a process publishes (docs/architecture.md, "Key cards").

The card itself, its parsing and this process's missed cards are
:mod:`objcache.observe.keycards`; this module only wraps torch's lookup
(``FxGraphCache.load_with_key``, a feature-detected part) and hands a published entry's
card to the write path.
"""

from __future__ import annotations

import logging
from typing import Any

from objcache.integrations import cache_client
from objcache.integrations.patching import is_marked, marked
from objcache.observe.keycards import (
    CARD_KIND,
    CARDS_ENV,
    MAX_CARD_BYTES,
    counters,
    enabled,
    encode_written,
    failed,
    from_debug_lines,
    host,
    record_miss,
    take_pending,
    written_key,
)

log = logging.getLogger("objcache.torch")


_saved_attrs: dict[tuple[type, str], Any] = {}


def _env_fields() -> dict[str, str]:

    fields = getattr(cache_client.get_client().cache, "env_fields", None)
    if isinstance(fields, dict) and fields:
        return {str(k): str(v) for k, v in fields.items()}
    from objcache.config.fingerprint import fingerprint

    return dict(fingerprint())


def _wrap_load_with_key(original: Any) -> Any:
    """``FxGraphCache.load_with_key(key, debug_lines, example_inputs, local, remote_cache,
    ...)``: torch's lookup, given the key and components torch computed. A miss through
    objcache's remote cache (torch's local cache and every objcache tier missed) keeps a
    card; a hit costs one attribute check."""

    def load_with_key(key: Any, debug_lines: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(key, debug_lines, *args, **kwargs)
        try:
            remote = kwargs.get("remote_cache", args[2] if len(args) > 2 else None)
            if (
                isinstance(result, tuple)
                and result
                and result[0] is None
                and getattr(type(remote), "objcache_kind", None) == "fx-graph"
                and isinstance(key, str)
                and isinstance(debug_lines, list)
                and enabled()
            ):
                counters["captured:fx-graph"] += 1
                record_miss(from_debug_lines("fx-graph", key, debug_lines, _env_fields()))
        except Exception as exc:
            failed("capture", exc)
        return result

    marked(load_with_key, original)
    return load_with_key


def apply_fx(module: Any) -> None:
    """Part for ``torch._inductor.codecache`` (idempotent)."""
    cls = module.FxGraphCache
    current = cls.__dict__.get("load_with_key")
    if is_marked(getattr(current, "__func__", current)):
        return
    _saved_attrs[(cls, "load_with_key")] = current
    cls.load_with_key = staticmethod(_wrap_load_with_key(cls.load_with_key))


def uninstall() -> None:
    for (cls, attr), value in reversed(list(_saved_attrs.items())):
        setattr(cls, attr, value)
    _saved_attrs.clear()


def published(client: Any, kind: str, key: str) -> None:
    """The entry of ``key`` was just put: store the card its miss kept, beside it, through
    the write-behind queue (encoded on the client's loop, never on the compile's thread)."""
    card = take_pending(kind, key)
    if card is None or kind not in CARD_KIND:
        return
    from objcache.core.writes import write
    from objcache.entry.layout import Namespace

    cache = client.cache
    job, run = str(client.job), str(client.observer.run_id)

    async def store() -> None:
        try:
            payload = encode_written(card, job, run, host())
            if len(payload) > MAX_CARD_BYTES:
                counters["too_large"] += 1
                return
            graph, digest = written_key(card, run)
            okey = Namespace(CARDS_ENV).candidate_key(CARD_KIND[kind], graph, digest)
            if (await write(cache, okey, payload, local=False)).queued:
                counters[f"stored:{kind}"] += 1
        except Exception as exc:
            failed("store", exc)

    client.bridge.submit(store)
