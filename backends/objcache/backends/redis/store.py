"""``redis://``, ``rediss://`` and ``unix://`` tiers through redis.asyncio.

URLs::

    redis://[[user]:password@]host:port/db?ttl=86400&max_size=67108864&prefix=objcache/
    rediss://...                      (TLS)
    unix:///run/redis.sock?db=0

Options: ``ttl`` (seconds, 0 = none: rely on the server's eviction policy), ``max_size``
(bytes, default 64 MiB: larger values raise :class:`EntryTooLarge` before anything is sent,
so the policy layer moves on to the next tier), ``prefix`` (key prefix, default
``objcache/``), ``connect_timeout`` / ``socket_timeout`` (seconds), ``max_connections``.

* One connection pool per (process, event loop, URL), shared by every instance; nothing
  is created before the first call.
* **No hidden retries.** redis-py 6+ retries three times with exponential backoff by
  default (26.7 s to fail against a black-holed server); here every connection gets
  ``Retry(NoBackoff(), 0)`` and explicit socket timeouts: the tier deadline and the
  policy layer's retries decide.
* CREATE is ``SET NX`` (atomic first-writer-wins), OVERWRITE a plain ``SET``; both add
  ``EX ttl`` when a TTL is set.
* ``list`` uses ``SCAN MATCH`` with the prefix's glob characters escaped (on a cluster, on
  every primary in turn), and one pipeline of ``STRLEN`` + ``OBJECT IDLETIME`` per SCAN
  batch. Redis keeps no modification time,
  so ``mtime`` is the time of last access (now minus idle time; now when the server's
  eviction policy is LFU and idle time is unavailable).
* A Redis Cluster node or configuration endpoint is served through redis-py's cluster
  client (``cluster.py``): ``cluster=auto`` asks the server once, on connecting. Its nodes'
  connects and replies are bounded below the tier's deadline (``bound_nodes``), and it
  connects only to the URL's node and the nodes the cluster announces.
* redis-py 8's maintenance notifications (a server-driven move of the connections to
  another host) are off (docs/security.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any, cast
from urllib.parse import urlencode, urlsplit

import redis.asyncio as aioredis
from redis import exceptions as rex
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import ConnectionPool, parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from objcache.backends.base import (
    Backend,
    ObjectInfo,
    PutMode,
    TierSpec,
    check_size,
    validate_key,
)
from objcache.backends.options import opt_bool, opt_float, opt_int, opt_str
from objcache.backends.records_contract import Versioned
from objcache.backends.redis import cluster
from objcache.backends.redis.spec import DRIVER_OPTIONS, OPTIONS
from objcache.backends.shared import Memo, SharedClients
from objcache.config.options import TIER_OPTIONS
from objcache.errors import (
    BackendError,
    EntryTooLarge,
    PermanentBackendError,
    TransientBackendError,
)

#: Query options objcache reads; the rest (checked against the table in ``spec``) go to redis-py.
OWN_OPTIONS = frozenset(o.name for o in (*TIER_OPTIONS, *OPTIONS)) - DRIVER_OPTIONS
#: put_if_version: KEYS[1] = name; ARGV = data, expected version ("" = must be absent), TTL
#: s. A version is the value's SHA-1, or "len:<n>" for a value too large to read (its
#: length, compared with STRLEN: the value is neither sent nor hashed).
_COMPARE_AND_SET = """
if ARGV[2] == '' then
  if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
elseif string.sub(ARGV[2], 1, 4) == 'len:' then
  if redis.call('EXISTS', KEYS[1]) == 0 or
     redis.call('STRLEN', KEYS[1]) ~= tonumber(string.sub(ARGV[2], 5)) then
    return 0
  end
else
  local current = redis.call('GET', KEYS[1])
  if not current or redis.sha1hex(current) ~= ARGV[2] then return 0 end
end
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
"""
#: get_versioned with a cap: KEYS[1] = name; ARGV[1] = cap. nil when absent, the length
#: (an integer) when over the cap, else the value: an oversized value never leaves the server.
_GET_CAPPED = """
local n = redis.call('STRLEN', KEYS[1])
if n == 0 and redis.call('EXISTS', KEYS[1]) == 0 then return false end
if n > tonumber(ARGV[1]) then return n end
return redis.call('GET', KEYS[1])
"""
SCAN_COUNT = 1000

_GLOB = re.compile(r"([\\*?\[\]])")
#: Error replies that say "not now" rather than "never" (failover, memory, loading).
_TRANSIENT_REPLIES = frozenset({"OOM", "LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN",
                                "CLUSTERDOWN", "READONLY", "MISCONF", "NOREPLICAS"})  # fmt: skip
_TRANSIENT_REPLY_ERRORS = (rex.OutOfMemoryError, rex.ReadOnlyError, rex.TryAgainError,
                           rex.ClusterDownError)  # fmt: skip
#: Errors that need a hint: (classes, codes, error type, message with {text} and {code}).
_HINTED: tuple[tuple[tuple[type[Exception], ...], frozenset[str], type[BackendError], str], ...] = (
    (
        (rex.AuthenticationError, rex.AuthenticationWrongNumberOfArgsError),
        frozenset({"WRONGPASS", "NOAUTH"}),
        PermanentBackendError,
        "authentication failed ({text}): check the user and password in the tier URL "
        "(redis://user:password@host)",
    ),
    (
        (rex.NoPermissionError,),
        frozenset({"NOPERM"}),
        PermanentBackendError,
        "the Redis ACL user may not run this command or key ({text}): grant it "
        "+@read +@write +scan +object on the key prefix",
    ),
    (
        (rex.AskError, rex.ClusterCrossSlotError),
        frozenset({"MOVED", "ASK", "CROSSSLOT"}),
        PermanentBackendError,
        "this is a Redis Cluster node, reached as one server ({code}): remove cluster=no "
        "from the tier URL, or set cluster=yes where its user may not run INFO",
    ),
    (
        (rex.ReadOnlyError,),
        frozenset({"READONLY"}),
        TransientBackendError,
        "READONLY: this server is a replica: name its primary, or the cluster's "
        "configuration endpoint, in the tier URL",
    ),
)


@dataclass(frozen=True)
class PoolKey:
    #: connection URL without objcache's options; may hold a password, so never printed
    url: str = field(repr=False)
    connect_timeout: float
    socket_timeout: float
    max_connections: int
    #: auto, yes or no (spec.CLUSTER_MODES)
    cluster: str = "auto"
    #: the tier's deadline (Sharded.bound_nodes): a cluster node's share of it
    deadline_s: float | None = None
    #: clear_auth_announced: a redis:// password may go to announced nodes on other hosts
    clear_auth: bool = False


@dataclass(frozen=True)
class Pool:
    """A client on one connection pool (or one per cluster node), and the gate that keeps
    callers within it."""

    redis: aioredis.Redis | RedisCluster
    #: redis-py's ConnectionPool fails beyond max_connections and its BlockingConnectionPool
    #: costs ~30 us per command (20% of a loopback GET); a semaphore makes callers wait.
    #: On a cluster it bounds the connections to each node (redis-py fails beyond them too).
    gate: asyncio.Semaphore
    #: the URL's (host, port) on a cluster (cluster.reseed), else None
    seed: tuple[str, int] | None = None
    #: on a cluster, when it last answered (a node's failure meanwhile is partial)
    answered: cluster.Answered | None = None

    def calling(self) -> Calling:
        """``async with pool.calling():`` around one command: within the gate, and an
        answer noted on a cluster."""
        return Calling(self)


class Calling:
    """The gate around one command; on a cluster a command that returned notes the answer."""

    __slots__ = ("pool",)

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def __aenter__(self) -> None:
        await self.pool.gate.acquire()

    async def __aexit__(self, kind: object, exc: object, tb: object) -> None:
        self.pool.gate.release()
        if kind is None and self.pool.answered is not None:
            self.pool.answered.now()


def client_kwargs(key: PoolKey) -> dict[str, Any]:
    """redis-py's connection arguments for ``key``: no retries, objcache's timeouts."""
    kwargs: dict[str, Any] = dict(parse_url(key.url))
    kwargs.update(
        socket_connect_timeout=key.connect_timeout,
        socket_timeout=key.socket_timeout,
        retry=Retry(NoBackoff(), 0),
        retry_on_error=[],
        max_connections=key.max_connections,
        maint_notifications_config=cluster.NO_MAINT_NOTIFICATIONS,
    )
    if "path" not in kwargs:  # TCP (unix sockets take no keepalive option)
        kwargs["socket_keepalive"] = True
    return kwargs


async def _open_client(key: PoolKey) -> Pool:
    kwargs = client_kwargs(key)
    gate = asyncio.Semaphore(key.max_connections)
    if key.cluster != "yes":
        client = aioredis.Redis(connection_pool=ConnectionPool(**kwargs))
        try:
            standalone = (
                key.cluster == "no" or "path" in kwargs or not await cluster.cluster_enabled(client)
            )
        except BaseException:
            await client.aclose(close_connection_pool=True)
            raise
        if standalone:
            return Pool(client, gate)  # the detection's connection stays in the pool
        await client.aclose(close_connection_pool=True)
    answered = cluster.Answered()
    found = cluster.open_cluster(
        kwargs, answered, deadline_s=key.deadline_s, clear_auth=key.clear_auth
    )
    seed = (kwargs["host"], int(kwargs.get("port", 6379)))
    try:
        await cluster.initialize(found, *seed)
    except BaseException:
        await found.aclose()
        raise
    return Pool(found, gate, seed=seed, answered=answered)


async def _close_client(pool: Pool) -> None:
    if isinstance(pool.redis, RedisCluster):
        await pool.redis.aclose()
    else:
        await pool.redis.aclose(close_connection_pool=True)


#: Shared by every RedisBackend in the process.
CLIENTS: SharedClients[PoolKey, Pool] = SharedClients(_open_client, _close_client)


def connection_url(spec: TierSpec) -> str:
    """The tier URL minus objcache's own query options (redis-py rejects unknown ones)."""
    parts = urlsplit(spec.url)
    rest = urlencode({k: v for k, v in spec.options.items() if k not in OWN_OPTIONS})
    # not urlunsplit: it writes unix:///path as unix:/path
    return f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{rest}" if rest else "")


def glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis MATCH pattern."""
    return _GLOB.sub(r"\\\1", text)


def classify(exc: BaseException, op: str, tier: str) -> BackendError:
    """The typed error for an exception raised by redis-py.

    redis-py strips the error code (OOM, NOPERM, ...) from the message and encodes it in
    the exception class; unknown codes stay at the start of a plain ResponseError."""
    if isinstance(exc, BackendError):
        return exc
    known = cluster.cluster_error(exc, op, tier)
    if known is not None:
        return known
    text = str(exc)
    code = str(getattr(exc, "status_code", None) or text.split(" ", 1)[0])
    for classes, codes, kind, hint in _HINTED:
        if isinstance(exc, classes) or code in codes:
            return kind(f"{op}: " + hint.format(text=text, code=code), tier=tier)
    if isinstance(exc, _TRANSIENT_REPLY_ERRORS) or code in _TRANSIENT_REPLIES:
        return TransientBackendError(f"{op}: {code} {text}", tier=tier)
    if isinstance(exc, rex.ResponseError):
        return PermanentBackendError(f"{op}: {text}", tier=tier)
    if isinstance(exc, (rex.ConnectionError, rex.TimeoutError, asyncio.TimeoutError, OSError)):
        # includes BusyLoadingError, "max number of clients", resets, socket timeouts
        hint = ""
        if tier.startswith("rediss://") and "connecting" in text.lower():
            # a plain-text server never answers the TLS handshake: redis-py says only
            # "Timeout connecting to server" (docs/troubleshooting.md, "Tier errors")
            hint = (
                "; this rediss:// tier connects with TLS: if the server speaks plain text, "
                "use redis:// (or enable TLS on the server)"
            )
        return TransientBackendError(f"{op}: {type(exc).__name__}: {exc}{hint}", tier=tier)
    return PermanentBackendError(f"{op}: {type(exc).__name__}: {exc}", tier=tier)


async def scan(pool: Pool, pattern: str) -> AsyncIterator[list[bytes]]:
    """SCAN batches of names: of the server, or of every primary of a cluster."""
    if isinstance(pool.redis, RedisCluster):
        batches = cluster.scan(pool.redis, pattern, SCAN_COUNT)
        while True:
            async with pool.calling():
                names = await anext(batches, None)
            if names is None:
                return
            yield names
    cursor = 0
    while True:
        async with pool.calling():
            cursor, batch = await pool.redis.scan(cursor, match=pattern, count=SCAN_COUNT)
        yield [cast(bytes, n) for n in batch]
        if cursor == 0:
            return


class RedisBackend(Backend):
    def __init__(self, spec: TierSpec) -> None:
        super().__init__(spec)
        self.prefix = opt_str(spec, "prefix") or ""
        self.ttl = opt_int(spec, "ttl")
        self.max_size = opt_int(spec, "max_size")
        self.pool_key = PoolKey(
            url=connection_url(spec),
            connect_timeout=opt_float(spec, "connect_timeout"),
            socket_timeout=opt_float(spec, "socket_timeout"),
            max_connections=opt_int(spec, "max_connections"),
            cluster=(opt_str(spec, "cluster") or "auto").strip().lower(),
            clear_auth=opt_bool(spec, "clear_auth_announced"),
        )
        self._prefix_bytes = self.prefix.encode()
        self._memo: Memo[Pool] = Memo()

    def bound_nodes(self, deadline_s: float) -> None:
        """base.Sharded: on a cluster, each node's connect and reply within a share of the
        tier's deadline (cluster.NODE_SHARE); a standalone server is the tier, unchanged."""
        self.pool_key = replace(self.pool_key, deadline_s=deadline_s)

    async def _pool(self) -> Pool:
        pool = self._memo.get()
        if pool is not None:
            return pool
        try:
            return self._memo.set(await CLIENTS.acquire(self.pool_key, self))
        except Exception as exc:
            raise classify(exc, "connect", self.name) from exc

    def _key(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def _error(self, exc: BaseException, op: str) -> BackendError:
        pool = self._memo.get()
        error = classify(exc, op, self.name)
        if pool is not None and pool.seed is not None and isinstance(pool.redis, RedisCluster):
            cluster.reseed(pool.redis, *pool.seed)
            if pool.answered is not None:
                return cluster.partial(error, pool.answered)
        return error

    # --- reads -------------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        name = self._key(key)
        pool = await self._pool()
        try:
            async with pool.calling():
                value = cast("bytes | None", await pool.redis.get(name))
        except Exception as exc:
            raise self._error(exc, "get") from exc
        return value

    async def get_capped(self, key: str, max_bytes: int) -> bytes | None:
        """One GETRANGE of at most ``max_bytes + 1`` bytes: an oversized value is refused
        after transferring one byte more than the cap, never whole. Entries are never empty,
        so an empty answer is an absent key."""
        if not max_bytes:
            return await self.get(key)
        name = self._key(key)
        pool = await self._pool()
        try:
            async with pool.calling():
                value = cast(bytes, await pool.redis.getrange(name, 0, max_bytes))
        except Exception as exc:
            raise self._error(exc, "get") from exc
        if not value:
            return None
        check_size(len(value), max_bytes)
        return value

    async def exists(self, key: str) -> bool:
        name = self._key(key)
        pool = await self._pool()
        try:
            async with pool.calling():
                return bool(await pool.redis.exists(name))
        except Exception as exc:
            raise self._error(exc, "exists") from exc

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        pool = await self._pool()
        pattern = glob_escape(self.prefix + prefix) + "*"
        cut = len(self._prefix_bytes)
        try:
            async for batch in scan(pool, pattern):
                # Memory is one SCAN page: repeats are dropped within the page only. SCAN
                # returns a name again on a later page only when the server's key table is
                # resized during the listing (or a cluster slot moves); that object is then
                # listed twice, which Backend.list allows (docs/architecture.md, "Listings").
                keys: dict[bytes, str] = {}
                for n in batch:
                    try:
                        keys[n] = n[cut:].decode()
                    except UnicodeDecodeError:
                        self.skip_undecodable(n)
                if keys:
                    now = time.time()
                    pipe = pool.redis.pipeline(transaction=False)
                    for n in keys:
                        pipe.strlen(n)
                        pipe.object("idletime", n)
                    async with pool.calling():
                        replies = await pipe.execute(raise_on_error=False)
                    for i, key in enumerate(keys.values()):
                        size, idle = replies[2 * i], replies[2 * i + 1]
                        if isinstance(size, Exception):
                            continue  # not a string value: not ours
                        mtime = now - idle if isinstance(idle, int) else now
                        yield ObjectInfo(key=key, size=int(size), mtime=mtime)
        except Exception as exc:
            raise self._error(exc, "list") from exc

    # --- writes ------------------------------------------------------------------------

    def _check_size(self, data: bytes) -> None:
        if len(data) > self.max_size:
            raise EntryTooLarge(
                f"{len(data)} bytes exceeds max_size={self.max_size}", tier=self.name
            )

    async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
        name = self._key(key)
        self._check_size(data)
        pool = await self._pool()
        try:
            async with pool.calling():
                done = await pool.redis.set(
                    name, data, nx=mode is PutMode.CREATE, ex=self.ttl if self.ttl else None
                )
        except Exception as exc:
            raise self._error(exc, "put") from exc
        return bool(done)

    # --- records (backends/records_contract.py) -------------------------------------------------

    async def get_versioned(self, key: str, max_bytes: int = 0) -> Versioned | None:
        """With ``max_bytes``: one script that answers an oversized value with its length
        (STRLEN) instead of its bytes (docs/security.md, "Records")."""
        if not max_bytes:
            data = await self.get(key)
            return None if data is None else Versioned(data, hashlib.sha1(data).hexdigest())
        name = self._key(key)
        pool = await self._pool()
        try:
            async with pool.calling():
                found = await pool.redis.eval(_GET_CAPPED, 1, name, max_bytes)
        except Exception as exc:
            raise self._error(exc, "get") from exc
        if found is None:
            return None
        if isinstance(found, int):
            return Versioned(b"", f"len:{found}", too_large=True)
        value = cast(bytes, found)
        return Versioned(value, hashlib.sha1(value).hexdigest())

    async def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        """A Lua compare-and-set on the value's SHA-1 (atomic on the server)."""
        name = self._key(key)
        self._check_size(data)
        pool = await self._pool()
        try:
            async with pool.calling():
                done = await pool.redis.eval(
                    _COMPARE_AND_SET, 1, name, data, version or "", self.ttl or 0
                )
        except Exception as exc:
            raise self._error(exc, "put") from exc
        return bool(done)

    async def delete(self, key: str) -> bool:
        name = self._key(key)
        pool = await self._pool()
        try:
            async with pool.calling():
                return bool(await pool.redis.delete(name))
        except Exception as exc:
            raise self._error(exc, "delete") from exc

    # --- doctor ------------------------------------------------------------------------------

    async def describe(self) -> str:
        """One line on the store (objcache doctor): the server's version and role, or the
        cluster's primaries, replicas and slots covered; raises :class:`BackendError` when
        the store cannot serve every key (cluster.describe). One connection of its own."""
        kwargs = client_kwargs(self.pool_key)
        kwargs.update(max_connections=1)
        client = aioredis.Redis(connection_pool=ConnectionPool(**kwargs))
        try:
            return await cluster.describe(client, self.pool_key.cluster, self.name)
        except BackendError:
            raise
        except Exception as exc:
            raise self._error(exc, "describe") from exc
        finally:
            await client.aclose(close_connection_pool=True)

    async def close(self) -> None:
        self._memo.clear()
        await CLIENTS.release(self.pool_key, self)
