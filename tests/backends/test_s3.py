"""s3:// backend against real S3 servers (SeaweedFS and moto), directly and through a
fault proxy. The shared contract and the fault contract (refused, black-holed and reset
connections, client sharing, paged listing, a missing bucket, a 503) run in tests/contract;
these tests cover what is S3's own: one client for concurrent first calls, multipart uploads
and their aborts, conditional creates of large entries, and that every failure is
classified and actionable (botocore makes exactly one attempt)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from objcache.backends.base import PutMode
from objcache.backends.s3.direct import DirectS3
from objcache.backends.s3.errors import classify
from objcache.backends.s3.store import CLIENTS, S3Backend
from objcache.config.urls import parse_tier_url
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.tier import Tier
from objcache.errors import PermanentBackendError, TransientBackendError
from tests.support.cloud import aws_profile, s3_url, session_bucket
from tests.support.proxy import FaultProxy
from tests.support.servers import S3Server, SeaweedS3
from tests.support.waiting import until

pytestmark = pytest.mark.servers

MiB = 1 << 20
MakeProxy = Callable[[str, int], FaultProxy]


def make(url: str) -> S3Backend:
    return S3Backend(parse_tier_url(url))


@pytest.fixture
def s3_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def s3_proxy(s3_server: S3Server, fault_proxy: MakeProxy) -> FaultProxy:
    port = int(s3_server.endpoint_url.rsplit(":", 1)[1])
    return fault_proxy("127.0.0.1", port)


@pytest.fixture
async def s3_via_proxy(
    s3_server: S3Server, s3_proxy: FaultProxy, s3_prefix: str
) -> AsyncIterator[Callable[..., S3Backend]]:
    """Factory of backends whose traffic goes through ``s3_proxy``, closed afterwards."""
    made: list[S3Backend] = []

    def factory(**options: Any) -> S3Backend:
        backend = make(s3_url(s3_server, s3_prefix, endpoint_url=s3_proxy.url(), **options))
        made.append(backend)
        return backend

    yield factory
    s3_proxy.passthrough()
    for backend in made:
        await backend.close()


def uploads_left(s3: S3Server, prefix: str) -> list[str]:
    listing = s3.client().list_multipart_uploads(Bucket=session_bucket(s3), Prefix=prefix)
    return [u["Key"] for u in listing.get("Uploads", [])]


# --- client sharing ------------------------------------------------------------------


async def test_concurrent_first_calls_create_one_client(
    s3_via_proxy: Callable[..., S3Backend],
) -> None:
    backends = [s3_via_proxy() for _ in range(8)]
    await asyncio.gather(*(b.get(f"k{i}") for i, b in enumerate(backends)))
    clients = {id(CLIENTS.peek(b.client_key)) for b in backends}
    assert len(clients) == 1


# --- multipart -----------------------------------------------------------------------


async def test_large_entry_goes_multipart_and_round_trips(
    s3_proxy: FaultProxy,
    s3_via_proxy: Callable[..., S3Backend],
    s3_server: S3Server,
    s3_prefix: str,
) -> None:
    backend = s3_via_proxy()
    data = os.urandom(17 * MiB)  # > 16 MiB threshold: 8 + 8 + 1 MiB parts
    assert await backend.put("big", data, PutMode.OVERWRITE) is True
    parts = [r for r in s3_proxy.http_requests if r.method == "PUT" and "partNumber=" in r.path]
    assert len(parts) == 3
    got = await backend.get("big")
    assert got is not None and hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    assert uploads_left(s3_server, s3_prefix) == []


async def test_parts_of_a_large_entry_take_the_direct_path(
    s3_via_proxy: Callable[..., S3Backend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """UploadPart is sent by the direct path (a view of the entry, signed off the loop);
    botocore creates and completes the upload."""
    sent: list[str] = []
    request = DirectS3.request

    async def spy(self: DirectS3, method: str, route: Any, name: str, op: str, **kw: Any) -> bytes:
        sent.append(op)
        return await request(self, method, route, name, op, **kw)

    monkeypatch.setattr(DirectS3, "request", spy)
    backend = s3_via_proxy()
    data = os.urandom(17 * MiB)
    assert await backend.put("big", data, PutMode.OVERWRITE) is True
    assert sent.count("UploadPart") == 3
    assert await backend.get("big") == data


async def test_concurrent_large_creates_store_one_whole_entry(
    s3_via_proxy: Callable[..., S3Backend], s3_server: S3Server, s3_prefix: str
) -> None:
    """Racing multipart CREATEs of one key: what every server here guarantees.

    Exactly one winner needs a server that serialises conditional
    CompleteMultipartUploads, as AWS S3 does. SeaweedFS 4.48 and moto 5 check If-None-Match
    before assembling, so concurrent completes can all succeed (raw aioboto3, three
    completes in flight: more than one winner in 15 of 15 tries on SeaweedFS). What holds
    everywhere: at least one writer wins, the stored object is one winner's whole entry
    (never a mix of parts), and no upload is left behind.
    """
    backend = s3_via_proxy(multipart_threshold=6 * MiB, part_size=5 * MiB)
    values = [bytes([i]) * (11 * MiB) for i in range(3)]
    results = await asyncio.gather(*(backend.put("race", v) for v in values))
    assert any(results)
    stored = await backend.get("race")
    assert stored in [v for v, won in zip(values, results, strict=True) if won]
    assert uploads_left(s3_server, s3_prefix) == [], "losing uploads must be aborted"


async def test_reset_mid_upload_leaves_nothing(
    s3_proxy: FaultProxy,
    s3_via_proxy: Callable[..., S3Backend],
    s3_server: S3Server,
    s3_prefix: str,
) -> None:
    backend = s3_via_proxy(multipart_threshold=6 * MiB, part_size=5 * MiB)
    s3_proxy.bandwidth_bps = 8 * MiB  # per connection: each 5 MiB part takes ~0.6 s
    put = asyncio.ensure_future(backend.put("partial", os.urandom(16 * MiB)))
    await until(lambda: s3_proxy.count_requests("PUT") >= 2, what="two part uploads")
    # Every response is now cut by a TCP RST: the parts fail (aiohttp's one re-send of an
    # idempotent PUT too), and so does the first attempt to abort the upload.
    s3_proxy.reset_after(0)
    with pytest.raises(TransientBackendError):
        await asyncio.wait_for(put, 60)
    s3_proxy.passthrough()
    s3_proxy.bandwidth_bps = 0
    assert await backend.get("partial") is None
    assert await backend.exists("partial") is False
    # the abort keeps trying in the background once the network is back
    await until(lambda: not uploads_left(s3_server, s3_prefix), what="the upload aborted")
    assert [i async for i in backend.list()] == []


async def test_cancelled_upload_is_aborted(
    s3_proxy: FaultProxy,
    s3_via_proxy: Callable[..., S3Backend],
    s3_server: S3Server,
    s3_prefix: str,
) -> None:
    """The tier deadline cancels a slow upload: the abort still happens."""
    backend = s3_via_proxy(multipart_threshold=6 * MiB, part_size=5 * MiB)
    s3_proxy.bandwidth_bps = 4 * MiB
    tier = Tier(backend, RetryPolicy(timeout_s=0.8, retries=0), CircuitBreaker(100))
    assert await tier.put("slow", os.urandom(16 * MiB)) is False
    assert tier.stats.put_errors["timeout"] == 1
    s3_proxy.bandwidth_bps = 0
    await until(lambda: not uploads_left(s3_server, s3_prefix), what="the cancelled upload aborted")
    assert await backend.get("slow") is None


# --- errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("access_key", "secret_key", "expected"),
    [
        ("no-such-key", "whatever-secret", "access key id is unknown"),
        ("objcache-test", "the-wrong-secret", "secret key does not match"),
    ],
    ids=["unknown-key", "wrong-secret"],
)
async def test_wrong_credentials_are_permanent(
    seaweed_s3: SeaweedS3, access_key: str, secret_key: str, expected: str
) -> None:
    profile = aws_profile(f"bad-{access_key}", access_key, secret_key)
    backend = make(s3_url(seaweed_s3, "p", profile=profile))
    try:
        with pytest.raises(PermanentBackendError, match=expected) as info:
            await backend.get("k")
        assert secret_key not in str(info.value)
        with pytest.raises(PermanentBackendError, match=expected):
            await backend.put("k", b"v")
    finally:
        await backend.close()


async def test_no_credentials_is_permanent(
    s3_server: S3Server,
    s3_proxy: FaultProxy,
    s3_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    backend = make(s3_url(s3_server, s3_prefix, endpoint_url=s3_proxy.url(), profile=""))
    try:
        with pytest.raises(PermanentBackendError, match="no usable AWS credentials"):
            await asyncio.wait_for(backend.get("k"), 60)
    finally:
        await backend.close()
    unknown = make(s3_url(s3_server, s3_prefix, endpoint_url=s3_proxy.url(), profile="nobody"))
    try:
        with pytest.raises(PermanentBackendError, match="ProfileNotFound"):
            await unknown.get("k")
    finally:
        await unknown.close()


# --- classification of conditions the test servers cannot produce --------------------


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "GetObject",
    )


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("SlowDown", 503, TransientBackendError),
        ("InternalError", 500, TransientBackendError),
        ("RequestTimeout", 400, TransientBackendError),
        ("", 502, TransientBackendError),
        ("", 504, TransientBackendError),
        ("ThrottlingException", 400, TransientBackendError),
        ("AccessDenied", 403, PermanentBackendError),
        ("ExpiredToken", 400, PermanentBackendError),
        ("PermanentRedirect", 301, PermanentBackendError),
        ("InvalidArgument", 400, PermanentBackendError),
    ],
)
def test_client_error_classification(code: str, status: int, kind: type[Exception]) -> None:
    assert type(classify(client_error(code, status), "get", "b", "s3://b")) is kind
