"""redis:// backend against a real redis-server, directly and through a fault proxy.

The shared contract (round trips, CREATE races, listing, keys) and the fault contract
(pool sharing; refused, black-holed and reset connections bounded in time, no hidden
redis-py retries) run in tests/contract; these tests cover what is Redis-specific: TTL, the
size limit, glob escaping, and that every failure is classified.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis

from objcache.backends.base import PutMode
from objcache.backends.redis.cluster import parse_topology
from objcache.backends.redis.store import (
    RedisBackend,
    classify,
    connection_url,
    glob_escape,
)
from objcache.config.urls import parse_tier_url
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.tier import Tier
from objcache.errors import EntryTooLarge, PermanentBackendError, TransientBackendError
from tests.support.proxy import FaultProxy
from tests.support.servers import RedisClusterServer, RedisServer

pytestmark = pytest.mark.servers

MakeProxy = Callable[[str, int], FaultProxy]


def backend(url: str, **options: object) -> RedisBackend:
    query = "&".join(f"{k}={v}" for k, v in options.items())
    sep = "&" if "?" in url else "?"
    return RedisBackend(parse_tier_url(f"{url}{sep}{query}" if query else url))


@pytest.fixture
def redis_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}/"


@pytest.fixture
async def b(redis_server: RedisServer, redis_prefix: str) -> AsyncIterator[RedisBackend]:
    made = backend(redis_server.url, prefix=redis_prefix)
    yield made
    await made.close()


@pytest.fixture
def redis_proxy(redis_server: RedisServer, fault_proxy: MakeProxy) -> FaultProxy:
    return fault_proxy(redis_server.host, redis_server.port)


def proxied(proxy: FaultProxy, prefix: str, **options: object) -> RedisBackend:
    return backend(f"redis://{proxy.host}:{proxy.port}/0", prefix=prefix, **options)


async def test_closed_instance_reopens_on_next_call(b: RedisBackend) -> None:
    await b.put("k", b"v")
    await b.close()
    assert await b.get("k") == b"v"


async def test_unix_socket_url(redis_server: RedisServer, redis_prefix: str) -> None:
    made = backend(redis_server.unix_url, prefix=redis_prefix)
    try:
        assert await made.put("u", b"over unix") is True
        assert await made.get("u") == b"over unix"
    finally:
        await made.close()


async def test_ttl_is_set_on_create_and_overwrite(
    redis_server: RedisServer, redis_client: redis.Redis, redis_prefix: str
) -> None:
    made = backend(redis_server.url, prefix=redis_prefix, ttl=120)
    try:
        await made.put("c", b"1")
        await made.put("o", b"1", PutMode.OVERWRITE)
        assert 100 < redis_client.ttl(f"{redis_prefix}c") <= 120
        assert 100 < redis_client.ttl(f"{redis_prefix}o") <= 120
    finally:
        await made.close()
    await (plain := backend(redis_server.url, prefix=redis_prefix)).put("n", b"1")
    await plain.close()
    assert redis_client.ttl(f"{redis_prefix}n") == -1  # no ttl option: no expiry


async def test_too_large_raises_before_sending(redis_proxy: FaultProxy, redis_prefix: str) -> None:
    made = proxied(redis_proxy, redis_prefix, max_size=1000)
    try:
        await made.put("small", b"x" * 1000)
        sent = redis_proxy.bytes_to_server
        with pytest.raises(EntryTooLarge):
            await made.put("big", b"x" * 1001)
        with pytest.raises(EntryTooLarge):
            await made.put("big", b"x" * 1001, PutMode.OVERWRITE)
        assert redis_proxy.bytes_to_server == sent, "nothing may be sent for an oversized value"
        assert await made.get("big") is None
    finally:
        await made.close()


async def test_default_max_size_is_64_mib(b: RedisBackend) -> None:
    assert b.max_size == 64 << 20


async def test_too_large_sends_tier_to_next(redis_server: RedisServer, redis_prefix: str) -> None:
    tier = Tier(
        backend(redis_server.url, prefix=redis_prefix, max_size=10),
        RetryPolicy(timeout_s=1.0, retries=2),
        CircuitBreaker(failures=1),
    )
    assert await tier.put("k", b"x" * 11) is False
    assert tier.stats.put_errors["too_large"] == 1
    assert tier.breaker.state == "closed", "a size refusal is not a tier failure"
    await tier.backend.close()


async def test_list_escapes_glob_characters(redis_server: RedisServer) -> None:
    tricky = f"g{uuid.uuid4().hex[:6]}*[ab]?/"
    made = backend(redis_server.url, prefix="")
    decoys = {tricky.replace("*", "X"), tricky.replace("[ab]", "a"), tricky.replace("?", "Q")}
    try:
        await made.put(f"{tricky}1", b"one")
        for d in decoys:
            await made.put(f"{d}1", b"decoy")
        listed = {i.key: i.size async for i in made.list(tricky)}
        assert listed == {f"{tricky}1": 3}
        for info in [i async for i in made.list(tricky)]:
            assert abs(info.mtime - time.time()) < 60
    finally:
        for key in (f"{tricky}1", *(f"{d}1" for d in decoys)):
            await made.delete(key)
        await made.close()


def test_connection_url_keeps_only_redis_options() -> None:
    spec = parse_tier_url(
        "rediss://user:s3cret@cache:6380/2?ttl=60&prefix=p/&max_size=10&timeout_ms=50"
        "&ssl_cert_reqs=none&read_only=1"
    )
    assert connection_url(spec) == "rediss://user:s3cret@cache:6380/2?ssl_cert_reqs=none"
    made = RedisBackend(spec)
    assert (made.ttl, made.prefix, made.max_size) == (60, "p/", 10)
    assert "s3cret" not in repr(made.pool_key) and "s3cret" not in made.name
    unix = RedisBackend(parse_tier_url("unix:///run/redis.sock?db=3&prefix=x/"))
    assert unix.pool_key.url == "unix:///run/redis.sock?db=3"


def test_glob_escape() -> None:
    assert glob_escape("a*b?c[d]e\\f") == "a\\*b\\?c\\[d\\]e\\\\f"


async def test_list_skips_foreign_types(
    b: RedisBackend, redis_client: redis.Redis, redis_prefix: str
) -> None:
    redis_client.rpush(f"{redis_prefix}alist", b"x")
    await b.put("mine", b"v")
    assert {i.key async for i in b.list()} == {"mine"}


async def test_a_name_that_is_not_utf8_is_skipped_and_counted_not_the_end_of_the_listing(
    redis_server: RedisServer,
    b: RedisBackend,
    redis_client: redis.Redis,
    redis_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A key planted with invalid UTF-8 bytes names no entry: every listing (``ls``, ``gc``,
    ``report``, ``explain`` list through it) skips it, counts it and logs it once, and still
    lists every good entry, directly and through a tier, whose stats show the count."""
    good = {f"v1/e/fx-graph/{i:02x}/key-{i}" for i in range(30)}
    for key in good:
        await b.put(key, b"v")
    redis_client.set(f"{redis_prefix}v1/e/fx-graph/00/".encode() + b"bad\xff\xfe", b"planted")
    caplog.set_level(logging.WARNING, logger="objcache")
    assert {i.key async for i in b.list("v1/")} == good
    assert {i.key async for i in b.list()} == good
    assert b.undecodable_names == 2  # once per listing that met it
    assert len([r for r in caplog.records if "not UTF-8" in r.getMessage()]) == 1
    tier = Tier.from_backend(
        backend(redis_server.url, prefix=redis_prefix),
        timeout_ms=5000,
        retries=0,
        breaker_failures=5,
        breaker_cooldown_s=1.0,
    )
    try:
        listed = await tier.list("v1/")
        assert listed is not None and {i.key for i in listed} == good
        assert tier.stats.as_dict()["undecodable_names"] == 1
    finally:
        await tier.backend.close()


# --- failures: classified (bounded in time: tests/contract/test_fault_contract.py) ---


async def test_oom_is_transient(b: RedisBackend, redis_client: redis.Redis) -> None:
    old = redis_client.config_get("maxmemory*")
    redis_client.config_set("maxmemory-policy", "noeviction")
    redis_client.config_set("maxmemory", 1)
    try:
        with pytest.raises(TransientBackendError, match="OOM"):
            await b.put("k", b"v")
        assert await b.get("k") is None  # reads still work
    finally:
        redis_client.config_set("maxmemory", old["maxmemory"])
        redis_client.config_set("maxmemory-policy", old["maxmemory-policy"])
    assert await b.put("k", b"v") is True


@pytest.fixture
def acl_users(redis_client: redis.Redis) -> Iterator[str]:
    """Two ACL users: ``ok`` (password pw, keys acl/*) and ``narrow`` (keys other/*)."""
    tag = uuid.uuid4().hex[:6]
    redis_client.acl_setuser(
        f"ok{tag}", enabled=True, passwords=["+pw"], keys=["acl/*"], commands=["+@all"]
    )
    redis_client.acl_setuser(
        f"narrow{tag}", enabled=True, passwords=["+pw"], keys=["other/*"], commands=["+@all"]
    )
    yield tag
    redis_client.acl_deluser(f"ok{tag}", f"narrow{tag}")


async def test_wrong_password_is_permanent(redis_server: RedisServer, acl_users: str) -> None:
    host = f"{redis_server.host}:{redis_server.port}"
    good = backend(f"redis://ok{acl_users}:pw@{host}/0", prefix="acl/")
    bad = backend(f"redis://ok{acl_users}:wrong@{host}/0", prefix="acl/")
    try:
        assert await good.put("k", b"v") is True
        with pytest.raises(PermanentBackendError, match="authentication failed") as info:
            await bad.get("k")
        assert "wrong" not in str(info.value), "the password must not appear in errors"
        assert "***" in str(info.value)
    finally:
        await good.delete("k")
        await good.close()
        await bad.close()


async def test_acl_denied_key_is_permanent(redis_server: RedisServer, acl_users: str) -> None:
    host = f"{redis_server.host}:{redis_server.port}"
    narrow = backend(f"redis://narrow{acl_users}:pw@{host}/0", prefix="acl/")
    try:
        with pytest.raises(PermanentBackendError, match="ACL"):
            await narrow.get("k")
    finally:
        await narrow.close()


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (redis.exceptions.BusyLoadingError("LOADING Redis is loading"), TransientBackendError),
        (redis.exceptions.ResponseError("OOM command not allowed"), TransientBackendError),
        (redis.exceptions.OutOfMemoryError("command not allowed"), TransientBackendError),
        (redis.exceptions.ResponseError("MISCONF cannot persist"), TransientBackendError),
        (redis.exceptions.ReadOnlyError("READONLY replica"), TransientBackendError),
        (redis.exceptions.ResponseError("MOVED 3999 127.0.0.1:6381"), PermanentBackendError),
        (redis.exceptions.ResponseError("WRONGTYPE Operation"), PermanentBackendError),
        (redis.exceptions.AuthenticationError("invalid password"), PermanentBackendError),
        (redis.exceptions.ResponseError("NOAUTH Authentication required."), PermanentBackendError),
        (redis.exceptions.NoPermissionError("NOPERM no perms"), PermanentBackendError),
        (redis.exceptions.TimeoutError("Timeout reading"), TransientBackendError),
        (ConnectionResetError(104, "reset"), TransientBackendError),
        (
            redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
            TransientBackendError,
        ),
        (redis.exceptions.SlotNotCoveredError('Slot "7" not covered'), TransientBackendError),
        (redis.exceptions.RedisClusterException("cannot be connected"), TransientBackendError),
        (redis.exceptions.ClusterError("TTL exhausted."), TransientBackendError),
        (
            redis.exceptions.RedisClusterException("Cluster mode is not enabled on this node"),
            PermanentBackendError,
        ),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else v.__name__,
)
def test_classification(error: Exception, kind: type[Exception]) -> None:
    assert type(classify(error, "get", "redis://h:1/0")) is kind


# --- Redis Cluster ---------------------------------------------------------------------------

_NODES = """\
a1 10.0.0.1:6379@16379 myself,master - 0 0 1 connected 0-5460
a2 10.0.0.2:6379@16379 master - 0 0 2 connected 5461-10922 [5461->-b3]
a3 10.0.0.3:6379@16379 master,fail - 0 0 3 connected 10923-16383
b1 10.0.0.4:6379@16379 slave a1 0 0 1 connected
b2 10.0.0.5:6379@16379 slave a2 0 0 2 connected
b3 10.0.0.6:6379@16379 slave,fail a3 0 0 3 disconnected
"""


def test_topology_counts_live_primaries_replicas_and_covered_slots() -> None:
    topology = parse_topology(_NODES, "fail")
    assert (topology.primaries, topology.replicas, topology.failed) == (2, 2, 2)
    assert topology.slots == 10923  # the failed primary's slots are not covered
    assert topology.line == (
        "Redis Cluster: 2 primaries, 2 replicas, 2 failed, 10923 of 16384 slots covered, "
        "cluster_state:fail"
    )
    assert "5461 slots have no live primary" in topology.problem
    healthy = "\n".join(line for line in _NODES.splitlines() if "fail" not in line)
    whole = parse_topology(healthy.replace("5461-10922", "5461-16383"), "ok")
    assert whole.slots == 16384 and whole.problem == ""


async def test_a_cluster_node_is_detected_and_the_option_forces_either_way(
    redis_cluster: RedisClusterServer, redis_server: RedisServer, redis_prefix: str
) -> None:
    found = backend(redis_cluster.url, prefix=redis_prefix)
    forced = backend(redis_cluster.nodes[-1].url, prefix=redis_prefix, cluster="yes")
    single = backend(redis_cluster.url, prefix=redis_prefix, cluster="no")
    wrong = backend(redis_server.url, prefix=redis_prefix, cluster="yes")
    keys = [f"k{i}" for i in range(20)]  # on every primary
    try:
        for key in keys:
            assert await found.put(key, key.encode()) is True
        assert [await forced.get(k) for k in keys] == [k.encode() for k in keys]
        assert sorted([i.key async for i in forced.list()]) == sorted(keys)
        assert "3 primaries, 3 replicas, 16384 of 16384 slots" in await found.describe()
        assert (await backend(redis_server.url).describe()).startswith("standalone Redis ")
        with pytest.raises(PermanentBackendError, match="remove cluster=no"):
            for key in keys:  # the keys of the other nodes answer MOVED
                await single.get(key)
        with pytest.raises(PermanentBackendError, match="remove cluster=no"):
            await single.describe()
        with pytest.raises(PermanentBackendError, match="not a Redis Cluster node"):
            await wrong.get("k0")
    finally:
        for key in keys:
            await found.delete(key)
        for made in (found, forced, single, wrong):
            await made.close()


def test_a_cluster_url_takes_no_database_but_0_and_no_unix_socket() -> None:
    from objcache.errors import ConfigError

    with pytest.raises(ConfigError, match="cluster must be auto, yes or no"):
        parse_tier_url("redis://h:1/0?cluster=maybe")
    with pytest.raises(ConfigError, match="over TCP"):
        parse_tier_url("unix:///run/redis.sock?cluster=yes")


async def test_moved_and_ask_during_a_slot_migration_are_followed_within_the_call(
    redis_cluster: RedisClusterServer, redis_prefix: str
) -> None:
    """A slot moves from one primary to another under a client that knows the old map:
    ASK while it migrates, MOVED once it has moved; both followed inside one call."""
    b = backend(redis_cluster.url, prefix=redis_prefix, timeout_ms=2000)
    try:
        assert await b.put("{moving}old", b"old") is True  # one slot: the hash tag's
        source = redis_cluster.owner(f"{redis_prefix}{{moving}}old")
        target = next(n for n in redis_cluster.primary_nodes() if n is not source)
        slot = int(source.command("CLUSTER", "KEYSLOT", "{moving}"))
        source_id, target_id = source.command("CLUSTER", "MYID"), target.command("CLUSTER", "MYID")
        target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        # a key the source no longer has is asked of the target (ASK)
        assert await asyncio.wait_for(b.put("{moving}new", b"new"), 2) is True
        assert await asyncio.wait_for(b.get("{moving}new"), 2) == b"new"
        source.command(
            "MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", f"{redis_prefix}{{moving}}old"
        )
        for node in redis_cluster.primary_nodes():
            node.command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        # the client's map still names the source, which answers MOVED
        assert await asyncio.wait_for(b.get("{moving}old"), 2) == b"old"
        assert await asyncio.wait_for(b.get("{moving}new"), 2) == b"new"
        assert redis_cluster.owner(f"{redis_prefix}{{moving}}old") is target
    finally:
        await b.delete("{moving}old")
        await b.delete("{moving}new")
        await b.close()
    redis_cluster.wait_healthy()


def test_a_node_failure_while_the_cluster_answers_is_partial() -> None:
    """A transient failure within PARTIAL_WINDOW_S of the cluster's last answer is a
    partial outage (the key misses, the breaker is left alone); long after it, or a
    permanent error, stays the tier's failure."""
    from objcache.backends.redis import cluster
    from objcache.errors import PartialOutage, PermanentBackendError, TransientBackendError

    answered = cluster.Answered()
    down = TransientBackendError("get: ConnectionError: refused", tier="redis://n/0")
    assert isinstance(cluster.partial(down, answered), PartialOutage)
    wrong = PermanentBackendError("get: NOPERM", tier="redis://n/0")
    assert cluster.partial(wrong, answered) is wrong
    answered.at -= cluster.PARTIAL_WINDOW_S + 1  # nothing answered for a while: all down
    assert cluster.partial(down, answered) is down
