"""Not a package: the source root of ``objcache.backends`` (docs/architecture.md, "Package
layout"). The backends import as ``objcache.backends.<name>``; this file exists so that a
bare ``import backends`` from a checkout fails instead of yielding a namespace package."""

raise ImportError("backends/ is the source folder of objcache.backends: import objcache.backends")
