"""Deadlines for code that calls a backend without a :class:`~objcache.core.tier.Tier` (the
maintenance commands of :mod:`objcache.cli.ops`, manifest listing): every call, and every page of
a listing, ends within the tier's deadline or fails as a transient error, so a black-holed
endpoint costs one deadline and not the SDK's read timeout (see docs/architecture.md)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from objcache.backends.base import Backend, ObjectInfo, PutMode
from objcache.errors import TransientBackendError

T = TypeVar("T")


async def within(call: Awaitable[T], timeout_s: float, what: str, tier: str) -> T:
    """``await call``, or a :class:`TransientBackendError` once ``timeout_s`` has passed."""
    try:
        return await asyncio.wait_for(call, timeout_s)
    except (asyncio.TimeoutError, TimeoutError):
        raise TransientBackendError(
            f"{what}: no answer within {timeout_s * 1000:.0f} ms", tier=tier
        ) from None


async def bounded_pages(
    items: AsyncIterator[T], timeout_s: float, what: str, tier: str
) -> AsyncIterator[T]:
    """``items`` with each next item (so each page fetched) due within ``timeout_s``."""
    iterator = aiter(items)
    while True:
        try:
            item = await within(anext(iterator), timeout_s, what, tier)
        except StopAsyncIteration:
            return
        yield item


class DeadlineBackend(Backend):
    """``inner`` with every call bounded by ``timeout_s``."""

    def __init__(self, inner: Backend, timeout_s: float) -> None:
        super().__init__(inner.spec)
        self.inner = inner
        self.timeout_s = timeout_s

    async def get(self, key: str) -> bytes | None:
        return await within(self.inner.get(key), self.timeout_s, "get", self.name)

    async def get_capped(self, key: str, max_bytes: int) -> bytes | None:
        # the inner backend's own capped read: refused before the body is read
        return await within(self.inner.get_capped(key, max_bytes), self.timeout_s, "get", self.name)

    async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
        return await within(self.inner.put(key, data, mode), self.timeout_s, "put", self.name)

    async def exists(self, key: str) -> bool:
        return await within(self.inner.exists(key), self.timeout_s, "exists", self.name)

    async def delete(self, key: str) -> bool:
        return await within(self.inner.delete(key), self.timeout_s, "delete", self.name)

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        return bounded_pages(self.inner.list(prefix), self.timeout_s, "list", self.name)

    async def close(self) -> None:
        # A client stuck on a dead connection must not hold the command past its deadline.
        with contextlib.suppress(TransientBackendError):
            await within(self.inner.close(), self.timeout_s, "close", self.name)
