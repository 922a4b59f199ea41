"""``file://``: a directory as a shared object store.

The folder: ``spec`` (what the registry reads: scheme, options, location check, extra),
``store`` (the backend). ``FileBackend`` is loaded on first use, so importing this package or
its ``spec`` imports no backend code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from objcache.backends.file.store import FileBackend

__all__ = ["FileBackend"]


def __getattr__(name: str) -> Any:
    if name == "FileBackend":
        from objcache.backends.file.store import FileBackend

        return FileBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
