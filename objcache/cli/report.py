"""``objcache report --job NAME``: one row per run of a job, across hosts, from the run
summaries in a store (docs/operations.md, "Fleet report").

It reads two listings (the job's run summaries and its run manifests, issued at once) and
then GETs every summary, 64 at a time. A run manifest without a summary is a run of an older
objcache and is listed as such. A summary that cannot be decoded or validated (corrupt,
unsigned, hostile) is skipped and counted by reason, never an error.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from objcache.backends.base import Backend
from objcache.cli.ops import Progress, bounded
from objcache.cli.plaintext import text
from objcache.entry.codec import Codec
from objcache.entry.layout import LAYOUT_VERSION, parse_object_key
from objcache.errors import EntryError
from objcache.integrations.torch import time_saved
from objcache.observe import run_summary as summary

#: A run whose lookups hit less often than this started cold.
COLD_BELOW = 0.5
#: Largest stored summary read (an entry around a summary of at most summary.MAX_BYTES).
READ_CAP = 2 * summary.MAX_BYTES
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """Seconds in ``90s``, ``30m``, ``24h``, ``7d``, ``2w`` (a bare number is seconds)."""
    match = _DURATION.fullmatch(text.strip().lower())
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30m, 24h, 7d)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


@dataclass
class Row:
    """One run: from its summary, or only its manifest's name (an older objcache)."""

    run: str
    started: float
    has_summary: bool = True
    host: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    duration_s: float | None = None
    kinds: dict[str, dict[str, int]] = field(default_factory=dict)
    bytes_in: int = 0
    bytes_out: int = 0
    lookup_s: float = 0.0
    misses: Counter[str] = field(default_factory=Counter)
    #: Compile time the run's hits saved, per kind, in torch's figures (empty: not recorded).
    time_saved_s: dict[str, float] = field(default_factory=dict)

    @property
    def saved_s(self) -> float:
        return time_saved.total_s(self.time_saved_s)

    @property
    def lookups(self) -> int:
        return sum(k["lookups"] for k in self.kinds.values())

    @property
    def hits(self) -> int:
        return sum(k["hits"] for k in self.kinds.values())

    @property
    def cold(self) -> bool:
        """Started cold: it looked entries up and fewer than half were found."""
        return self.lookups > 0 and self.hits < COLD_BELOW * self.lookups

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"run": self.run, "started": self.started}
        if not self.has_summary:
            return {**body, "summary": False}
        return {
            **body,
            "summary": True,
            "host": self.host,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "duration_s": self.duration_s,
            "lookups": self.lookups,
            "hits": self.hits,
            "hit_rate": round(self.hits / self.lookups, 4) if self.lookups else None,
            "cold": self.cold,
            "kinds": self.kinds,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "lookup_s": self.lookup_s,
            "time_saved_s": round(self.saved_s, 6),
            "time_saved_by_kind": dict(self.time_saved_s),
            "misses": dict(self.misses),
        }

    @classmethod
    def from_summary(cls, body: dict[str, Any]) -> Row:
        remote = [t for t in body["tiers"].values() if t["remote"]] or list(body["tiers"].values())
        misses: Counter[str] = Counter()
        for tier in remote:
            for outcomes in tier["kinds"].values():
                misses.update({o: n for o, n in outcomes.items() if o != "hit"})
        return cls(
            run=body["run"],
            started=body["started"],
            host=body["host"],
            rank=body["rank"],
            local_rank=body["local_rank"],
            duration_s=body["duration_s"],
            kinds=body["kinds"],
            bytes_in=body["bytes_in"],
            bytes_out=body["bytes_out"],
            lookup_s=body["lookup_s"],
            misses=misses,
            time_saved_s=dict(body.get("time_saved_s", {})),
        )


@dataclass
class Report:
    job: str
    env: str
    rows: list[Row] = field(default_factory=list)
    #: Summaries that were listed but could not be used, by reason.
    skipped: Counter[str] = field(default_factory=Counter)

    def total(self) -> dict[str, Any]:
        with_summary = [r for r in self.rows if r.has_summary]
        kinds: dict[str, dict[str, int]] = {}
        misses: Counter[str] = Counter()
        for row in with_summary:
            misses.update(row.misses)
            for kind, k in row.kinds.items():
                into = kinds.setdefault(kind, {"lookups": 0, "hits": 0})
                into["lookups"] += k["lookups"]
                into["hits"] += k["hits"]
        lookups = sum(k["lookups"] for k in kinds.values())
        hits = sum(k["hits"] for k in kinds.values())
        return {
            "runs": len(self.rows),
            "runs_with_summary": len(with_summary),
            "runs_without_summary": len(self.rows) - len(with_summary),
            "cold_runs": sum(r.cold for r in with_summary),
            "hosts": len({r.host for r in with_summary}),
            "lookups": lookups,
            "hits": hits,
            "hit_rate": round(hits / lookups, 4) if lookups else None,
            "kinds": kinds,
            "bytes_in": sum(r.bytes_in for r in with_summary),
            "bytes_out": sum(r.bytes_out for r in with_summary),
            "lookup_s": round(sum(r.lookup_s for r in with_summary), 6),
            "time_saved_s": round(sum(r.saved_s for r in with_summary), 6),
            "misses": dict(misses),
            "skipped": sum(self.skipped.values()),
            "skipped_reasons": dict(self.skipped),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "env": self.env,
            "runs": [r.as_dict() for r in self.rows],
            "total": self.total(),
        }


async def _run_ids(backend: Backend, env: str, kind: str, job: str, since: float) -> dict[str, str]:
    """Run id -> object key of the runs of ``job`` listed under ``kind`` that started at or
    after ``since`` (the start time is in the name: no GET for runs out of range)."""
    found: dict[str, str] = {}
    async for info in backend.list(f"{LAYOUT_VERSION}/{env}/{kind}/"):
        parsed = parse_object_key(info.key)
        if parsed is None or not parsed[2].startswith(f"{job}/"):
            continue
        run_id = parsed[2][len(job) + 1 :]
        started = summary.run_started(run_id)
        if started is not None and started >= since:
            found[run_id] = info.key
    return found


async def collect(
    backend: Backend,
    codec: Codec,
    *,
    env: str,
    job: str,
    since_s: float | None = None,
    progress: Progress | None = None,
    total: Progress | None = None,
) -> Report:
    """The report of ``job`` in ``env``: two LISTs at once, then one GET per summary."""
    since = time.time() - since_s if since_s is not None else 0.0
    ids, manifest_ids = await asyncio.gather(
        _run_ids(backend, env, summary.KIND, job, since),
        _run_ids(backend, env, "manifest", job, since),
    )
    if total is not None:
        total(len(ids))
    report = Report(job, env)

    async def read(run_id: str) -> Row | str:
        try:
            # a summary is small: never read a planted huge object whole (docs/security.md)
            data = await backend.get_capped(ids[run_id], READ_CAP)
        except Exception:
            return "unreadable"
        if data is None:
            return "gone"
        try:
            # decoded with the summary's own cap: a zstd frame claiming more is refused
            # before decompression (docs/security.md, "What the CLI prints")
            body = summary.parse(codec.decode(data, ids[run_id], summary.MAX_BYTES))
        except EntryError as exc:
            return exc.reason
        except summary.SummaryError:
            return "invalid"
        if body["job"] != job or body["run"] != run_id:
            return "misplaced"
        return Row.from_summary(body)

    for result in await bounded(sorted(ids), read, progress):
        if isinstance(result, Row):
            report.rows.append(result)
        else:
            report.skipped[result] += 1
    for run_id in manifest_ids.keys() - ids.keys():
        report.rows.append(Row(run_id, summary.run_started(run_id) or 0.0, has_summary=False))
    report.rows.sort(key=lambda r: (r.started, r.run))
    return report


# --- rendering -------------------------------------------------------------------------------


def _kinds(kinds: dict[str, dict[str, int]]) -> str:
    return (
        ", ".join(f"{kind} {k['hits']}/{k['lookups']}" for kind, k in sorted(kinds.items())) or "-"
    )


def _misses(misses: dict[str, int]) -> str:
    return ", ".join(f"{r}={n}" for r, n in sorted(misses.items())) or "-"


def render(report: Report, console: Console, size: Callable[[float], str]) -> None:
    """The report as a rich table, then the fleet total and what was skipped; ``size``
    formats byte counts (the CLI's).

    Hosts, kinds and reasons come from summaries anyone with write access to the store can
    put there: every cell and line carrying them is a :func:`~objcache.cli.plaintext.text`,
    never markup, control characters escaped (docs/security.md, "What the CLI prints")."""
    table = Table(
        "started (UTC)",
        "host",
        "rank",
        "hits/lookups per kind",
        "in",
        "out",
        "lookup s",
        "saved s",
        "misses by reason",
        "",
        title=text(f"job {report.job} · env {report.env}"),
    )
    for row in report.rows:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row.started))
        if not row.has_summary:
            table.add_row(started, "-", "-", "no summary (older objcache)", *["-"] * 5, "")
            continue
        rank = "-" if row.rank is None else str(row.rank)
        table.add_row(
            started,
            text(row.host or "-"),
            rank,
            text(_kinds(row.kinds)),
            size(row.bytes_in),
            size(row.bytes_out),
            f"{row.lookup_s:.3f}",
            f"{row.saved_s:.1f}" if row.time_saved_s else "-",
            text(_misses(row.misses)),
            "[bold red]COLD[/]" if row.cold else "",
        )
    console.print(table)
    t = report.total()
    rate = "-" if t["hit_rate"] is None else f"{100 * t['hit_rate']:.1f}%"
    console.print(
        text(
            f"fleet: {t['runs']} runs on {t['hosts']} hosts, {t['cold_runs']} cold; "
            f"hits {t['hits']}/{t['lookups']} ({rate}); {_kinds(t['kinds'])}; "
            f"in {size(t['bytes_in'])}, out {size(t['bytes_out'])}; "
            f"lookups {t['lookup_s']:.3f} s; compile time saved {t['time_saved_s']:.1f} s; "
            f"misses {_misses(t['misses'])}"
        ),
        soft_wrap=True,
    )
    console.print(
        text(
            f"{t['runs_without_summary']} runs without a summary (older objcache); "
            f"{t['skipped']} summaries skipped"
            + (f" ({_misses(t['skipped_reasons'])})" if t["skipped"] else "")
        ),
        soft_wrap=True,
    )
