"""Zero-code activation: cover every Python process that imports torch.

The package ships ``objcache-autoload.pth`` into site-packages. Its one line checks
``os.environ`` and, only when ``OBJCACHE_TIERS`` or ``OBJCACHE_ENABLE`` is set, imports this
module and calls :func:`activate`; with neither set nothing is imported at all. Importing
this module does nothing by itself. It never imports torch: :func:`activate` puts a finder at
the front of ``sys.meta_path`` that notices when each torch module objcache patches is
imported (:data:`.watched.WATCHED`), and applies that part of the install right after the
module has run. So ``import torch`` costs nothing extra,
and a process that never compiles never imports torch's compiler stack because of objcache.
Inductor's compile workers are Python processes too: they load the same ``.pth``.

``OBJCACHE_ENABLE=0`` (or false/no/off) switches the zero-code path off even when
``OBJCACHE_TIERS`` is set: a one-variable kill switch (:func:`.zero_code_switch.enabled`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from objcache.integrations.install.watched import WATCHED, WATCHED_PACKAGES, on_stop_watching
from objcache.integrations.install.zero_code_switch import enabled

__all__ = ["activate", "disable", "enabled"]

_lock = threading.RLock()
_finder: _PostImportFinder | None = None
_disabled = False


class _PostImportFinder:
    """Finds nothing itself: wraps the real loader of a watched module to run a hook after it."""

    def __init__(self, names: Sequence[str], packages: Sequence[str] = ()) -> None:
        self.names = set(names)
        #: every module under these is watched, for as long as the finder is in place
        self.packages = tuple(f"{package}." for package in packages)
        self._busy: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname in self._busy or (
            fullname not in self.names and not fullname.startswith(self.packages)
        ):
            return None
        self._busy.add(fullname)
        try:
            spec: ModuleSpec | None = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                found: ModuleSpec | None = find(fullname, path, target)
                if found is not None:
                    spec = found
                    break
        finally:
            self._busy.discard(fullname)
        if spec is None:
            return None
        loader = spec.loader
        if loader is not None and hasattr(loader, "exec_module"):
            _wrap_loader(loader, fullname)
        return spec

    def invalidate_caches(self) -> None:
        pass


def _wrap_loader(loader: Any, fullname: str) -> None:
    original = loader.exec_module

    def exec_module(module: ModuleType) -> None:
        original(module)
        if module.__name__ == fullname:
            _imported(fullname, module)

    loader.exec_module = exec_module


def _imported(name: str, module: ModuleType) -> None:
    with _lock:
        if _finder is not None:
            _finder.names.discard(name)
            if not _finder.names and not _finder.packages:
                _remove_finder()
        if _disabled:
            return
    _apply(name, module)


def _apply(name: str, module: ModuleType | None = None) -> None:
    try:
        from objcache.integrations.install import hooks

        hooks.apply_part(name, module)
    except Exception:  # never break an import
        _warn(f"objcache: could not hook {name}")


def _warn(message: str) -> None:
    import logging  # not at import time: logging alone costs ~10 ms of start-up

    logging.getLogger("objcache.torch").warning(message, exc_info=True)


def _remove_finder() -> None:
    global _finder
    if _finder is not None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(_finder)
        _finder = None


def activate(environ: Mapping[str, str] | None = None) -> bool:
    """Watch for torch's modules (or hook the ones already imported). Never raises."""
    global _finder, _disabled
    try:
        if not enabled(environ):
            return False
        on_stop_watching(disable)
        with _lock:
            _disabled = False
            pending = [n for n in WATCHED if n not in sys.modules]
            if (pending or WATCHED_PACKAGES) and _finder is None:
                _finder = _PostImportFinder(pending, list(WATCHED_PACKAGES))
                sys.meta_path.insert(0, _finder)
        for name in WATCHED:
            if name in sys.modules:
                _apply(name)
        return True
    except Exception:
        _warn("objcache: zero-code activation failed")
        return False


def disable() -> None:
    """Stop installing on later imports (``uninstall()`` calls this through
    :func:`.watched.stop_watching`)."""
    global _disabled
    with _lock:
        _disabled = True
        _remove_finder()
