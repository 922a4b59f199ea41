"""Tier URLs: parsing into :class:`TierSpec` with one-line errors, and redaction for logs."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from objcache import registry
from objcache.backends.base import TierSpec
from objcache.errors import ConfigError
from objcache.options import TIER_OPTIONS, lookup
from objcache.options import check as check_options

_SECRET_QUERY = re.compile(r"(?i)(password|secret|token|key|credential|signature)")


def parse_tier_url(url: str, where: str = "tier URL") -> TierSpec:
    """Parse one tier URL. ``where`` names it in errors, e.g. ``OBJCACHE_TIERS[1]``.

    The scheme, its location and every query option are checked against
    :mod:`objcache.registry`: an unknown option is an error naming it."""
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
            raise ConfigError(f"{where}: cannot parse the URL; {registry.PERCENT_ENCODE}") from None
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


def redact(url: str) -> str:
    """Remove passwords and secret-looking query values from a URL."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"{user}@{host}"
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
