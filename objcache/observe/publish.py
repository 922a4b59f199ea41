"""Replace a file in a folder others may write (docs/security.md, "Files in shared folders").

The stats file and the Prometheus textfile live in folders that other users or jobs may be
able to write (node_exporter's textfile folder is shared by every job of a node). A
predictable temporary name opened with ``open('wb')`` follows a symlink planted there and
overwrites whatever it points at. :func:`publish` writes a fresh random name created
``O_CREAT | O_EXCL | O_NOFOLLOW`` (never an existing file, never through a symlink), then
renames it over the target (a rename replaces a symlink at the target, never follows it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def publish(target: Path, data: bytes, mode: int) -> None:
    """Atomically replace ``target`` with ``data`` (a new file of ``mode``, narrowed by the
    umask). Raises ``OSError``; leaves no temporary file behind."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(8)}")
    fd = os.open(tmp, _FLAGS, mode)
    try:
        with open(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
