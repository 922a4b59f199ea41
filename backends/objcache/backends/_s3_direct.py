"""Single-part GET, PUT and HEAD of S3 objects over aiohttp, signed here (SigV4).

botocore spends about 1.5 ms of CPU on every request before and after the bytes move (event
hooks, an endpoint-ruleset evaluation per call, since S3's ruleset takes the object key as
a parameter and so defeats botocore's cache, request and response models). A cache makes
three kinds of call per entry, and a bulk copy makes thousands: for those three, objcache
signs and sends the request itself, at about a quarter of the CPU (docs/benchmarks.md).

botocore still decides everything that needs its knowledge of S3:

* **where a bucket's objects live**: the URL base (virtual-hosted or path style, FIPS,
  dual-stack, a custom ``endpoint_url``) is read off one presigned URL per bucket, which
  runs botocore's own endpoint ruleset; the signing region is the client's (or the one in
  the presigned credential scope);
* **credentials**: the client's own provider chain and refresh (profile, SSO, role, IMDS);
* **everything else**: listing, multipart uploads, deletes, bucket checks.

Buckets botocore routes specially (access-point or Outposts ARNs, S3 Express directory
buckets) never take this path. A redirect, a region complaint or a refused signature turns
the path off for that bucket and the call is repeated through botocore, which follows S3's
region redirects and, when the credentials really are wrong, reports that the usual way.
Error responses become botocore ``ClientError`` objects, so one classifier
(:mod:`objcache.backends._s3_errors`) serves both paths.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import re
import ssl
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import aiohttp
from botocore import exceptions as bce
from yarl import URL

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
    """AWS Signature Version 4 for S3 header-signed requests (no query signing)."""

    def __init__(self) -> None:
        self._key: tuple[tuple[str, str, str], bytes] | None = None

    def _signing_key(self, secret: str, date: str, region: str) -> bytes:
        cached = self._key
        if cached is not None and cached[0] == (secret, date, region):
            return cached[1]
        key = ("AWS4" + secret).encode()
        for part in (date, region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        self._key = ((secret, date, region), key)
        return key

    def headers(
        self,
        method: str,
        route: Route,
        encoded_path: str,
        credentials: Any,
        payload_hash: str,
        extra: dict[str, str],
        now: datetime.datetime | None = None,
    ) -> dict[str, str]:
        """The request headers, ``Authorization`` included. ``extra`` headers are signed."""
        now = now or datetime.datetime.now(datetime.timezone.utc)
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        date = amz_date[:8]
        signed = {
            "host": route.host,
            "x-amz-content-sha256": payload_hash,
            "x-amz-date": amz_date,
            **{k.lower(): " ".join(v.split()) for k, v in extra.items()},
        }
        if credentials.token:
            signed["x-amz-security-token"] = credentials.token
        names = sorted(signed)
        canonical = "\n".join(
            (
                method,
                encoded_path,
                "",  # no query string
                "".join(f"{n}:{signed[n]}\n" for n in names),
                ";".join(names),
                payload_hash,
            )
        )
        scope = f"{date}/{route.region}/s3/aws4_request"
        to_sign = "\n".join(
            ("AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest())
        )
        key = self._signing_key(credentials.secret_key, date, route.region)
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        signed["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}"
        )
        return signed


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

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            ssl_context = ssl.create_default_context(cafile=self._ca_bundle)
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, ssl=ssl_context),
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
        body: bytes | None = None,
        extra: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> bytes:
        """Send one request; the body of a 2xx answer, else the ``ClientError`` botocore
        would raise (:class:`Reroute` for answers botocore may get past: redirects, region
        complaints, a refused signature)."""
        encoded = quote(name, safe="/~")
        frozen = await self.credentials.get_frozen_credentials()
        headers = self.signer.headers(
            method,
            route,
            f"{route.path}/{encoded}",
            frozen,
            EMPTY_SHA256 if body is None else UNSIGNED_PAYLOAD,
            extra or {},
        )
        url = URL(f"{route.base}/{encoded}", encoded=True)
        async with self._session().request(
            method, url, headers=headers, data=body, allow_redirects=False, proxy=route.proxy
        ) as response:
            if response.status < 300:
                if response_headers is not None:  # e.g. the ETag of a record; names lowercased
                    response_headers.update((k.lower(), v) for k, v in response.headers.items())
                data = await response.read()
                expected = response.content_length
                if method == "GET" and expected is not None and len(data) != expected:
                    raise aiohttp.ClientPayloadError(
                        f"response body cut short: {len(data)} of {expected} bytes"
                    )
                return data
            error = await response.read() if method != "HEAD" else b""
            exc = client_error(response.status, error, response.headers, operation)
            if 300 <= response.status < 400 or exc.response["Error"]["Code"] in _HAND_BACK_CODES:
                raise Reroute(exc.response["Error"]["Code"])
            raise exc

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
