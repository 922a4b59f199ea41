"""The one way to open a store (docs/architecture.md, "Opening a store").

:func:`open_tier` turns a tier URL into what its user needs, in one of two modes:

* ``"cache"`` (the client's tiers, the run summary's separate location): a :class:`Tier`
  with the configuration's deadline, retries and breaker, and ``read_only`` on top of the
  URL's own flags. Nothing it does raises: a failing store call is a counted miss.
* ``"command"`` (every maintenance command): the bounded backend, every call (each listing
  page too) under the tier's deadline, no retries, no breaker, raising what the store raised.

The per-tier URL options (``?timeout_ms=``, ``?retries=``, ``?read_only=1``, ...) are read
by :class:`Tier`. No other module calls ``create_backend``, ``Tier.from_backend`` or
``Tier.for_command`` (``tests/test_stores.py`` checks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, overload

from objcache.backends import create_backend
from objcache.backends.base import Backend, TierSpec
from objcache.config.settings import Config
from objcache.core.tier import Tier


@overload
def open_tier(
    spec: TierSpec, config: Config, *, mode: Literal["cache"] = ..., read_only: bool = ...
) -> Tier: ...


@overload
def open_tier(spec: TierSpec, config: Config, *, mode: Literal["command"]) -> Backend: ...


def open_tier(
    spec: TierSpec,
    config: Config,
    *,
    mode: Literal["cache", "command"] = "cache",
    read_only: bool = False,
) -> Tier | Backend:
    """The store ``spec`` names, opened for ``mode`` (no I/O happens until the first call).

    ``"cache"``: a :class:`Tier` with ``config``'s deadline (``OBJCACHE_TIMEOUT_MS``, unless
    the URL says ``?timeout_ms=``), retries and breaker; ``read_only`` makes it read-only
    whatever the URL says. ``"command"``: :meth:`Tier.bounded` of a :meth:`Tier.for_command`
    tier, the tier's deadline with no retries and no breaker, raising; a missed deadline is a
    :class:`~objcache.errors.TransientBackendError` ("no answer within N ms")."""
    backend = create_backend(spec)
    if mode == "command":
        return Tier.for_command(backend, timeout_ms=config.timeout_ms).bounded()
    return Tier.from_backend(
        backend,
        timeout_ms=config.timeout_ms,
        retries=config.retries,
        breaker_failures=config.breaker_failures,
        breaker_cooldown_s=config.breaker_cooldown_s,
        read_only=read_only,
    )


def disk_spec(path: Path | str, **options: str) -> TierSpec:
    """The ``disk://`` tier of the folder ``path`` with ``options`` (``max_bytes``, ...) as
    a parsed URL would carry them; the URL itself names the folder only."""
    return TierSpec(f"disk://{path}", "disk", "", str(path), dict(options))


def local_spec(config: Config, *, evict: bool = False) -> TierSpec:
    """The local tier (``OBJCACHE_LOCAL_DIR``). With ``evict`` (the cache's own local tier)
    it carries ``max_bytes`` (``OBJCACHE_LOCAL_MAX_BYTES``), so the store evicts above it;
    a maintenance command opens it without, so no command evicts what it reads or copies."""
    if evict:
        return disk_spec(config.local_dir, max_bytes=str(config.local_max_bytes))
    return disk_spec(config.local_dir)
