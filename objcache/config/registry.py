"""One table of URL schemes: per scheme, the backend that serves it, the extra that installs
its dependencies, how its URL's location is checked and the table of its query options.

Third parties add schemes through the ``objcache.backends`` entry-point group (name: the
scheme, value: ``module:Class``) without touching objcache; such a class may declare its
option table as ``options``, else only the tier options are checked for it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from urllib.parse import SplitResult

from objcache.config.options import TIER_OPTIONS, Option, OptionTable
from objcache.errors import ConfigError

MiB = 1 << 20
#: S3 refuses multipart parts below 5 MiB (except the last).
MIN_PART_SIZE = 5 * MiB

#: ``(parts, where) -> (location, path)``: checks a URL's host/bucket/path for one scheme.
LocationCheck = Callable[[SplitResult, str], tuple[str, str]]

#: The hint for a password whose special characters split the URL.
PERCENT_ENCODE = (
    "percent-encode special characters of the password "
    "('@' as %40, '/' as %2F, '?' as %3F, '#' as %23, '%' as %25)"
)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")


def _filesystem(parts: SplitResult, where: str) -> tuple[str, str]:
    if parts.netloc not in ("", "localhost"):
        raise ConfigError(f"{where}: file:// path must be absolute (got host {parts.netloc!r})")
    if not parts.path.startswith("/"):
        raise ConfigError(f"{where}: file:// path must be absolute")
    return "", parts.path


def _bucket(parts: SplitResult, where: str) -> tuple[str, str]:
    if not parts.netloc:
        raise ConfigError(f"{where}: {parts.scheme}:// URL needs a bucket name")
    if "@" in parts.netloc:  # never echo what precedes it: keys pasted into the URL
        raise ConfigError(
            f"{where}: credentials do not belong in a {parts.scheme}:// URL (bucket "
            f"{parts.netloc.rsplit('@', 1)[1]!r}); use the environment or a profile"
        )
    if not _BUCKET.match(parts.netloc):
        raise ConfigError(f"{where}: invalid bucket name {parts.netloc!r}")
    return parts.netloc, parts.path.strip("/")


def _redis_host(parts: SplitResult, where: str) -> tuple[str, str]:
    if "@" in parts.path + parts.query + parts.fragment:
        # a raw '/', '?' or '#' in the password ended the host part early
        raise ConfigError(f"{where}: '@' after the host: {PERCENT_ENCODE}")
    if not parts.hostname:
        raise ConfigError(f"{where}: {parts.scheme}:// URL needs a host")
    return parts.netloc, parts.path


def _unix_socket(parts: SplitResult, where: str) -> tuple[str, str]:
    if not parts.path.startswith("/"):
        raise ConfigError(f"{where}: unix:// socket path must be absolute")
    return parts.netloc, parts.path


def _anything(parts: SplitResult, where: str) -> tuple[str, str]:
    return parts.netloc, parts.path


# --- option tables, one per backend ------------------------------------------------------

FS_OPTIONS: OptionTable = (
    Option("fsync", "bool", True, "fsync each entry and its directory before it is visible."),
    Option(
        "shared",
        "str",
        "user",
        "user: a private store (folders 0700, files 0600); group: shared by a group "
        "(root may belong to another member, folders 0770, files 0640).",
    ),
)
DISK_OPTIONS: OptionTable = (
    Option("fsync", "bool", False, "fsync each entry (the local tier is a cache: off)."),
    Option("max_bytes", "size", 0, "Evict least-recently-used entries above this (10G, 512M)."),
)
REDIS_OPTIONS: OptionTable = (
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
)
#: Options objcache passes on to redis-py in the connection URL (all others are its own).
REDIS_DRIVER_OPTIONS = frozenset(
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
S3_OPTIONS: OptionTable = (
    Option("region", "str", None, "AWS region (default: the SDK's configuration)."),
    Option("endpoint_url", "str", None, "S3-compatible endpoint (MinIO, SeaweedFS, R2)."),
    Option("profile", "str", None, "Named profile of the shared AWS credentials file."),
    Option("addressing_style", "str", "auto", "auto, path or virtual."),
    Option("connect_timeout", "float", 3.0, "Seconds to open a connection."),
    Option("read_timeout", "float", 20.0, "Seconds to wait for response bytes."),
    Option("max_pool_connections", "int", 64, "HTTP connections per process.", 1),
    Option("direct", "bool", True, "Send GET/PUT/HEAD/DELETE without botocore's overhead."),
    Option("multipart_threshold", "int", 16 * MiB, "Entries from this size upload in parts.", 1),
    Option("part_size", "int", 8 * MiB, "Bytes per multipart part (>= 5 MiB).", MIN_PART_SIZE),
    Option("part_concurrency", "int", 8, "Parts of one entry uploaded at once.", 1),
)
GCS_OPTIONS: OptionTable = (
    Option("project", "str", None, "Google Cloud project (default: the credentials')."),
    Option(
        "endpoint", "str", None, "Storage endpoint (default: STORAGE_EMULATOR_HOST or Google's)."
    ),
    Option("connect_timeout", "float", 3.0, "Seconds to open a connection."),
    Option("read_timeout", "float", 20.0, "Seconds to wait for response bytes."),
    Option("resumable_threshold", "int", 8 * MiB, "Entries from this size upload resumably.", 1),
    Option(
        "resumable_chunk", "int", 64 * MiB, "Bytes per resumable chunk (n x 256 KiB).", 256 << 10
    ),
)


@dataclass(frozen=True)
class Scheme:
    """What objcache knows about one URL scheme."""

    name: str
    #: ``module:Class`` of the backend
    target: str
    #: pip extra that installs the backend's dependencies ("" when none are needed)
    extra: str
    location: LocationCheck
    #: the backend's own query options, or None when unknown (a third party's)
    options: OptionTable | None


SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        Scheme("disk", "objcache.backends.disk:DiskBackend", "", _filesystem, DISK_OPTIONS),
        Scheme("file", "objcache.backends.file:FileBackend", "", _filesystem, FS_OPTIONS),
        Scheme(
            "redis", "objcache.backends.redis:RedisBackend", "redis", _redis_host, REDIS_OPTIONS
        ),
        Scheme(
            "rediss", "objcache.backends.redis:RedisBackend", "redis", _redis_host, REDIS_OPTIONS
        ),
        Scheme(
            "unix", "objcache.backends.redis:RedisBackend", "redis", _unix_socket, REDIS_OPTIONS
        ),
        Scheme("s3", "objcache.backends.s3:S3Backend", "s3", _bucket, S3_OPTIONS),
        Scheme("gs", "objcache.backends.gcs:GCSBackend", "gcs", _bucket, GCS_OPTIONS),
    )
}


def register(name: str, target: str, options: OptionTable | None = None) -> None:
    """Serve ``name://`` by ``module:Class`` in this process (tests; installed packages use
    the entry points)."""
    SCHEMES[name] = Scheme(name, target, "", _anything, options)


@functools.cache
def _entry_points() -> dict[str, Scheme]:
    return {
        ep.name: Scheme(ep.name, ep.value, "", _anything, None)
        for ep in entry_points(group="objcache.backends")
        if ep.name not in SCHEMES
    }


def scheme(name: str) -> Scheme | None:
    return SCHEMES.get(name) or _entry_points().get(name)


def option_tables(name: str) -> tuple[OptionTable, ...] | None:
    """The option tables a ``name://`` URL is checked against (None: the backend's own
    options are unknown, only the tier options are)."""
    entry = scheme(name)
    if entry is None or entry.options is None:
        return None
    return (entry.options, TIER_OPTIONS)
