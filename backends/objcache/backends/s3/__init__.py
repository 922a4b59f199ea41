"""``s3://``: S3 and S3-compatible stores, through aioboto3.

The folder: ``spec`` (what the registry reads: scheme, options, location check, extra),
``store`` (the backend), ``direct`` (single-part requests over aiohttp), ``errors`` (S3 error
classification). ``S3Backend`` is loaded on first use, so importing this package or its
``spec`` imports no SDK and no backend code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from objcache.backends.s3.store import S3Backend

__all__ = ["S3Backend"]


def __getattr__(name: str) -> Any:
    if name == "S3Backend":
        from objcache.backends.s3.store import S3Backend

        return S3Backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
