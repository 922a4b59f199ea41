"""What ``gs://`` is, for the registry: scheme, location check, option table, extra;
importing it does not import google-cloud-storage."""

from __future__ import annotations

from objcache.config.locations import bucket
from objcache.config.options import MiB, Option, OptionTable
from objcache.config.registry import Scheme

OPTIONS: OptionTable = (
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

SCHEMES = (
    Scheme(
        "gs",
        "objcache.backends.gcs.store:GCSBackend",
        "gcs",
        bucket,
        OPTIONS,
        sdk="google.cloud.storage",
    ),
)
