"""The one installer of every integration: torch's, Triton's and vLLM's parts applied alike.

``hooks`` installs and uninstalls (routing torch's remote caches through objcache and
applying the other parts), ``features`` says which parts this torch carries, ``watched`` is
the one list of the modules a part is applied on, ``autoload`` the zero-code path behind
``objcache-autoload.pth`` and ``zero_code_switch`` its switch. What it changes is recorded
in the one ledger, :mod:`objcache.integrations.patching`, to put back exactly."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from objcache.config.settings import Config


def install(config: Config | None = None) -> None:
    """Every integration at once (``objcache.install()``): torch's caches and the parts
    applied with them (vLLM's where vLLM runs), then Triton's own kernel cache when
    ``OBJCACHE_TRITON=1``. Idempotent."""
    from objcache.integrations.install import hooks
    from objcache.integrations.triton import install_from_env

    hooks.install(config)
    install_from_env()


def uninstall() -> None:
    """Undo :func:`install`: torch's cache classes, flags and builders as they were."""
    from objcache.integrations.install import hooks

    hooks.uninstall()
