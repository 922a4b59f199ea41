"""What ``file://`` is, for the registry: scheme, location check, option table (no SDK)."""

from __future__ import annotations

from objcache.config.locations import absolute_path
from objcache.config.options import Option, OptionTable
from objcache.config.registry import Scheme

OPTIONS: OptionTable = (
    Option("fsync", "bool", True, "fsync each entry and its directory before it is visible."),
    Option(
        "shared",
        "str",
        "user",
        "user: a private store (folders 0700, files 0600); group: shared by a group "
        "(root may belong to another member, folders 0770, files 0640).",
    ),
)

SCHEMES = (Scheme("file", "objcache.backends.file.store:FileBackend", "", absolute_path, OPTIONS),)
