"""Crafted malicious entries for signed-entry tests (reusable by the torch-level tests).

``malicious_pickle(marker)`` is a pickle whose ``__reduce__`` creates ``marker`` when it is
unpickled; ``unsigned_entry`` / ``foreign_signed_entry`` wrap it in a well-formed objcache
entry (correct magic, length and BLAKE2b digest) that is unsigned, or signed with a key the
victim does not hold. A cache with a signing key must refuse both before any unpickling.
"""

from __future__ import annotations

import pickle
from pathlib import Path

from objcache.entry.codec import Codec

ATTACKER_KEY = b"attacker-key-not-the-victims-0123456789"


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


def malicious_pickle(marker: Path) -> bytes:
    data = pickle.dumps(_Payload(str(marker)))
    assert b"_Payload" not in data  # unpickling needs nothing but builtins.open
    return data


def unsigned_entry(payload: bytes, okey: str) -> bytes:
    return Codec().encode(payload, okey)


def foreign_signed_entry(payload: bytes, okey: str, key: bytes = ATTACKER_KEY) -> bytes:
    return Codec(signing_keys=(key,)).encode(payload, okey)
