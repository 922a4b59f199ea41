"""The storage backend contract.

A backend moves opaque bytes under string keys. It has no policy: no retries, no deadlines,
no circuit breaking, no codec. Those live in :mod:`objcache.core.tier`. Errors are typed:

* a missing key is a value (``None`` / ``False``), never an exception;
* :class:`~objcache.errors.TransientBackendError` for throttling, 5xx, resets, timeouts;
* :class:`~objcache.errors.PermanentBackendError` for everything else.

Keys are ``/``-separated object names produced by :mod:`objcache.entry.layout`; a backend prepends
its own prefix (the path of its URL).
"""

from __future__ import annotations

import abc
import enum
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

# TierSpec and MAX_KEY_BYTES live with the URLs and the object keys; a backend imports them
# from here, with the rest of the contract.
from objcache.config.urls import TierSpec as TierSpec
from objcache.entry.layout import MAX_KEY_BYTES as MAX_KEY_BYTES
from objcache.errors import EntryTooLarge, InvalidKey

log = logging.getLogger("objcache")


class PutMode(enum.Enum):
    """How a put treats an existing object."""

    #: First writer wins: the put is a no-op (returns False) when the key exists.
    CREATE = "create"
    #: Last writer wins.
    OVERWRITE = "overwrite"


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object."""

    key: str
    size: int
    #: Last modification, seconds since the epoch.
    mtime: float


def check_size(size: int, max_bytes: int) -> None:
    """Raise :class:`~objcache.errors.EntryTooLarge` when ``size`` is over a non-zero cap."""
    if max_bytes and size > max_bytes:
        raise EntryTooLarge(f"object too large: over the {max_bytes}-byte cap")


def validate_key(key: str) -> str:
    """Reject keys that could escape a store or that no store accepts."""
    try:
        size = len(key.encode())
    except UnicodeEncodeError:  # a listed file name that is not UTF-8 (os.fsdecode)
        raise InvalidKey(f"key is not UTF-8: {key!r}") from None
    if not key or size > MAX_KEY_BYTES:
        raise InvalidKey(f"key length must be 1..{MAX_KEY_BYTES} bytes, got {size}")
    if "\x00" in key or key.startswith("/") or "\\" in key:
        raise InvalidKey(f"key contains a forbidden character or starts with '/': {key!r}")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidKey(f"key has an empty, '.' or '..' path segment: {key!r}")
    return key


class Backend(abc.ABC):
    """Async bytes store. Instances are shared process-wide; construction must be cheap."""

    #: Stored names that listings skipped because they are not UTF-8: no key names them,
    #: and one of them must not end the listing (docs/architecture.md, "Listings").
    undecodable_names: int = 0
    #: Calls the backend runs at once, where it has a bound of its own (a pool of worker
    #: threads); 0: none. A bulk command queues the calls past it before their deadline
    #: starts, so that waiting for a thread is not counted as a store that does not answer.
    max_in_flight: int = 0

    def __init__(self, spec: TierSpec) -> None:
        self.spec = spec

    def skip_undecodable(self, name: bytes | str) -> None:
        """Count a stored name a listing skips, not being UTF-8; the first one is logged."""
        self.undecodable_names += 1
        if self.undecodable_names == 1:
            log.warning(
                "objcache: %s: listing skips stored names that are not UTF-8 (no key names "
                "them; counted as undecodable_names), the first: %s",
                self.name,
                ascii(name),
            )

    @property
    def name(self) -> str:
        """The tier URL without secrets."""
        return self.spec.display

    @abc.abstractmethod
    async def get(self, key: str) -> bytes | None:
        """The object's bytes, or None if absent."""

    async def get_capped(self, key: str, max_bytes: int) -> bytes | None:
        """:meth:`get`, refusing an object over ``max_bytes`` with
        :class:`~objcache.errors.EntryTooLarge`. Backends whose protocol tells the size
        before the body override this to refuse without transferring it."""
        data = await self.get(key)
        if data is not None:
            check_size(len(data), max_bytes)
        return data

    async def get_into(self, key: str, max_bytes: int, sink: Sink) -> bool:
        """:meth:`get_capped` handed to ``sink``: whether the object was there. The body goes
        to ``sink.piece`` whole, or in pieces as it arrives where ``sink.begin`` (told the
        size, where the protocol tells it first) asks for that; the pieces then add up to
        the whole object or the call raises (docs/architecture.md, "Streamed entries").
        Backends whose protocol streams bodies override this; the others hand them whole."""
        data = await self.get_capped(key, max_bytes)
        if data is None:
            return False
        await sink.begin(len(data))
        await sink.piece(data)
        return True

    @abc.abstractmethod
    async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
        """Store ``data``. Returns False only when ``mode`` is CREATE and the key existed."""

    @abc.abstractmethod
    async def exists(self, key: str) -> bool:
        """Whether the key is present."""

    @abc.abstractmethod
    async def delete(self, key: str) -> bool:
        """Remove the key. Returns whether it existed (best effort for object stores)."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in no particular order, holding
        one page of the store's listing at a time. A name that is not UTF-8 is skipped and
        counted (:meth:`skip_undecodable`). A store listed by cursor (a Redis SCAN) may list
        an object twice when it changes shape during the listing: callers that count or
        delete drop repeats (docs/architecture.md, "Listings")."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients and connections."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class Sink(Protocol):
    """Where :meth:`Backend.get_into` hands an object's body."""

    async def begin(self, size: int | None) -> bool:
        """The body is about to come, of ``size`` bytes where known: whether to hand it in
        pieces as it arrives (True) or whole, in one :meth:`piece` (False)."""
        ...

    async def piece(self, data: bytes) -> None:
        """The next bytes of the body."""
        ...


class PendingWrite(Protocol):
    """An entry being written to a local store in pieces (:meth:`LocalStore.open_write`);
    each method is blocking, for a worker thread, one thread at a time."""

    size: int

    def write(self, data: bytes | memoryview) -> None:
        """Append ``data``."""

    def publish(self, mode: PutMode) -> bool:
        """Make the written bytes the entry (as :meth:`Backend.put` would); whether stored."""

    def discard(self) -> None:
        """Drop what was written; the entry is untouched."""


@runtime_checkable
class Sharded(Protocol):
    """What a backend whose store is several servers offers (``redis://`` on a cluster)."""

    def bound_nodes(self, deadline_s: float) -> None:
        """Told the tier's deadline before the first call: each server's answer is bounded
        below it, so a silent server is its keys' miss within the deadline, not the tier's
        (docs/architecture.md, "Redis Cluster")."""
        ...


@runtime_checkable
class Describes(Protocol):
    """What a backend may tell ``objcache doctor`` beyond its probe (``redis://`` does)."""

    async def describe(self) -> str:
        """One line on the store's shape (server version and role, a cluster's primaries,
        replicas and slots); raises :class:`~objcache.errors.BackendError` when that shape
        cannot serve every key (uncovered slots, a cluster that answers CLUSTERDOWN)."""
        ...


@runtime_checkable
class LocalStore(Protocol):
    """What the local tier offers beyond :class:`Backend` (``disk://`` does).

    :class:`~objcache.core.tiered.TieredCache` uses these when its local tier's backend has them;
    with any other backend the local tier is an ordinary one (no fast path, no quarantine).
    """

    def read_sync(self, key: str) -> bytes | None:
        """Blocking read in the caller's thread: the sync client's local-hit fast path."""

    def note_hit(self, key: str, size: int) -> None:
        """Account a :meth:`read_sync` hit; called on the event loop thread."""

    async def quarantine(self, key: str) -> bool:
        """Move a refused entry aside so it is no longer served; whether one was moved."""

    async def present(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` the store holds (as ``exists`` tells each), in one hop."""

    async def put_then(
        self, key: str, data: bytes, mode: PutMode, then: Callable[[bool], None]
    ) -> bool:
        """:meth:`Backend.put`, then ``then(stored)`` in the same worker-thread hop
        (``then(False)`` when the write raised): a write-through lets its node lease go
        there, saving the waiting processes a hop (docs/architecture.md)."""


@runtime_checkable
class WritesInPieces(Protocol):
    """What a local store offers to write a large entry as it arrives (``disk://`` does):
    one piece at a time, never the whole in memory (docs/architecture.md, "Streamed
    entries")."""

    def open_write(self, key: str) -> PendingWrite:
        """An entry of ``key`` to write in pieces, published whole or not at all; blocking,
        for a worker thread (errors typed as every call's)."""
        ...

    async def publish_then(
        self, pending: PendingWrite, mode: PutMode, then: Callable[[bool], None] | None
    ) -> bool:
        """``pending.publish(mode)``, then ``then(stored)`` in the same worker-thread hop, as
        :meth:`put_then` (and accounted as its write would be)."""
        ...
