"""The scheme registry: per URL scheme, the backend that serves it, the extra that installs
its dependencies, how its URL's location is checked and the table of its query options, as
each backend describes itself.

objcache's own backends are the folders of the ``objcache.backends`` package; each has a
``spec`` module whose ``SCHEMES`` lists a :class:`Scheme` per scheme it serves, and the
registry finds them by walking that package at first use: a new folder is a new backend,
with no table here to edit. A ``spec`` module belongs to this layer (it may import only
``objcache.config``, ``objcache.entry`` and ``objcache.errors``; tests/test_layering.py
checks), so finding the backends imports no backend code and no cloud SDK
(docs/architecture.md, "Adding a backend").

Third parties add schemes through the ``objcache.backends`` entry-point group (name: the
scheme, value: ``module:Class``) without touching objcache; such a class may declare its
option table as ``options``, else only the tier options are checked for it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from urllib.parse import SplitResult

from objcache.config.locations import anything
from objcache.config.options import TIER_OPTIONS, OptionTable

#: The package whose folders are objcache's own backends.
BACKENDS_PACKAGE = "objcache.backends"

#: ``(parts, where) -> (location, path)``: checks a URL's host/bucket/path for one scheme.
LocationCheck = Callable[[SplitResult, str], tuple[str, str]]


@dataclass(frozen=True)
class Scheme:
    """What objcache knows about one URL scheme."""

    name: str
    #: ``module:Class`` of the backend
    target: str
    #: pip extra that installs the backend's dependencies ("" when none are needed)
    extra: str
    location: LocationCheck
    #: the backend's own query options, or None when unknown (a third party's)
    options: OptionTable | None
    #: the module the extra installs and the backend imports ("" when none); the
    #: description never imports it
    sdk: str = ""


#: Schemes this process added with :func:`register`.
_registered: dict[str, Scheme] = {}


@functools.cache
def _builtin() -> dict[str, Scheme]:
    """The schemes of the ``spec`` module of every folder of ``objcache.backends``, folders
    in name order, each folder's schemes in its own order."""
    package = importlib.import_module(BACKENDS_PACKAGE)
    found: dict[str, Scheme] = {}
    for folder in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        name = f"{BACKENDS_PACKAGE}.{folder.name}.spec"
        if not folder.ispkg or importlib.util.find_spec(name) is None:
            continue  # a shared module (base, fs, ...), not a backend
        for entry in importlib.import_module(name).SCHEMES:
            if entry.name in found:
                raise RuntimeError(f"{name} declares {entry.name}:// again")
            found[entry.name] = entry
    return found


def builtin_schemes() -> dict[str, Scheme]:
    """objcache's own schemes, by name, in the order of their folders."""
    return dict(_builtin())


def schemes() -> dict[str, Scheme]:
    """The schemes objcache serves in this process: its own and those :func:`register`
    added (not the entry points', found by name only)."""
    return {**_builtin(), **_registered}


def register(name: str, target: str, options: OptionTable | None = None) -> None:
    """Serve ``name://`` by ``module:Class`` in this process (tests; installed packages use
    the entry points)."""
    _registered[name] = Scheme(name, target, "", anything, options)


@functools.cache
def _entry_points() -> dict[str, Scheme]:
    return {
        ep.name: Scheme(ep.name, ep.value, "", anything, None)
        for ep in entry_points(group="objcache.backends")
        if ep.name not in _builtin()
    }


def scheme(name: str) -> Scheme | None:
    return _registered.get(name) or _builtin().get(name) or _entry_points().get(name)


def option_tables(name: str) -> tuple[OptionTable, ...] | None:
    """The option tables a ``name://`` URL is checked against (None: the backend's own
    options are unknown, only the tier options are)."""
    entry = scheme(name)
    if entry is None or entry.options is None:
        return None
    return (entry.options, TIER_OPTIONS)
