"""``objcache report --job NAME``: one row per run of a job, across hosts and environments,
from the run summaries in a store (docs/operations.md, "Fleet report").

With ``--env``, it reads two listings (the job's run summaries and its run manifests in that
environment, issued at once); without, one listing of the whole store finds them in every
environment. Then it GETs every summary, 64 at a time.  Each row names its environment (id,
torch, CPU ISA, GPU from the summary), so a machine that ran another torch or another CPU
shows up as exactly that. A run manifest without a summary is a run of an older
objcache and is listed as such. A summary that cannot be decoded or validated (corrupt,
unsigned, hostile) is skipped and counted by reason, never an error.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from objcache.backends.base import Backend
from objcache.cli.ops import Newest, Progress, bounded
from objcache.entry.codec import Codec
from objcache.entry.layout import LAYOUT_VERSION, parse_object_key
from objcache.errors import EntryError
from objcache.integrations.torch.timing import time_saved
from objcache.observe import run_summary as summary
from objcache.observe.plaintext import text

#: A run whose lookups hit less often than this started cold.
COLD_BELOW = 0.5
#: Largest stored summary read (an entry around a summary of at most summary.MAX_BYTES).
READ_CAP = 2 * summary.MAX_BYTES
#: Newest runs read by default (``--runs``): at most this many summaries of READ_CAP each.
DEFAULT_RUNS = 200
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
    #: The environment id the run's objects are stored under.
    env: str = ""
    #: That environment's fingerprint fields as the summary records them (empty: not recorded).
    env_fields: dict[str, str] = field(default_factory=dict)
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
    #: Why the run's lookups missed, by count: the column "top miss cause". Filled from the
    #: summary's per-reason miss counts (``absent``, ``corrupt``, ...); a finer source, such
    #: as the key components that differ from the nearest written entry, sets it instead.
    miss_causes: Counter[str] | None = None
    #: The start the run belongs to (None: a summary without one): runs of one group on one
    #: host are one row (:func:`fold_groups`), ``runs`` their ids.
    group: str | None = None
    runs: list[str] = field(default_factory=list)
    #: Where the run's time went: phase -> (seconds, times); None: an older objcache's
    #: summary, without phase times (docs/architecture.md, "Phase times").
    phases: dict[str, tuple[float, int]] | None = None
    #: Lookups the local tier answered (a warm-local run answers most of them there).
    local_hits: int = 0
    #: torch's recompiles: (frame, reason, seconds), at most run_summary.MAX_RECOMPILES.
    recompiles: list[tuple[str, str, float]] = field(default_factory=list)
    #: The start-up prefetch's time line (None: no prefetch, or an older objcache's
    #: summary); a folded group keeps its first process's (docs/architecture.md,
    #: "Prefetch time line").
    prefetch: dict[str, Any] | None = None

    @property
    def causes(self) -> Counter[str]:
        return self.misses if self.miss_causes is None else self.miss_causes

    @property
    def top_miss_cause(self) -> tuple[str, int] | None:
        """The most frequent miss cause and its count (None: the run missed nothing)."""
        ranked = sorted(self.causes.items(), key=lambda kv: (-kv[1], kv[0]))
        return ranked[0] if ranked and ranked[0][1] else None

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
    def warm_local(self) -> bool:
        """Started warm on its own machine: its local tier answered at least half of its
        lookups and the remote tiers hardly any (a tenth at most), or it asked objcache
        nothing (torch's own local caches answered first); a new machine's lookups are
        answered by the remote tiers, or missed."""
        remote_hits = max(0, self.hits - self.local_hits)
        return self.local_hits >= COLD_BELOW * self.lookups and remote_hits <= self.lookups / 10

    @property
    def cold(self) -> bool:
        """Started cold: it looked entries up and fewer than half were found."""
        return self.lookups > 0 and self.hits < COLD_BELOW * self.lookups

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"run": self.run, "started": self.started, "env": self.env}
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
            "env_fields": dict(self.env_fields),
            "top_miss_cause": _cause(self.top_miss_cause),
            "processes": max(1, len(self.runs)),
        }

    @classmethod
    def from_summary(cls, body: dict[str, Any], env: str = "") -> Row:
        remote = [t for t in body["tiers"].values() if t["remote"]] or list(body["tiers"].values())
        misses: Counter[str] = Counter()
        for tier in remote:
            for outcomes in tier["kinds"].values():
                misses.update({o: n for o, n in outcomes.items() if o != "hit"})
        # reads of the run's lookups only (a lookup's candidates are several reads), and
        # never more than its lookups
        local_hits = sum(
            outcomes.get("hit", 0)
            for t in body["tiers"].values()
            if not t["remote"]
            for kind, outcomes in t["kinds"].items()
            if kind in body["kinds"]
        )
        local_hits = min(local_hits, sum(k["lookups"] for k in body["kinds"].values()))
        phases = body.get("phases") or None
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
            env=env,
            env_fields=dict(body.get("env", {})),
            group=body.get("group"),
            runs=[body["run"]],
            phases=None if phases is None else {k: (p["s"], p["n"]) for k, p in phases.items()},
            local_hits=local_hits,
            recompiles=[(r["frame"], r["reason"], r["s"]) for r in body.get("recompiles", [])],
            prefetch=body.get("prefetch"),
        )


def fold_groups(rows: list[Row]) -> list[Row]:
    """One row per start: the summaries of one run group on one host (a vLLM start's three
    processes, a job's local ranks) added up; rows without a group stay as they are."""
    folded: list[Row] = []
    by_group: dict[tuple[str, str | None, str], Row] = {}
    for row in rows:
        if row.group is None or not row.has_summary:
            folded.append(row)
            continue
        key = (row.env, row.host, row.group)
        first = by_group.get(key)
        if first is None:
            by_group[key] = row
            folded.append(row)
            continue
        for kind, k in row.kinds.items():
            mine = first.kinds.setdefault(kind, {"lookups": 0, "hits": 0})
            mine["lookups"] += k["lookups"]
            mine["hits"] += k["hits"]
        first.bytes_in += row.bytes_in
        first.bytes_out += row.bytes_out
        first.lookup_s += row.lookup_s
        first.misses.update(row.misses)
        first.local_hits += row.local_hits
        first.recompiles.extend(row.recompiles)
        if first.prefetch is None:
            first.prefetch = row.prefetch
        if row.phases is not None:
            mine_phases = first.phases if first.phases is not None else {}
            for name, (secs, n) in row.phases.items():
                had = mine_phases.get(name, (0.0, 0))
                mine_phases[name] = (had[0] + secs, had[1] + n)
            first.phases = mine_phases
        for kind, s in row.time_saved_s.items():
            first.time_saved_s[kind] = first.time_saved_s.get(kind, 0.0) + s
        end = max(first.started + (first.duration_s or 0), row.started + (row.duration_s or 0))
        first.started = min(first.started, row.started)
        first.duration_s = round(end - first.started, 3)
        first.runs.extend(row.runs)
    return folded


def _cause(top: tuple[str, int] | None) -> dict[str, Any] | None:
    return None if top is None else {"cause": top[0], "misses": top[1]}


@dataclass
class Report:
    job: str
    #: The environment asked for (None: every environment of the job).
    env: str | None
    rows: list[Row] = field(default_factory=list)
    #: Summaries that were listed but could not be used, by reason.
    skipped: Counter[str] = field(default_factory=Counter)
    #: Runs listed but not read, by reason (older than --since, over the newest N).
    not_read: Counter[str] = field(default_factory=Counter)

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
            "not_read": dict(self.not_read),
        }

    def environments(self) -> dict[str, dict[str, Any]]:
        """env id -> its fields (from its runs' summaries), runs, hosts, hits, lookups and
        top miss cause: one line per environment the job ran in."""
        envs: dict[str, dict[str, Any]] = {}
        causes: dict[str, Counter[str]] = {}
        for row in self.rows:
            env = envs.setdefault(
                row.env, {"fields": {}, "runs": 0, "hosts": set(), "hits": 0, "lookups": 0}
            )
            env["runs"] += 1
            if not row.has_summary:
                continue
            env["fields"] = env["fields"] or dict(row.env_fields)
            env["hosts"].add(row.host)
            env["hits"] += row.hits
            env["lookups"] += row.lookups
            causes.setdefault(row.env, Counter()).update(row.causes)
        for env_id, env in envs.items():
            env["hosts"] = len(env["hosts"])
            ranked = sorted(causes.get(env_id, Counter()).items(), key=lambda kv: (-kv[1], kv[0]))
            env["top_miss_cause"] = _cause(ranked[0] if ranked and ranked[0][1] else None)
        return envs

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "env": self.env,
            "envs": self.environments(),
            "runs": [r.as_dict() for r in self.rows],
            "total": self.total(),
        }


#: A run: (environment id, run id).
RunKey = tuple[str, str]


async def _run_ids(
    backend: Backend,
    prefix: str,
    kinds: tuple[str, ...],
    job: str,
    since: float,
    newest: int,
    not_read: Counter[str],
) -> dict[str, dict[RunKey, str]]:
    """Per kind of ``kinds``: (env, run id) -> object key of the newest ``newest`` runs of
    ``job`` listed under ``prefix`` that started at or after ``since`` (the start time is in
    the name: no GET for runs out of range; memory of ``newest`` runs whatever is listed)."""
    keep = {kind: Newest(newest) for kind in kinds}
    async for info in backend.list(prefix):
        parsed = parse_object_key(info.key)
        if parsed is None or parsed[1] not in keep or not parsed[2].startswith(f"{job}/"):
            continue
        run_id = parsed[2][len(job) + 1 :]
        started = summary.run_started(run_id)
        if started is None or started < since:
            if parsed[1] == summary.KIND and started is not None:
                not_read["older than --since"] += 1
            continue
        keep[parsed[1]].offer(started, f"{run_id}/{parsed[0]}", (parsed[0], run_id, info.key))
    if keep.get(summary.KIND) is not None and keep[summary.KIND].left_out:
        not_read[f"over the newest {newest}"] += keep[summary.KIND].left_out
    return {
        kind: {(e, r): okey for _, _, (e, r, okey) in k.newest_first()} for kind, k in keep.items()
    }


async def collect(
    backend: Backend,
    codec: Codec,
    *,
    env: str | None = None,
    job: str,
    since_s: float | None = None,
    newest: int = DEFAULT_RUNS,
    progress: Progress | None = None,
    total: Progress | None = None,
) -> Report:
    """The report of ``job`` in ``env``, or in every environment when ``env`` is None:
    two LISTs at once (one of the whole store without ``env``), then one GET per summary."""
    since = time.time() - since_s if since_s is not None else 0.0
    report = Report(job, env)
    listed = (since, newest, report.not_read)
    if env is None:
        both = await _run_ids(
            backend, f"{LAYOUT_VERSION}/", (summary.KIND, "manifest"), job, *listed
        )
        ids, manifest_ids = both[summary.KIND], both["manifest"]
    else:
        runs, manifests = await asyncio.gather(
            _run_ids(backend, f"{LAYOUT_VERSION}/{env}/run/", (summary.KIND,), job, *listed),
            _run_ids(backend, f"{LAYOUT_VERSION}/{env}/manifest/", ("manifest",), job, *listed),
        )
        ids, manifest_ids = runs[summary.KIND], manifests["manifest"]
    if total is not None:
        total(len(ids))

    async def read(run: RunKey) -> Row | str:
        run_env, run_id = run
        try:
            # a summary is small: never read a planted huge object whole (docs/security.md)
            data = await backend.get_capped(ids[run], READ_CAP)
        except Exception:
            return "unreadable"
        if data is None:
            return "gone"
        try:
            # decoded with the summary's own cap: a zstd frame claiming more is refused
            # before decompression (docs/security.md, "What the CLI prints")
            body = summary.parse(codec.decode(data, ids[run], summary.MAX_BYTES))
        except EntryError as exc:
            return exc.reason
        except summary.SummaryError:
            return "invalid"
        if body["job"] != job or body["run"] != run_id:
            return "misplaced"
        return Row.from_summary(body, run_env)

    for result in await bounded(sorted(ids), read, progress):
        if isinstance(result, Row):
            report.rows.append(result)
        else:
            report.skipped[result] += 1
    # with summaries over the newest N, a manifest older than the oldest read is not a run
    # "without a summary": its summary may be among those not read
    oldest = min((summary.run_started(r) or 0.0 for _, r in ids), default=0.0)
    for run_env, run_id in manifest_ids.keys() - ids.keys():
        started = summary.run_started(run_id) or 0.0
        if report.not_read and started < oldest:
            continue
        report.rows.append(Row(run_id, started, has_summary=False, env=run_env))
    report.rows.sort(key=lambda r: (r.started, r.run, r.env))
    report.rows = fold_groups(report.rows)
    return report


def explain_causes(report: Report, causes: Mapping[str, Counter[str]]) -> None:
    """Feed the column "top miss cause" from key cards: ``causes`` maps a run id to its
    missed lookups counted by cause (``objcache explain``: the key components that differ
    from the nearest written card, or "first compile of this graph in the store"). Runs
    without explained misses keep their summary's per-reason counts."""
    for row in report.rows:
        found: Counter[str] = Counter()
        for run in row.runs or [row.run]:
            found.update(causes.get(run, {}))
        if found:
            row.miss_causes = found


# --- rendering -------------------------------------------------------------------------------


def _kinds(kinds: dict[str, dict[str, int]]) -> str:
    return (
        ", ".join(f"{kind} {k['hits']}/{k['lookups']}" for kind, k in sorted(kinds.items())) or "-"
    )


def _misses(misses: dict[str, int]) -> str:
    return ", ".join(f"{r}={n}" for r, n in sorted(misses.items())) or "-"


def _env(env: str, fields: dict[str, str], full: bool = False) -> str:
    """An environment as a person tells them apart: id, torch, CPU ISA (and GPU)."""
    torch, isa = fields.get("torch", "?"), fields.get("cpu_isa", "?")
    if not full:
        return f"{env[:8] or '?'} torch {torch} {isa}"
    return f"env {env or '?'}: torch {torch}, cpu_isa {isa}, gpu {fields.get('gpu', '?')}"


def _top(top: tuple[str, int] | dict[str, Any] | None) -> str:
    if top is None:
        return "-"
    cause, n = (top["cause"], top["misses"]) if isinstance(top, dict) else top
    return f"{cause} ({n})"


def render(report: Report, console: Console, size: Callable[[float], str]) -> None:
    """The report as a rich table, then the fleet total and what was skipped; ``size``
    formats byte counts (the CLI's).

    Hosts, kinds and reasons come from summaries anyone with write access to the store can
    put there: every cell and line carrying them is a :func:`~objcache.observe.plaintext.text`,
    never markup, control characters escaped (docs/security.md, "What the CLI prints")."""
    table = Table(
        "started (UTC)",
        "host",
        "env (torch, ISA)",
        "rank",
        "hits/lookups per kind",
        "in",
        "out",
        "lookup s",
        "saved s",
        "misses by reason",
        "top miss cause",
        "",
        title=text(
            f"job {report.job} · "
            + (f"env {report.env}" if report.env else "every environment (--env to narrow)")
        ),
    )
    for row in report.rows:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row.started))
        if not row.has_summary:
            env = text(_env(row.env, {}))
            table.add_row(started, "-", env, "-", "no summary (older objcache)", *["-"] * 6, "")
            continue
        rank = "-" if row.rank is None else str(row.rank)
        host = row.host or "-"
        if len(row.runs) > 1:
            host += f" ({len(row.runs)} processes)"
        table.add_row(
            started,
            text(host),
            text(_env(row.env, row.env_fields)),
            rank,
            text(_kinds(row.kinds)),
            size(row.bytes_in),
            size(row.bytes_out),
            f"{row.lookup_s:.3f}",
            f"{row.saved_s:.1f}" if row.time_saved_s else "-",
            text(_misses(row.misses)),
            text(_top(row.top_miss_cause)),
            "[bold red]COLD[/]" if row.cold else "",
        )
    console.print(table)
    for env_id, e in sorted(report.environments().items()):
        rate = f"{e['hits']}/{e['lookups']}"
        console.print(
            text(
                f"{_env(env_id, e['fields'], full=True)}: {e['runs']} runs on "
                f"{e['hosts']} hosts, hits {rate}; top miss cause {_top(e['top_miss_cause'])}"
            ),
            soft_wrap=True,
        )
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
            + (f"; runs not read: {_misses(t['not_read'])}" if t["not_read"] else "")
        ),
        soft_wrap=True,
    )
