"""objcache for ``torch.compile``, by feature: torch's five remote caches, local write-through,
CPU kernel artifacts, precompile entries and Mega-Cache bundles.

Importing this package imports neither torch nor the hooks; :func:`install` does.

* :mod:`.remote` — torch's remote cache classes, what is stored (``serde``), write-through,
  guarded candidates, PGO as a join and the keys;
* :mod:`.precompile` — precompile entries: saved, served, and the guards they still check;
* :mod:`.kernels` — compiled C++ kernels and precompiled headers, content-addressed;
* :mod:`.mega` — Mega-Cache bundles and seeding the local tier;
* :mod:`.timing` — compile time in torch's own figures, for the run summary.

The install (:mod:`objcache.integrations.install`: the hooks, the feature checks and the
zero-code path behind ``objcache-autoload.pth``) applies them.
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
