"""Storage backends, one folder per store (``disk``, ``file``, ``redis``, ``s3``, ``gcs``) over
the storage contract in ``base`` (the ``Backend`` class) and ``records_contract`` (versioned
records), the helpers they share (``options``, ``shared``, and the filesystem store's
``fs_folders``, ``fs_openat2``, ``fs_store`` and ``fs``), and :func:`create_backend`, which
builds the backend a tier URL names. Each folder's ``spec`` describes its backend to
:mod:`objcache.config.registry`, which finds it by walking this package. This layer sits above
``objcache.config`` and may import it, ``objcache.entry`` and ``objcache.errors``; it sits
below ``objcache.observe`` and the core (a ``spec`` is config: it imports none of this layer;
docs/architecture.md, "Layers").

The registry's walk imports this package and each folder's: they import nothing at import
time that leads back to the registry or up into this layer (``tests/test_layering.py``
checks), so the two never import each other and describing the backends runs no backend
code (docs/architecture.md, "Adding a backend")."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from objcache.errors import ConfigError

if TYPE_CHECKING:
    from objcache.backends.base import Backend
    from objcache.config.urls import TierSpec


def backend_class(name: str) -> type[Backend]:
    """The class serving ``name``; a missing optional dependency is a one-line error."""
    from objcache.backends.base import Backend
    from objcache.config import registry

    entry = registry.scheme(name)
    if entry is None:
        raise ConfigError(f"unknown scheme {name!r}")
    module_name, _, attr = entry.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"; install it with: pip install 'objcache[{entry.extra}]'" if entry.extra else ""
        raise ConfigError(f"{name}:// needs a missing package ({exc.name}){hint}") from None
    cls = getattr(module, attr)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigError(f"{entry.target} is not an objcache Backend")
    return cls


def create_backend(spec: TierSpec) -> Backend:
    return backend_class(spec.scheme)(spec)
