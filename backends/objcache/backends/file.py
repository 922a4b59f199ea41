"""``file:///dir``: a directory used as a shared object store (NFS, EFS, Filestore, or a
plain local folder). It is also the embedded default store when nothing is configured.

Same semantics as every backend (first-writer-wins CREATE across processes and NFS
clients, atomic OVERWRITE); see :mod:`objcache.backends._fs` for how. Entries are fsynced
before they are published (``?fsync=0`` turns it off): on NFS this makes the server commit
the data before the name appears, so another machine never reads a name whose data a
server crash lost. Folders are not fsynced: losing a just-published name is a cache miss.
No eviction (``objcache gc`` removes old entries) and no atime bookkeeping: readers of a
shared store may lack write permission, and attribute writes are round trips on NFS.
"""

from __future__ import annotations

from typing import ClassVar

from objcache.backends._fs import FsBackend


class FileBackend(FsBackend):
    """Shared directory store."""

    touch_on_read: ClassVar[bool] = False
