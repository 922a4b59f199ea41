"""The S3 direct path (objcache.backends.s3.direct): signatures identical to botocore's,
routes read off botocore's endpoint resolution, the per-entry calls really taking the path
against real servers, and the fall back to botocore when the server redirects."""

from __future__ import annotations

import datetime
import hashlib
import shutil
import ssl
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import aiohttp
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials

from objcache.backends.base import PutMode
from objcache.backends.s3 import direct as _s3_direct
from objcache.backends.s3.direct import (
    EMPTY_SHA256,
    UNSIGNED_PAYLOAD,
    Route,
    SigV4,
    env_proxy,
    is_special_bucket,
    route_from_presigned,
)
from objcache.backends.s3.store import CLIENTS, S3Backend
from objcache.client import Client
from objcache.config.settings import Config
from objcache.config.urls import parse_tier_url
from objcache.errors import ClockSkew, PermanentBackendError
from tests.faults._shim import ThrottleShim
from tests.support.cloud import s3_url
from tests.support.servers import S3Server

NOW = datetime.datetime(2026, 11, 23, 6, 30, 15, tzinfo=datetime.timezone.utc)


# --- the signer ------------------------------------------------------------------------


class _FixedPayload(S3SigV4Auth):
    """botocore's S3 signer with a given payload hash (it would hash the body over http)."""

    def __init__(self, credentials: ReadOnlyCredentials, region: str, payload_hash: str) -> None:
        super().__init__(credentials, "s3", region)
        self._payload_hash = payload_hash

    def payload(self, request: AWSRequest) -> str:
        return self._payload_hash


def botocore_authorization(
    method: str, url: str, headers: dict[str, str], creds: ReadOnlyCredentials, region: str
) -> str:
    request = AWSRequest(method=method, url=url, headers=dict(headers))
    signer = _FixedPayload(creds, region, headers["x-amz-content-sha256"])
    # botocore stamps the time itself (naive UTC): make it ours.
    with mock.patch("botocore.auth.get_current_datetime", return_value=NOW.replace(tzinfo=None)):
        signer.add_auth(request)
    return str(request.headers["Authorization"])


KEYS = [
    "v1/0123abcd/fx-graph/3f/fabc",
    "v1/env/kind/00/with space+plus=equals&amp",
    "v1/env/kind/ff/ünïcødé/日本語",
    "v1/env/kind/aa/!'()*~._-@$,;:",
]


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzEJr//session+token=="])
@pytest.mark.parametrize(
    ("method", "body", "extra"),
    [
        ("GET", None, {}),
        ("HEAD", None, {}),
        ("PUT", b"entry", {"x-amz-checksum-crc32": "AAAAAA==", "If-None-Match": "*"}),
    ],
)
@pytest.mark.parametrize(
    "route",
    [
        Route("http://127.0.0.1:8333/bucket", "127.0.0.1:8333", "/bucket", "us-east-1"),
        Route(
            "https://b.s3.eu-west-1.amazonaws.com", "b.s3.eu-west-1.amazonaws.com", "", "eu-west-1"
        ),
    ],
    ids=["path-style", "virtual-hosted"],
)
def test_signature_is_the_one_botocore_computes(
    key: str,
    token: str | None,
    method: str,
    body: bytes | None,
    extra: dict[str, str],
    route: Route,
) -> None:
    """The differential test: the headers objcache sends, signed independently by
    botocore's S3 signer over the payload hash S3's rules call for, give the same
    Authorization."""
    creds = ReadOnlyCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    encoded = _s3_direct.quote(key, safe="/~")
    ours = SigV4().headers(method, route, f"{route.path}/{encoded}", creds, body, extra, NOW)
    if body is None:
        payload = EMPTY_SHA256
    elif route.base.startswith("https://"):
        payload = UNSIGNED_PAYLOAD
    else:
        payload = hashlib.sha256(body).hexdigest()
    assert ours["x-amz-content-sha256"] == payload
    assert ours["x-amz-date"] == NOW.strftime("%Y%m%dT%H%M%SZ")
    assert ours.get("x-amz-security-token") == token
    sent = {k: v for k, v in ours.items() if k != "authorization"}
    expected = botocore_authorization(method, f"{route.base}/{encoded}", sent, creds, route.region)
    assert ours["authorization"] == expected


def test_cached_signing_key_follows_secret_date_and_region() -> None:
    """One signer, many requests: its cached signing key must never outlive the secret,
    the day or the region it was derived for (each answer equals a fresh signer's)."""
    shared = SigV4()
    tomorrow = NOW + datetime.timedelta(days=1)
    cases = [
        (ReadOnlyCredentials("AK", "secret-1", None), "r1", NOW),
        (ReadOnlyCredentials("AK", "secret-1", None), "r2", NOW),
        (ReadOnlyCredentials("AK", "secret-2", None), "r2", NOW),
        (ReadOnlyCredentials("AK", "secret-2", None), "r2", tomorrow),
        (ReadOnlyCredentials("AK", "secret-1", None), "r1", NOW),
    ]
    seen = set()
    for creds, region, when in cases:
        route = Route("http://h/b", "h", "/b", region)
        ours = shared.headers("GET", route, "/b/k", creds, None, {}, when)
        fresh = SigV4().headers("GET", route, "/b/k", creds, None, {}, when)
        assert ours == fresh
        seen.add(ours["authorization"])
    assert len(seen) == 4, "the first and last case are the same request"


# --- routes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "region", "expected"),
    [
        (
            "http://127.0.0.1:8333/bkt/objcache-route-probe?AWSAccessKeyId=a&Signature=s",
            "us-east-1",
            Route("http://127.0.0.1:8333/bkt", "127.0.0.1:8333", "/bkt", "us-east-1"),
        ),
        (
            "https://bkt.s3.amazonaws.com/objcache-route-probe?AWSAccessKeyId=a",
            "us-east-1",
            Route("https://bkt.s3.amazonaws.com", "bkt.s3.amazonaws.com", "", "us-east-1"),
        ),
        (
            "https://s3.eu-west-1.amazonaws.com:443/my.dotted/objcache-route-probe?x=1",
            "eu-west-1",
            Route(
                "https://s3.eu-west-1.amazonaws.com/my.dotted",
                "s3.eu-west-1.amazonaws.com",
                "/my.dotted",
                "eu-west-1",
            ),
        ),
        (
            "https://b.minio:9000/objcache-route-probe?X-Amz-Credential=AK%2F20261123%2Fhome%2Fs3%2Faws4_request",
            "ignored",
            Route("https://b.minio:9000", "b.minio:9000", "", "home"),
        ),
    ],
)
def test_route_is_read_off_botocores_presigned_url(url: str, region: str, expected: Route) -> None:
    assert route_from_presigned(url, region) == expected


@pytest.mark.parametrize(
    "url",
    [
        "https://b.s3express-usw2-az1.us-west-2.amazonaws.com/objcache-route-probe"
        "?X-Amz-Credential=AK%2F20261123%2Fus-west-2%2Fs3express%2Faws4_request",
        "https://b.s3.amazonaws.com/other-key?AWSAccessKeyId=a",
        "ftp://b/objcache-route-probe",
    ],
)
def test_unexpected_presigned_urls_keep_botocore(url: str) -> None:
    assert route_from_presigned(url, "us-east-1") is None


def test_access_points_and_directory_buckets_keep_botocore() -> None:
    assert is_special_bucket("arn:aws:s3:us-west-2:123456789012:accesspoint/ap")
    assert is_special_bucket("cache--usw2-az1--x-s3")
    assert not is_special_bucket("objcache-cache")


# --- against the real servers ----------------------------------------------------------

servers = pytest.mark.servers


class BotoCalls:
    """Counts the botocore client's per-entry calls of one backend's shared client."""

    def __init__(self, boto: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for op in ("get_object", "put_object", "head_object"):
            original = getattr(boto, op)

            async def counted(*args: Any, _op: str = op, _f: Any = original, **kw: Any) -> Any:
                self.calls.append(_op)
                return await _f(*args, **kw)

            monkeypatch.setattr(boto, op, counted)


@pytest.fixture
async def backend(seaweed_s3: S3Server, direct_prefix: str) -> AsyncIterator[S3Backend]:
    b = S3Backend(parse_tier_url(s3_url(seaweed_s3, direct_prefix)))
    yield b
    await b.close()


@pytest.fixture
def direct_prefix() -> str:
    return f"d{uuid.uuid4().hex[:10]}"


@servers
async def test_per_entry_calls_take_the_direct_path(
    backend: S3Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    await backend.exists("warm-up")  # opens the shared client
    client = CLIENTS.peek(backend.client_key)
    assert client is not None and client.direct is not None
    boto = BotoCalls(client.boto, monkeypatch)
    data = bytes(range(256)) * 1000
    assert await backend.put("k", data) is True
    assert await backend.put("k", b"other") is False, "If-None-Match is signed and honoured"
    assert await backend.put("k", b"over", PutMode.OVERWRITE) is True
    assert await backend.get("k") == b"over"
    assert await backend.exists("k") is True
    assert await backend.get("absent") is None
    assert await backend.exists("absent") is False
    assert boto.calls == [], "no per-entry call went through botocore"
    assert await client.direct.route(backend.bucket) is not None


@servers
async def test_direct_0_sends_everything_through_botocore(
    seaweed_s3: S3Server, direct_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = S3Backend(parse_tier_url(s3_url(seaweed_s3, direct_prefix, direct="0")))
    try:
        await backend.exists("warm-up")
        client = CLIENTS.peek(backend.client_key)
        assert client is not None and client.direct is None
        boto = BotoCalls(client.boto, monkeypatch)
        assert await backend.put("k", b"v") is True
        assert await backend.put("k", b"w") is False
        assert await backend.get("k") == b"v"
        assert await backend.exists("k") is True
        assert boto.calls == ["put_object", "put_object", "get_object", "head_object"]
    finally:
        await backend.close()


def s3_error(code: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        "<Message>m</Message></Error>"
    ).encode()


@servers
@pytest.mark.parametrize(
    ("status", "code"),
    [
        (301, "PermanentRedirect"),
        (400, "AuthorizationHeaderMalformed"),
        (403, "SignatureDoesNotMatch"),
    ],
)
async def test_a_redirect_or_refusal_hands_the_bucket_back_to_botocore(
    seaweed_s3: S3Server,
    direct_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    status: int,
    code: str,
) -> None:
    port = int(seaweed_s3.endpoint_url.rsplit(":", 1)[1])
    shim = ThrottleShim(port, status=status, body=s3_error(code), content_type="application/xml")
    backend = S3Backend(parse_tier_url(s3_url(seaweed_s3, direct_prefix, endpoint_url=shim.url)))
    try:
        assert await backend.put("k", b"v") is True
        client = CLIENTS.peek(backend.client_key)
        assert client is not None and client.direct is not None
        boto = BotoCalls(client.boto, monkeypatch)
        shim.throttle_next(1)  # the next request (the direct GET) is refused
        assert await backend.get("k") == b"v", "the same call is repeated through botocore"
        assert shim.throttled == 1
        assert await backend.exists("k") is True
        assert boto.calls == ["get_object", "head_object"], "the bucket stays with botocore"
        assert await client.direct.route(backend.bucket) is None
    finally:
        await backend.close()
        shim.close()


@servers
async def test_direct_errors_are_classified_like_botocores(seaweed_s3: S3Server) -> None:
    backend = S3Backend(parse_tier_url(s3_url(seaweed_s3, "p", bucket="no-such-bucket-d1")))
    try:
        with pytest.raises(PermanentBackendError, match="does not exist"):
            await backend.get("k")
        with pytest.raises(PermanentBackendError, match="does not exist"):
            await backend.exists("k")
    finally:
        await backend.close()


def test_proxy_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example,127.0.0.1")
    assert env_proxy("https://b.s3.us-east-1.amazonaws.com") == "http://proxy.corp:3128"
    assert env_proxy("https://s3.internal.example/b") is None
    assert env_proxy("http://127.0.0.1:8333/b") is None


# --- payload signing and clock skew -----------------------------------------------------


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("http://127.0.0.1:8333/bucket", hashlib.sha256(b"entry bytes").hexdigest()),
        ("https://b.s3.eu-west-1.amazonaws.com", UNSIGNED_PAYLOAD),
    ],
)
def test_the_payload_is_signed_over_plain_http(base: str, expected: str) -> None:
    """Over http nothing else protects the body on the wire: its SHA-256 is signed. Over
    https TLS and the signed x-amz-checksum-crc32 header do, so the body is not hashed."""
    parts = urlsplit(base)
    route = Route(base, parts.netloc, parts.path, "eu-west-1")
    creds = ReadOnlyCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None)
    extra = {"x-amz-checksum-crc32": "AAAAAA=="}
    ours = SigV4().headers("PUT", route, f"{route.path}/k", creds, b"entry bytes", extra, NOW)
    assert ours["x-amz-content-sha256"] == expected


@servers
async def test_request_time_too_skewed_is_a_clock_error_that_leaves_the_breaker_closed(
    seaweed_s3: S3Server, direct_prefix: str, tmp_path: Path
) -> None:
    port = int(seaweed_s3.endpoint_url.rsplit(":", 1)[1])
    shim = ThrottleShim(
        port, status=403, body=s3_error("RequestTimeTooSkewed"), content_type="application/xml"
    )
    url = s3_url(seaweed_s3, direct_prefix, endpoint_url=shim.url)
    backend = S3Backend(parse_tier_url(url))
    try:
        assert await backend.put("k", b"v") is True
        shim.throttle_next(1)
        with pytest.raises(ClockSkew, match="clock") as exc:
            await backend.get("k")
        assert "access denied" not in str(exc.value) and "\n" not in str(exc.value)
    finally:
        await backend.close()
    config = Config.from_env({}, tiers=url, local_dir=tmp_path / "local", prefetch=False)
    client = Client(config)
    try:
        shim.throttle_next(50)
        for i in range(10):  # far past the breaker's threshold
            assert client.get("fx-graph", f"skewed-{i}") is None
        remote = client.stats()["tiers"][1]
        assert remote["misses"] == {"clock_skew": 10}, remote
        assert remote["breaker_opened"] == 0
    finally:
        client.close()
        client.bridge.stop()
        shim.close()


async def test_a_name_the_store_refuses_is_an_invalid_key_that_leaves_the_breaker_closed(
    seaweed_s3: S3Server, direct_prefix: str, tmp_path: Path
) -> None:
    """SeaweedFS's KeyTooLongError (S3's InvalidObjectName) is the caller's input, not the
    tier's health: ``invalid_key`` misses, and the next ordinary put still goes through."""
    port = int(seaweed_s3.endpoint_url.rsplit(":", 1)[1])
    shim = ThrottleShim(
        port, status=400, body=s3_error("KeyTooLongError"), content_type="application/xml"
    )
    url = s3_url(seaweed_s3, direct_prefix, endpoint_url=shim.url)
    config = Config.from_env(
        {}, tiers=url, local_dir=tmp_path / "local", prefetch=False, breaker_failures=3
    )
    client = Client(config)
    try:
        shim.throttle_next(10)
        for i in range(10):  # far past the breaker's threshold
            assert client.get("fx-graph", f"long-{i}") is None
        remote = client.stats()["tiers"][1]
        assert remote["misses"] == {"invalid_key": 10}, remote
        assert remote["breaker_opened"] == 0 and remote["breaker"] == "closed"
        client.put("fx-graph", "ordinary", b"v")
        assert client.flush(10) == 0
        assert client.stats()["tiers"][1]["puts"] >= 1  # the ordinary key reached the tier
    finally:
        client.close()
        client.bridge.stop()
        shim.close()


class _Creds:
    async def get_frozen_credentials(self) -> ReadOnlyCredentials:
        return ReadOnlyCredentials("AK", "SK", None)


@pytest.mark.parametrize("call", ["get_into", "request"])
async def test_an_answer_without_a_length_is_read_no_further_than_the_cap(call: str) -> None:
    """A server or proxy that ignores the Range and answers chunked (no Content-Length): the
    body is refused as it passes the cap (EntryTooLarge), not read whole into memory."""
    from aiohttp import web

    from objcache.errors import EntryTooLarge
    from objcache.testing.backend_contract import KeepingSink

    written = []

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(64):  # 64 MiB, if nobody stops reading
            await response.write(b"x" * (1 << 20))
            written.append(1)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/{tail:.*}", endless)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    direct = _s3_direct.DirectS3(
        None, _Creds(), connect_timeout=5, read_timeout=30, max_connections=4, ca_bundle=None
    )
    route = Route(f"http://127.0.0.1:{port}/bucket", f"127.0.0.1:{port}", "/bucket", "us-east-1")
    sink = KeepingSink(False)
    try:
        with pytest.raises(EntryTooLarge):
            if call == "get_into":
                await direct.get_into(route, "k", sink, 1 << 20, {"range": "bytes=0-1048576"})
            else:
                await direct.request(
                    "GET", route, "k", "GetObject", extra={"range": "bytes=0-1048576"},
                    max_bytes=(1 << 20) + 1,
                )  # fmt: skip
        assert sink.pieces == [] and len(written) < 64
    finally:
        await direct.close()
        await runner.cleanup()


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its own CA) and its key, made by openssl."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
async def test_tls_is_set_up_for_an_https_endpoint_only_with_the_configured_ca_bundle(
    tmp_path: Path,
) -> None:
    """A plain-http endpoint makes no TLS context (loading a CA bundle is 15-35 ms of CPU a
    process); an https endpoint's requests verify its certificate against the CA bundle
    botocore names: served with it, refused without it."""
    from aiohttp import web

    cert, key = _self_signed(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=b"entry bytes")

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    sites = [
        web.TCPSite(runner, "127.0.0.1", 0),
        web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls),
    ]
    for site in sites:
        await site.start()
    plain, tls = (s._server.sockets[0].getsockname()[1] for s in sites)  # type: ignore[union-attr]

    def route(scheme: str, port: int) -> Route:
        return Route(f"{scheme}://127.0.0.1:{port}/b", f"127.0.0.1:{port}", "/b", "us-east-1")

    def direct(ca_bundle: str | None) -> _s3_direct.DirectS3:
        return _s3_direct.DirectS3(
            None, _Creds(), connect_timeout=5, read_timeout=30, max_connections=4,
            ca_bundle=ca_bundle,
        )  # fmt: skip

    trusting, stranger = direct(str(cert)), direct(None)
    try:
        assert await trusting.request("GET", route("http", plain), "k", "GetObject") == (
            b"entry bytes"
        )
        assert trusting._tls is None  # plain http: no context made
        assert await trusting.request("GET", route("https", tls), "k", "GetObject") == (
            b"entry bytes"
        )
        assert trusting._tls is not None
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await stranger.request("GET", route("https", tls), "k", "GetObject")
    finally:
        await trusting.close()
        await stranger.close()
        await runner.cleanup()
