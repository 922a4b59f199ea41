"""s3:// backend against real S3 servers (SeaweedFS and moto), directly and through a
fault proxy. The shared contract runs in tests/contract; these tests cover client
sharing, multipart uploads, conditional creates of large entries, and that every failure
is classified, actionable and bounded in time (botocore makes exactly one attempt)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


async def test_construction_does_no_io_and_instances_share_one_client(
    s3_proxy: FaultProxy, s3_via_proxy: Callable[..., S3Backend]
) -> None:
    tasks = asyncio.all_tasks()
    a, b = s3_via_proxy(), s3_via_proxy()
    assert asyncio.all_tasks() == tasks, "constructing a backend must start no task"
    s3_proxy.settle()
    assert s3_proxy.connections == 0, "nor connect"
    assert CLIENTS.peek(a.client_key) is None, "nor create a client"
    await a.put("k", b"v")
    assert await b.get("k") == b"v"
    client = CLIENTS.peek(a.client_key)
    assert client is not None and client is CLIENTS.peek(b.client_key)
    await a.close()
    await a.close()  # idempotent
    assert CLIENTS.peek(b.client_key) is client, "b still uses the shared client"
    assert await b.exists("k") is True
    await b.close()
    assert CLIENTS.peek(b.client_key) is None, "the last close closes the client"
    assert await b.get("k") == b"v", "a closed instance reopens lazily"


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


async def test_large_create_of_existing_key_uploads_nothing(
    s3_proxy: FaultProxy, s3_via_proxy: Callable[..., S3Backend]
) -> None:
    backend = s3_via_proxy(multipart_threshold=6 * MiB, part_size=5 * MiB)
    assert await backend.put("k", b"a" * (7 * MiB)) is True
    s3_proxy.reset_counters()
    assert await backend.put("k", b"b" * (7 * MiB)) is False
    assert s3_proxy.bytes_to_server < 64 * 1024
    assert await backend.get("k") == b"a" * (7 * MiB)


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


async def test_missing_bucket_is_permanent_and_says_what_to_do(s3_server: S3Server) -> None:
    backend = make(s3_url(s3_server, "p", bucket=f"missing-{uuid.uuid4().hex[:8]}"))
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "get": lambda: backend.get("k"),
        "exists": lambda: backend.exists("k"),
        "delete": lambda: backend.delete("k"),
        "list": lambda: backend.list().__anext__(),
    }
    if not isinstance(s3_server, SeaweedS3):  # SeaweedFS creates the bucket on a PUT by an admin
        calls["put"] = lambda: backend.put("k", b"v")
    try:
        for op, call in calls.items():
            with pytest.raises(PermanentBackendError) as info:
                await call()
            message = str(info.value)
            assert "does not exist" in message, (op, message)
            assert "terraform/modules/s3-cache" in message
            assert message.startswith("s3://missing-")
    finally:
        await backend.close()


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


async def test_refused_connection_is_transient_and_fast(
    s3_proxy: FaultProxy, s3_via_proxy: Callable[..., S3Backend]
) -> None:
    backend = s3_via_proxy(connect_timeout=10)
    s3_proxy.refuse()
    started = time.monotonic()
    with pytest.raises(TransientBackendError):
        await backend.get("k")
    with pytest.raises(TransientBackendError):
        await backend.put("k", b"v")
    # Refused costs no timeout: a call that waited out the 10 s connect timeout would not
    # fit, nor would botocore's retries with backoff; a busy machine does.
    assert time.monotonic() - started < 5.0


async def test_blackhole_is_one_bounded_attempt(
    s3_proxy: FaultProxy, s3_via_proxy: Callable[..., S3Backend]
) -> None:
    backend = s3_via_proxy(read_timeout=1, connect_timeout=1)
    s3_proxy.blackhole()  # before the first call: each attempt opens its own connection
    started = time.monotonic()
    with pytest.raises(TransientBackendError, match=r"(?i)timeout"):
        await backend.get("k")
    elapsed = time.monotonic() - started
    s3_proxy.settle()
    assert s3_proxy.connections == 1, "one attempt: a second one would connect again"
    assert elapsed > 0.9, "it waited out the 1 s read timeout"
    assert elapsed < 10, "the configured 1 s read timeout, not the default 20 s"


async def test_blackhole_get_returns_within_tier_deadline(
    s3_proxy: FaultProxy, s3_via_proxy: Callable[..., S3Backend]
) -> None:
    backend = s3_via_proxy()  # default socket timeouts (20 s read): the deadline must rule
    await backend.put("k", b"v")
    s3_proxy.blackhole()
    tier = Tier(backend, RetryPolicy(timeout_s=0.5, retries=2), CircuitBreaker(100))
    started = time.monotonic()
    assert await tier.get("k") == (None, "timeout")
    elapsed = time.monotonic() - started
    assert elapsed < 8, f"{elapsed:.1f} s: the 0.5 s deadline, not the 20 s socket timeout"


async def test_reset_mid_body_is_transient(
    s3_proxy: FaultProxy, s3_via_proxy: Callable[..., S3Backend]
) -> None:
    backend = s3_via_proxy()
    data = os.urandom(2 * MiB)
    await backend.put("body", data)
    s3_proxy.reset_after(256 * 1024)
    with pytest.raises(TransientBackendError):
        await asyncio.wait_for(backend.get("body"), 60)
    s3_proxy.passthrough()
    assert await backend.get("body") == data, "the client recovers on the next call"


class _Throttling(BaseHTTPRequestHandler):
    """Answers every request like an overloaded S3: 503 SlowDown."""

    requests: list[str]
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        type(self).requests.append(self.command)
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = (
            b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message></Error>"
        )
        self.send_response(503)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def throttling_endpoint() -> Iterator[tuple[str, list[str]]]:
    handler = type("Handler", (_Throttling,), {"requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler.requests
    server.shutdown()
    server.server_close()


async def test_throttling_is_transient_and_retried_only_by_the_policy(
    moto_s3: S3Server, throttling_endpoint: tuple[str, list[str]]
) -> None:
    endpoint, seen = throttling_endpoint
    backend = make(s3_url(moto_s3, "p", bucket="any-bucket", endpoint_url=endpoint))
    try:
        with pytest.raises(TransientBackendError, match="SlowDown"):
            await backend.get("k")
        assert seen == ["GET"], "botocore must not retry"
        seen.clear()
        tier = Tier(backend, RetryPolicy(timeout_s=5, retries=2), CircuitBreaker(100))
        assert await tier.get("k") == (None, "error")
        assert seen == ["GET"] * 3, "the policy layer retries transient errors"
    finally:
        await backend.close()


# --- listing and fan-out -------------------------------------------------------------


async def test_list_follows_pages(
    s3_proxy: FaultProxy, s3_via_proxy: Callable[..., S3Backend]
) -> None:
    backend = s3_via_proxy()
    backend.list_page_size = 2
    for i in range(5):
        await backend.put(f"l/{i}", b"x" * i)
    s3_proxy.reset_counters()
    assert {i.key: i.size async for i in backend.list("l/")} == {f"l/{i}": i for i in range(5)}
    assert s3_proxy.count_requests("GET") == 3


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
