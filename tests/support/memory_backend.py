"""An in-process backend with fault knobs, for testing the *policy* layers (TieredCache,
Tier, write-behind) deterministically. Backends themselves are tested against real servers
by the contract suite; this is never a substitute for those."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

from objcache.backends.base import Backend, ObjectInfo, PutMode, TierSpec, validate_key
from objcache.errors import PartialOutage, PermanentBackendError, TransientBackendError


class MemoryBackend(Backend):
    def __init__(self, name: str = "mem://test") -> None:
        super().__init__(TierSpec(url=name, scheme="mem", location="", path="", options={}))
        self.data: dict[str, bytes] = {}
        self.calls: Counter[str] = Counter()
        self.delay_s = 0.0
        #: When set, every call waits for this event first: a slow peer whose reply the
        #: test lets through once the other side is where the test needs it.
        self.hold_until: asyncio.Event | None = None
        #: "transient", "permanent", "hang" or "" (healthy)
        self.fault = ""

    async def _enter(self, op: str) -> None:
        self.calls[op] += 1
        if self.hold_until is not None:
            await self.hold_until.wait()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fault == "hang":
            await asyncio.sleep(3600)
        if self.fault == "transient":
            raise TransientBackendError("injected transient fault", tier=self.name)
        if self.fault == "partial":
            raise PartialOutage("injected: one node down", tier=self.name)
        if self.fault == "permanent":
            raise PermanentBackendError("injected permanent fault", tier=self.name)

    async def get(self, key: str) -> bytes | None:
        validate_key(key)
        await self._enter("get")
        return self.data.get(key)

    async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
        validate_key(key)
        await self._enter("put")
        if mode is PutMode.CREATE and key in self.data:
            return False
        self.data[key] = bytes(data)
        return True

    async def exists(self, key: str) -> bool:
        await self._enter("exists")
        return key in self.data

    async def delete(self, key: str) -> bool:
        await self._enter("delete")
        return self.data.pop(key, None) is not None

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        await self._enter("list")
        now = time.time()
        for k, v in list(self.data.items()):
            if k.startswith(prefix):
                yield ObjectInfo(k, len(v), now)
