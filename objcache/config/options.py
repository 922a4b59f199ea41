"""Tier URL query options as data: name, type, default and help of each, checked by name.

Each backend's table lives in the ``spec`` module of its folder (found through
:mod:`objcache.config.registry`); the same tables validate tier URLs
(an unknown or mistyped option is a one-line error naming it, with a "did you mean" when one
is close), give backends their typed values, and generate docs/configuration.md.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from objcache.entry.caps import parse_size
from objcache.errors import ConfigError

#: Bytes in a mebibyte, for the sizes in option tables.
MiB = 1 << 20

Kind = Literal["bool", "int", "float", "str", "size"]
Value = bool | int | float | str | None

_TRUE = ("", "1", "true", "yes")
_FALSE = ("0", "false", "no")


@dataclass(frozen=True)
class Option:
    """One query option of a tier URL."""

    name: str
    kind: Kind
    default: Value
    help: str
    #: smallest accepted value of an int or size (floats must be > 0)
    minimum: int = 0
    #: shown in the docs instead of ``default`` (e.g. "OBJCACHE_TIMEOUT_MS")
    default_text: str = ""

    def parse(self, raw: str | None, where: str) -> Value:
        """The typed value of ``raw`` (``None`` or empty: the default)."""
        if raw is None or (raw == "" and self.kind != "bool"):
            return self.default
        low = raw.strip().lower()
        if self.kind == "bool":
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ConfigError(f"{where}: {self.name} must be 0/1/true/false, got {raw!r}")
        if self.kind == "str":
            return raw
        if self.kind == "float":
            try:
                number = float(low)
            except ValueError:
                raise ConfigError(f"{where}: option {self.name} must be a number") from None
            if not number > 0:
                raise ConfigError(f"{where}: option {self.name} must be > 0")
            return number
        if self.kind == "size":
            value = parse_size(raw, f"{where}: {self.name}")
        else:
            if not low.isdigit():
                raise ConfigError(f"{where}: {self.name} must be a non-negative integer")
            value = int(low)
        if value < self.minimum:
            raise ConfigError(f"{where}: option {self.name} must be >= {self.minimum}")
        return value

    @property
    def shown_default(self) -> str:
        if self.default_text:
            return self.default_text
        if self.default is None:
            return "unset"
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        return str(self.default)


OptionTable = tuple[Option, ...]

#: Options every tier understands; policy, read by :mod:`objcache.core.tier`, not by backends.
TIER_OPTIONS: OptionTable = (
    Option(
        "read_only", "bool", False, "Never write to this tier (puts, back-fill, manifests, CLI)."
    ),
    Option("write_only", "bool", False, "Never read from this tier (an archive)."),
    Option(
        "home",
        "bool",
        False,
        "With OBJCACHE_WRITE_TO=nearest, this tier receives every write too.",
    ),
    Option(
        "timeout_ms",
        "int",
        None,
        "Deadline of one call to this tier, retries included.",
        default_text="OBJCACHE_TIMEOUT_MS",
    ),
    Option(
        "retries",
        "int",
        None,
        "Retries of a transient error of this tier.",
        default_text="OBJCACHE_RETRIES",
    ),
    Option("max_size", "int", 0, "Largest entry this tier stores (0: no limit); bigger go on."),
)


def lookup(table: OptionTable, name: str) -> Option:
    for option in table:
        if option.name == name:
            return option
    raise KeyError(name)


def check(options: Mapping[str, str], tables: Iterable[OptionTable], where: str) -> None:
    """Refuse an unknown option (naming it, with a close match) or an ill-typed value.

    The first table that names an option decides its type."""
    known: dict[str, Option] = {}
    for table in tables:
        for option in table:
            known.setdefault(option.name, option)
    for name, raw in options.items():
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
            raise ConfigError(f"{where}: unknown option {name!r}{hint}")
        known[name].parse(raw, where)


def markdown(table: OptionTable) -> str:
    """A Markdown table of ``table`` for docs/configuration.md."""
    rows = ["| Option | Type | Default | Meaning |", "|---|---|---|---|"]
    for o in table:
        rows.append(f"| `{o.name}` | {o.kind} | `{o.shown_default}` | {o.help} |")
    return "\n".join(rows)
