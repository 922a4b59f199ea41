"""Tier URLs: parsing into :class:`TierSpec` with one-line errors, and redaction for logs."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from objcache.config import registry
from objcache.config.locations import PERCENT_ENCODE
from objcache.config.options import TIER_OPTIONS, lookup
from objcache.config.options import check as check_options
from objcache.errors import ConfigError

_SECRET_QUERY = re.compile(r"(?i)(password|secret|token|key|credential|signature)")
#: Schemes whose URL user name is an ACL user, not a secret: shown by :func:`redact`.
_USER_SCHEMES = ("redis", "rediss", "unix")


@dataclass(frozen=True)
class TierSpec:
    """A parsed tier URL: ``scheme://location/prefix?option=value``."""

    url: str
    scheme: str
    #: bucket, host:port, or "" for file:// and disk
    location: str
    #: object-name prefix inside the bucket, or the directory for file:// and disk
    path: str
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def display(self) -> str:
        """The URL with any password or secret query value removed: safe to log."""
        return redact(self.url)

    def __repr__(self) -> str:
        # The URL and location may hold a password (redis://:pw@host): never show them.
        return f"TierSpec({self.display!r})"


def parse_tier_url(url: str, where: str = "tier URL") -> TierSpec:
    """Parse one tier URL. ``where`` names it in errors, e.g. ``OBJCACHE_TIERS[1]``.

    The scheme, its location and every query option are checked against
    :mod:`objcache.config.registry` (each backend's ``spec``): an unknown option is an error
    naming it."""
    url = url.strip()
    if "://" not in url:
        raise ConfigError(f"{where}: {redact(url)!r} is not a URL (expected scheme://...)")
    scheme = url.split("://", 1)[0].lower()
    entry = registry.scheme(scheme)
    if entry is None:
        raise ConfigError(f"unknown scheme {scheme!r} in {where}")
    try:
        parts = urlsplit(url)
        options = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
        _ = parts.port  # raises ValueError on a non-numeric port
    except ValueError as exc:
        if "@" in url:  # a password cut short: echo none of it (urllib's message quotes it)
            raise ConfigError(f"{where}: cannot parse the URL; {PERCENT_ENCODE}") from None
        raise ConfigError(f"{where}: cannot parse {redact(url)!r}: {exc}") from None
    location, path = entry.location(parts, where)
    tables = registry.option_tables(scheme)
    if tables is None:  # a third party's backend: only the tier options are known
        options_checked = {k: v for k, v in options.items() if k in {o.name for o in TIER_OPTIONS}}
        check_options(options_checked, [TIER_OPTIONS], where)
    else:
        check_options(options, tables, where)
    return TierSpec(url=url, scheme=scheme, location=location, path=path, options=options)


def parse_tier_list(value: str, where: str = "OBJCACHE_TIERS") -> list[TierSpec]:
    """Parse a comma-separated tier list, naming the bad entry by index."""
    urls = [u for u in (s.strip() for s in value.split(",")) if u]
    return [parse_tier_url(u, f"{where}[{i}]") for i, u in enumerate(urls)]


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
        if not tail.lower().startswith(f"{scheme.lower()}://"):  # urlsplit lowercases it
            return tail  # unparseable
        return f"{scheme}://{shown}@{tail[len(scheme) + 3 :]}"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    netloc = parts.netloc
    query = "&".join(
        f"{k}=***" if _SECRET_QUERY.search(k) else (f"{k}={_redact_value(v)}" if v else k)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    out = urlunsplit((parts.scheme, netloc, parts.path, query, ""))
    if not out.startswith(f"{parts.scheme}://") and url.startswith(f"{parts.scheme}://"):
        out = f"{parts.scheme}://{out[len(parts.scheme) + 1 :]}"
    return out


def _redact_value(value: str) -> str:
    """A query value that is itself a URL (``endpoint_url=http://user:pw@host``) may carry a
    password too."""
    return redact(value) if "://" in value and "@" in value else value


def flag(spec: TierSpec, name: str) -> bool:
    """A boolean tier option (``read_only``, ``write_only``, ``home``), parsed as checked."""
    return bool(lookup(TIER_OPTIONS, name).parse(spec.options.get(name), spec.display))
