"""Single-part GET, PUT and HEAD of S3 objects, and UploadPart, over aiohttp, signed by
botocore's SigV4.

botocore spends about 1.5 ms of CPU on every request before and after the bytes move (event
hooks, an endpoint-ruleset evaluation per call, since S3's ruleset takes the object key as
a parameter and so defeats botocore's cache, request and response models). A cache makes
three kinds of call per entry, and a bulk copy makes thousands: for those three, and for
the parts of a large entry's upload, objcache sends the request itself over aiohttp, signed
by botocore's ``S3SigV4Auth`` (not by a signer of its own: docs/security.md), at a fraction
of the CPU (docs/benchmarks.md).

botocore still decides everything that needs its knowledge of S3:

* **where a bucket's objects live**: the URL base (virtual-hosted or path style, FIPS,
  dual-stack, a custom ``endpoint_url``) is read off one presigned URL per bucket, which
  runs botocore's own endpoint ruleset; the signing region is the client's (or the one in
  the presigned credential scope);
* **credentials**: the client's own provider chain and refresh (profile, SSO, role, IMDS);
* **everything else**: listing, creating, completing and aborting multipart uploads,
  deletes, bucket checks.

Buckets botocore routes specially (access-point or Outposts ARNs, S3 Express directory
buckets) never take this path. A redirect, a region complaint or a refused signature turns
the path off for that bucket and the call is repeated through botocore, which follows S3's
region redirects and, when the credentials really are wrong, reports that the usual way.
Error responses become botocore ``ClientError`` objects, so one classifier
(:mod:`objcache.backends.s3.errors`) serves both paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import hashlib
import re
import ssl
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import aiohttp
from botocore import exceptions as bce
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from yarl import URL

from objcache.backends.base import Sink, check_size

#: Key used only to ask botocore where a bucket's objects live (never requested).
_PROBE_KEY = "objcache-route-probe"
#: The payload hash of a request without a body.
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
#: Bodies are not hashed for the signature; the x-amz-checksum-crc32 header guards them.
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
#: Server answers that botocore may get past and this path cannot: redirects and region
#: complaints (botocore follows them), and a refused signature (a server or proxy that
#: disagrees with this signer must not cost the tier).
_HAND_BACK_CODES = frozenset(
    {
        "PermanentRedirect",
        "TemporaryRedirect",
        "Redirect",
        "AuthorizationHeaderMalformed",
        "SignatureDoesNotMatch",
    }
)
_ERROR_FIELD = re.compile(rb"<(Code|Message)>([^<]{0,1024})</\1>")
USER_AGENT = "objcache-s3-direct"
#: Bodies at least this big are signed in a worker thread (their SHA-256, over plain http).
SIGN_OFFLOAD_BYTES = 1 << 20


class Reroute(Exception):
    """The server redirected or refused this path's request: use botocore from now on."""


@dataclass(frozen=True)
class Route:
    """Where one bucket's objects live, as botocore resolved it."""

    base: str  # scheme://host[:port][/bucket] with no trailing slash, already URI-encoded
    host: str  # the Host header, exactly as signed
    path: str  # the URI-encoded path of ``base``
    region: str
    proxy: str | None = None  # from HTTP(S)_PROXY / NO_PROXY, as botocore reads them


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (None: connect directly)."""
    parts = urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies_environment().get(parts.scheme)


def route_from_presigned(url: str, client_region: str | None) -> Route | None:
    """The route implied by a presigned GET of :data:`_PROBE_KEY`; None when the URL is not
    shaped as expected (then botocore keeps the bucket)."""
    parts = urlsplit(url)
    suffix = "/" + _PROBE_KEY
    if parts.scheme not in ("http", "https") or not parts.path.endswith(suffix):
        return None
    region = client_region or "us-east-1"
    credential = parse_qs(parts.query).get("X-Amz-Credential")
    if credential:
        scope = credential[0].split("/")
        if len(scope) != 5 or scope[3] != "s3":
            return None  # signed for another service (e.g. s3express, s3-object-lambda)
        region = scope[2]
    path = parts.path[: -len(suffix)]
    default_port = {"http": 80, "https": 443}[parts.scheme]
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None and parts.port != default_port:
        host = f"{host}:{parts.port}"
    return Route(base=f"{parts.scheme}://{host}{path}", host=host, path=path, region=region)


def is_special_bucket(bucket: str) -> bool:
    """Buckets whose requests botocore signs or routes differently."""
    return bucket.startswith("arn:") or bucket.endswith("--x-s3")


class SigV4:
    """SigV4 header signing for S3 by botocore's own ``S3SigV4Auth`` (no query signing).

    botocore decides the payload hash the way it does for its own requests: over plain
    http the body's SHA-256 is signed (nothing else protects it on the wire); over https,
    with the signed ``x-amz-checksum-crc32`` header, ``UNSIGNED-PAYLOAD``; an empty body
    signs the empty hash.
    """

    def headers(
        self,
        method: str,
        route: Route,
        encoded_path: str,
        credentials: Any,
        body: bytes | memoryview | None,
        extra: dict[str, str],
        now: datetime.datetime | None = None,
    ) -> dict[str, str]:
        """The request headers, ``Authorization`` included. ``extra`` headers are signed."""
        scheme = route.base.split("://", 1)[0]
        request = AWSRequest(
            method=method,
            url=f"{scheme}://{route.host}{encoded_path}",
            headers={"host": route.host, **extra},
            data=body or b"",
        )
        checksum = next((k for k in extra if k.lower().startswith("x-amz-checksum-")), None)
        if checksum is not None:
            request.context["checksum"] = {"request_algorithm": {"in": "header", "name": checksum}}
            request.context["payload_signing_enabled"] = False  # only honoured over https
        signer = S3SigV4Auth(credentials, "s3", route.region)
        if now is None:
            signer.add_auth(request)
        else:  # tests: botocore stamps the time itself, as naive UTC
            from unittest import mock

            stamp = now.astimezone(datetime.timezone.utc).replace(tzinfo=None)
            with mock.patch("botocore.auth.get_current_datetime", return_value=stamp):
                signer.add_auth(request)
        return {k.lower(): str(v) for k, v in request.headers.items()}


async def _read_body(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """A GET's whole body, all its ``Content-Length`` said; with a non-zero ``max_bytes``
    an answer without one (chunked: a server or proxy that ignored the Range) is read no
    further than the chunk that passes the cap (EntryTooLarge)."""
    expected = response.content_length
    if expected is not None and max_bytes:
        check_size(expected, max_bytes)  # refused before the body is read
    if expected is not None or not max_bytes:
        data = await response.read()
        _check_length(len(data), expected)
        return data
    chunks: list[bytes] = []
    received = 0
    async for chunk in response.content.iter_any():
        received += len(chunk)
        check_size(received, max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _check_length(received: int, expected: int | None) -> None:
    """A GET's body is all its ``Content-Length`` said, or the answer is an error."""
    if expected is not None and received != expected:
        raise aiohttp.ClientPayloadError(f"response body cut short: {received} of {expected} bytes")


def client_error(status: int, body: bytes, headers: Any, operation: str) -> bce.ClientError:
    """The ``ClientError`` botocore would raise for this error response."""
    fields = dict(_ERROR_FIELD.findall(body[:8192]))
    code = fields.get(b"Code", b"").decode(errors="replace") or str(status)
    message = fields.get(b"Message", b"").decode(errors="replace")
    response: dict[str, Any] = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": dict(headers)},
    }
    return bce.ClientError(response, operation)


class DirectS3:
    """The direct path for one botocore client: its credentials, routes and HTTP pool."""

    def __init__(
        self,
        boto: Any,
        credentials: Any,
        *,
        connect_timeout: float,
        read_timeout: float,
        max_connections: int,
        ca_bundle: str | None,
    ) -> None:
        self.boto = boto
        self.credentials = credentials
        self.signer = SigV4()
        self._routes: dict[str, Route | None] = {}
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout, sock_read=read_timeout
        )
        self._max_connections = max_connections
        self._ca_bundle = ca_bundle
        self._http: aiohttp.ClientSession | None = None
        self._tls: ssl.SSLContext | None = None

    def _ssl(self, route: Route) -> ssl.SSLContext | bool:
        """The TLS context of ``route``'s requests, made at the first https request: loading
        the CA bundle costs 15-35 ms of CPU a process, which a plain-http endpoint (a store
        on the machine's network) never needs."""
        if not route.base.startswith("https:"):
            return True  # aiohttp's default, unused over plain http
        if self._tls is None:
            self._tls = ssl.create_default_context(cafile=self._ca_bundle)
        return self._tls

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                timeout=self._timeout,
                auto_decompress=False,
                # Proxies come from Route.proxy: trust_env would also read ~/.netrc in a
                # worker thread on every request.
                skip_auto_headers=("Content-Type",),
                headers={"User-Agent": USER_AGENT},
            )
        return self._http

    async def route(self, bucket: str) -> Route | None:
        """Where ``bucket``'s objects live, or None when botocore must handle it."""
        if bucket in self._routes:
            return self._routes[bucket]
        if is_special_bucket(bucket):
            route = None
        else:
            # No network I/O: botocore's endpoint ruleset and (cached) credentials only.
            # Errors propagate (e.g. no credentials) and the caller's botocore call reports
            # them the usual way; nothing is cached then.
            url = await self.boto.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": _PROBE_KEY}, ExpiresIn=60
            )
            route = route_from_presigned(url, self.boto.meta.region_name)
            if route is not None:
                route = dataclasses.replace(route, proxy=env_proxy(route.base))
        self._routes[bucket] = route
        return route

    def disable(self, bucket: str) -> None:
        self._routes[bucket] = None

    async def request(
        self,
        method: str,
        route: Route,
        name: str,
        operation: str,
        *,
        body: bytes | memoryview | None = None,
        extra: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
        query: dict[str, str] | None = None,
        max_bytes: int = 0,
    ) -> bytes:
        """Send one request; the body of a 2xx answer (a GET's read no further than one
        chunk past ``max_bytes`` where non-zero, whatever its headers say), else the
        ``ClientError`` botocore would raise (:class:`Reroute` for answers botocore may get
        past: redirects, region complaints, a refused signature). ``query``: the URL's
        parameters (UploadPart's ``partNumber`` and ``uploadId``), signed with it. A body of
        :data:`SIGN_OFFLOAD_BYTES` or more is signed in a worker thread: over plain http
        the signature covers its SHA-256 (hashlib lets go of the GIL)."""
        async with self._exchange(
            method, route, name, operation, body=body, extra=extra, query=query
        ) as response:
            if response_headers is not None:  # e.g. the ETag of a record; names lowercased
                response_headers.update((k.lower(), v) for k, v in response.headers.items())
            if method != "GET":
                return await response.read()
            return await _read_body(response, max_bytes)

    async def get_into(
        self, route: Route, name: str, sink: Sink, max_bytes: int, extra: dict[str, str]
    ) -> None:
        """A GET whose body goes to ``sink`` (whole, or in pieces as it arrives where the
        sink asks for that: :meth:`~objcache.backends.base.Backend.get_into`); an answer
        over ``max_bytes`` (a ranged GET's one byte more) is refused before its body is
        read. Errors as :meth:`request`."""
        async with self._exchange("GET", route, name, "GetObject", extra=extra) as response:
            expected = response.content_length
            if expected is not None:
                check_size(expected, max_bytes)
            if not await sink.begin(expected):
                data = await _read_body(response, max_bytes)
                check_size(len(data), max_bytes)
                await sink.piece(data)
                return
            received = 0
            async for data in response.content.iter_any():
                received += len(data)
                check_size(received, max_bytes)
                await sink.piece(data)
            _check_length(received, expected)

    @contextlib.asynccontextmanager
    async def _exchange(
        self,
        method: str,
        route: Route,
        name: str,
        operation: str,
        *,
        body: bytes | memoryview | None = None,
        extra: dict[str, str] | None = None,
        query: dict[str, str] | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One signed request, its 2xx response open for its body (see :meth:`request`)."""
        encoded = quote(name, safe="/~")
        if query:
            encoded += "?" + "&".join(
                f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items())
            )
        frozen = await self.credentials.get_frozen_credentials()
        sign = (method, route, f"{route.path}/{encoded}", frozen, body, extra or {})
        if body is not None and len(body) >= SIGN_OFFLOAD_BYTES:
            headers = await asyncio.to_thread(self.signer.headers, *sign)
        else:
            headers = self.signer.headers(*sign)
        url = URL(f"{route.base}/{encoded}", encoded=True)
        async with self._session().request(
            method,
            url,
            headers=headers,
            data=body,
            allow_redirects=False,
            proxy=route.proxy,
            ssl=self._ssl(route),
        ) as response:
            if response.status < 300:
                yield response
                return
            error = await response.read() if method != "HEAD" else b""
            exc = client_error(response.status, error, response.headers, operation)
            if 300 <= response.status < 400 or exc.response["Error"]["Code"] in _HAND_BACK_CODES:
                raise Reroute(exc.response["Error"]["Code"])
            raise exc

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
