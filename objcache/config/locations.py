"""Location checks of tier URLs that more than one backend's description uses: an absolute
path, a bucket, anything. A check takes the split URL and where it came from (for errors)
and returns ``(location, path)``; see :class:`objcache.config.registry.Scheme`."""

from __future__ import annotations

import re
from urllib.parse import SplitResult

from objcache.errors import ConfigError

#: The hint for a password whose special characters split the URL.
PERCENT_ENCODE = (
    "percent-encode special characters of the password "
    "('@' as %40, '/' as %2F, '?' as %3F, '#' as %23, '%' as %25)"
)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")


def absolute_path(parts: SplitResult, where: str) -> tuple[str, str]:
    """A folder on this machine: ``scheme:///abs/dir`` (or ``scheme://localhost/abs/dir``)."""
    if parts.netloc not in ("", "localhost"):
        raise ConfigError(f"{where}: file:// path must be absolute (got host {parts.netloc!r})")
    if not parts.path.startswith("/"):
        raise ConfigError(f"{where}: file:// path must be absolute")
    return "", parts.path


def bucket(parts: SplitResult, where: str) -> tuple[str, str]:
    """A bucket and an object-name prefix: ``scheme://bucket/prefix``, no credentials."""
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


def anything(parts: SplitResult, where: str) -> tuple[str, str]:
    """No check: the backend checks its own location (a third party's)."""
    return parts.netloc, parts.path
