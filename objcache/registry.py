"""Backend lookup by URL scheme: objcache's own backends plus the ``objcache.backends``
entry-point group, so third parties add schemes without touching objcache."""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import entry_points

from objcache.backends.base import Backend, TierSpec
from objcache.errors import ConfigError

_BUILTIN: dict[str, str] = {
    "disk": "objcache.backends.disk:DiskBackend",
    "file": "objcache.backends.file:FileBackend",
    "redis": "objcache.backends.redis:RedisBackend",
    "rediss": "objcache.backends.redis:RedisBackend",
    "unix": "objcache.backends.redis:RedisBackend",
    "s3": "objcache.backends.s3:S3Backend",
    "gs": "objcache.backends.gcs:GCSBackend",
}

_EXTRA = {"s3": "s3", "gs": "gcs", "redis": "redis", "rediss": "redis", "unix": "redis"}


@functools.cache
def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group="objcache.backends")}


def known_schemes() -> tuple[str, ...]:
    return tuple(sorted(set(_BUILTIN) | set(_entry_points())))


def backend_class(scheme: str) -> type[Backend]:
    """The class serving ``scheme``; a missing optional dependency is a one-line error."""
    target = _entry_points().get(scheme) or _BUILTIN.get(scheme)
    if target is None:
        raise ConfigError(f"unknown scheme {scheme!r}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = _EXTRA.get(scheme)
        hint = f"; install it with: pip install 'objcache[{extra}]'" if extra else ""
        raise ConfigError(f"{scheme}:// needs a missing package ({exc.name}){hint}") from None
    cls = getattr(module, attr)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigError(f"{target} is not an objcache Backend")
    return cls


def create_backend(spec: TierSpec) -> Backend:
    return backend_class(spec.scheme)(spec)
