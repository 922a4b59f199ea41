"""The async face of the filesystem store ``disk://`` and ``file://`` share: each operation
of :class:`objcache.backends.fs_store.FsStore` is one worker-thread hop, and an ``OSError`` is
typed transient or permanent. The hop goes to a pool of daemon threads: a call stuck in the
kernel never holds up interpreter exit, and a cancelled caller never leaves a half-done
operation behind."""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator, Callable
from typing import ClassVar, ParamSpec, TypeVar

from objcache.backends.base import Backend, ObjectInfo, PutMode, TierSpec
from objcache.backends.fs_folders import check_key
from objcache.backends.fs_store import FsStore
from objcache.backends.options import opt_bool
from objcache.backends.records_contract import RECORD_DEADLINE, RECORD_MAX_BYTES, Versioned
from objcache.backends.shared import to_daemon_thread
from objcache.errors import (
    BackendError,
    ConfigError,
    PermanentBackendError,
    TransientBackendError,
)

P = ParamSpec("P")
T = TypeVar("T")

#: Errors worth retrying: NFS hiccups, interrupted calls, resource contention.
_TRANSIENT = {
    errno.EAGAIN,
    errno.EINTR,
    errno.EIO,
    errno.ETIMEDOUT,
    errno.ESTALE,
    errno.EBUSY,
    errno.ENOLCK,
    errno.ECONNRESET,
    errno.ECONNABORTED,
}


def os_error(exc: OSError, tier: str, what: str) -> BackendError:
    """Type an OSError: transient for NFS/IO hiccups, permanent otherwise."""
    cls = TransientBackendError if exc.errno in _TRANSIENT else PermanentBackendError
    return cls(f"{what}: {exc.strerror or exc}", tier=tier)


class FsBackend(Backend):
    """Async face of :class:`FsStore`: each operation is one worker-thread hop."""

    #: Record hits in the entry's atime.
    touch_on_read: ClassVar[bool] = False

    def __init__(self, spec: TierSpec) -> None:
        super().__init__(spec)
        if not spec.path.startswith("/"):
            raise ConfigError(f"{spec.display}: the store path must be absolute")
        fsync = opt_bool(spec, "fsync")
        self.store = FsStore(
            spec.path, fsync=fsync, touch_on_read=self.touch_on_read, group=self._group(spec)
        )
        self.store.on_undecodable = self.skip_undecodable
        self.closed = False

    def _group(self, spec: TierSpec) -> bool:
        """Whether the store is shared by a group (only ``file://`` can be)."""
        return False

    async def _run(self, what: str, fn: Callable[P, T], *args: P.args, **kw: P.kwargs) -> T:
        try:
            return await to_daemon_thread(fn, *args, **kw)
        except BackendError:
            raise
        except OSError as exc:
            raise os_error(exc, self.name, what) from exc

    async def get(self, key: str) -> bytes | None:
        check_key(key)
        return await self._run(f"get {key}", self.store.read, key)

    async def get_capped(self, key: str, max_bytes: int) -> bytes | None:
        check_key(key)
        return await self._run(f"get {key}", self.store.read, key, max_bytes)

    async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
        check_key(key)
        return await self._run(f"put {key}", self.store.write, key, data, mode)

    async def exists(self, key: str) -> bool:
        check_key(key)
        return await self._run(f"exists {key}", self.store.stat, key) is not None

    async def present(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` the store holds, as :meth:`exists` tells each, in one
        worker-thread hop for all of them (a bulk pull asks about thousands of keys
        before it fetches: docs/architecture.md, "Prefetch manifests"). A key no call can
        address is not held."""
        return await self._run("exists", self._present_sync, keys)

    def _present_sync(self, keys: list[str]) -> set[str]:
        held = set()
        for key in keys:
            try:
                check_key(key)
            except BackendError:
                continue
            if self.store.stat(key) is not None:
                held.add(key)
        return held

    async def delete(self, key: str) -> bool:
        check_key(key)
        return await self._run(f"delete {key}", self.store.delete, key)

    async def close(self) -> None:
        self.closed = True

    async def get_versioned(self, key: str, max_bytes: int = 0) -> Versioned | None:
        check_key(key)
        return await self._run(f"get {key}", self.store.read_versioned, key, max_bytes)

    async def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        check_key(key)
        # the deadline and cap of the record update this write belongs to
        deadline, cap = RECORD_DEADLINE.get(), RECORD_MAX_BYTES.get()
        return await self._run(
            f"put {key}", self.store.write_if_version, key, data, version, deadline, cap
        )

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """Walks one folder per thread hop, descending only where ``prefix`` can match."""
        start = prefix.rpartition("/")[0]
        if start:
            check_key(start)
        stack = [start]
        while stack:
            files, dirs = await self._run(f"list {prefix}", self.store.scan_dir, stack.pop())
            for info in files:
                if info.key.startswith(prefix):
                    yield info
            stack.extend(
                d for d in dirs if (d + "/").startswith(prefix) or prefix.startswith(d + "/")
            )
