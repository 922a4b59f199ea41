"""The import watcher: applies each part of the install as its module's import ends.

A finder at the front of ``sys.meta_path`` that finds nothing itself: it wraps the real loader
of each watched module not imported yet (:data:`.watched.WATCHED`) and of every module of a
watched package (:data:`.watched.WATCHED_PACKAGES`, Inductor's), and applies that module's
part right after its body has run, before the program's next line can change what it
defines. The zero-code path (:mod:`.autoload`) starts it as torch is imported; an explicit
``install()`` starts it for the modules it does not import itself (Inductor's code
generators, which the first compile imports). ``uninstall()`` stops it
(:func:`.watched.stop_watching`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from objcache.integrations.install.watched import WATCHED, WATCHED_PACKAGES, on_stop_watching

__all__ = ["apply", "disable", "warn", "watch", "watching"]

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
    apply(name, module)


def apply(name: str, module: ModuleType | None = None) -> None:
    """Apply ``name``'s part (never raises: a failure is logged once and the import goes on)."""
    try:
        from objcache.integrations.install import hooks

        hooks.apply_part(name, module)
    except Exception:  # never break an import
        warn(f"objcache: could not hook {name}")


def warn(message: str) -> None:
    """Log ``message`` with the exception being handled (never raises)."""
    import logging  # not at import time: logging alone costs ~10 ms of start-up

    logging.getLogger("objcache.torch").warning(message, exc_info=True)


def _remove_finder() -> None:
    global _finder
    if _finder is not None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(_finder)
        _finder = None


def watch() -> None:
    """Apply each part as its module's import ends, from now on (idempotent)."""
    global _finder, _disabled
    on_stop_watching(disable)
    with _lock:
        _disabled = False
        pending = [n for n in WATCHED if n not in sys.modules]
        if (pending or WATCHED_PACKAGES) and _finder is None:
            _finder = _PostImportFinder(pending, list(WATCHED_PACKAGES))
            sys.meta_path.insert(0, _finder)


def watching() -> bool:
    """Whether the watcher is in place (the zero-code path started it as torch was imported)."""
    return _finder is not None


def disable() -> None:
    """Stop installing on later imports (``uninstall()`` calls this through
    :func:`.watched.stop_watching`)."""
    global _disabled
    with _lock:
        _disabled = True
        _remove_finder()
