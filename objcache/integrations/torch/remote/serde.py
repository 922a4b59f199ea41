"""What objcache stores for each torch cache kind, and the value torch gets back.

torch hands its remote caches a JSON value and, through
``torch._inductor.remote_cache.RemoteCacheJsonSerde``, would send the backend
``json.dumps({"data": base64(pickle), "time_taken_ms": n})``. objcache stores the payload
itself instead:

* ``fx-graph``, ``aot-autograd``, ``pgo``: the raw pickle (``base64.b64decode(data)``), byte
  for byte the ``content`` torch's Mega-Cache artifact classes carry, so bundles, write-through
  and remote entries share one representation. On a hit the envelope is rebuilt with the
  shape each reader asserts: ``data`` a base64 ``str`` (``GuardedCache.iterate_over_candidates``
  for FX graphs and AOTAutograd, ``torch._dynamo.pgo.lookup_remote_cache_entry`` for PGO) and,
  for the
  graph kinds, ``time_taken_ms`` (torch only ever writes it; no reader uses it, so it comes
  back as 0).
* ``autotune``, ``bundled-autotune``: plain JSON dicts, stored as compact JSON.

A value that does not have the expected envelope shape (a future torch adding fields, a
third party using the same class) is stored as compact JSON and returned unchanged: a raw
pickle always starts with the protocol opcode ``0x80`` and JSON never does, so the two
cannot be confused.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

#: Kinds whose torch value is ``{"data": base64(pickle), ...}``.
PICKLE_KINDS = frozenset({"fx-graph", "aot-autograd", "pgo"})
#: Envelope fields each pickle kind carries besides ``data``.
_ENVELOPE_EXTRA: dict[str, tuple[str, ...]] = {
    "fx-graph": ("time_taken_ms",),
    "aot-autograd": ("time_taken_ms",),
    "pgo": (),
}
_PICKLE_PROTO = 0x80


class SerdeError(ValueError):
    """A payload that cannot be turned back into a torch value (counted as a miss)."""


def compact_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def pack(kind: str, value: Any) -> bytes:
    """The bytes objcache stores for torch's ``value`` of ``kind``."""
    if kind in PICKLE_KINDS and _is_envelope(kind, value):
        data = value["data"]
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError, TypeError):
            return compact_json(value)
        if raw[:1] == bytes([_PICKLE_PROTO]):
            return raw
    return compact_json(value)


def unpack(kind: str, payload: bytes) -> tuple[Any, bytes | None]:
    """``(value for torch, raw pickle or None)`` for stored ``payload``.

    The raw pickle is returned alongside so the caller can write it through to torch's
    local cache without decoding base64 again.
    """
    if not payload:
        raise SerdeError("empty payload")
    if kind in PICKLE_KINDS and payload[0] == _PICKLE_PROTO:
        value: dict[str, Any] = {"data": base64.b64encode(payload).decode("ascii")}
        for extra in _ENVELOPE_EXTRA[kind]:
            value[extra] = 0
        return value, payload
    try:
        return json.loads(payload), None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SerdeError(f"{kind}: payload is neither a pickle nor JSON: {exc}") from None


def envelope_bytes(kind: str, payload: bytes) -> bytes:
    """What torch's JSON serde would have sent the backend, rebuilt from a stored payload."""
    value, _ = unpack(kind, payload)
    return json.dumps(value).encode("ascii")


def pack_envelope_bytes(kind: str, data: bytes) -> bytes:
    """:func:`pack` for the JSON bytes torch's serde produces (bytes-level backend use)."""
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SerdeError(f"{kind}: backend data is not JSON") from None
    return pack(kind, value)


def _is_envelope(kind: str, value: Any) -> bool:
    if not isinstance(value, dict) or not isinstance(value.get("data"), str):
        return False
    allowed = {"data", *_ENVELOPE_EXTRA[kind]}
    return set(value) <= allowed
