"""The fault contract: what every networked backend does behind the TCP fault proxy
(tests/support/proxy.py), on the same real servers the backend contract runs it on
(``tests.support.servers.CONTRACT_SERVERS``). A failure is classified, actionable and bounded
in time, with no hidden retries of the client library, so the tier's deadline and retries
rule (docs/architecture.md, "Policies"); a backend's instances share one client and do no
I/O until the first call.

Each case runs once per server of :data:`BEHIND_PROXY`; the cases that count HTTP requests,
take the large-entry path or need a bucket (a missing one, a store answering 503) run on the
object stores only. What only one backend does under
a fault (S3's aborted multipart uploads, GCS's resumable uploads, Redis's size limit) stays
in its own file under tests/backends.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from objcache.backends import create_backend
from objcache.backends.base import Backend, PutMode
from objcache.backends.gcs.store import SHARED
from objcache.backends.redis.store import CLIENTS as REDIS_CLIENTS
from objcache.backends.s3.store import CLIENTS as S3_CLIENTS
from objcache.config.urls import parse_tier_url
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.tier import Tier
from objcache.errors import PermanentBackendError, TransientBackendError
from objcache.testing.backend_contract import KeepingSink
from tests.support import servers
from tests.support.cloud import gcs_url, s3_url
from tests.support.proxy import FaultProxy

pytestmark = pytest.mark.servers

MiB = 1 << 20
Options = dict[str, Any]
S3_SLOWDOWN_503 = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
GCS_503 = json.dumps({"error": {"code": 503, "message": "Backend Error"}}).encode()


def _s3_url(server: servers.S3Server, prefix: str, endpoint: str, options: Options) -> str:
    return s3_url(server, prefix, endpoint_url=endpoint, **options)


def _gcs_url(server: servers.FakeGCS, prefix: str, endpoint: str, options: Options) -> str:
    return gcs_url(server, prefix, endpoint=endpoint, **options)


def _redis_url(server: servers.RedisServer, prefix: str, endpoint: str, options: Options) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"prefix": f"{prefix}/", **options}.items())
    return f"redis://{endpoint.removeprefix('http://')}/0?{query}"


@dataclass(frozen=True)
class Kind:
    """One backend as the fault contract drives it: how to reach its server through a proxy
    and what each case may expect of it. The defaults are an HTTP object store's."""

    #: the session fixture of its server (also the case's id)
    server: str
    server_class: type[servers.Server]
    #: a tier URL on ``server`` whose traffic goes to ``endpoint`` (the proxy)
    url: Callable[[Any, str, str, Options], str] = _s3_url
    #: the key the backend's shared client is held under, and that client (None: none open)
    key: Callable[[Any], Any] = lambda backend: backend.client_key
    peek: Callable[[Any], Any] = S3_CLIENTS.peek
    #: the last instance's close closes the shared client (GCS keeps its for the process)
    last_close_closes_client: bool = True
    #: the option of the socket read timeout, and a bound below its default (5 s for
    #: Redis, 20 s for the HTTP stores) that a call waiting out 1 s stays under
    read_timeout_option: str = "read_timeout"
    under_default_s: float = 10
    #: the connection a call is made on stays open between calls (Redis's pool): a
    #: blackhole then hangs it without a new connect; an HTTP store connects per attempt
    pooled: bool = False
    #: options of the blackholed-deadline case, and the bound its 0.5 s deadline stays
    #: under; by default the socket timeouts are the defaults (20 s read): the deadline rules
    deadline_options: Options = field(default_factory=dict)
    deadline_bound_s: float = 8
    #: an entry that takes the large (multipart, resumable) path, with the options it needs
    large_size: int = 7 * MiB
    large_options: Options = field(
        default_factory=lambda: {"multipart_threshold": 6 * MiB, "part_size": 5 * MiB}
    )
    #: the Terraform module a missing bucket's message points to; the server makes a missing
    #: bucket on a PUT by its admin (SeaweedFS), so a put to one is no error there
    terraform_module: str = "s3-cache"
    creates_missing_bucket: bool = False
    #: how the store says it is overloaded (a 503 with its error body), what the error then
    #: names, and the method of a small put
    overloaded: tuple[str, bytes] = ("application/xml", S3_SLOWDOWN_503)
    overloaded_match: str = "SlowDown"
    put_method: str = "PUT"


#: Every server a networked backend's contract runs on, in front of which one proxy can
#: stand. Not here: a Redis Cluster (its client follows MOVED to each node's own address;
#: its faults: tests/faults/test_redis_cluster.py, tests/backends/test_redis_cluster.py) and
#: the local folder (no network).
BEHIND_PROXY: dict[str, Kind] = {
    kind.server: kind
    for kind in (
        Kind(
            "redis_server",
            servers.RedisServer,
            url=_redis_url,
            key=lambda backend: backend.pool_key,
            peek=REDIS_CLIENTS.peek,
            read_timeout_option="socket_timeout",
            under_default_s=4,
            pooled=True,
            # redis-py's default retries took 26.7 s to fail here; the tier deadline rules
            deadline_bound_s=4,
            large_size=0,  # one path for every size
        ),
        Kind("seaweed_s3", servers.SeaweedS3, creates_missing_bucket=True),
        Kind("moto_s3", servers.MotoS3),
        Kind(
            "fake_gcs",
            servers.FakeGCS,
            url=_gcs_url,
            peek=lambda key: SHARED.clients.get(key),  # the dict is made anew in a fork
            last_close_closes_client=False,
            # the read timeout bounds the abandoned worker thread; without the deadline one
            # attempt alone would wait it out (10 s)
            deadline_options={"read_timeout": 10},
            deadline_bound_s=5,
            large_size=9 * MiB,  # > 8 MiB: resumable
            large_options={},
            terraform_module="gcs-cache",
            overloaded=("application/json", GCS_503),
            overloaded_match="503",
            put_method="POST",
        ),
    )
}
OBJECT_STORES = [name for name, kind in BEHIND_PROXY.items() if kind.large_size]
NOT_BEHIND_A_PROXY = (servers.RedisClusterServer, servers.LocalFolder)


@dataclass
class Proxied:
    """One case's backend kind, its proxy, and a factory of backends behind that proxy."""

    kind: Kind
    proxy: FaultProxy
    make: Callable[..., Backend]


@pytest.fixture(params=list(BEHIND_PROXY))
async def behind_proxy(
    request: pytest.FixtureRequest, fault_proxy: Callable[[str, int], FaultProxy]
) -> AsyncIterator[Proxied]:
    """Backends of one kind whose traffic goes through a fresh fault proxy; the proxy is put
    back to passthrough and every backend closed at teardown."""
    kind = BEHIND_PROXY[request.param]
    server = request.getfixturevalue(kind.server)
    proxy = fault_proxy(server.host, server.port)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    made: list[Backend] = []

    def make(endpoint: str = "", **options: Any) -> Backend:
        """A backend behind the proxy, or at ``endpoint``; ``options`` go into its URL."""
        url = kind.url(server, prefix, endpoint or proxy.url(), options)
        backend = create_backend(parse_tier_url(url))
        made.append(backend)
        return backend

    yield Proxied(kind, proxy, make)
    proxy.passthrough()
    proxy.bandwidth_bps = 0
    for backend in made:
        await backend.close()


object_stores = pytest.mark.parametrize("behind_proxy", OBJECT_STORES, indirect=True)


def test_every_networked_contract_server_runs_the_fault_contract() -> None:
    """A server the backend contract runs on is behind a proxy here, or named as one that
    cannot be (a new backend's server joins :data:`BEHIND_PROXY`)."""
    contract = {
        cls
        for entry in servers.CONTRACT_SERVERS.values()
        if not isinstance(entry, str)
        for cls in entry
    }
    covered = {kind.server_class for kind in BEHIND_PROXY.values()}
    assert sorted(c.__name__ for c in contract - covered - set(NOT_BEHIND_A_PROXY)) == []


# --- client sharing ------------------------------------------------------------------


async def test_construction_does_no_io_and_instances_share_one_client(
    behind_proxy: Proxied,
) -> None:
    kind, proxy = behind_proxy.kind, behind_proxy.proxy
    tasks = asyncio.all_tasks()
    a, b = behind_proxy.make(), behind_proxy.make()
    assert asyncio.all_tasks() == tasks, "constructing a backend must start no task"
    proxy.settle()
    assert proxy.connections == 0, "nor connect"
    assert kind.key(a) == kind.key(b)
    assert kind.peek(kind.key(a)) is None, "nor create a client"
    await a.put("k", b"v")
    assert await b.get("k") == b"v"
    client = kind.peek(kind.key(a))
    assert client is not None and client is kind.peek(kind.key(b))
    if kind.pooled:
        proxy.settle()
        assert proxy.connections == 1, "sequential calls reuse one pooled connection"
    await a.close()
    assert kind.peek(kind.key(b)) is client, "b still uses the shared client"
    await a.close()  # idempotent
    assert await b.get("k") == b"v"
    assert await b.exists("k") is True
    await b.close()
    if kind.last_close_closes_client:
        assert kind.peek(kind.key(b)) is None, "the last close closes the client"
    await b.close()  # idempotent after the last close too
    assert await b.get("k") == b"v", "a closed instance reopens lazily"


# --- failures: classified and bounded in time ----------------------------------------


async def test_refused_connection_is_transient_and_fast(behind_proxy: Proxied) -> None:
    backend = behind_proxy.make(connect_timeout=10)
    behind_proxy.proxy.refuse()
    started = time.monotonic()
    with pytest.raises(TransientBackendError):
        await backend.get("k")
    with pytest.raises(TransientBackendError):
        await backend.put("k", b"v")
    # Refused costs no timeout: a call that waited out the 10 s connect timeout would not
    # fit, nor would a client library's retries with backoff; a busy machine does.
    assert time.monotonic() - started < 5.0


async def test_blackhole_is_one_bounded_attempt(behind_proxy: Proxied) -> None:
    kind, proxy = behind_proxy.kind, behind_proxy.proxy
    backend = behind_proxy.make(**{kind.read_timeout_option: 1, "connect_timeout": 1})
    if kind.pooled:
        await backend.put("k", b"v")  # on the one pooled connection
    proxy.blackhole()  # an HTTP store: before the first call, each attempt connects anew
    proxy.reset_counters()
    started = time.monotonic()
    with pytest.raises(TransientBackendError, match=r"(?i)timeout"):
        await backend.get("k")
    elapsed = time.monotonic() - started
    proxy.settle()
    # one attempt: a second one (a retry) would connect again
    assert proxy.connections == (0 if kind.pooled else 1)
    assert elapsed > 0.9, "it waited out the 1 s read timeout"
    assert elapsed < kind.under_default_s, "the configured 1 s read timeout, not the default"


async def test_blackhole_get_returns_within_tier_deadline(behind_proxy: Proxied) -> None:
    kind, proxy = behind_proxy.kind, behind_proxy.proxy
    backend = behind_proxy.make(**kind.deadline_options)
    await backend.put("k", b"v")  # a connection exists, then the server vanishes
    proxy.blackhole()
    tier = Tier(backend, RetryPolicy(timeout_s=0.5, retries=2), CircuitBreaker(100))
    started = time.monotonic()
    assert await tier.get("k") == (None, "timeout")
    elapsed = time.monotonic() - started
    assert elapsed < kind.deadline_bound_s, f"{elapsed:.1f} s: the 0.5 s deadline rules"
    # another instance (connect succeeds, the server never answers) is bounded too
    fresh = behind_proxy.make(**kind.deadline_options)
    started = time.monotonic()
    assert await Tier(fresh, RetryPolicy(0.5, 2), CircuitBreaker(100)).get("k") == (
        None,
        "timeout",
    )
    elapsed = time.monotonic() - started
    assert elapsed < kind.deadline_bound_s, f"{elapsed:.1f} s: the 0.5 s deadline rules"


async def test_reset_mid_body_is_transient(behind_proxy: Proxied) -> None:
    proxy = behind_proxy.proxy
    backend = behind_proxy.make()
    data = os.urandom(2 * MiB)
    await backend.put("body", data)
    proxy.reset_after(256 * 1024)
    with pytest.raises(TransientBackendError):
        await asyncio.wait_for(backend.get("body"), 60)
    proxy.passthrough()
    assert await backend.get("body") == data, "the client recovers on the next call"


@pytest.mark.parametrize("in_pieces", [True, False], ids=["in-pieces", "whole"])
async def test_reset_mid_body_into_a_sink_is_transient(
    behind_proxy: Proxied, in_pieces: bool
) -> None:
    """``get_into`` (a large entry streamed to its local file): a reset mid-body is a
    transient error, and the sink never holds the whole body before it."""
    proxy = behind_proxy.proxy
    backend = behind_proxy.make()
    data = os.urandom(2 * MiB)
    await backend.put("body", data)
    proxy.reset_after(256 * 1024)
    cut = KeepingSink(in_pieces)
    with pytest.raises(TransientBackendError):
        await asyncio.wait_for(backend.get_into("body", 4 * MiB, cut), 60)
    assert sum(map(len, cut.pieces)) < len(data)
    proxy.passthrough()
    whole = KeepingSink(in_pieces)
    assert await backend.get_into("body", 4 * MiB, whole) is True
    assert b"".join(whole.pieces) == data, "the client recovers on the next call"


# --- what the proxy shows of an object store's traffic -------------------------------


@object_stores
async def test_large_create_of_existing_key_uploads_nothing(behind_proxy: Proxied) -> None:
    kind, proxy = behind_proxy.kind, behind_proxy.proxy
    backend = behind_proxy.make(**kind.large_options)
    first, second = b"a" * kind.large_size, b"b" * kind.large_size
    assert await backend.put("k", first) is True
    proxy.reset_counters()
    assert await backend.put("k", second) is False
    assert proxy.bytes_to_server < 64 * 1024
    assert await backend.get("k") == first


@object_stores
async def test_list_follows_pages(behind_proxy: Proxied) -> None:
    proxy = behind_proxy.proxy
    backend = behind_proxy.make()
    backend.list_page_size = 2  # type: ignore[attr-defined]
    for i in range(5):
        await backend.put(f"l/{i}", b"x" * i)
    proxy.reset_counters()
    assert {i.key: i.size async for i in backend.list("l/")} == {f"l/{i}": i for i in range(5)}
    assert proxy.count_requests("GET") == 3


# --- what an object store's errors say -----------------------------------------------


@object_stores
async def test_missing_bucket_is_permanent_and_says_what_to_do(behind_proxy: Proxied) -> None:
    kind = behind_proxy.kind
    bucket = f"missing-{uuid.uuid4().hex[:8]}"
    backend = behind_proxy.make(bucket=bucket, **kind.large_options)
    large = b"v" * kind.large_size
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "get": lambda: backend.get("k"),
        "exists": lambda: backend.exists("k"),
        "delete": lambda: backend.delete("k"),
        "list": lambda: backend.list().__anext__(),
    }
    if not kind.creates_missing_bucket:
        calls["put"] = lambda: backend.put("k", b"v")
        calls["large put"] = lambda: backend.put("k", large, PutMode.OVERWRITE)
    scheme = str(backend.spec.scheme)
    for op, call in calls.items():
        with pytest.raises(PermanentBackendError) as info:
            await call()
        message = str(info.value)
        assert "does not exist" in message, (op, message)
        assert f"terraform/modules/{kind.terraform_module}" in message
        assert message.startswith(f"{scheme}://{bucket}")


class _Overloaded(BaseHTTPRequestHandler):
    """Answers every request like an overloaded store: 503 with the store's error body."""

    requests: list[str]
    answer: tuple[str, bytes]
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        type(self).requests.append(self.command)
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        content_type, body = self.answer
        self.send_response(503)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def overloaded_endpoint(behind_proxy: Proxied) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server that answers everything with the case's store's 503; its URL and the
    methods of the requests it got."""
    handler: type[_Overloaded] = type(
        "Handler", (_Overloaded,), {"requests": [], "answer": behind_proxy.kind.overloaded}
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler.requests
    server.shutdown()
    server.server_close()


@object_stores
async def test_an_overloaded_store_is_transient_and_retried_only_by_the_policy(
    behind_proxy: Proxied, overloaded_endpoint: tuple[str, list[str]]
) -> None:
    kind = behind_proxy.kind
    endpoint, seen = overloaded_endpoint
    backend = behind_proxy.make(endpoint=endpoint)
    with pytest.raises(TransientBackendError, match=kind.overloaded_match):
        await backend.get("k")
    assert seen == ["GET"], "the client library must not retry"
    seen.clear()
    tier = Tier(backend, RetryPolicy(timeout_s=5, retries=2), CircuitBreaker(100))
    assert await tier.get("k") == (None, "error")
    assert seen == ["GET"] * 3, "the policy layer retries transient errors"
    seen.clear()
    with pytest.raises(TransientBackendError, match=kind.overloaded_match):
        await backend.put("k", b"v")
    assert seen == [kind.put_method]
