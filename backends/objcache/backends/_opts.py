"""Typed access to a tier URL's query options, with one-line ConfigErrors."""

from __future__ import annotations

from objcache.backends.base import TierSpec
from objcache.errors import ConfigError

MiB = 1 << 20


def opt_str(spec: TierSpec, name: str, default: str | None = None) -> str | None:
    value = spec.options.get(name)
    return value if value else default


def opt_int(spec: TierSpec, name: str, default: int, minimum: int = 0) -> int:
    raw = spec.options.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{spec.display}: option {name} must be an integer") from None
    if value < minimum:
        raise ConfigError(f"{spec.display}: option {name} must be >= {minimum}")
    return value


def opt_float(spec: TierSpec, name: str, default: float) -> float:
    raw = spec.options.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{spec.display}: option {name} must be a number") from None
    if value <= 0:
        raise ConfigError(f"{spec.display}: option {name} must be > 0")
    return value


def opt_bool(spec: TierSpec, name: str, default: bool) -> bool:
    raw = spec.options.get(name)
    if raw is None:
        return default
    if raw.lower() in ("", "1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise ConfigError(f"{spec.display}: {name} must be 0/1/true/false, got {raw!r}")
