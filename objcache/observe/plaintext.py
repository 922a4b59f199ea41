"""Strings from a store, made safe to print on an operator's terminal (docs/security.md,
"What the CLI prints").

Hosts, kinds, key names from listings, ``ENV.json`` fields and run-summary fields are written
by whoever can write the store. Printed as they are, an ``ESC]0;...BEL`` retitles the
terminal, ``ESC[2J`` clears it, and through rich markup ``x[/]`` raises ``MarkupError``.
:func:`plain` escapes every character that is not printable (C0 and C1 controls, DEL,
bidirectional and other format characters, line separators, lone surrogates) as a Python
escape; :func:`text` wraps the result in a :class:`rich.text.Text`, which rich never parses
for markup or emoji codes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def plain(value: object) -> str:
    """``str(value)`` with every non-printable character written as ``\\xNN``, ``\\uNNNN``
    or ``\\UNNNNNNNN`` (a space stays a space)."""
    s = value if isinstance(value, str) else str(value)
    if s.isprintable():
        return s
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in s)


def text(value: object, style: str = "") -> Text:
    """:func:`plain` as a rich ``Text``: a table cell or a line never read as markup."""
    from rich.text import Text  # only the CLI prints: a compile process never imports rich

    return Text(plain(value), style=style)
