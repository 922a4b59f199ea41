"""``disk://``: the machine-local tier, LRU eviction by bytes.

The folder: ``spec`` (what the registry reads: scheme, options, location check, extra),
``store`` (the backend). ``DiskBackend`` is loaded on first use, so importing this package or
its ``spec`` imports no backend code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from objcache.backends.disk.store import DiskBackend

__all__ = ["DiskBackend"]


def __getattr__(name: str) -> Any:
    if name == "DiskBackend":
        from objcache.backends.disk.store import DiskBackend

        return DiskBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
