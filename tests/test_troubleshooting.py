"""docs/troubleshooting.md quotes only messages the code can print.

Every backtick-quoted message in the first column of its message tables is split at its
placeholders (``...``, quoted values, numbers, paths, ``OBJCACHE_TIERS[i]``); each literal
fragment left must occur in objcache's source. Texts that come from a server or a library
(S3 error codes, Redis replies, OS errors) are listed below with where they come from.
"""

from __future__ import annotations

import re

from tests.support.paths import ROOT

DOC = ROOT / "docs" / "troubleshooting.md"

#: quoted text -> who prints it, when not objcache's own source
FOREIGN = {
    "AccessDenied": "S3 error code",
    "403": "HTTP status",
    "InvalidAccessKeyId": "S3 error code",
    "SignatureDoesNotMatch": "S3 error code",
    "BadDigest": "S3 error code",
    "InvalidArgument": "S3 error code",
    "x-amz-checksum-crc32": "S3 header",
    "Could not connect to the endpoint URL": "botocore's EndpointConnectionError",
    "Cannot connect to host": "aiohttp's ClientConnectorError",
    "Connection refused": "OS error text",
    "Name or service not known": "resolver error text",
    "SlowDown": "S3 error code",
    "503": "HTTP status",
    "429": "HTTP status",
    "OOM command not allowed": "Redis reply",
    "Timeout connecting to server": "redis-py's TimeoutError",
    "WRONGPASS": "Redis reply",
    "NOAUTH": "Redis reply",
    "NOPERM": "Redis reply",
    "zstd: ...": "zstandard's error, prefixed by the codec",
}
#: fragments inside objcache's messages that a library writes
FOREIGN_FRAGMENTS = {
    "Port could not be cast": "urllib.parse",
    "invalid literal for int": "int()",
    "No such file or directory": "the OS (strerror)",
}
#: what varies in a message: elided text, quoted values, numbers, paths and URLs, variable,
#: option and operation names, a package in parentheses
PLACEHOLDER = re.compile(
    r"\.\.\.|'[^']*'|\w+://\S*|OBJCACHE_\w+(?:\[\w\])?|\b[a-z]+_[a-z_]+\b"
    r"|\b(?:get|put|list|push|gc|[NiM])\b|\(\w+\)|[~/][\w./-]+|\d+(?:\.\d+)?"
)
SECTIONS = ("## Configuration errors", "## Tier errors", "## Refused entries", "## Keys")


def source_text() -> str:
    """objcache's source with implicitly concatenated string literals joined."""
    files = {p.resolve() for p in (ROOT / "objcache").rglob("*.py")}
    files |= {p.resolve() for p in (ROOT / "backends").rglob("*.py")}
    text = "\n".join(p.read_text() for p in sorted(files))
    return re.sub(r"\"\s*\n\s*f?\"", "", text)


def quoted_messages() -> list[str]:
    quotes: list[str] = []
    section = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = line
        if not section.startswith(SECTIONS) or not line.startswith("| `"):
            continue
        first_cell = line.split(" | ")[0]
        quotes += re.findall(r"`([^`]+)`", first_cell)
    return quotes


def test_every_quoted_message_is_printed_by_the_code() -> None:
    quotes = quoted_messages()
    assert len(quotes) > 40, quotes
    code = source_text()
    missing = []
    for quote in quotes:
        if quote in FOREIGN:
            continue
        fragments = [f.strip(" :;,()") for f in PLACEHOLDER.split(quote)]
        for fragment in fragments:
            if len(fragment) >= 8 and fragment not in code and fragment not in FOREIGN_FRAGMENTS:
                missing.append(f"{quote!r}: {fragment!r}")
    assert not missing, "quoted in docs/troubleshooting.md, printed nowhere:\n" + "\n".join(missing)
