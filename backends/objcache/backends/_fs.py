"""Filesystem object store shared by ``disk://`` and ``file://``.

Layout: the key ``a/b/c`` is the file ``<root>/a/b/c``. Every name objcache itself creates
starts with :data:`RESERVED` (temp files, the quarantine folder), so keys may not contain
a path segment starting with it; listings skip such names.

Writes are atomic: the data goes to a uniquely named temp file in the destination folder,
is optionally fsynced, closed (NFS reports write errors at close), then published:

* ``OVERWRITE``: ``os.replace(tmp, final)``; readers see the old or the new file.
* ``CREATE``: ``os.link(tmp, final)``, which fails with EEXIST when another writer (in any
  process or on any NFS client) got there first: first writer wins. Where hard links are
  unsupported (EPERM/ENOTSUP from link, e.g. FUSE stores), a zero-length, mode-000
  placeholder is created at ``final`` with O_EXCL and then replaced by the temp file;
  readers treat such a placeholder as absent.

Any error (ENOSPC included) removes the temp file, so no partial entry is ever visible and
the previous entry is untouched. Each operation is one plain synchronous function that the
async layer runs in ONE thread hop (see ``bench/fs_io.py`` for why not aiofiles); a
cancelled caller therefore never leaves a half-done operation behind.

Temp files, placeholders and lease files older than an hour (writers that crashed) are
removed when ``list()`` or the disk index scan walks past them, and by an occasional sweep
of the folder a put writes into.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import os
import random
import secrets
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import ClassVar, ParamSpec, TypeVar

from objcache.backends._opts import opt_bool
from objcache.backends._records import Versioned
from objcache.backends.base import (
    Backend,
    ObjectInfo,
    PutMode,
    TierSpec,
    check_size,
    validate_key,
)
from objcache.errors import (
    BackendError,
    ConfigError,
    InvalidKey,
    PermanentBackendError,
    TransientBackendError,
)

P = ParamSpec("P")
T = TypeVar("T")

#: Prefix of every name objcache creates inside a store; no key segment may start with it.
RESERVED = ".objcache-"
TMP_PREFIX = RESERVED + "tmp-"
#: Lease files of cross-process single-flight (objcache/nodelease.py), beside the entry.
LEASE_PREFIX = RESERVED + "lease-"
#: Lock files of record writes, beside the record; kept (removing one could let two
#: writers hold "the" lock on different files).
LOCK_PREFIX = RESERVED + "lock-"
QUARANTINE_DIR = RESERVED + "quarantine"
#: Temp files and placeholders older than this belong to a crashed writer.
STALE_AFTER_S = 3600.0
#: Quarantined entries are deleted after this long (kept a while for post-mortems).
QUARANTINE_TTL_S = 24 * 3600.0
#: Longest path segment (NAME_MAX on every common filesystem).
MAX_SEGMENT_BYTES = 255
#: One put in this many sweeps its folder for stale temp files (at most hourly per folder).
SWEEP_ONE_IN = 32

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC
#: link() errors that mean "this filesystem has no hard links".
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS}
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


def check_key(key: str) -> str:
    """:func:`validate_key` plus the filesystem's own limits. Touches no storage."""
    validate_key(key)
    for segment in key.split("/"):
        if segment.startswith(RESERVED):
            raise InvalidKey(f"key segment {segment!r} uses the reserved prefix {RESERVED!r}")
        if len(segment.encode()) > MAX_SEGMENT_BYTES:
            raise InvalidKey(f"key segment longer than {MAX_SEGMENT_BYTES} bytes: {key!r}")
    return key


def os_error(exc: OSError, tier: str, what: str) -> BackendError:
    """Type an OSError: transient for NFS/IO hiccups, permanent otherwise."""
    cls = TransientBackendError if exc.errno in _TRANSIENT else PermanentBackendError
    return cls(f"{what}: {exc.strerror or exc}", tier=tier)


def _write_all(fd: int, data: bytes) -> None:
    """The low-level write loop (tests replace it to simulate a full disk mid-write)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_all(fd: int, size: int) -> bytes:
    data = os.read(fd, size) if size else b""
    if len(data) == size:  # the common case: one read
        return data
    chunks, remaining = [data], size - len(data)
    while remaining > 0:
        chunk = os.read(fd, remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _is_placeholder(st: os.stat_result) -> bool:
    return stat.S_IMODE(st.st_mode) == 0 and st.st_size == 0


def content_version(data: bytes) -> str:
    """A record's version in a filesystem store: BLAKE2b-128 of its bytes."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class FsStore:
    """Synchronous store logic; every public method is one thread hop's worth of work."""

    def __init__(self, root: str, *, fsync: bool, touch_on_read: bool) -> None:
        self.root = os.path.abspath(root)
        self.fsync = fsync
        #: Record reads in the file's atime (the disk tier's LRU clock).
        self.touch_on_read = touch_on_read
        #: Only re-touch an entry whose recorded atime is older than this.
        self.touch_interval_s = 60.0
        #: None until the first CREATE tells whether link() works here.
        self.hardlinks: bool | None = None
        self._safe_dirs: set[str] = set()
        self._swept: dict[str, float] = {}

    # --- paths -------------------------------------------------------------------------

    def path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def key_of(self, path: str) -> str:
        return os.path.relpath(path, self.root).replace(os.sep, "/")

    def _check_dir(self, directory: str) -> None:
        """Refuse a folder that resolves (through symlinks) outside the root."""
        if directory in self._safe_dirs:
            return
        root = os.path.realpath(self.root)
        real = os.path.realpath(directory)
        if real != root and not real.startswith(root + os.sep):
            raise InvalidKey(f"{self.key_of(directory)!r} resolves outside the store")
        if len(self._safe_dirs) > 4096:
            self._safe_dirs.clear()
        self._safe_dirs.add(directory)

    # --- single-entry operations ------------------------------------------------------

    def read(self, key: str, max_bytes: int = 0) -> bytes | None:
        path = self.path(key)
        self._check_dir(os.path.dirname(path))
        try:
            fd = os.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except PermissionError:
            if self.stat(key) is None:  # a CREATE placeholder (mode 000) of another user
                return None
            raise
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InvalidKey(f"{key!r} is a symlink; refusing to follow it") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or _is_placeholder(st):
                return None
            check_size(st.st_size, max_bytes)  # before reading a byte (docs/security.md)
            data = _read_all(fd, st.st_size)
            if self.touch_on_read:
                now = time.time_ns()
                if st.st_atime_ns < now - self.touch_interval_s * 1e9:
                    with contextlib.suppress(OSError):  # a read-only cache still serves hits
                        os.utime(fd, ns=(now, st.st_mtime_ns))
            return data
        finally:
            os.close(fd)

    def stat(self, key: str) -> os.stat_result | None:
        """The entry's stat, or None when absent (or only a placeholder/folder)."""
        path = self.path(key)
        self._check_dir(os.path.dirname(path))
        try:
            st = os.stat(path, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(st.st_mode) or _is_placeholder(st):
            return None
        return st

    def write(self, key: str, data: bytes, mode: PutMode) -> bool:
        path = self.path(key)
        directory = os.path.dirname(path)
        self._check_dir(directory)
        tmp, fd = self._open_temp(directory)
        published = False
        try:
            try:
                _write_all(fd, data)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if mode is PutMode.OVERWRITE:
                os.replace(tmp, path)
                published = True
                return True
            published = self._publish_create(tmp, path)
            return published
        finally:
            if not (published and mode is PutMode.OVERWRITE):
                _unlink_quietly(tmp)
            self._maybe_sweep(directory)

    def _open_temp(self, directory: str) -> tuple[str, int]:
        tmp = os.path.join(directory, f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
        for _ in range(3):
            try:
                return tmp, os.open(tmp, _CREATE_FLAGS, 0o666)
            except FileNotFoundError:
                # A concurrent delete may prune folders; retry a couple of times.
                os.makedirs(directory, exist_ok=True)
        return tmp, os.open(tmp, _CREATE_FLAGS, 0o666)

    def _publish_create(self, tmp: str, path: str) -> bool:
        if self.hardlinks is not False:
            try:
                os.link(tmp, path)
                self.hardlinks = True
                return True
            except FileExistsError:
                # NFS may report EEXIST for a retransmitted link that did succeed.
                if os.stat(tmp).st_nlink == 2:
                    return True
                self._refuse_folder(path)
                return False
            except OSError as exc:
                if self.hardlinks or exc.errno not in _NO_LINKS:
                    raise
                self.hardlinks = False
        try:
            os.close(os.open(path, _CREATE_FLAGS, 0))  # the placeholder claims the key
        except FileExistsError:
            self._refuse_folder(path)
            return False
        try:
            os.replace(tmp, path)
        except BaseException:
            _unlink_quietly(path)
            raise
        return True

    def _refuse_folder(self, path: str) -> None:
        if os.path.isdir(path):
            raise PermanentBackendError(f"{self.key_of(path)!r} is a folder of longer keys")

    # --- records (conditional writes, see backends/_records.py) --------------------------

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The entry and its version (a digest of its bytes), or None."""
        data = self.read(key)
        return None if data is None else (data, content_version(data))

    def write_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        """Replace the entry if it is still at ``version`` (None: absent), under a lock file
        beside it; the new bytes are published by an atomic rename."""
        path = self.path(key)
        directory, name = os.path.split(path)
        self._check_dir(directory)
        os.makedirs(directory, exist_ok=True)
        lock = os.open(
            os.path.join(directory, LOCK_PREFIX + name),
            os.O_RDWR | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW,
            0o666,
        )
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = self.read(key)
            if (None if current is None else content_version(current)) != version:
                return False
            return self.write(key, data, PutMode.OVERWRITE)
        finally:
            os.close(lock)

    def delete(self, key: str) -> bool:
        path = self.path(key)
        self._check_dir(os.path.dirname(path))
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                return False
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def quarantine(self, key: str) -> bool:
        """Move the entry into the quarantine folder: no longer served nor listed."""
        path = self.path(key)
        self._check_dir(os.path.dirname(path))
        if self.stat(key) is None:
            return False
        qdir = os.path.join(self.root, QUARANTINE_DIR)
        os.makedirs(qdir, exist_ok=True)
        digest = hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
        tail = key.rsplit("/", 1)[-1][:100]
        try:
            os.rename(path, os.path.join(qdir, f"{time.time_ns()}-{digest}-{tail}"))
        except FileNotFoundError:
            return False
        return True

    # --- walking ------------------------------------------------------------------------

    def scan_dir(self, rel: str) -> tuple[list[ObjectInfo], list[str]]:
        """Entries and sub-folders (as keys) of one folder; removes stale temp files."""
        directory = self.path(rel) if rel else self.root
        self._check_dir(directory)
        files: list[ObjectInfo] = []
        dirs: list[str] = []
        for entry, st in self._entries(directory, time.time()):
            key = f"{rel}/{entry.name}" if rel else entry.name
            if st is None:
                dirs.append(key)
            else:
                files.append(ObjectInfo(key=key, size=st.st_size, mtime=st.st_mtime))
        return files, dirs

    def scan_all(self) -> dict[str, tuple[int, float]]:
        """Every entry as key -> (size, atime); also expires quarantined entries."""
        out: dict[str, tuple[int, float]] = {}
        now = time.time()
        stack = [self.root]
        while stack:
            directory = stack.pop()
            for entry, st in self._entries(directory, now):
                if st is None:
                    stack.append(entry.path)
                else:
                    out[self.key_of(entry.path)] = (st.st_size, st.st_atime)
        self._expire_quarantine(now)
        return out

    def _entries(
        self, directory: str, now: float
    ) -> Iterator[tuple[os.DirEntry[str], os.stat_result | None]]:
        """(entry, stat) for entries, (entry, None) for sub-folders; skips reserved names."""
        try:
            it = os.scandir(directory)
        except (FileNotFoundError, NotADirectoryError):
            return
        with it:
            for entry in it:
                try:
                    if entry.name.startswith(RESERVED):
                        self._drop_if_stale(entry, now)
                    elif entry.is_dir(follow_symlinks=False):
                        yield entry, None
                    elif entry.is_file(follow_symlinks=False):
                        st = entry.stat(follow_symlinks=False)
                        if not _is_placeholder(st):
                            yield entry, st
                        elif st.st_mtime < now - STALE_AFTER_S:
                            _unlink_quietly(entry.path)
                except FileNotFoundError:
                    continue  # deleted while we looked

    @staticmethod
    def _drop_if_stale(entry: os.DirEntry[str], now: float) -> None:
        if entry.name.startswith((TMP_PREFIX, LEASE_PREFIX)):
            st = entry.stat(follow_symlinks=False)
            if st.st_mtime < now - STALE_AFTER_S:
                _unlink_quietly(entry.path)

    def sweep(self, directory: str) -> None:
        """Remove stale temp files and placeholders from one folder."""
        for _ in self._entries(directory, time.time()):
            pass

    def _maybe_sweep(self, directory: str) -> None:
        if random.randrange(SWEEP_ONE_IN):
            return
        now = time.monotonic()
        if now - self._swept.get(directory, -STALE_AFTER_S) < STALE_AFTER_S:
            return
        if len(self._swept) > 4096:
            self._swept.clear()
        self._swept[directory] = now
        with contextlib.suppress(OSError):  # opportunistic
            self.sweep(directory)

    def _expire_quarantine(self, now: float) -> None:
        qdir = os.path.join(self.root, QUARANTINE_DIR)
        try:
            with os.scandir(qdir) as it:
                for entry in it:
                    # Named "<time_ns>-...": rename() kept the entry's own, older mtime.
                    stamp = entry.name.split("-", 1)[0]
                    if not stamp.isdigit() or int(stamp) / 1e9 < now - QUARANTINE_TTL_S:
                        _unlink_quietly(entry.path)
        except (FileNotFoundError, NotADirectoryError):
            pass


class FsBackend(Backend):
    """Async face of :class:`FsStore`: each operation is one worker-thread hop."""

    #: Record hits in the entry's atime.
    touch_on_read: ClassVar[bool] = False

    def __init__(self, spec: TierSpec) -> None:
        super().__init__(spec)
        if not spec.path.startswith("/"):
            raise ConfigError(f"{spec.display}: the store path must be absolute")
        fsync = opt_bool(spec, "fsync")
        self.store = FsStore(spec.path, fsync=fsync, touch_on_read=self.touch_on_read)
        self.closed = False

    async def _run(self, what: str, fn: Callable[P, T], *args: P.args, **kw: P.kwargs) -> T:
        try:
            return await asyncio.to_thread(fn, *args, **kw)
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

    async def delete(self, key: str) -> bool:
        check_key(key)
        return await self._run(f"delete {key}", self.store.delete, key)

    async def close(self) -> None:
        self.closed = True

    async def get_versioned(self, key: str) -> Versioned | None:
        check_key(key)
        found = await self._run(f"get {key}", self.store.read_versioned, key)
        return None if found is None else Versioned(*found)

    async def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        check_key(key)
        return await self._run(f"put {key}", self.store.write_if_version, key, data, version)

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
