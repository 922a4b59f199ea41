"""Every error type objcache raises or counts.

Callers inside torch never see these: the torch and Triton integrations turn them into
misses. They exist so that the CLI, the stats and the logs can say exactly what went wrong.
"""

from __future__ import annotations


class ObjcacheError(Exception):
    """Base class of all objcache errors."""


class ConfigError(ObjcacheError, ValueError):
    """Bad configuration: an unparseable tier URL, an unknown scheme, a bad number."""


# --- entry format ---------------------------------------------------------------------


class ReadOnlyRefused(ConfigError):
    """A command that writes or deletes was pointed at a read-only configuration or tier."""


class EntryError(ObjcacheError):
    """An entry's bytes were refused by the decoder. Never returned to a caller as data."""

    #: Short label used in stats ("corrupt", "unsigned", ...).
    reason = "corrupt"


class CorruptEntry(EntryError):
    """Bad magic, wrong length, digest mismatch, undecompressable payload."""

    reason = "corrupt"


class OversizedEntry(EntryError):
    """The entry claims a payload larger than its kind's cap (a zstd bomb, a planted blob)."""

    reason = "too_large"


class UnsupportedVersion(EntryError):
    """An entry written by a newer (or unknown) format version."""

    reason = "version"


class UnsignedEntry(EntryError):
    """A signing key is configured but the entry carries no signature."""

    reason = "unsigned"


class BadSignature(EntryError):
    """The entry's HMAC does not match any accepted signing key."""

    reason = "bad_signature"


# --- backends -------------------------------------------------------------------------


class BackendError(ObjcacheError):
    """A storage call failed. ``tier`` names the tier URL without secrets."""

    def __init__(self, message: str, *, tier: str = "") -> None:
        super().__init__(f"{tier}: {message}" if tier else message)
        self.tier = tier


class TransientBackendError(BackendError):
    """Worth retrying: throttling, 5xx, connection resets, timeouts."""


class PartialOutage(TransientBackendError):
    """One part of a sharded store failed while the rest answers (a Redis Cluster primary
    down, its replica not promoted yet): this key is a miss, the tier is not at fault, so it
    does not count against the tier's breaker (docs/architecture.md, "Redis Cluster")."""


class PermanentBackendError(BackendError):
    """Not worth retrying: access denied, missing bucket, bad credentials, bad request."""


class ClockSkew(PermanentBackendError):
    """The server refused the request's timestamp (S3 ``RequestTimeTooSkewed``): this
    machine's clock is off. Not the tier's fault, so it does not count against its breaker."""


class InvalidKey(PermanentBackendError, ValueError):
    """A key that could escape its store (path traversal) or exceeds the size limit."""


class EntryTooLarge(PermanentBackendError):
    """The value exceeds the tier's size limit; it is left to the next tier."""


class UnsafeFolder(ObjcacheError, OSError):
    """A folder objcache would write through is a symlink, is owned by another user or is
    writable by others: nothing is written there (docs/security.md, "Files objcache places
    outside a store"). An ``OSError``, so a caller that shrugs off a failed write shrugs off
    this one too."""
