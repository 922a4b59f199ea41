"""What ``s3://`` is, for the registry: scheme, location check, option table, extra;
importing it does not import aiobotocore."""

from __future__ import annotations

from objcache.config.locations import bucket
from objcache.config.options import MiB, Option, OptionTable
from objcache.config.registry import Scheme

#: S3 refuses multipart parts below 5 MiB (except the last).
MIN_PART_SIZE = 5 * MiB

OPTIONS: OptionTable = (
    Option("region", "str", None, "AWS region (default: the SDK's configuration)."),
    Option("endpoint_url", "str", None, "S3-compatible endpoint (MinIO, SeaweedFS, R2)."),
    Option("profile", "str", None, "Named profile of the shared AWS credentials file."),
    Option("addressing_style", "str", "auto", "auto, path or virtual."),
    Option("connect_timeout", "float", 3.0, "Seconds to open a connection."),
    Option("read_timeout", "float", 20.0, "Seconds to wait for response bytes."),
    Option("max_pool_connections", "int", 256, "HTTP connections per process.", 1),
    Option("direct", "bool", True, "Send GET/PUT/HEAD/DELETE without botocore's overhead."),
    Option("multipart_threshold", "int", 16 * MiB, "Entries from this size upload in parts.", 1),
    Option("part_size", "int", 8 * MiB, "Bytes per multipart part (>= 5 MiB).", MIN_PART_SIZE),
    Option("part_concurrency", "int", 8, "Parts of one entry uploaded at once.", 1),
)

SCHEMES = (
    Scheme("s3", "objcache.backends.s3.store:S3Backend", "s3", bucket, OPTIONS, sdk="aiobotocore"),
)
