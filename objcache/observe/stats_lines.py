"""The lines `objcache stats` starts with: whose stats, and did the run start warm?

Pure functions of a stats file's content (see :meth:`objcache.core.tiered.TieredCache.stats_dict`
and ``objcache.client``, which stamps it), so they are tested without a process.
"""

from __future__ import annotations

import time
from typing import Any


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{max(seconds, 0):.0f} s"


def stamp_line(data: dict[str, Any], now: float | None = None) -> str:
    """``stats of job J on host H (pid P), written <UTC time> (<age> ago), environment E``
    (``N processes of one start: pids ...`` where several processes merged theirs)."""
    parts = ["stats"]
    if data.get("job"):
        parts.append(f"of job {data['job']}")
    if data.get("host"):
        parts.append(f"on {data['host']}")
    processes = data.get("processes")
    if isinstance(processes, list) and len(processes) > 1:
        pids = ", ".join(str(p.get("pid")) for p in processes[:8] if isinstance(p, dict))
        more = f" and {len(processes) - 8} more" if len(processes) > 8 else ""
        parts.append(f"({len(processes)} processes of one start: pids {pids}{more})")
    elif data.get("pid"):
        parts.append(f"(pid {data['pid']})")
    written = data.get("written_at")
    if isinstance(written, (int, float)):
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(written))
        ago = _age((time.time() if now is None else now) - written)
        parts.append(f"written {when} ({ago} ago)")
    line = " ".join(parts)
    return f"{line}, environment {data.get('env', '?')}"


def _served(counts: dict[str, int], local: str | None) -> str:
    named = sorted(counts.items(), key=lambda kv: (kv[0] != local, -kv[1], kv[0]))
    return ", ".join(f"{'locally' if name == local else name} {n}" for name, n in named if n)


def summary_lines(data: dict[str, Any]) -> list[str]:
    """Lookups and hit rate, who served them, prefetch apart, writes not made."""
    cache = data.get("cache", {})
    tiers = data.get("tiers", [])
    local = next((t["name"] for t in tiers if t.get("local")), None)
    lookups = sum(cache.get("gets", {}).values())
    hits = sum(cache.get("hits", {}).values())
    rate = f"{100 * hits / lookups:.1f}%" if lookups else "-"
    served = _served(cache.get("lookups_served_by", {}), local)
    lines = [
        f"lookups {lookups}, hits {hits} ({rate})"
        + (f": served {served}" if served else "")
        + f", misses {lookups - hits}"
    ]
    prefetched = cache.get("prefetch_fetched", {})
    if prefetched:
        fetched = sum(prefetched.values())
        lines.append(f"prefetch fetched {fetched} (not lookups): {_served(prefetched, local)}")
    skipped = sum(t.get("put_errors", {}).get("breaker", 0) for t in tiers)
    lines.append(
        f"write-through {cache.get('write_through', 0)}, back-fills {cache.get('backfills', 0)}, "
        f"write-behind dropped {cache.get('write_behind_dropped', 0)}, "
        f"puts skipped by an open breaker {skipped}"
    )
    return lines


def latency_cell(latency: dict[str, Any]) -> str:
    """``≤p50/≤p99`` of a latency histogram, ``-`` when nothing was measured."""
    p50, p99 = latency.get("p50_ms_le"), latency.get("p99_ms_le")
    if p50 is None or p99 is None:
        return "-"
    return f"≤{p50:g}/≤{p99:g}"
