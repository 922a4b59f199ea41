"""What ``disk://`` is, for the registry: scheme, location check, option table (no SDK)."""

from __future__ import annotations

from objcache.config.locations import absolute_path
from objcache.config.options import Option, OptionTable
from objcache.config.registry import Scheme

OPTIONS: OptionTable = (
    Option("fsync", "bool", False, "fsync each entry (the local tier is a cache: off)."),
    Option("max_bytes", "size", 0, "Evict least-recently-used entries above this (10G, 512M)."),
)

SCHEMES = (Scheme("disk", "objcache.backends.disk.store:DiskBackend", "", absolute_path, OPTIONS),)
