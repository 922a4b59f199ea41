"""The record contract: conditional writes for values that are updated in place.

Immutable entries are written once (``PutMode.CREATE``). A *record* (a PGO profile, a
pointer) is read, merged and written back; two writers must not undo each other, so the
write is conditional on the version that was read (docs/architecture.md, "Records"):

* :meth:`RecordBackend.get_versioned` returns the bytes and an opaque version token;
* :meth:`RecordBackend.put_if_version` stores new bytes only if the object is still at that
  version (``None``: only if it does not exist), and returns False on a conflict.

Every backend implements both with its store's own compare-and-set: S3 ``If-Match`` on the
ETag and ``If-None-Match: *``; GCS ``if_generation_match``; Redis a Lua compare-and-set on
the value's SHA-1; file:// and the local disk a lock file and an atomic rename.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Versioned:
    """An object's bytes and the version token to pass to ``put_if_version``."""

    data: bytes
    version: str


@runtime_checkable
class RecordBackend(Protocol):
    async def get_versioned(self, key: str) -> Versioned | None:
        """The object and its version, or None if absent."""
        ...

    async def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        """Store ``data`` if the object is at ``version`` (None: absent); False otherwise."""
        ...
