"""The one way an integration reaches the cache: :func:`get_client`, typed.

It loads the client (asyncio and the rest of the core) on its first call only, so importing an
integration stays cheap; the integrations call it through this module
(``cache_client.get_client()``), never through the root package ``objcache``, which imports
them for ``install()`` (docs/architecture.md, "Layers").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from objcache.client import Client
    from objcache.config.settings import Config


def get_client(config: Config | None = None) -> Client:
    """The process-wide synchronous client (:func:`objcache.client.get_client`)."""
    from objcache import client

    return client.get_client(config)
