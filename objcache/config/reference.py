"""The configuration reference (``docs/configuration.md``), generated from
:class:`~objcache.config.settings.Config`'s fields, the size and key rules, and each backend's
table of tier URL options (``make docs``; ``objcache/cli/docgen.py`` prints it)."""

from __future__ import annotations

import dataclasses

from objcache.config import registry
from objcache.config.settings import Config


def reference_markdown() -> str:
    """The configuration reference, generated from :class:`Config`'s fields."""
    rows = ["| Variable | Python field | Default | Meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(Config):
        if f.default is not dataclasses.MISSING:
            default = repr(f.default) if f.default not in ((), None) else "unset"
        else:
            default = "`~/.cache/objcache/local`"
        if f.name == "local_max_bytes":
            default = "10 GiB"
        elif f.name == "write_behind_max_bytes":
            default = "256 MiB"
        elif f.name == "max_entry_bytes":
            default = _caps_default()
        default = default if default.startswith("`") or default == "unset" else f"`{default}`"
        rows.append(f"| `{f.metadata['env']}` | `{f.name}` | {default} | {f.metadata['help']} |")
    head = (
        "# Configuration reference\n\n"
        "Generated from `objcache.Config` by `make docs`; do not edit by hand.\n"
        "Every variable has a Python keyword of the same meaning: "
        "`objcache.Config(tiers='s3://bucket/p', read_only=True)` or "
        "`objcache.Config.from_env(read_only=True)`.\n\n"
    )
    return head + "\n".join(rows) + "\n\n" + _sizes_and_keys_markdown() + _tier_options_markdown()


def _size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def _caps_default() -> str:
    """The default size caps, grouped by size, from :mod:`objcache.entry.caps`."""
    from objcache.entry import caps

    by_size: dict[int, list[str]] = {}
    for kind, cap in caps.DEFAULT_PER_KIND.items():
        by_size.setdefault(cap, []).append(kind)
    large = ", ".join(f"`{k}`" for k in sorted(caps.LARGE_KINDS))
    parts = [f"`{_size_text(caps.DEFAULT_CAP)}` ({large} and a client's own kinds)"]
    for cap in sorted(by_size, reverse=True):
        kinds = ", ".join(f"`{k}`" for k in sorted(by_size[cap]))
        parts.append(f"{kinds}: `{_size_text(cap)}`")
    return "; ".join(parts)


def _sizes_and_keys_markdown() -> str:
    """How sizes are written, and the key limits (from :mod:`objcache.entry.layout`)."""
    from objcache.entry import layout

    return (
        "## Sizes\n\n"
        "Every size (`OBJCACHE_LOCAL_MAX_BYTES`, `OBJCACHE_WRITE_BEHIND_MAX_BYTES`, "
        "`OBJCACHE_MAX_ENTRY_BYTES`, `?max_bytes=`), as a variable, a keyword string "
        "(`Config(local_max_bytes='10G')`) or a tier URL option, is a byte count with an "
        "optional binary suffix, any case, `B`/`iB` allowed: `10G` = `10GiB` = "
        f"{10 << 30}, `512M`, `64k`, `1T`, or plain bytes.\n\n"
        "## Keys\n\n"
        "Any string is a key, of any length. A key is stored as one path segment, "
        f"percent-encoded; when that would pass {layout.MAX_PLAIN_SEGMENT} bytes it is stored "
        f"under a bounded name: its first {layout.MAPPED_HEAD} encoded bytes, "
        f"`{layout.MAPPED_MARK}`, and the BLAKE2b-256 of the whole key (docs/architecture.md, "
        '"Long keys"). So object keys stay far inside every backend\'s limits:\n\n'
        "| Backend | Name limit |\n|---|---|\n"
        "| disk, `file://` | 255-byte path component, `PATH_MAX` 4,096 bytes |\n"
        "| `s3://` | 1,024-byte object name, the URL's prefix included |\n"
        "| `gs://` | 1,024-byte object name, the URL's prefix included |\n"
        "| `redis://` | 512 MB key (objcache keeps it bounded all the same) |\n\n"
        f"A backend refuses an object key over {layout.MAX_KEY_BYTES} bytes or with an empty, "
        "`.` or "
        "`..` segment; a name a store refuses is an `invalid_key` miss that never counts "
        "against the tier's breaker.\n\n"
    )


def _tier_options_markdown() -> str:
    """The query options of tier URLs, from each backend's table (found by
    :mod:`objcache.config.registry`)."""
    from objcache.config import options

    by_table: dict[int, list[str]] = {}
    for name, entry in registry.schemes().items():
        if entry.options is not None and name != "disk":  # disk:// is the local tier
            by_table.setdefault(id(entry.options), []).append(name)
    parts = [
        "## Tier URL options\n\n"
        "Query options of a tier URL in `OBJCACHE_TIERS`, e.g. "
        "`s3://bucket/prefix?region=us-east-1&read_only=1`. An unknown option is a "
        "configuration error naming it.\n\n### Every tier\n\n"
        + options.markdown(options.TIER_OPTIONS)
    ]
    for names in by_table.values():
        table = registry.schemes()[names[0]].options
        assert table is not None
        schemes = ", ".join(f"`{n}://`" for n in names)
        parts.append(f"### {schemes}\n\n" + options.markdown(table))
    return "\n\n".join(parts) + "\n"
