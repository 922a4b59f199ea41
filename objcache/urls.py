"""Tier URLs: parsing into :class:`TierSpec` with one-line errors, and redaction for logs."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from objcache.backends.base import TierSpec
from objcache.errors import ConfigError

#: Schemes objcache itself serves; third-party schemes come from entry points.
BUILTIN_SCHEMES = ("disk", "file", "redis", "rediss", "unix", "s3", "gs")

#: Query options every tier understands (the rest belong to the backend).
TIER_OPTIONS = ("read_only", "write_only", "home", "timeout_ms", "max_size", "retries")

_SECRET_QUERY = re.compile(r"(?i)(password|secret|token|key|credential|signature)")
#: Schemes whose URL user name is an ACL user, not a secret: shown by :func:`redact`.
_USER_SCHEMES = ("redis", "rediss", "unix")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")


def parse_tier_url(url: str, where: str = "tier URL", known: tuple[str, ...] = ()) -> TierSpec:
    """Parse one tier URL. ``where`` names it in errors, e.g. ``OBJCACHE_TIERS[1]``."""
    url = url.strip()
    if "://" not in url:
        raise ConfigError(f"{where}: {redact(url)!r} is not a URL (expected scheme://...)")
    scheme = url.split("://", 1)[0].lower()
    if scheme not in BUILTIN_SCHEMES and scheme not in known:
        raise ConfigError(f"unknown scheme {scheme!r} in {where}")
    try:
        parts = urlsplit(url)
        options = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
        _ = parts.port  # raises ValueError on a non-numeric port
    except ValueError:
        # urllib's message quotes the "port", which may be a password's first half.
        raise ConfigError(
            f"{where}: cannot parse {redact(url)!r} (a port that is not a number, or a "
            "password with an unencoded / ? # or @: percent-encode it)"
        ) from None
    location, path = parts.netloc, parts.path
    if scheme in ("file", "disk"):
        if location not in ("", "localhost"):
            host = parts.hostname or ""
            raise ConfigError(f"{where}: file:// path must be absolute (got host {host!r})")
        if not path.startswith("/"):
            raise ConfigError(f"{where}: file:// path must be absolute")
        location = ""
    elif scheme == "unix":
        if not path.startswith("/"):
            raise ConfigError(f"{where}: unix:// socket path must be absolute")
    elif scheme in ("s3", "gs"):
        if not location:
            raise ConfigError(f"{where}: {scheme}:// URL needs a bucket name")
        if "@" in location:  # never echo what precedes it: keys pasted into the URL
            raise ConfigError(
                f"{where}: credentials do not belong in a {scheme}:// URL (bucket "
                f"{location.rsplit('@', 1)[1]!r}); use the environment or a profile"
            )
        if not _BUCKET.match(location):
            raise ConfigError(f"{where}: invalid bucket name {location!r}")
        path = path.strip("/")
    elif scheme in ("redis", "rediss") and not parts.hostname:
        raise ConfigError(f"{where}: {scheme}:// URL needs a host")
    for flag in ("read_only", "write_only", "home"):
        if flag in options and options[flag].lower() not in ("", "0", "1", "true", "false"):
            raise ConfigError(f"{where}: {flag} must be 0/1/true/false")
    for num in ("timeout_ms", "max_size", "retries"):
        if num in options and not options[num].isdigit():
            raise ConfigError(f"{where}: {num} must be a non-negative integer")
    return TierSpec(url=url, scheme=scheme, location=location, path=path, options=options)


def parse_tier_list(value: str, where: str = "OBJCACHE_TIERS") -> list[TierSpec]:
    """Parse a comma-separated tier list, naming the bad entry by index."""
    from objcache.registry import known_schemes

    known = known_schemes()
    urls = [u for u in (s.strip() for s in value.split(",")) if u]
    return [parse_tier_url(u, f"{where}[{i}]", known) for i, u in enumerate(urls)]


def _split_userinfo(rest: str) -> tuple[str, str] | None:
    """``(userinfo, the rest)`` of what follows ``scheme://``, or None without userinfo.

    Conservative, for redaction: a password holding an unencoded ``/``, ``?``, ``#`` or
    ``@`` ends the authority early for urllib, so when the authority looks like the start
    of ``user:password`` (a ``:`` not followed by a port) the userinfo runs to the last
    ``@`` of the URL.
    """
    auth_end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority = rest[:auth_end]
    if "@" in authority:
        at = authority.rindex("@")
    elif "@" in rest[auth_end:] and ":" in authority:
        host, _, port = authority.rpartition(":")
        if host and port.isdigit():
            return None  # host:port, then an @ in the path or query
        at = rest.rindex("@")
    else:
        return None
    return rest[:at], rest[at + 1 :]


def redact(url: str) -> str:
    """Remove passwords and secret-looking query values from a URL (docs/security.md).

    Shown: the scheme, a Redis ACL user name, host, path, and query values whose names do
    not look secret (URLs among them are redacted in turn). Hidden: every password, even
    one with unencoded ``/ ? # @``; the whole userinfo of other schemes (an access key
    pasted into an ``s3://`` URL); ``password``, ``secret``, ``token``, ``key``... values.
    """
    scheme, sep, rest = url.partition("://")
    split = _split_userinfo(rest) if sep else None
    if split is not None:
        userinfo, tail = split
        user, colon, _ = userinfo.partition(":")
        shown = (f"{user}:***" if colon else user) if scheme.lower() in _USER_SCHEMES else "***"
        tail = redact(f"{scheme}://{tail}")
        if not tail.startswith(f"{scheme}://"):
            return tail  # unparseable
        return f"{scheme}://{shown}@{tail[len(scheme) + 3 :]}"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    netloc = parts.netloc
    query = "&".join(
        f"{k}=***"
        if _SECRET_QUERY.search(k)
        else (f"{k}={redact(v) if '://' in v else v}" if v else k)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    out = urlunsplit((parts.scheme, netloc, parts.path, query, ""))
    if not out.startswith(f"{parts.scheme}://") and url.startswith(f"{parts.scheme}://"):
        out = f"{parts.scheme}://{out[len(parts.scheme) + 1 :]}"
    return out


def flag(spec: TierSpec, name: str) -> bool:
    """A boolean tier option."""
    return spec.options.get(name, "0").lower() in ("", "1", "true") and name in spec.options
