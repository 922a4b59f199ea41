"""objcache: a tiered remote cache (local disk, Redis, S3, GCS) for torch.compile.

Enable it with environment variables (``OBJCACHE_TIERS=...``) or one call::

    import objcache
    objcache.install()            # routes torch's remote caches through objcache

``import objcache`` is light (no asyncio, no torch): the names below load on first use, so
the zero-code path (``objcache-autoload.pth``) costs nothing measurable at start-up.
"""

from __future__ import annotations

import os as _os
from typing import TYPE_CHECKING, Any

# In a checkout the backends' source lives in the top-level backends/ folder as the
# ``objcache`` portion ``backends/objcache/backends/`` (docs/architecture.md, "Package
# layout"); installed wheels carry it in objcache/backends/ and this finds nothing.
_BACKENDS_ROOT = _os.path.join(_os.path.dirname(_os.path.dirname(__file__)), "backends", "objcache")
if _os.path.isdir(_os.path.join(_BACKENDS_ROOT, "backends")):
    __path__.append(_BACKENDS_ROOT)

if TYPE_CHECKING:
    from objcache.client import Client
    from objcache.config.settings import Config
    from objcache.errors import ConfigError, ObjcacheError

__version__ = "0.1.0"
__all__ = [
    "Config",
    "ConfigError",
    "ObjcacheError",
    "__version__",
    "get_client",
    "install",
    "stats",
    "uninstall",
]

_LAZY = {
    "Config": "objcache.config.settings",
    "ConfigError": "objcache.errors",
    "ObjcacheError": "objcache.errors",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'objcache' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def get_client(config: Config | None = None) -> Client:
    """The process-wide synchronous client (see :mod:`objcache.client`); it imports the client
    (asyncio and the rest of the core) only on first call. The integrations reach it through
    :func:`objcache.integrations.cache_client.get_client`, never through this package.
    """
    from objcache.client import get_client as _get_client

    return _get_client(config)


def stats() -> dict[str, Any]:
    """Hits, misses by reason, bytes and latency per tier for this process."""
    return dict(get_client().stats())


def install(config: Config | None = None) -> None:
    """Route torch.compile's caches (and CPU kernel builds) through objcache (idempotent)."""
    from objcache.integrations.install import install as _install

    _install(config)  # Triton's own kernel cache too, when OBJCACHE_TRITON=1


def uninstall() -> None:
    """Undo :func:`install`: torch's cache classes, flags and builders as they were."""
    from objcache.integrations.install import uninstall as _uninstall

    _uninstall()
