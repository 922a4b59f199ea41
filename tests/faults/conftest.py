"""Fixtures of the fault suite: one real store per test behind a FaultProxy.

``proxied_store`` is parametrized over redis, s3 (SeaweedFS) and gcs (fake-gcs-server). It hands
out Clients whose only remote tier goes through the proxy, with small deadlines so the
suite stays fast, and raw (proxy-free) access to the same objects for planting or
tampering with data at rest.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest

from objcache.backends import create_backend
from objcache.backends.base import Backend, PutMode
from objcache.bridge import Bridge
from objcache.client import Client
from objcache.config.settings import Config
from objcache.config.urls import parse_tier_url
from tests.support.cloud import gcs_url, s3_url
from tests.support.proxy import FaultProxy
from tests.support.servers import FakeGCS, RedisServer, SeaweedS3

T = TypeVar("T")

#: Deadline of one remote call in this suite (retries included).
DEADLINE_MS = 250
#: Consecutive failures that open a tier's breaker in this suite.
BREAKER_FAILURES = 3

_raw_bridge = Bridge("faults-raw")


def raw(factory: Callable[[], Coroutine[Any, Any, T]], timeout: float = 30.0) -> T:
    """Run a coroutine on the suite's own loop (direct store access, no proxy)."""
    return _raw_bridge.call(factory, timeout)


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


@dataclasses.dataclass
class Store:
    kind: str
    prefix: str
    proxy: FaultProxy
    tmp: Path
    _url: Callable[[str | None, str], str]
    _clients: list[Client] = dataclasses.field(default_factory=list)
    _backend: Backend | None = None

    def url(self, *, proxied: bool = True, prefix: str | None = None) -> str:
        return self._url(self.proxy.url() if proxied else None, prefix or self.prefix)

    def client(self, *, warm: bool = True, **config: Any) -> Client:
        """A Client whose one remote tier is this store through the proxy."""
        options: dict[str, Any] = {
            "tiers": self.url(),
            "local_dir": self.tmp / f"local-{uuid.uuid4().hex[:6]}",
            "timeout_ms": DEADLINE_MS,
            "breaker_failures": BREAKER_FAILURES,
            "breaker_cooldown_s": 60.0,
            "prefetch": False,
            "stats_file": self.tmp / "stats.json",
            "flush_timeout_s": 5.0,
        }
        options.update(config)
        client = Client(Config(**options))
        self._clients.append(client)
        if warm:
            warm_up(client)
        return client

    @property
    def backend(self) -> Backend:
        """The store without the proxy (same prefix), for planting and inspecting objects."""
        if self._backend is None:
            self._backend = create_backend(parse_tier_url(self.url(proxied=False)))
        return self._backend

    def raw_get(self, okey: str) -> bytes | None:
        return raw(lambda: self.backend.get(okey))

    def raw_put(self, okey: str, data: bytes) -> None:
        raw(lambda: self.backend.put(okey, data, PutMode.OVERWRITE))

    def close(self) -> None:
        for c in self._clients:
            c.close()
            c.bridge.stop()
        if self._backend is not None:
            backend = self._backend
            raw(backend.close)
        self.proxy.close()


def warm_up(client: Client) -> None:
    """Create each remote tier's client (TLS-less, but aioboto3/google-auth set-up costs
    a few hundred ms on a loaded machine) with a generous deadline, then restore it."""
    for tier in client.cache.remotes:
        policy = tier.policy
        tier.policy = dataclasses.replace(policy, timeout_s=10.0)
        try:
            client.bridge.call(lambda t=tier: t.get("v1/warm-up/none"), 15.0)  # type: ignore[misc]
        finally:
            tier.policy = policy
        tier.stats.misses.clear()


@pytest.fixture(scope="session")
def redis_fault_server() -> Iterator[RedisServer]:
    """A Redis of the fault suite's own (OOM tests change its maxmemory)."""
    with RedisServer(unix_socket=False) as server:
        yield server


def _store_factory(
    kind: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> Store:
    prefix = f"f-{uuid.uuid4().hex[:10]}"
    if kind == "redis":
        server: Any = request.getfixturevalue("redis_fault_server")
        proxy = FaultProxy(server.host, server.port)

        def url(endpoint: str | None, p: str) -> str:
            host, port = (proxy.host, proxy.port) if endpoint else (server.host, server.port)
            return f"redis://{host}:{port}/0?prefix={p}/"

    elif kind == "s3":
        server = request.getfixturevalue("seaweed_s3")
        proxy = FaultProxy("127.0.0.1", port_of(server.endpoint_url))

        def url(endpoint: str | None, p: str) -> str:
            return s3_url(server, p, endpoint_url=endpoint)

    elif kind == "gcs":
        server = request.getfixturevalue("fake_gcs")
        proxy = FaultProxy("127.0.0.1", port_of(server.endpoint))

        def url(endpoint: str | None, p: str) -> str:
            return gcs_url(server, p, endpoint=endpoint)

    else:  # pragma: no cover
        raise ValueError(f"no server of the fault suite for the {kind!r} backend: add it here")
    return Store(kind, prefix, proxy, tmp_path, url)


def network_backends() -> list[str]:
    """The folders of objcache.backends whose schemes need a client library: the stores
    reached over the network, from the scheme registry (so a new one is not silently left
    out of the fault suite: ``_store_factory`` refuses a kind it cannot start)."""
    from objcache.config import registry

    targets = (e.target for e in registry.builtin_schemes().values() if e.sdk)
    return list(dict.fromkeys(t.partition(":")[0].split(".")[2] for t in targets))


@pytest.fixture(params=network_backends())
def proxied_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = _store_factory(request.param, request, tmp_path)
    yield s
    s.close()


@pytest.fixture
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[str], Store]]:
    made: list[Store] = []

    def make(kind: str) -> Store:
        s = _store_factory(kind, request, tmp_path)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


__all__ = ["FakeGCS", "SeaweedS3"]
