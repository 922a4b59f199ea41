"""A filesystem store's root and the folders below it, walked without following a symlink.

Layout: the key ``a/b/c`` is the file ``<root>/a/b/c``. Every name objcache itself creates
starts with :data:`RESERVED` (temp files, lock and lease files, the quarantine folder), so
keys may not contain a path segment starting with it (:func:`check_key`); listings skip such
names.

:class:`FsFolders` is the hardened walk the filesystem store (:mod:`objcache.backends.fs_store`)
is built on and the core's lease files (objcache/core/fetch_once/nodelease.py) use without the
store:
every folder is opened relative to its parent's fd, ``O_NOFOLLOW``, and refused unless its
owner and mode pass (docs/security.md, "Local filesystem"; docs/architecture.md, "One
remote fetch per node").
"""

from __future__ import annotations

import os

from objcache.backends.base import validate_key
from objcache.config.files import O_CLOEXEC, O_NOFOLLOW, distrust, open_folder
from objcache.errors import InvalidKey, PermanentBackendError, UnsafeFolder

#: Prefix of every name objcache creates inside a store; no key segment may start with it.
RESERVED = ".objcache-"
#: Lease files of cross-process single-flight (objcache/core/fetch_once/nodelease.py), beside
#: the entry.
LEASE_PREFIX = RESERVED + "lease-"
#: Longest path segment (NAME_MAX on every common filesystem).
MAX_SEGMENT_BYTES = 255


def check_key(key: str) -> str:
    """:func:`validate_key` plus the filesystem's own limits. Touches no storage."""
    validate_key(key)
    for segment in key.split("/"):
        if segment.startswith(RESERVED):
            raise InvalidKey(f"key segment {segment!r} uses the reserved prefix {RESERVED!r}")
        if len(segment.encode()) > MAX_SEGMENT_BYTES:
            raise InvalidKey(f"key segment longer than {MAX_SEGMENT_BYTES} bytes: {key!r}")
    return key


class FsFolders:
    """The folders of a store rooted at ``root``, each reached from the root with directory
    file descriptors, one ``O_NOFOLLOW`` open per folder (``dir_fd=``): a folder replaced
    with a symlink at any time, even after this process wrote there, is refused
    (``InvalidKey``), never followed (docs/security.md, "Local filesystem"). The root and
    every folder below it must be owned by this user and writable by nobody else (with
    ``group=True``: owned by anyone, writable by its group, by nobody else).
    """

    def __init__(self, root: str, *, group: bool = False) -> None:
        self.root = os.path.abspath(root)
        #: A store shared by a group (``file://...?shared=group``): folders 0770, files 0640.
        self.group = group
        self._euid = os.geteuid()
        self.dir_mode = 0o770 if group else 0o700
        self.file_mode = 0o640 if group else 0o600
        #: (st_dev, st_ino) of the root once it passed :meth:`_check_root`.
        self._root_ok: tuple[int, int] | None = None

    def path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def _distrust(self, st: os.stat_result) -> str | None:
        """Why a folder or file of the store with this stat cannot be trusted, or None
        (:func:`objcache.config.files.distrust`; group-writable allowed where the store is
        group-shared)."""
        return distrust(st, self._euid, group=self.group)

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
        flags = os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC
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
        try:  # group-shared: the umask may have taken the group's write bit
            return open_folder(parent, name, create=create, mode=self.dir_mode, exact=self.group)
        except UnsafeFolder as exc:
            raise InvalidKey(str(exc)) from None

    # --- node leases (objcache/core/fetch_once/nodelease.py) ---------------------------------

    def open_lease(self, key: str) -> tuple[int, str, int]:
        """``(folder fd, name, file fd)`` of the lease file of ``key``, beside the entry:
        reached by the folder walk (folders created as for a put), opened or created
        ``O_NOFOLLOW`` relative to the folder, mode 0600 (0640 group-shared). The caller
        closes both fds."""
        check_key(key)
        directory, name = self._parent(key, create=True)
        assert directory is not None
        lease = LEASE_PREFIX + name
        flags = os.O_RDWR | os.O_CREAT | O_CLOEXEC | O_NOFOLLOW
        try:
            return directory, lease, os.open(lease, flags, self.file_mode, dir_fd=directory)
        except BaseException:
            os.close(directory)
            raise
