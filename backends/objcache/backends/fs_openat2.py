"""``openat2`` through ctypes: open a path below a folder's fd in one system call that
follows no symlink at any level and never leaves the folder. The filesystem store's read of
an entry (:mod:`objcache.backends.fs_store`) uses it where the kernel has it, else walks
folder by folder (docs/security.md, "Local filesystem"; docs/benchmarks.md)."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable


class OpenAt2:
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
