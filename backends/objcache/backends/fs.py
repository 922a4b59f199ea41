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
cancelled caller therefore never leaves a half-done operation behind. The hop goes to a
pool of daemon threads: a call stuck in the kernel never holds up interpreter exit.

Temp files, placeholders and lease files older than an hour (writers that crashed) are
removed when ``list()`` or the disk index scan walks past them, and by an occasional sweep
of the folder a put writes into.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import random
import secrets
import stat
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import ClassVar, ParamSpec, TypeVar

from objcache.backends.base import (
    Backend,
    ObjectInfo,
    PutMode,
    TierSpec,
    check_size,
    validate_key,
)
from objcache.backends.options import opt_bool
from objcache.backends.records_contract import RECORD_DEADLINE, RECORD_MAX_BYTES, Versioned
from objcache.backends.shared import to_daemon_thread
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
#: Lease files of cross-process single-flight (objcache/core/nodelease.py), beside the entry.
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
#: How long a record write waits for the record's lock file outside a record update
#: (inside one, until its deadline); then the write reports a conflict.
LOCK_WAIT_S = 10.0
#: Longest pause between two tries of a busy record lock.
LOCK_POLL_MAX_S = 0.05

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC | _O_NOFOLLOW
#: How every folder below a store's root is opened: never through a symlink.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC | _O_NOFOLLOW
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


#: Prefix of the version of a record too large to read: its file's identity, not its bytes.
_STAT_VERSION = "stat-"


def stat_version(st: os.stat_result) -> str:
    """The version of a record that is not read (over the cap): which file it is."""
    return f"{_STAT_VERSION}{st.st_dev}-{st.st_ino}-{st.st_size}-{st.st_mtime_ns}"


def _lock_until(fd: int, deadline: float) -> bool:
    """Take the exclusive flock of ``fd``, polling (never blocking) until ``deadline``
    (``time.monotonic()``): whoever can open the lock file, even read-only, can hold it
    (docs/security.md, "Records"), and never longer than :data:`LOCK_WAIT_S` (a record
    deadline of 0 means none): it holds a worker thread meanwhile. False when it is still
    busy then."""
    deadline = min(deadline, time.monotonic() + LOCK_WAIT_S)
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, LOCK_POLL_MAX_S)


def _unlink_quietly(name: str, directory: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=directory)


class _OpenAt2:
    """``openat2(dirfd, path, {flags, 0, RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH})`` through
    ctypes (Linux 5.6+): one system call that refuses a symlink at any level of ``path`` and
    any escape from ``dirfd``. ``usable`` turns False for good where the kernel, a seccomp
    filter or the platform says no; callers then walk folder by folder."""

    SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}
    RESOLVE = 0x04 | 0x08  # RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH

    def __init__(self) -> None:
        self.usable = sys.platform == "linux" and os.uname().machine in self.SYS_OPENAT2
        self._call: Callable[[int, bytes, int], int] | None = None

    def _bind(self) -> Callable[[int, bytes, int], int]:
        import ctypes

        class OpenHow(ctypes.Structure):
            _fields_ = [
                ("flags", ctypes.c_uint64),
                ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64),
            ]

        syscall = ctypes.CDLL(None, use_errno=True).syscall
        syscall.restype = ctypes.c_long
        number = self.SYS_OPENAT2[os.uname().machine]
        size = ctypes.sizeof(OpenHow)

        def call(dirfd: int, path: bytes, flags: int) -> int:
            how = OpenHow(flags, 0, self.RESOLVE)
            fd = int(syscall(number, dirfd, path, ctypes.byref(how), size))
            if fd < 0:
                code = ctypes.get_errno()
                raise OSError(code, os.strerror(code))
            return fd

        return call

    def __call__(self, dirfd: int, path: str, flags: int) -> int | None:
        """The new fd; None where openat2 cannot be used here (and from then on)."""
        if self._call is None:
            self._call = self._bind()
        try:
            return self._call(dirfd, os.fsencode(path), flags)
        except OSError as exc:
            if exc.errno in (errno.ENOSYS, errno.EPERM, errno.E2BIG, errno.EINVAL):
                self.usable = False  # an old kernel or a seccomp filter: walk instead
                return None
            raise


_openat2 = _OpenAt2()


class FsStore:
    """Synchronous store logic; every public method is one thread hop's worth of work.

    Every operation walks from the root with directory file descriptors, one ``O_NOFOLLOW``
    open per folder (``dir_fd=``), and acts on names relative to the last one: a folder
    replaced with a symlink at any time, even after this process wrote there, is refused
    (``InvalidKey``), never followed (docs/security.md, "Local filesystem"). The root and
    every folder below it must be owned by this user and writable by nobody else (with
    ``group=True``: owned by anyone, writable by its group, by nobody else); so must an
    entry's file to be read.
    """

    def __init__(self, root: str, *, fsync: bool, touch_on_read: bool, group: bool = False) -> None:
        self.root = os.path.abspath(root)
        self.fsync = fsync
        #: Record reads in the file's atime (the disk tier's LRU clock).
        self.touch_on_read = touch_on_read
        #: Only re-touch an entry whose recorded atime is older than this.
        self.touch_interval_s = 60.0
        #: None until the first CREATE tells whether link() works here.
        self.hardlinks: bool | None = None
        #: A store shared by a group (``file://...?shared=group``): folders 0770, files 0640.
        self.group = group
        self._euid = os.geteuid()
        self.dir_mode = 0o770 if group else 0o700
        self.file_mode = 0o640 if group else 0o600
        #: (st_dev, st_ino) of the root once it passed :meth:`_check_root`.
        self._root_ok: tuple[int, int] | None = None
        self._swept: dict[str, float] = {}

    # --- paths -------------------------------------------------------------------------

    def path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def _distrust(self, st: os.stat_result) -> str | None:
        """Why a folder or file of the store with this stat cannot be trusted, or None:
        owned by another user, or writable by others (or, unless the store is group-shared,
        by its group). Whoever can write a folder can plant entries and swap folders in it
        (docs/security.md, "Local filesystem")."""
        mode = stat.S_IMODE(st.st_mode)
        if not self.group and st.st_uid != self._euid:
            return f"is owned by another user (uid {st.st_uid})"
        if mode & stat.S_IWOTH or (mode & stat.S_IWGRP and not self.group):
            who = "others" if mode & stat.S_IWOTH else "its group"
            return f"is writable by {who} (mode {mode:o})"
        return None

    def _check_entry(self, key: str, st: os.stat_result) -> None:
        """Refuse an entry file :meth:`_distrust` refuses, whatever the folders above it:
        the one-call open (openat2) checks none of them. Every read of an entry's bytes,
        records included, goes through here."""
        why = self._distrust(st)
        if why is not None:
            raise PermanentBackendError(
                f"{self.path(key)} {why}; refusing the entry (see docs/security.md, "
                '"Local filesystem")'
            )

    def _check_root(self, fd: int) -> None:
        """Refuse a root that :meth:`_distrust` refuses."""
        st = os.fstat(fd)
        if self._root_ok == (st.st_dev, st.st_ino):
            return
        why = self._distrust(st)
        if why is not None:
            raise PermanentBackendError(
                f"{self.root} {why}; refusing it as a store (see docs/security.md)"
            )
        self._root_ok = (st.st_dev, st.st_ino)

    def _check_folder(self, fd: int, rel: str) -> None:
        """Refuse the folder ``rel`` below the root, open as ``fd``, as the root is refused:
        an objcache of this user created it 0700, so anything else was made or changed by
        hand, by another user, or by an older objcache under a umask such as 002."""
        why = self._distrust(os.fstat(fd))
        if why is not None:
            raise PermanentBackendError(
                f"{os.path.join(self.root, rel)} {why}; refusing the folder (see "
                'docs/security.md, "Local filesystem")'
            )

    def _open_root(self, create: bool) -> int | None:
        flags = os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC
        try:
            fd = os.open(self.root, flags)
        except FileNotFoundError:
            if not create:
                return None
            os.makedirs(self.root, mode=self.dir_mode, exist_ok=True)
            fd = os.open(self.root, flags)
        try:
            self._check_root(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_dir(self, rel: str, create: bool) -> int | None:
        """An fd of the folder ``rel`` ("" for the root), walked one ``O_NOFOLLOW`` level at
        a time; None when it is absent and not ``create``. A symlink at any level is an
        ``InvalidKey``; a file where a folder should be is ``NotADirectoryError``."""
        fd = self._open_root(create)
        if fd is None or not rel:
            return fd
        walked = ""
        try:
            for segment in rel.split("/"):
                child = self._open_child(fd, segment, create)
                os.close(fd)
                fd = child
                if fd is None:
                    return None
                walked = f"{walked}/{segment}" if walked else segment
                self._check_folder(fd, walked)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        return fd

    def _parent(self, key: str, create: bool = False) -> tuple[int | None, str]:
        """(an fd of the folder holding ``key``, None when absent; the entry's name)."""
        rel, _, name = key.rpartition("/")
        return self._open_dir(rel, create), name

    def _open_child(self, parent: int, name: str, create: bool) -> int | None:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                return None
        except NotADirectoryError:  # a symlink (O_NOFOLLOW), or a file
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise InvalidKey(f"{name!r} is a symlink; refusing to follow it") from None
            if create:
                raise
            return None
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, self.dir_mode, dir_fd=parent)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        if self.group:  # the umask may have taken the group's write bit
            with contextlib.suppress(OSError):
                os.fchmod(fd, self.dir_mode)
        return fd

    # --- single-entry operations ------------------------------------------------------

    def read(self, key: str, max_bytes: int = 0) -> bytes | None:
        opened = self._open_checked(key)
        if opened is None:
            return None
        fd, st = opened
        try:
            check_size(st.st_size, max_bytes)  # before reading a byte (docs/security.md)
            return self._read_open(fd, st)
        finally:
            os.close(fd)

    def _open_checked(self, key: str) -> tuple[int, os.stat_result] | None:
        """The entry ``key`` opened for reading, with its fstat; None when absent or not a
        complete entry (not a regular file, or a placeholder). The caller closes the fd."""
        fd = self._open_entry(key)
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or _is_placeholder(st):
                os.close(fd)
                return None
            # Whatever the folders above it: the one-call read (openat2) checks none of them.
            self._check_entry(key, st)
        except BaseException:
            os.close(fd)
            raise
        return fd, st

    def _read_open(self, fd: int, st: os.stat_result) -> bytes:
        data = _read_all(fd, st.st_size)
        if self.touch_on_read:
            now = time.time_ns()
            if st.st_atime_ns < now - self.touch_interval_s * 1e9:
                with contextlib.suppress(OSError):  # a read-only cache still serves hits
                    os.utime(fd, ns=(now, st.st_mtime_ns))
        return data

    def _open_entry(self, key: str) -> int | None:
        """The entry ``key`` opened for reading without following a symlink at any level;
        None when absent. One ``openat2`` (``RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH``) where
        the kernel has it: the local-hit path (docs/benchmarks.md); else the folder walk."""
        flags = os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW
        if _openat2.usable:
            root = self._open_root(create=False)
            if root is None:
                return None
            try:
                fd = _openat2(root, key, flags)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EXDEV):
                    raise InvalidKey(f"{key!r} goes through a symlink; refusing it") from None
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    return None
                if exc.errno == errno.EACCES:
                    self._placeholder_or_raise(key, exc)
                    return None
                raise
            finally:
                os.close(root)
            if fd is not None:
                return fd
        directory, name = self._parent(key)
        if directory is None:
            return None
        try:
            return os.open(name, flags, dir_fd=directory)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except PermissionError as exc:
            self._placeholder_or_raise(key, exc)
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InvalidKey(f"{key!r} is a symlink; refusing to follow it") from None
            raise
        finally:
            os.close(directory)

    def _placeholder_or_raise(self, key: str, exc: OSError) -> None:
        """An unreadable entry: absent when it is a CREATE placeholder (mode 000) of another
        user (returns), else the error."""
        if self.stat(key) is not None:
            raise exc

    def stat(self, key: str) -> os.stat_result | None:
        """The entry's stat, or None when absent (or only a placeholder/folder)."""
        directory, name = self._parent(key)
        if directory is None:
            return None
        try:
            st = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        finally:
            os.close(directory)
        if not stat.S_ISREG(st.st_mode) or _is_placeholder(st):
            return None
        return st

    def write(self, key: str, data: bytes, mode: PutMode) -> bool:
        rel, _, name = key.rpartition("/")
        directory, tmp, fd = self._open_temp(rel)
        published = False
        try:
            try:
                _write_all(fd, data)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if mode is PutMode.OVERWRITE:
                os.rename(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
                published = True
                return True
            published = self._publish_create(directory, tmp, name)
            return published
        finally:
            if not (published and mode is PutMode.OVERWRITE):
                _unlink_quietly(tmp, directory)
            self._maybe_sweep(rel, directory)
            os.close(directory)

    def _open_temp(self, rel: str) -> tuple[int, str, int]:
        """(folder fd, temp name, temp fd) in the folder ``rel``, created as needed."""
        tmp = f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        for attempt in range(3):
            directory = self._open_dir(rel, create=True)
            assert directory is not None
            try:
                return directory, tmp, os.open(tmp, _CREATE_FLAGS, self.file_mode, dir_fd=directory)
            except FileNotFoundError:
                # A concurrent delete may prune folders; retry a couple of times.
                os.close(directory)
                if attempt == 2:
                    raise
            except BaseException:
                os.close(directory)
                raise
        raise AssertionError("unreachable")

    def _publish_create(self, directory: int, tmp: str, name: str) -> bool:
        at = {"src_dir_fd": directory, "dst_dir_fd": directory}
        if self.hardlinks is not False:
            try:
                os.link(tmp, name, **at, follow_symlinks=False)
                self.hardlinks = True
                return True
            except FileExistsError:
                # NFS may report EEXIST for a retransmitted link that did succeed.
                if os.stat(tmp, dir_fd=directory, follow_symlinks=False).st_nlink == 2:
                    return True
                self._refuse_folder(directory, name)
                return False
            except OSError as exc:
                if self.hardlinks or exc.errno not in _NO_LINKS:
                    raise
                self.hardlinks = False
        try:
            os.close(os.open(name, _CREATE_FLAGS, 0, dir_fd=directory))  # claims the key
        except FileExistsError:
            self._refuse_folder(directory, name)
            return False
        try:
            os.rename(tmp, name, **at)
        except BaseException:
            _unlink_quietly(name, directory)
            raise
        return True

    @staticmethod
    def _refuse_folder(directory: int, name: str) -> None:
        st = os.stat(name, dir_fd=directory, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            raise PermanentBackendError(f"{name!r} is a folder of longer keys")

    # --- node leases (objcache/core/nodelease.py) ---------------------------------------------

    def open_lease(self, key: str) -> tuple[int, str, int]:
        """``(folder fd, name, file fd)`` of the lease file of ``key``, beside the entry:
        reached by the folder walk (folders created as for a put), opened or created
        ``O_NOFOLLOW`` relative to the folder, mode 0600 (0640 group-shared). The caller
        closes both fds."""
        check_key(key)
        directory, name = self._parent(key, create=True)
        assert directory is not None
        lease = LEASE_PREFIX + name
        flags = os.O_RDWR | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW
        try:
            return directory, lease, os.open(lease, flags, self.file_mode, dir_fd=directory)
        except BaseException:
            os.close(directory)
            raise

    # --- records (conditional writes, see backends/records_contract.py) --------------------------

    def read_versioned(self, key: str, max_bytes: int = 0) -> Versioned | None:
        """The entry and its version, or None; an entry over a non-zero ``max_bytes`` is
        not read (its size comes from fstat): its version only, ``too_large``."""
        opened = self._open_checked(key)
        if opened is None:
            return None
        fd, st = opened
        try:
            if max_bytes and st.st_size > max_bytes:
                return Versioned(b"", stat_version(st), too_large=True)
            data = self._read_open(fd, st)
            return Versioned(data, content_version(data))
        finally:
            os.close(fd)

    def _current_version(self, key: str, expected: str, max_bytes: int) -> str | None:
        """The version ``key`` has now, read no further than needed to compare it with
        ``expected``: a digest version was read within ``max_bytes``, so an entry over it
        now is another version, and is not read."""
        opened = self._open_checked(key)
        if opened is None:
            return None
        fd, st = opened
        try:
            if expected.startswith(_STAT_VERSION) or (max_bytes and st.st_size > max_bytes):
                return stat_version(st)
            return content_version(_read_all(fd, st.st_size))
        finally:
            os.close(fd)

    def write_if_version(
        self,
        key: str,
        data: bytes,
        version: str | None,
        deadline: float | None = None,
        max_bytes: int = 0,
    ) -> bool:
        """Replace the entry if it is still at ``version`` (None: absent), under a lock file
        beside it; the new bytes are published by an atomic rename. The lock is polled
        until ``deadline`` (``time.monotonic()``; None: :data:`LOCK_WAIT_S` from now), never
        waited on: a lock still busy then is a conflict. The current entry is read for the
        comparison only within ``max_bytes`` (docs/security.md, "Records")."""
        if deadline is None:
            deadline = time.monotonic() + LOCK_WAIT_S
        directory, name = self._parent(key, create=True)
        assert directory is not None
        try:
            lock = os.open(
                LOCK_PREFIX + name,
                os.O_RDWR | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW,
                self.file_mode,
                dir_fd=directory,
            )
        finally:
            os.close(directory)
        try:
            if not _lock_until(lock, deadline):
                return False
            if version is None:
                if self.stat(key) is not None:
                    return False
            elif self._current_version(key, version, max_bytes) != version:
                return False
            return self.write(key, data, PutMode.OVERWRITE)
        finally:
            os.close(lock)

    def delete(self, key: str) -> bool:
        rel, _, name = key.rpartition("/")
        try:
            directory = self._open_dir(rel, create=False)
        except NotADirectoryError:
            return False
        if directory is None:
            return False
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode):
                return False
            os.unlink(name, dir_fd=directory)
        except (FileNotFoundError, NotADirectoryError):
            return False
        finally:
            os.close(directory)
        return True

    def quarantine(self, key: str) -> bool:
        """Move the entry into the quarantine folder: no longer served nor listed."""
        if self.stat(key) is None:
            return False
        directory, name = self._parent(key)
        if directory is None:
            return False
        try:
            qdir = self._open_dir(QUARANTINE_DIR, create=True)
            assert qdir is not None
            digest = hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
            target = f"{time.time_ns()}-{digest}-{name[:100]}"
            try:
                os.rename(name, target, src_dir_fd=directory, dst_dir_fd=qdir)
            except FileNotFoundError:
                return False
            finally:
                os.close(qdir)
        finally:
            os.close(directory)
        return True

    # --- walking ------------------------------------------------------------------------

    def scan_dir(self, rel: str) -> tuple[list[ObjectInfo], list[str]]:
        """Entries and sub-folders (as keys) of one folder; removes stale temp files."""
        files: list[ObjectInfo] = []
        dirs: list[str] = []
        try:
            directory = self._open_dir(rel, create=False)
        except NotADirectoryError:
            return files, dirs
        if directory is None:
            return files, dirs
        try:
            for name, st in self._entries(directory, time.time()):
                key = f"{rel}/{name}" if rel else name
                if st is None:
                    dirs.append(key)
                else:
                    files.append(ObjectInfo(key=key, size=st.st_size, mtime=st.st_mtime))
        finally:
            os.close(directory)
        return files, dirs

    def scan_all(self) -> dict[str, tuple[int, float]]:
        """Every entry as key -> (size, atime); also expires quarantined entries."""
        out: dict[str, tuple[int, float]] = {}
        now = time.time()
        root = self._open_root(create=False)
        if root is None:
            return out
        stack: list[tuple[str, int]] = [("", root)]
        while stack:
            rel, directory = stack.pop()
            try:
                for name, st in self._entries(directory, now):
                    key = f"{rel}/{name}" if rel else name
                    if st is not None:
                        out[key] = (st.st_size, st.st_atime)
                        continue
                    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                        stack.append((key, os.open(name, _DIR_FLAGS, dir_fd=directory)))
            finally:
                os.close(directory)
        self._expire_quarantine(now)
        return out

    def _entries(self, directory: int, now: float) -> Iterator[tuple[str, os.stat_result | None]]:
        """(name, stat) for entries, (name, None) for sub-folders of the open folder
        ``directory``; skips reserved names and symlinks."""
        with os.scandir(directory) as it:
            for entry in it:
                try:
                    if entry.name.startswith(RESERVED):
                        self._drop_if_stale(directory, entry, now)
                    elif entry.is_dir(follow_symlinks=False):
                        yield entry.name, None
                    elif entry.is_file(follow_symlinks=False):
                        st = entry.stat(follow_symlinks=False)
                        if not _is_placeholder(st):
                            yield entry.name, st
                        elif st.st_mtime < now - STALE_AFTER_S:
                            _unlink_quietly(entry.name, directory)
                except FileNotFoundError:
                    continue  # deleted while we looked

    @staticmethod
    def _drop_if_stale(directory: int, entry: os.DirEntry[str], now: float) -> None:
        if entry.name.startswith((TMP_PREFIX, LEASE_PREFIX)):
            st = entry.stat(follow_symlinks=False)
            if st.st_mtime < now - STALE_AFTER_S:
                _unlink_quietly(entry.name, directory)

    def sweep(self, directory: int) -> None:
        """Remove stale temp files and placeholders from one open folder."""
        for _ in self._entries(directory, time.time()):
            pass

    def _maybe_sweep(self, rel: str, directory: int) -> None:
        if random.randrange(SWEEP_ONE_IN):
            return
        now = time.monotonic()
        if now - self._swept.get(rel, -STALE_AFTER_S) < STALE_AFTER_S:
            return
        if len(self._swept) > 4096:
            self._swept.clear()
        self._swept[rel] = now
        with contextlib.suppress(OSError):  # opportunistic
            self.sweep(directory)

    def _expire_quarantine(self, now: float) -> None:
        try:
            qdir = self._open_dir(QUARANTINE_DIR, create=False)
        except (NotADirectoryError, InvalidKey):
            return
        if qdir is None:
            return
        try:
            with os.scandir(qdir) as it:
                for entry in it:
                    # Named "<time_ns>-...": rename() kept the entry's own, older mtime.
                    stamp = entry.name.split("-", 1)[0]
                    if not stamp.isdigit() or int(stamp) / 1e9 < now - QUARANTINE_TTL_S:
                        _unlink_quietly(entry.name, qdir)
        finally:
            os.close(qdir)


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
