"""What ``redis://``, ``rediss://`` and ``unix://`` are, for the registry: schemes, location
checks, option table, extra; importing it does not import redis-py."""

from __future__ import annotations

from urllib.parse import SplitResult, parse_qs

from objcache.config.locations import PERCENT_ENCODE
from objcache.config.options import MiB, Option, OptionTable
from objcache.config.registry import Scheme
from objcache.errors import ConfigError

OPTIONS: OptionTable = (
    Option("prefix", "str", "objcache/", "Prefix of every key objcache writes."),
    Option("ttl", "int", 0, "Expire entries after this many seconds (0: never)."),
    Option("max_size", "int", 64 * MiB, "Largest value stored; bigger go to the next tier.", 1),
    Option("connect_timeout", "float", 2.0, "Seconds to open a connection."),
    Option("socket_timeout", "float", 5.0, "Seconds to wait for a reply."),
    Option("max_connections", "int", 64, "Connections per process to this server.", 1),
    Option("db", "int", None, "Database number (unix:// sockets; redis:// takes it as /N)."),
    Option("ssl_cert_reqs", "str", None, "rediss://: none, optional or required (redis-py)."),
    Option("ssl_ca_certs", "str", None, "rediss://: CA bundle file (redis-py)."),
    Option("ssl_certfile", "str", None, "rediss://: client certificate file (redis-py)."),
    Option("ssl_keyfile", "str", None, "rediss://: client key file (redis-py)."),
    Option("ssl_check_hostname", "bool", None, "rediss://: check the server's name (redis-py)."),
    Option("client_name", "str", None, "CLIENT SETNAME of each connection (redis-py)."),
    Option("health_check_interval", "int", 0, "Seconds between PINGs of idle connections."),
    Option(
        "cluster",
        "str",
        "auto",
        "Redis Cluster protocol: auto (ask the server once, on connecting), yes or no "
        '(docs/operations.md, "Redis Cluster").',
    ),
    Option(
        "clear_auth_announced",
        "bool",
        False,
        "redis:// Redis Cluster with a password: send it in clear text to the nodes the "
        "cluster announces on other hosts than the URL's (docs/security.md).",
    ),
)
#: Values of the ``cluster`` option.
CLUSTER_MODES = ("auto", "yes", "no")
#: Options objcache passes on to redis-py in the connection URL (all others are its own).
DRIVER_OPTIONS = frozenset(
    {
        "db",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_check_hostname",
        "client_name",
        "health_check_interval",
    }
)


def cluster_mode(parts: SplitResult, where: str) -> str:
    """The URL's ``cluster`` option, checked: auto, yes or no."""
    mode = parse_qs(parts.query).get("cluster", ["auto"])[-1].strip().lower() or "auto"
    if mode not in CLUSTER_MODES:
        raise ConfigError(f"{where}: cluster must be auto, yes or no, got {mode!r}")
    return mode


def host(parts: SplitResult, where: str) -> tuple[str, str]:
    cluster_mode(parts, where)
    if "@" in parts.path + parts.query + parts.fragment:
        # a raw '/', '?' or '#' in the password ended the host part early
        raise ConfigError(f"{where}: '@' after the host: {PERCENT_ENCODE}")
    if not parts.hostname:
        raise ConfigError(f"{where}: {parts.scheme}:// URL needs a host")
    return parts.netloc, parts.path


def unix_socket(parts: SplitResult, where: str) -> tuple[str, str]:
    if not parts.path.startswith("/"):
        raise ConfigError(f"{where}: unix:// socket path must be absolute")
    if cluster_mode(parts, where) == "yes":
        raise ConfigError(
            f"{where}: a Redis Cluster is reached over TCP: use redis:// or rediss://"
        )
    return parts.netloc, parts.path


_TARGET = "objcache.backends.redis.store:RedisBackend"
SCHEMES = (
    Scheme("redis", _TARGET, "redis", host, OPTIONS, sdk="redis"),
    Scheme("rediss", _TARGET, "redis", host, OPTIONS, sdk="redis"),
    Scheme("unix", _TARGET, "redis", unix_socket, OPTIONS, sdk="redis"),
)
