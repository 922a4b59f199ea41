"""objcache: a tiered remote cache (local disk, Redis, S3, GCS) for torch.compile.

Enable it with environment variables (``OBJCACHE_TIERS=...``) or one call::

    import objcache
    objcache.install()            # routes torch's remote caches through objcache
"""

from __future__ import annotations

from typing import Any

from objcache.config import Config
from objcache.errors import ConfigError, ObjcacheError

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "ObjcacheError", "__version__", "get_client", "stats"]


def get_client(config: Config | None = None) -> Any:
    """The process-wide synchronous client (see :mod:`objcache.client`)."""
    from objcache.client import get_client as _get_client

    return _get_client(config)


def stats() -> dict[str, Any]:
    """Hits, misses by reason, bytes and latency per tier for this process."""
    return dict(get_client().stats())
