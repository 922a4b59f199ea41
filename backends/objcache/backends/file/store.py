"""``file:///dir``: a directory used as a shared object store (NFS, EFS, Filestore, or a
plain local folder). It is also the embedded default store when nothing is configured.

Same semantics as every backend (first-writer-wins CREATE across processes and NFS
clients, atomic OVERWRITE); see :mod:`objcache.backends.fs_store` for how. Entries are fsynced
before they are published (``?fsync=0`` turns it off): on NFS this makes the server commit
the data before the name appears, so another machine never reads a name whose data a
server crash lost. Folders are not fsynced: losing a just-published name is a cache miss.
No eviction (``objcache gc`` removes old entries) and no atime bookkeeping: readers of a
shared store may lack write permission, and attribute writes are round trips on NFS.

Permissions (docs/security.md, "Local filesystem"): the root must be owned by this user and
writable by nobody else; folders are created 0700, files 0600, so a fleet sharing a store
runs as one user. ``?shared=group`` is the group-shared case: the root may be owned by
another member and be group-writable (never world-writable); folders are created 0770 and
files 0640.
"""

from __future__ import annotations

from typing import ClassVar

from objcache.backends.base import TierSpec
from objcache.backends.fs import FsBackend
from objcache.errors import ConfigError


class FileBackend(FsBackend):
    """Shared directory store."""

    touch_on_read: ClassVar[bool] = False

    def _group(self, spec: TierSpec) -> bool:
        shared = spec.options.get("shared", "user")
        if shared not in ("user", "group"):
            raise ConfigError(f"{spec.display}: shared must be user or group, got {shared!r}")
        return shared == "group"
