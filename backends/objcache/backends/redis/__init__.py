"""``redis://``, ``rediss://`` and ``unix://``: Redis through redis-py.

The folder: ``spec`` (what the registry reads: scheme, options, location check, extra),
``store`` (the backend), ``cluster`` (Redis Cluster: detection, the cluster client, SCAN
over every primary, the topology ``objcache doctor`` reports). ``RedisBackend`` is loaded
on first use, so importing this package or its ``spec`` imports no SDK and no backend
code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from objcache.backends.redis.store import RedisBackend

__all__ = ["RedisBackend"]


def __getattr__(name: str) -> Any:
    if name == "RedisBackend":
        from objcache.backends.redis.store import RedisBackend

        return RedisBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
