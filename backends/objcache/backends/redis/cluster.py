"""Redis Cluster under the ``redis://`` and ``rediss://`` tiers (docs/architecture.md,
"Redis Cluster"): whether a server is a cluster node, the cluster client, SCAN over every
primary, and the shape of the store that ``objcache doctor`` reports.

* Detection is one ``INFO cluster`` on the first connection (``cluster=auto``), inside the
  first call's deadline; ``cluster=yes`` / ``cluster=no`` skip it.
* The cluster client is redis-py's ``RedisCluster`` with no retries of its own (the tier's
  policy decides): it follows MOVED and ASK inside the call, and after a connection error
  or CLUSTERDOWN it reads the slot map again on the next call, so a failover costs the
  calls that hit the dead primary, not a restart.
* Every entry and record is one key, so one slot: nothing objcache sends spans slots.
* A node's connect and reply are bounded by a share of the tier's deadline (``NODE_SHARE``):
  a node that accepts connections and never answers is its keys' partial miss within the
  call's deadline, not the tier's missed deadline (docs/architecture.md, "Redis Cluster").
* The client connects only to the URL's node and the nodes the cluster announces in its slot
  map (:class:`Nodes`); a MOVED or ASK elsewhere is refused before a socket opens, and a
  ``redis://`` password goes in clear to the URL's host only (docs/security.md, "Redis
  Cluster: where the client connects").
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis
from redis import exceptions as rex
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.maint_notifications import MaintNotificationsConfig

from objcache.errors import (
    BackendError,
    PartialOutage,
    PermanentBackendError,
    TransientBackendError,
)

#: Hash slots of every Redis Cluster.
SLOTS = 16384
#: A node's failure within this long of any answer of the cluster is a partial outage: its
#: keys miss, the tier's breaker is left alone (the other primaries serve).
PARTIAL_WINDOW_S = 5.0
#: A node's connect and reply each get at most this share of the tier's deadline: a call may
#: spend one on a slot-map read that asks the silent node first, one on the command, and
#: still answer (a partial miss) within the deadline.
NODE_SHARE = 1 / 3
#: redis-py 8 asks every RESP3 connection for maintenance notifications (``CLIENT
#: MAINT_NOTIFICATIONS ON``), with which the server may move the client's connections to
#: another host:port: off, standalone tiers too (docs/security.md).
NO_MAINT_NOTIFICATIONS = MaintNotificationsConfig(enabled=False)


class Answered:
    """When the cluster last answered a call (its client's start counts: it read the slot
    map from a node)."""

    def __init__(self) -> None:
        self.at = time.monotonic()

    def now(self) -> None:
        self.at = time.monotonic()

    def recently(self) -> bool:
        return time.monotonic() - self.at < PARTIAL_WINDOW_S


def partial(error: BackendError, answered: Answered) -> BackendError:
    """``error`` as a :class:`PartialOutage` when it is a node's transient failure while the
    rest of the cluster answers; a whole cluster that stopped answering stays the tier's
    failure (its breaker then skips it)."""
    if type(error) is TransientBackendError and answered.recently():
        return PartialOutage(str(error))
    return error


class Unannounced(rex.ConnectionError):
    """A connection to an address that is neither the URL's node nor announced by the
    cluster's slot map (a MOVED or ASK elsewhere): refused before a socket opens."""


class ClearCredentials(rex.RedisError):
    """The cluster announces a node on another host than the URL's, and the ``redis://``
    tier would send its password there in clear text."""


def _resolved(host: str) -> str:
    # redis-py names a node "localhost" by its address (ClusterNode)
    return socket.gethostbyname(host) if host == "localhost" else host


class Nodes:
    """Where one cluster client may connect (docs/security.md, "Redis Cluster: where the
    client connects"): the URL's node, and every node the cluster announced in a slot map
    (CLUSTER SLOTS) read from a node it already trusts. The slot map is the cluster's word,
    trusted as the URL's node is; a MOVED or ASK is one reply, so an address it names that no
    slot map announced is refused (:class:`Unannounced`): that key misses, redis-py reads the
    slot map again on the next call, and a real resharding's new node is in it.

    Credentials: with ``clear`` False (a ``redis://`` URL with a password) an announced node
    on another host than the URL's stops the client (:class:`ClearCredentials`), unless the
    URL says ``clear_auth_announced=1``."""

    def __init__(self, host: str, port: int, answered: Answered, *, clear: bool) -> None:
        self.hosts = {host, _resolved(host)}
        self.allowed = {(h, port) for h in self.hosts}
        self.answered = answered
        self.clear = clear

    def announce(self, address: tuple[str, int]) -> tuple[str, int]:
        """redis-py's ``address_remap``: called for each node of a slot map it read, so the
        cluster answered too (:class:`Answered`)."""
        host, port = address[0], int(address[1])
        if not self.clear and host not in self.hosts:
            raise ClearCredentials(
                f"the cluster announces a node at {host}:{port}, another host than the URL's: "
                "this redis:// tier would send its password there in clear text: use "
                "rediss://, or add clear_auth_announced=1 to the tier URL to allow it "
                '(docs/security.md, "Redis Cluster: where the client connects")'
            )
        self.allowed.add((host, port))
        self.answered.now()
        return host, port

    def check(self, host: str, port: int) -> None:
        if (host, int(port)) not in self.allowed:
            raise Unannounced(
                f"refused to connect to {host}:{port}: no slot map of the cluster announced "
                "that node (a MOVED or ASK to it was not followed; docs/security.md)"
            )


class _Checked:
    """Mixin of the cluster's connection classes: :meth:`Nodes.check` before the socket."""

    nodes: Nodes
    host: str
    port: int

    async def _connect(self) -> None:
        self.nodes.check(self.host, self.port)
        await cast(Any, super())._connect()


def checked(base: type[Connection], nodes: Nodes) -> type[Connection]:
    """``base`` (redis-py's Connection or SSLConnection) connecting only where ``nodes``
    allows."""
    made = type(f"Checked{base.__name__}", (_Checked, base), {"nodes": nodes})
    return cast("type[Connection]", made)


async def initialize(client: RedisCluster, host: str, port: int) -> None:
    """``client.initialize()``, where a dead primary cannot fail it: redis-py reads the slot
    map from the seed node, then asks its *default* node, the primary of slot 0, for its
    COMMAND table. With that primary down every new client failed to start, so every call
    of the tier failed and opened its breaker, though the other primaries served. Then the
    table is asked of the seed node, which just answered (feature-detected: where this
    redis-py has no such parts, the first failure stands)."""
    try:
        await client.initialize()
        return
    except (rex.ConnectionError, rex.TimeoutError, OSError) as first:
        failure = first
    manager = getattr(client, "nodes_manager", None)
    parser = getattr(client, "commands_parser", None)
    if manager is None or parser is None or not hasattr(client, "_initialize"):
        raise failure
    try:
        await manager.initialize()
        node = client.get_node(host=host, port=port)
        if node is None:
            raise failure
        client.set_default_node(node)
        await parser.initialize(node)
        client._initialize = False
    except BaseException as exc:
        await client.aclose()
        if not isinstance(exc, Exception):  # a cancelled call (its deadline) stays cancelled
            raise
        raise failure from None


async def cluster_enabled(client: aioredis.Redis) -> bool:
    """Whether the server says ``cluster_enabled:1``. A server that refuses INFO (an ACL user
    without it, a renamed command) is taken as standalone: were it a cluster node, its MOVED
    replies say so (``classify``), and ``cluster=yes`` skips the question."""
    try:
        info = await client.info("cluster")
    except rex.ResponseError:
        return False
    return str(info.get("cluster_enabled", 0)) == "1"


def open_cluster(
    kwargs: Mapping[str, Any],
    answered: Answered,
    *,
    deadline_s: float | None = None,
    clear_auth: bool = False,
) -> RedisCluster:
    """A cluster client from the keyword arguments of the standalone one (``parse_url``'s,
    with objcache's timeouts and pool size): same node, credentials and TLS, no retries;
    each node's connect and reply within ``NODE_SHARE`` of ``deadline_s``; connections only
    where :class:`Nodes` allows."""
    options = dict(kwargs)
    if options.pop("db", 0) not in (0, "0", None):
        raise PermanentBackendError(
            "connect: a Redis Cluster has only database 0: end the tier URL with /0"
        )
    tls = options.pop("connection_class", None) is SSLConnection
    if tls:
        options["ssl"] = True
    if deadline_s:
        for name in ("socket_timeout", "socket_connect_timeout"):
            options[name] = min(options.get(name) or deadline_s, deadline_s * NODE_SHARE)
    options.pop("retry_on_error", None)
    host, port = options["host"], int(options.get("port", 6379))
    nodes = Nodes(host, port, answered, clear=tls or clear_auth or not options.get("password"))
    options.update(
        retry=Retry(NoBackoff(), 0), require_full_coverage=True, address_remap=nodes.announce
    )
    client = RedisCluster(**options)
    # every node redis-py makes takes its connection class from these keyword arguments (the
    # nodes manager's are the same dict); the URL's node was made already
    connection = checked(client.connection_kwargs["connection_class"], nodes)
    client.connection_kwargs["connection_class"] = connection
    for node in client.nodes_manager.startup_nodes.values():
        node.connection_class = connection
    return client


def reseed(client: RedisCluster, host: str, port: int) -> None:
    """Put the URL's node back among the nodes a slot-map refresh may ask.

    redis-py replaces its startup nodes with the nodes it discovered; a configuration
    endpoint (a DNS name over nodes that come and go) would be forgotten, and a client whose
    discovered nodes were all replaced could never find the cluster again."""
    startup = client.nodes_manager.startup_nodes
    seed = ClusterNode(host, port, **client.connection_kwargs)
    startup.setdefault(seed.name, seed)


async def scan(client: RedisCluster, pattern: str, count: int) -> AsyncIterator[list[bytes]]:
    """SCAN batches of every primary, one primary after another. A key that moves during
    the listing may be listed twice (the caller drops repeats) or not at all."""
    await client.initialize()
    for node in client.get_primaries():
        cursor = 0
        while True:
            # with target_nodes, redis-py answers ({node name: cursor}, names)
            reply: Any = await client.scan(cursor, match=pattern, count=count, target_nodes=node)
            cursors, batch = reply
            cursor = int(cursors[node.name])
            yield [cast(bytes, n) for n in batch]
            if cursor == 0:
                break


@dataclass(frozen=True)
class Topology:
    """A Redis Cluster as one node sees it (CLUSTER NODES, CLUSTER INFO)."""

    primaries: int
    replicas: int
    #: slots whose primary is not marked failed
    slots: int
    #: nodes marked failed (``fail``; ``fail?`` is one node's suspicion only)
    failed: int
    #: ``cluster_state`` of the node asked: ``ok`` or ``fail``
    state: str

    @property
    def line(self) -> str:
        failed = f", {self.failed} failed" if self.failed else ""
        return (
            f"Redis Cluster: {_count(self.primaries, 'primary', 'primaries')}, "
            f"{_count(self.replicas, 'replica', 'replicas')}{failed}, "
            f"{self.slots} of {SLOTS} slots covered, cluster_state:{self.state}"
        )

    @property
    def problem(self) -> str:
        """Why the cluster cannot serve every key now; empty when it can."""
        if self.slots < SLOTS:
            return (
                f"{SLOTS - self.slots} slots have no live primary: keys there answer "
                "CLUSTERDOWN (assign them: redis-cli --cluster fix)"
            )
        if self.state != "ok":
            return "the cluster answers CLUSTERDOWN (a primary is down with no replica to promote?)"
        return ""


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def parse_topology(nodes: str, state: str) -> Topology:
    """CLUSTER NODES text: ``<id> <ip:port@bus> <flags> <primary> <ping> <pong> <epoch>
    <link> <slot> ...``; a slot is ``N``, ``N-M``, or ``[N->-id]`` (migrating: not counted)."""
    primaries = replicas = slots = failed = 0
    for line in nodes.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        flags = set(fields[2].split(","))
        if "fail" in flags:
            failed += 1
            continue
        if "master" in flags:
            primaries += 1
            for span in fields[8:]:
                if span.startswith("["):
                    continue
                first, _, last = span.partition("-")
                slots += int(last or first) - int(first) + 1
        elif "slave" in flags:
            replicas += 1
    return Topology(primaries, replicas, slots, failed, state)


async def describe(client: aioredis.Redis, mode: str, tier: str) -> str:
    """One line on the server behind a standalone connection: version and role, or the
    cluster's topology. Raises :class:`BackendError` when the store cannot serve every key
    (uncovered slots, CLUSTERDOWN, a cluster node reached with ``cluster=no``)."""
    try:
        info = await client.info()
    except rex.ResponseError as exc:  # NOPERM, renamed: the data probe still decides
        return f"topology unknown: INFO refused ({exc})"
    version = f"Redis {info.get('redis_version', '?')}"
    if str(info.get("cluster_enabled", 0)) != "1":
        if info.get("role") == "slave":
            primary = f"{info.get('master_host', '?')}:{info.get('master_port', '?')}"
            return f"standalone {version}, a replica of {primary}: writes are refused"
        return f"standalone {version}"
    command: Any = client.execute_command  # untyped in redis-py
    state = _fields(_text(await command("CLUSTER", "INFO"))).get("cluster_state")
    topology = parse_topology(_text(await command("CLUSTER", "NODES")), state or "unknown")
    line = f"{topology.line} ({version})"
    if mode == "no":
        raise PermanentBackendError(
            f"{line}: the tier URL says cluster=no, so keys of other nodes would answer "
            "MOVED: remove cluster=no",
            tier=tier,
        )
    if topology.problem:
        raise TransientBackendError(f"{line}: {topology.problem}", tier=tier)
    return line


def _text(reply: object) -> str:
    return reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)


def _fields(text: str) -> dict[str, str]:
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def cluster_error(exc: BaseException, op: str, tier: str) -> BackendError | None:
    """The typed error for a failure only the cluster client raises; None for the others."""
    if isinstance(exc, rex.ClusterError) and not isinstance(exc, rex.ResponseError):
        # "TTL exhausted": redirections kept bouncing (a resharding under way)
        return TransientBackendError(f"{op}: Redis Cluster: {exc}", tier=tier)
    if isinstance(exc, ClearCredentials):
        return PermanentBackendError(f"{op}: {exc}", tier=tier)
    if not isinstance(exc, rex.RedisClusterException):
        return None
    text = str(exc)
    if "not enabled" in text:
        return PermanentBackendError(
            f"{op}: this server is not a Redis Cluster node: remove cluster=yes from the tier URL",
            tier=tier,
        )
    # unreachable nodes, slots not covered, TTL of redirections exhausted: "not now"
    return TransientBackendError(f"{op}: Redis Cluster: {' '.join(text.split())}", tier=tier)
