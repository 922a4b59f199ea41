"""redis:// on a Redis Cluster against fake nodes (tests/support/resp.py): a primary that
accepts connections and never answers is its keys' partial miss within the deadline, the
client connects only where the cluster's slot map says, a redis:// password goes in clear
to the URL's host only, and maintenance notifications are never asked for.

The real cluster (failover, resharding, topology) is tested in tests/faults and
tests/backends/test_redis.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from redis import exceptions as rex

from objcache.backends.redis import cluster
from objcache.backends.redis.store import RedisBackend
from objcache.config.urls import parse_tier_url
from objcache.core.tier import Tier
from objcache.errors import PermanentBackendError
from tests.support.resp import FakeCluster, FakeNode

DEADLINE_MS = 1000
PREFIX = "t/"


def tier(url: str, **options: object) -> Tier:
    query = "&".join(f"{k}={v}" for k, v in {"prefix": PREFIX, **options}.items())
    backend = RedisBackend(parse_tier_url(f"{url}?{query}"))
    return Tier.from_backend(
        backend, timeout_ms=DEADLINE_MS, retries=2, breaker_failures=5, breaker_cooldown_s=30
    )


def keys_of(cluster: FakeCluster, node: FakeNode, n: int) -> list[str]:
    """``n`` keys whose slots ``node`` holds."""
    found = (f"k{i}" for i in range(10_000))
    return [k for k in found if cluster.owner(PREFIX + k) is node][:n]


@pytest.fixture
async def two_nodes() -> AsyncIterator[FakeCluster]:
    async with FakeCluster() as cluster:
        yield cluster


async def test_a_hung_primary_is_its_keys_partial_miss_and_the_others_serve(
    two_nodes: FakeCluster,
) -> None:
    healthy, hung = two_nodes.nodes
    hung.hang.add("GET")  # accepts connections, never answers a GET
    served = keys_of(two_nodes, healthy, 2)
    silent = keys_of(two_nodes, hung, 7)
    for key in served:
        healthy.data[(PREFIX + key).encode()] = b"value " + key.encode()
    t = tier(f"redis://{healthy.address}/0")
    try:
        assert await t.get(served[0]) == (b"value " + served[0].encode(), "")
        for key in silent:  # more than the breaker's 5 failures
            started = time.monotonic()
            got = await t.get(key)
            elapsed = time.monotonic() - started
            assert got == (None, "error")  # the node's miss, not the tier's deadline
            assert elapsed < DEADLINE_MS / 1000, elapsed
        assert t.breaker.state == "closed" and t.stats.breaker_opened == 0
        assert await t.get(served[1]) == (b"value " + served[1].encode(), "")
        assert dict(t.stats.misses) == {"error": len(silent)}
    finally:
        await t.backend.close()


async def test_a_moved_to_a_node_the_cluster_never_announced_is_refused() -> None:
    async with FakeCluster() as cluster:
        first, second = cluster.nodes
        outsider = await FakeNode().start()
        outsider.data = {(PREFIX + k).encode(): b"planted" for k in keys_of(cluster, first, 3)}
        first.moved_to = ("127.0.0.1", outsider.port)
        served = keys_of(cluster, second, 1)[0]
        second.data[(PREFIX + served).encode()] = b"kept"
        t = tier(f"redis://:s3cret@{first.address}/0")
        try:
            for key in keys_of(cluster, first, 3):
                assert await t.get(key) == (None, "error")
            assert outsider.received == []  # never connected: no AUTH, no GET
            assert t.breaker.state == "closed"
            assert await t.get(served) == (b"kept", "")
            # the announced nodes did get the password
            assert {*first.credentials(), *second.credentials()} == {b"s3cret"}
        finally:
            await t.backend.close()
            await outsider.stop()


async def test_a_cleartext_password_goes_to_the_urls_host_only_unless_allowed() -> None:
    async with FakeCluster(("127.0.0.1", "127.0.0.2")) as cluster:
        named, elsewhere = cluster.nodes
        key = keys_of(cluster, elsewhere, 1)[0]
        elsewhere.data[(PREFIX + key).encode()] = b"there"
        refused = tier(f"redis://:s3cret@{named.address}/0").backend
        try:
            with pytest.raises(PermanentBackendError, match=r"clear text.*clear_auth_announced"):
                await refused.get(key)
        finally:
            await refused.close()
        assert elsewhere.received == []

        # without a password, or allowed by the URL, the announced node is used
        for userinfo, allowed, sent in (("", 0, set()), (":s3cret@", 1, {b"s3cret"})):
            elsewhere.received.clear()
            t = tier(f"redis://{userinfo}{named.address}/0", clear_auth_announced=allowed)
            try:
                assert await t.get(key) == (b"there", "")
            finally:
                await t.backend.close()
            assert set(elsewhere.credentials()) == sent


@pytest.mark.parametrize("mode", ["standalone", "cluster"])
async def test_maintenance_notifications_are_never_asked_for(mode: str) -> None:
    async with FakeCluster(("127.0.0.1",)) as cluster:
        node = cluster.nodes[0]
        if mode == "standalone":
            node.cluster = None
        t = tier(f"redis://:s3cret@{node.address}/0")
        try:
            assert await t.get("absent") == (None, "absent")
        finally:
            await t.backend.close()
        names = node.names()
        assert b"GET" in names and (b"CLUSTER SLOTS" in names) == (mode == "cluster")
        assert b"CLIENT MAINT_NOTIFICATIONS" not in names, names


async def test_a_cluster_silent_as_a_whole_opens_the_breaker(
    two_nodes: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partial only while some node answers: with every node silent (no GET, no slot map)
    the failures are the tier's once nothing answered for PARTIAL_WINDOW_S."""
    monkeypatch.setattr(cluster, "PARTIAL_WINDOW_S", 0.5)
    t = tier(f"redis://{two_nodes.nodes[0].address}/0")
    try:
        assert await t.get("absent") == (None, "absent")  # started: the slot map was read
        for node in two_nodes.nodes:
            node.hang.update({"GET", "CLUSTER"})
        reasons: list[str] = []
        while not t.breaker_open() and len(reasons) < 40:
            reasons.append((await t.get(f"k{len(reasons)}"))[1])
        assert t.breaker_open(), reasons
        assert (await t.get("k-last"))[1] == "breaker"
    finally:
        await t.backend.close()


async def test_a_start_cancelled_by_its_deadline_stays_cancelled_and_closes_the_client() -> None:
    """The second start (the slot map, then the COMMAND table from the seed node) of a
    client whose first start failed, cancelled by the call's deadline: the cancellation
    reaches the deadline (it becomes the tier's ``timeout``), not the first start's
    connection error, and the client's connections are closed."""
    started, closed = asyncio.Event(), []

    class Manager:
        async def initialize(self) -> None:
            started.set()
            await asyncio.Event().wait()  # a silent node

    class Client:
        nodes_manager, commands_parser, _initialize = Manager(), object(), True

        async def initialize(self) -> None:
            raise rex.ConnectionError("the default node is down")

        async def aclose(self) -> None:
            closed.append(True)

    task = asyncio.ensure_future(cluster.initialize(Client(), "127.0.0.1", 7000))  # type: ignore[arg-type]
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed == [True]
