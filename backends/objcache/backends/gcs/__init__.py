"""``gs://``: Google Cloud Storage, through google-cloud-storage.

The folder: ``spec`` (what the registry reads: scheme, options, location check, extra),
``store`` (the backend), ``errors`` (GCS error classification). ``GCSBackend`` is loaded on
first use, so importing this package or its ``spec`` imports no SDK and no backend code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from objcache.backends.gcs.store import GCSBackend

__all__ = ["GCSBackend"]


def __getattr__(name: str) -> Any:
    if name == "GCSBackend":
        from objcache.backends.gcs.store import GCSBackend

        return GCSBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
