"""S3 error classification: which failures are worth retrying, and what to tell the user.

Backends do not retry; they classify. Transient: throttling, 5xx, resets, timeouts
(including failures while the body streams, which botocore never retries). Permanent:
everything that will fail the same way next time (missing bucket, bad credentials, access
denied), with a one-line message that names the tier and says what to do.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from botocore import exceptions as bce

from objcache.errors import (
    BackendError,
    ClockSkew,
    InvalidKey,
    PermanentBackendError,
    TransientBackendError,
)

_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "RequestTimeoutException",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequests",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "ProvisionedThroughputExceededException",
        "EC2ThrottledException",
        "OperationAborted",
        "PriorRequestNotComplete",
        "TransactionInProgressException",
        "IDPCommunicationError",
        "KMS.ThrottlingException",
    }
)
_TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})

#: codes of a conditional write that lost: someone else created the key first
PRECONDITION_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})

_CREDENTIAL_ERRORS = (
    bce.NoCredentialsError,
    bce.PartialCredentialsError,
    bce.CredentialRetrievalError,
    bce.ProfileNotFound,
    bce.TokenRetrievalError,
    bce.SSOTokenLoadError,
    bce.UnauthorizedSSOTokenError,
)


def error_code(exc: bce.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def status_code(exc: bce.ClientError) -> int:
    meta: dict[str, Any] = exc.response.get("ResponseMetadata", {})
    return int(meta.get("HTTPStatusCode") or 0)


def is_precondition_failure(exc: BaseException) -> bool:
    """A conditional create lost the race (412, or 409 ConditionalRequestConflict)."""
    if not isinstance(exc, bce.ClientError):
        return False
    return error_code(exc) in PRECONDITION_CODES or status_code(exc) == 412


def is_not_found(exc: BaseException) -> bool:
    """A missing key. NoSuchBucket is not a miss: it is a misconfigured tier."""
    if not isinstance(exc, bce.ClientError):
        return False
    code = error_code(exc)
    if code == "NoSuchBucket":
        return False
    return code in ("NoSuchKey", "404", "NotFound") or status_code(exc) == 404


def missing_bucket(bucket: str, tier: str) -> PermanentBackendError:
    return PermanentBackendError(
        f"bucket {bucket!r} does not exist: create it (terraform/modules/s3-cache) "
        "or fix OBJCACHE_TIERS",
        tier=tier,
    )


def _client_error(exc: bce.ClientError, op: str, bucket: str, tier: str) -> BackendError:
    code, status = error_code(exc), status_code(exc)
    message = str(exc.response.get("Error", {}).get("Message", "")) or str(exc)
    if code in _TRANSIENT_CODES or status in _TRANSIENT_STATUS:
        return TransientBackendError(f"{op}: {code or status} ({message})", tier=tier)
    if code == "NoSuchBucket":
        return missing_bucket(bucket, tier)
    if code == "RequestTimeTooSkewed":
        return ClockSkew(
            f"{op}: this machine's clock differs from the server's by more than S3 allows "
            "(RequestTimeTooSkewed): synchronise it (chrony, systemd-timesyncd, NTP)",
            tier=tier,
        )
    if code in ("KeyTooLongError", "InvalidObjectName"):
        # The name, not the tier: an invalid_key that leaves the breaker closed.
        return InvalidKey(
            f"{op}: the store refuses this object name ({code}: {message})", tier=tier
        )
    if code == "InvalidAccessKeyId":
        return PermanentBackendError(
            f"{op}: the access key id is unknown to this endpoint: check AWS_ACCESS_KEY_ID "
            "or the credentials of the profile in use",
            tier=tier,
        )
    if code == "SignatureDoesNotMatch":
        return PermanentBackendError(
            f"{op}: the secret key does not match the access key id: check "
            "AWS_SECRET_ACCESS_KEY or the credentials of the profile in use",
            tier=tier,
        )
    if code in ("ExpiredToken", "TokenRefreshRequired", "InvalidToken"):
        return PermanentBackendError(
            f"{op}: the session token is expired or invalid: refresh the credentials "
            "(e.g. aws sso login) or use a role",
            tier=tier,
        )
    if code == "AccessDenied" or status == 403:
        return PermanentBackendError(
            f"{op}: access denied ({code or status}): grant this identity the objcache "
            "reader/writer policy (terraform/modules/s3-cache) or check which credentials "
            "are in use (AWS_PROFILE, role)",
            tier=tier,
        )
    if code in ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraint"):
        return PermanentBackendError(
            f"{op}: bucket {bucket!r} is in another region ({code}): set ?region= in the tier URL",
            tier=tier,
        )
    return PermanentBackendError(f"{op}: {code or status}: {message}", tier=tier)


def classify(exc: BaseException, op: str, bucket: str, tier: str) -> BackendError:
    """The typed error for any exception raised by a call to S3."""
    if isinstance(exc, BackendError):
        return exc
    if isinstance(exc, bce.ClientError):
        return _client_error(exc, op, bucket, tier)
    if isinstance(exc, _CREDENTIAL_ERRORS):
        return PermanentBackendError(
            f"{op}: no usable AWS credentials ({type(exc).__name__}): configure the standard "
            "chain (AWS_PROFILE / ?profile=, environment, SSO, container or instance role)",
            tier=tier,
        )
    if isinstance(exc, bce.SSLError) and "CERTIFICATE_VERIFY_FAILED" in str(exc):
        return PermanentBackendError(
            f"{op}: TLS certificate of the endpoint is not trusted: fix endpoint_url or "
            "AWS_CA_BUNDLE",
            tier=tier,
        )
    if isinstance(
        exc,
        (
            bce.ConnectionError,  # endpoint connection refused, connect timeout
            bce.HTTPClientError,  # read timeout, connection closed, proxy
            bce.ResponseStreamingError,
            bce.IncompleteReadError,
            aiohttp.ClientPayloadError,  # reset mid-body
            aiohttp.ClientConnectionError,
            asyncio.TimeoutError,  # socket read timeout while streaming (not our deadline)
            ConnectionError,
            OSError,
        ),
    ):
        return TransientBackendError(f"{op}: {type(exc).__name__}: {exc}", tier=tier)
    return PermanentBackendError(f"{op}: {type(exc).__name__}: {exc}", tier=tier)
