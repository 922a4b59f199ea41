"""objcache for ``torch.compile``: torch's five remote caches, local write-through, CPU
kernel artifacts, and Mega-Cache bundles.

Importing this package imports neither torch nor the hooks; :func:`install` does.

* :mod:`.hooks` — install/uninstall, the cache classes and backend torch talks to;
* :mod:`.serde` — raw pickles / compact JSON in storage, torch's value shapes on a hit;
* :mod:`.writethrough` — remote hits written into ``TORCHINDUCTOR_CACHE_DIR``;
* :mod:`.kernels` — compiled C++ kernels and precompiled headers, content-addressed;
* :mod:`.autoload` — the zero-code path behind ``objcache-autoload.pth``.
"""

from __future__ import annotations

from typing import Any


def install(config: Any | None = None) -> None:
    """Route torch's remote caches and C++ kernel builds through objcache (idempotent)."""
    from objcache.integrations.install import hooks

    hooks.install(config)


def uninstall() -> None:
    """Put torch back exactly as it was before :func:`install`."""
    from objcache.integrations.install import hooks

    hooks.uninstall()


def installed() -> bool:
    from objcache.integrations.install import hooks

    return hooks.installed()


def stats() -> dict[str, Any]:
    """Counters of the torch integration in this process."""
    from objcache.integrations.install import hooks

    return hooks.stats()
