"""Replace a file in a folder others may write (docs/security.md, "Files in shared folders").

The stats file and the Prometheus textfile live in folders that other users or jobs may be
able to write (node_exporter's textfile folder is shared by every job of a node). A
predictable temporary name opened with ``open('wb')`` follows a symlink planted there and
overwrites whatever it points at. :func:`publish` goes through
:func:`objcache.config.files.publish_file`, with the target's folder as the trusted root
(the user named it; it may be shared, so it is not required to be private): a fresh random
name created ``O_CREAT | O_EXCL | O_NOFOLLOW`` (never an existing file, never through a
symlink), renamed over the target (a rename replaces a symlink at the target, never follows
it).
"""

from __future__ import annotations

from pathlib import Path

from objcache.config.files import publish_file


def publish(target: Path, data: bytes, mode: int) -> None:
    """Atomically replace ``target`` with ``data`` (a new file of exactly ``mode``). Raises
    ``OSError``; leaves no temporary file behind."""
    publish_file(target.parent, [target.name], data, mode=mode)
