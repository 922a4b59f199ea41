"""Tiers and caches for the tests of objcache/core/: memory tiers (tests/support/memory_backend.py),
a disk tier, a cache over them, entries seeded under a namespace, a record backend in memory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from objcache.backends.disk.store import DiskBackend
from objcache.backends.records_contract import Versioned
from objcache.config.urls import parse_tier_url
from objcache.core.fetch_once.nodelease import NodeLeases
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.tier import Tier, TierFlags
from objcache.core.tiered import TieredCache
from objcache.entry.codec import Codec
from objcache.entry.layout import Namespace
from tests.support.memory_backend import MemoryBackend

NS = Namespace("testenv")
CODEC = Codec()


def tier(name: str, *, timeout: float = 30.0, flags: TierFlags | None = None) -> Tier:
    """A memory tier; its deadline is one no busy machine reaches unless a test says so."""
    policy = RetryPolicy(timeout_s=timeout, retries=1, backoff_initial_s=0.001)
    return Tier(MemoryBackend(name), policy, CircuitBreaker(3, 60), flags or TierFlags())


def mem(t: Tier) -> MemoryBackend:
    assert isinstance(t.backend, MemoryBackend)
    return t.backend


def disk_tier(root: Path, query: str = "", *, timeout: float = 30.0) -> Tier:
    """A disk:// tier on ``root`` (``query`` appended to its URL), no retries."""
    return Tier(
        DiskBackend(parse_tier_url(f"disk://{root}{query}")),
        RetryPolicy(timeout_s=timeout, retries=0),
        CircuitBreaker(5, 60),
    )


def make(
    *remotes: Tier, read_only: bool = False, write_behind_max_bytes: int = 256 << 20
) -> tuple[TieredCache, Tier]:
    """A cache over a memory local tier and ``remotes`` (the write-behind bound: the cache's
    default unless a test says so); returns the cache and its local tier."""
    local = tier("mem://local")
    cache = TieredCache(
        local,
        list(remotes),
        CODEC,
        NS,
        read_only=read_only,
        env_fields={"torch": "t"},
        write_behind_max_bytes=write_behind_max_bytes,
    )
    return cache, local


def seed(t: Tier, key: str, payload: bytes, kind: str = "fx-graph") -> str:
    okey = NS.object_key(kind, key)
    mem(t).data[okey] = CODEC.encode(payload, okey)
    return okey


class Versions(MemoryBackend):
    """A record backend in memory: every conditional write meets ``conflicts`` other
    writers first (each bumps the version), and ``fault`` applies as to every call."""

    def __init__(self, name: str, conflicts: int = 0) -> None:
        super().__init__(name)
        self.conflicts = conflicts
        self.version = 0

    async def get_versioned(self, key: str) -> Versioned | None:
        await self._enter("get_versioned")
        data = self.data.get(key)
        return None if data is None else Versioned(data, str(self.version))

    async def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        await self._enter("put_if_version")
        if self.conflicts:
            self.conflicts -= 1
            self.version += 1
            self.data[key] = self.data.get(key, b"") + b"+"
            return False
        if version != (None if key not in self.data else str(self.version)):
            return False
        self.version += 1
        self.data[key] = data
        return True


def appending(item: bytes) -> Callable[[bytes | None], bytes | None]:
    """A record change adding ``item`` to a comma-separated set (None: already there)."""

    def change(current: bytes | None) -> bytes | None:
        items = [i for i in (current or b"").split(b",") if i]
        return None if item in items else b",".join([*items, item])

    return change


def leased_cache(root: Path, *remotes: Tier, local: Tier | None = None) -> TieredCache:
    """A cache whose disk local tier on ``root`` is shared with other processes' leases."""
    local = local or disk_tier(root, "?max_bytes=1M")
    return TieredCache(local, list(remotes), CODEC, NS, leases=NodeLeases(str(root), hold_s=30))
