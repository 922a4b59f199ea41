"""The filesystem store ``disk://`` and ``file://`` share: synchronous, one thread hop's
worth of work per public method (the async face is :mod:`objcache.backends.fs`).

Keys, reserved names and the folder walk (never through a symlink, owner and mode checked)
are :mod:`objcache.backends.fs_folders`; an entry's file is opened by the same rules, with one
``openat2`` where the kernel has it, and read no further than its cap.

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

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator

from objcache.backends.base import ObjectInfo, PutMode, check_size
from objcache.backends.fs_folders import LEASE_PREFIX, RESERVED, FsFolders
from objcache.backends.fs_openat2 import OpenAt2
from objcache.backends.records_contract import Versioned
from objcache.backends.shared import RANDOM
from objcache.config.files import CREATE_FLAGS, DIR_FLAGS, O_CLOEXEC, O_NOFOLLOW
from objcache.config.files import write_all as _write_all  # tests replace it
from objcache.errors import InvalidKey, PermanentBackendError

TMP_PREFIX = RESERVED + "tmp-"
#: Lock files of record writes, beside the record; kept (removing one could let two
#: writers hold "the" lock on different files).
LOCK_PREFIX = RESERVED + "lock-"
QUARANTINE_DIR = RESERVED + "quarantine"
#: Temp files and placeholders older than this belong to a crashed writer.
STALE_AFTER_S = 3600.0
#: Quarantined entries are deleted after this long (kept a while for post-mortems).
QUARANTINE_TTL_S = 24 * 3600.0
#: One put in this many sweeps its folder for stale temp files (at most hourly per folder).
SWEEP_ONE_IN = 32
#: How long a record write waits for the record's lock file outside a record update
#: (inside one, until its deadline); then the write reports a conflict.
LOCK_WAIT_S = 10.0
#: Longest pause between two tries of a busy record lock.
LOCK_POLL_MAX_S = 0.05

#: link() errors that mean "this filesystem has no hard links".
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS}


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


def _undecodable(name: str) -> bool:
    """Whether a name read from the filesystem is not UTF-8 (Python hands its bytes over as
    surrogates): no key names it (docs/architecture.md, "Listings")."""
    if name.isascii():
        return False
    try:
        name.encode()
    except UnicodeEncodeError:
        return True
    return False


def _ignore(name: str) -> None:
    """The default of :attr:`FsStore.on_undecodable`."""


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


class PendingWrite:
    """An entry being written into its temp file, in pieces (:meth:`write`, in order), then
    :meth:`publish`-ed under its name as :meth:`FsStore.write` publishes, or :meth:`discard`-ed:
    either way the temp file and the folder's descriptor are let go of, so nothing partial is
    ever visible (a large entry received from a remote tier is written as it arrives,
    docs/architecture.md, "Streamed entries"). One thread at a time."""

    def __init__(self, store: FsStore, rel: str, name: str, directory: int, tmp: str, fd: int):
        self._store, self._rel, self._name = store, rel, name
        self.key = f"{rel}/{name}" if rel else name
        self._directory, self._tmp, self._fd = directory, tmp, fd
        self.size = 0

    def write(self, data: bytes | memoryview) -> None:
        _write_all(self._fd, data)
        self.size += len(data)

    def publish(self, mode: PutMode) -> bool:
        """Whether the entry is now stored under its name (CREATE: False when another
        writer got there first)."""
        directory, tmp, name = self._directory, self._tmp, self._name
        published = False
        try:
            try:
                if self._store.fsync:
                    os.fsync(self._fd)
            finally:
                self._close_file()
            if mode is PutMode.OVERWRITE:
                os.rename(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
                published = True
                return True
            published = self._store._publish_create(directory, tmp, name)
            return published
        finally:
            if not (published and mode is PutMode.OVERWRITE):
                _unlink_quietly(tmp, directory)
            self._store._maybe_sweep(self._rel, directory)
            self._close_folder()

    def discard(self) -> None:
        """Drop the temp file (a piece failed, or what arrived did not verify)."""
        try:
            self._close_file()
            _unlink_quietly(self._tmp, self._directory)
        finally:
            self._close_folder()

    def _close_file(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def _close_folder(self) -> None:
        directory, self._directory = self._directory, -1
        if directory >= 0:
            os.close(directory)


#: The one ``openat2`` of this process: where it turns out unusable, every read walks.
_openat2 = OpenAt2()


class FsStore(FsFolders):
    """Synchronous store logic; every public method is one thread hop's worth of work.

    Every operation walks from the root as :class:`FsFolders` does (never through a symlink,
    every folder's owner and mode checked; docs/security.md, "Local filesystem"); so must
    an entry's file pass those checks to be read.
    """

    def __init__(self, root: str, *, fsync: bool, touch_on_read: bool, group: bool = False) -> None:
        super().__init__(root, group=group)
        self.fsync = fsync
        #: Record reads in the file's atime (the disk tier's LRU clock).
        self.touch_on_read = touch_on_read
        #: Only re-touch an entry whose recorded atime is older than this.
        self.touch_interval_s = 60.0
        #: None until the first CREATE tells whether link() works here.
        self.hardlinks: bool | None = None
        #: Told each name a walk skips, not being UTF-8 (the backend counts them).
        self.on_undecodable: Callable[[str], None] = _ignore
        self._swept: dict[str, float] = {}

    # --- checks ------------------------------------------------------------------------

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
        flags = os.O_RDONLY | O_CLOEXEC | O_NOFOLLOW
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
        pending = self.open_write(key)
        try:
            pending.write(data)
        except BaseException:
            pending.discard()
            raise
        return pending.publish(mode)

    def open_write(self, key: str) -> PendingWrite:
        """An entry of ``key`` written in pieces (:class:`PendingWrite`): its temp file, in
        the key's folder (created as needed)."""
        rel, _, name = key.rpartition("/")
        directory, tmp, fd = self._open_temp(rel)
        return PendingWrite(self, rel, name, directory, tmp, fd)

    def _open_temp(self, rel: str) -> tuple[int, str, int]:
        """(folder fd, temp name, temp fd) in the folder ``rel``, created as needed."""
        tmp = f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        for attempt in range(3):
            directory = self._open_dir(rel, create=True)
            assert directory is not None
            try:
                return directory, tmp, os.open(tmp, CREATE_FLAGS, self.file_mode, dir_fd=directory)
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
            os.close(os.open(name, CREATE_FLAGS, 0, dir_fd=directory))  # claims the key
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
                os.O_RDWR | os.O_CREAT | O_CLOEXEC | O_NOFOLLOW,
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
                if _undecodable(name):
                    self.on_undecodable(key)  # a folder's whole subtree is left out too
                elif st is None:
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
                    if _undecodable(name):
                        self.on_undecodable(key)
                        continue
                    if st is not None:
                        out[key] = (st.st_size, st.st_atime)
                        continue
                    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                        stack.append((key, os.open(name, DIR_FLAGS, dir_fd=directory)))
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
        if RANDOM.randrange(SWEEP_ONE_IN):
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
