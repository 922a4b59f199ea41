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

A record is capped like an entry (docs/security.md, "Records"): with ``max_bytes``,
``get_versioned`` learns the object's size before its body (stat, ranged GET, blob
metadata, ``STRLEN``) and answers an oversized one with its version only
(``too_large``), so the next write replaces it instead of reading it or failing on it.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

#: When the record update running in this context gives up (``time.monotonic()``): a
#: backend call that waits on something other than the network (the lock file of file://
#: and disk://) waits no longer, and reports a conflict. None: no update is running.
RECORD_DEADLINE: ContextVar[float | None] = ContextVar("objcache_record_deadline", default=None)
#: The ``max_bytes`` of the record update running in this context (0: none): a backend that
#: reads the current object again to compare versions (file://, disk://) reads no more.
RECORD_MAX_BYTES: ContextVar[int] = ContextVar("objcache_record_max_bytes", default=0)


@dataclass(frozen=True)
class Versioned:
    """An object's bytes and the version token to pass to ``put_if_version``."""

    data: bytes
    version: str
    #: Over the ``max_bytes`` asked for: ``data`` is empty, ``version`` replaces it.
    too_large: bool = False


@runtime_checkable
class RecordBackend(Protocol):
    async def get_versioned(self, key: str, max_bytes: int = 0) -> Versioned | None:
        """The object and its version, or None if absent; an object over a non-zero
        ``max_bytes`` is not read: its version, with ``too_large`` set."""
        ...

    async def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        """Store ``data`` if the object is at ``version`` (None: absent); False otherwise."""
        ...
