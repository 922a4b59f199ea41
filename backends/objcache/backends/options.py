"""Typed values of a tier URL's query options, from the scheme's table (the ``spec`` of its
backend, found by :mod:`objcache.config.registry`: name, type, default, minimum): one place
per option."""

from __future__ import annotations

from objcache.config.options import Option, Value, lookup
from objcache.config.urls import TierSpec


def _value(spec: TierSpec, name: str) -> Value:
    from objcache.config import registry

    for table in registry.option_tables(spec.scheme) or ():
        try:
            option: Option = lookup(table, name)
        except KeyError:
            continue
        return option.parse(spec.options.get(name), spec.display)
    raise KeyError(f"{spec.scheme}:// has no option {name!r} in its spec")


def opt_str(spec: TierSpec, name: str) -> str | None:
    value = _value(spec, name)
    assert value is None or isinstance(value, str)
    return value or None


def opt_int(spec: TierSpec, name: str) -> int:
    value = _value(spec, name)
    assert isinstance(value, int) and not isinstance(value, bool)
    return value


def opt_float(spec: TierSpec, name: str) -> float:
    value = _value(spec, name)
    assert isinstance(value, float)
    return value


def opt_bool(spec: TierSpec, name: str) -> bool:
    value = _value(spec, name)
    assert isinstance(value, bool)
    return value
