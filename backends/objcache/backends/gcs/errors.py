"""GCS error classification for google-cloud-storage (requests + google-auth underneath)."""

from __future__ import annotations

import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as gauth

from objcache.errors import BackendError, PermanentBackendError, TransientBackendError

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def status_of(exc: BaseException) -> int:
    code = getattr(exc, "code", None)
    return code if isinstance(code, int) else 0


def is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, gexc.NotFound)


def is_precondition_failure(exc: BaseException) -> bool:
    return isinstance(exc, gexc.PreconditionFailed) or status_of(exc) == 412


def missing_bucket(bucket: str, tier: str) -> PermanentBackendError:
    return PermanentBackendError(
        f"bucket {bucket!r} does not exist: create it (terraform/modules/gcs-cache) "
        "or fix OBJCACHE_TIERS",
        tier=tier,
    )


def classify(exc: BaseException, op: str, bucket: str, tier: str) -> BackendError:
    """The typed error for any exception raised by a google-cloud-storage call."""
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, gexc.GoogleAPICallError):
        status = status_of(exc)
        # The message of a wrapped HTTP error can be long (whole response body): one line.
        detail = str(getattr(exc, "message", "") or exc).splitlines()[0][:200]
        if status in _TRANSIENT_STATUS:
            return TransientBackendError(f"{op}: HTTP {status}: {detail}", tier=tier)
        if status in (401, 403):
            return PermanentBackendError(
                f"{op}: HTTP {status} permission denied: grant this identity "
                "roles/storage.objectViewer (readers) or roles/storage.objectUser (writers) "
                "on the bucket (terraform/modules/gcs-cache), or check which credentials "
                "Application Default Credentials picked",
                tier=tier,
            )
        return PermanentBackendError(f"{op}: HTTP {status}: {detail}", tier=tier)
    if isinstance(exc, gauth.DefaultCredentialsError):
        return PermanentBackendError(
            f"{op}: no Google Application Default Credentials: run `gcloud auth "
            "application-default login`, set GOOGLE_APPLICATION_CREDENTIALS, or use workload "
            "identity",
            tier=tier,
        )
    if isinstance(exc, gauth.RefreshError):
        if exc.retryable:
            return TransientBackendError(f"{op}: credential refresh failed: {exc}", tier=tier)
        return PermanentBackendError(
            f"{op}: credentials were refused when refreshed ({exc}): re-authenticate",
            tier=tier,
        )
    if isinstance(
        exc,
        (
            gauth.TransportError,
            requests.ConnectionError,  # refused, reset, connect timeout
            requests.Timeout,
            requests.exceptions.ChunkedEncodingError,  # reset mid-body
            requests.exceptions.ContentDecodingError,
            ConnectionError,
            TimeoutError,
            OSError,
        ),
    ):
        return TransientBackendError(f"{op}: {type(exc).__name__}: {exc}", tier=tier)
    return PermanentBackendError(f"{op}: {type(exc).__name__}: {exc}", tier=tier)
