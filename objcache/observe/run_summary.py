"""Run summaries: what one process of a job saw, written once at exit for ``objcache report``.

A summary is its own small object per run, ``v1/<env>/run/<shard>/<job>/<run id>``, written
through the write-behind queue to the remote tiers only (never the local tier), in CREATE
mode, at exit. The run id (``run-<epoch>-<pid>-<random>``) is also the name of the run's
prefetch manifest when it writes one, so ``objcache report`` can tell a run from an older
objcache (a manifest without a summary). Why a separate object and not a field of the run
manifest: a warm run writes no manifest, and compaction deletes run manifests
(docs/architecture.md, "Run summaries").

Parsing is strict and bounded: a summary read back is hostile input (anyone with write access
to the bucket can put bytes there), so anything unexpected is a :class:`SummaryError`.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from objcache.observe import prefetch_timeline as timeline

KIND = "run"
FORMAT = 1
#: Largest summary accepted (bytes of JSON); a real one is a few KiB.
MAX_BYTES = 256 << 10
#: Largest count or byte total accepted in a summary (a petabyte).
MAX_COUNT = 10**15
#: Most entries accepted in any mapping of a summary (kinds, tiers, reasons).
MAX_ENTRIES = 64
#: Longest string accepted (host, job, tier, kind, reason).
MAX_STR = 512
#: The name of a run: also its prefetch manifest's (``<job>/<run id>``).
RUN_ID = re.compile(r"run-(\d{1,12})-(\d{1,10})-([0-9a-f]{1,32})")


class SummaryError(ValueError):
    """Bytes that are not a valid run summary."""


def new_run_id(started: float | None = None) -> str:
    started = time.time() if started is None else started
    return f"run-{int(started)}-{os.getpid()}-{secrets.token_hex(4)}"


def run_started(run_id: str) -> float | None:
    """The start time (epoch seconds) a run id carries, or None if it is not one."""
    match = RUN_ID.fullmatch(run_id)
    return float(match.group(1)) if match else None


def ranks(environ: Mapping[str, str] | None = None) -> tuple[int | None, int | None]:
    """``(RANK, LOCAL_RANK)`` as torchrun sets them; None when unset or not a number."""
    environ = os.environ if environ is None else environ

    def read(name: str) -> int | None:
        raw = environ.get(name, "").strip()
        return int(raw) if raw.isdigit() else None

    return read("RANK"), read("LOCAL_RANK")


def build(
    stats: dict[str, Any],
    *,
    job: str,
    run: str,
    started: float,
    ended: float,
    environ: Mapping[str, str] | None = None,
    host: str | None = None,
    time_saved: Mapping[str, float] | None = None,
    env: Mapping[str, str] | None = None,
    miss_cards: Mapping[str, int] | None = None,
    group: str | None = None,
    phases: Mapping[str, tuple[float, int]] | None = None,
    recompiles: list[tuple[str, str, float]] | None = None,
    prefetch: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary of one run from its ``TieredCache.stats_dict()``; ``time_saved`` is the
    compile time its hits saved per kind, in torch's figures
    (:mod:`objcache.integrations.torch.timing.time_saved`); ``env`` the environment's fingerprint
    fields (torch, cpu_isa, gpu, ...), so a store holding only summaries of an environment
    still describes it (``objcache ls --envs``, ``objcache report``); ``prefetch`` the
    start-up prefetch's time line (:mod:`objcache.observe.prefetch_timeline`), when one ran."""
    cache = stats.get("cache", {})
    rank, local_rank = ranks(environ)
    kinds = {
        kind: {"lookups": int(n), "hits": int(cache.get("hits", {}).get(kind, 0))}
        for kind, n in cache.get("gets", {}).items()
    }
    tiers: dict[str, Any] = {}
    bytes_in = bytes_out = 0
    for t in stats.get("tiers", []):
        remote = not t.get("local", False)
        tiers[t["name"]] = {
            "remote": remote,
            "kinds": {k: dict(v) for k, v in t.get("kinds", {}).items()},
            "bytes_in": int(t.get("bytes_read", 0)),
            "bytes_out": int(t.get("bytes_written", 0)),
        }
        if remote:
            bytes_in += int(t.get("bytes_read", 0))
            bytes_out += int(t.get("bytes_written", 0))
    return {
        "format": FORMAT,
        "job": job,
        "run": run,
        "host": host or socket.gethostname(),
        "rank": rank,
        "local_rank": local_rank,
        "started": round(started, 3),
        "duration_s": round(max(0.0, ended - started), 3),
        "kinds": kinds,
        "tiers": tiers,
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "lookup_s": round(float(cache.get("lookup_ms_total", 0.0)) / 1000, 6),
        "write_behind_dropped": int(cache.get("write_behind_dropped", 0)),
        "time_saved_s": {k: round(float(v), 6) for k, v in (time_saved or {}).items()},
        "env": {str(k): str(v) for k, v in (env or {}).items()},
        # the run's key cards of lookups that missed everywhere, stored beside the summary
        # (docs/architecture.md, "Key cards"): how many, and how many over the cap
        "miss_cards": {k: int(v) for k, v in (miss_cards or {}).items()},
        # the start this process belongs to (objcache/observe/process_stats.py): a vLLM
        # start's three processes are one row of `objcache report`
        "group": group,
        # where the run's time went (docs/architecture.md, "Phase times"): torch's phases
        # and objcache's own waits, name -> seconds and times
        "phases": {
            name: {"s": round(float(s), 6), "n": int(n)}
            for name, (s, n) in {**objcache_phases(stats), **(phases or {})}.items()
        },
        # torch's recompiles, each with the guard that failed (redacted)
        "recompiles": [
            {"frame": frame[:MAX_STR], "reason": reason[:MAX_STR], "s": round(float(s), 6)}
            for frame, reason, s in (recompiles or [])[:MAX_RECOMPILES]
        ],
        # the prefetch's own time line (docs/architecture.md, "Prefetch time line")
        "prefetch": None if prefetch is None else dict(prefetch),
    }


def objcache_phases(stats: dict[str, Any]) -> dict[str, tuple[float, int]]:
    """objcache's own share of a start: the time lookups waited (as the caller saw it), each
    tier's GETs, node-lease waits and the prefetch, from ``TieredCache.stats_dict()``."""
    cache = stats.get("cache", {})
    out: dict[str, tuple[float, int]] = {}
    lookups = int(cache.get("lookup", {}).get("count") or 0)
    if lookups:
        out["objcache:lookup wait"] = (float(cache.get("lookup_ms_total", 0.0)) / 1000, lookups)
    for t in stats.get("tiers", []):
        latency = t.get("get_latency", {})
        count, mean = int(latency.get("count") or 0), latency.get("mean_ms")
        if count and mean is not None:
            where = "local" if t.get("local") else "remote"
            out[f"objcache:get {where} {t['name']}"[:MAX_STR]] = (count * float(mean) / 1000, count)
    for phase, (ms, n) in cache.get("phase_ms", {}).items():
        out[f"objcache:{phase}"] = (float(ms) / 1000, int(n))
    return out


def encode(summary: dict[str, Any]) -> bytes:
    return json.dumps(summary, separators=(",", ":"), sort_keys=True).encode()


# --- strict parsing ------------------------------------------------------------------------


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_STR:
        raise SummaryError(f"{what}: not a short string")
    return value


def _count(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
        raise SummaryError(f"{what}: not a count")
    return value


def _seconds(value: Any, what: str) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not 0 <= value <= 1e11:
        raise SummaryError(f"{what}: not a time in seconds")
    return float(value)


def _field(value: Any, what: str) -> str:
    """An environment field's value: a short string, possibly empty."""
    if not isinstance(value, str) or len(value) > MAX_STR:
        raise SummaryError(f"{what}: not a short string")
    return value


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict) or len(value) > MAX_ENTRIES:
        raise SummaryError(f"{what}: not a mapping of at most {MAX_ENTRIES} entries")
    for key in value:
        _str(key, f"{what} key")
    return value


#: Most phases accepted in a summary (torch's, objcache's and one per tier).
MAX_PHASES = 128


def _phases(value: Any) -> dict[str, dict[str, float | int]]:
    if not isinstance(value, dict) or len(value) > MAX_PHASES:
        raise SummaryError(f"phases: not a mapping of at most {MAX_PHASES} entries")
    out: dict[str, dict[str, float | int]] = {}
    for name, p in value.items():
        _str(name, "phase name")
        if not isinstance(p, dict):
            raise SummaryError(f"phases.{name}: not a mapping")
        out[name] = {"s": _seconds(p.get("s"), f"phases.{name}.s"), "n": _count(p.get("n"), "n")}
    return out


#: Most recompiles accepted in a summary.
MAX_RECOMPILES = 16


def _recompiles(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or len(value) > MAX_RECOMPILES:
        raise SummaryError(f"recompiles: not a list of at most {MAX_RECOMPILES}")
    out = []
    for i, r in enumerate(value):
        if not isinstance(r, dict):
            raise SummaryError(f"recompiles[{i}]: not a mapping")
        out.append(
            {
                "frame": _str(r.get("frame"), f"recompiles[{i}].frame"),
                "reason": _str(r.get("reason"), f"recompiles[{i}].reason"),
                "s": _seconds(r.get("s"), f"recompiles[{i}].s"),
            }
        )
    return out


_PREFETCH_COUNTS = (
    "manifests", "keys", "already_local", "requested", "fetched", "bytes", "not_found",
    "elsewhere", "entries_left_out", "errors",
)  # fmt: skip
_PREFETCH_TIMES = ("started_s", "manifest_s", "ended_s", "first_lookup_s", "last_arrival_s")


def _maybe_seconds(value: Any, what: str) -> float | None:
    return None if value is None else _seconds(value, what)


#: A prefetch entry's and a wait's fields, each with its parser.
_ENTRY: dict[str, Callable[[Any, str], Any]] = {
    "kind": _str, "key": _field, "requested_s": _seconds, "arrived_s": _maybe_seconds,
    "bytes": _count, "tier": _field,
}  # fmt: skip
_WAIT: dict[str, Callable[[Any, str], Any]] = {
    "kind": _str, "key": _field, "s": _seconds, "at_s": _seconds, "tier": _field,
}  # fmt: skip


def _records(
    value: Any, cap: int, fields: dict[str, Callable[[Any, str], Any]], what: str
) -> list[dict[str, Any]]:
    """A list of at most ``cap`` mappings of the prefetch, each field parsed by its own."""
    if not isinstance(value, list) or len(value) > cap:
        raise SummaryError(f"prefetch.{what}: not a list of at most {cap}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise SummaryError(f"prefetch.{what}[{i}]: not a mapping")
        where = f"prefetch.{what}[{i}]"
        out.append(
            {name: parse(item.get(name), f"{where}.{name}") for name, parse in fields.items()}
        )
    return out


def _prefetch(value: Any) -> dict[str, Any] | None:
    """The prefetch's time line (objcache/observe/prefetch_timeline.py), parsed strictly."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise SummaryError("prefetch: not a mapping")
    since = value.get("since")
    if since not in ("process start", "prefetch start"):
        raise SummaryError("prefetch.since: not a known origin")
    out: dict[str, Any] = {"since": since}
    for name in _PREFETCH_TIMES:
        out[name] = _maybe_seconds(value.get(name), f"prefetch.{name}")
    if out["started_s"] is None:
        raise SummaryError("prefetch.started_s: missing")
    for name in _PREFETCH_COUNTS:
        out[name] = _count(value.get(name, 0), f"prefetch.{name}")
    by_tier: dict[str, dict[str, int]] = {}
    for tier, t in _mapping(value.get("by_tier", {}), "prefetch.by_tier").items():
        t = _mapping(t, f"prefetch.by_tier.{tier}")
        by_tier[tier] = {"n": _count(t.get("n"), "n"), "bytes": _count(t.get("bytes"), "bytes")}
    out["by_tier"] = by_tier
    out["entries"] = _records(value.get("entries", []), timeline.MAX_ENTRIES, _ENTRY, "entries")
    lookups = _mapping(value.get("lookups", {}), "prefetch.lookups")
    out["lookups"] = {
        o: _count(lookups.get(o, 0), f"prefetch.lookups.{o}") for o in timeline.OUTCOMES
    }
    out["wait_s"] = _seconds(value.get("wait_s", 0.0), "prefetch.wait_s")
    out["missed_reasons"] = {
        reason: _count(n, "prefetch.missed_reasons")
        for reason, n in _mapping(value.get("missed_reasons", {}), "missed_reasons").items()
    }
    out["waits"] = _records(value.get("waits", []), timeline.MAX_WAITS, _WAIT, "waits")
    return out


def _rank(value: Any, what: str) -> int | None:
    return None if value is None else _count(value, what)


def parse(data: bytes) -> dict[str, Any]:
    """A validated summary (the shape :func:`build` makes), or :class:`SummaryError`."""
    if len(data) > MAX_BYTES:
        raise SummaryError(f"{len(data)} bytes, more than {MAX_BYTES}")
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise SummaryError("not JSON") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise SummaryError(f"not a run summary of format {FORMAT}")
    kinds: dict[str, dict[str, int]] = {}
    for kind, k in _mapping(body.get("kinds"), "kinds").items():
        k = _mapping(k, f"kinds.{kind}")
        lookups, hits = _count(k.get("lookups"), "lookups"), _count(k.get("hits"), "hits")
        if hits > lookups:
            raise SummaryError(f"kinds.{kind}: more hits than lookups")
        kinds[kind] = {"lookups": lookups, "hits": hits}
    tiers: dict[str, dict[str, Any]] = {}
    for name, t in _mapping(body.get("tiers"), "tiers").items():
        t = _mapping(t, f"tiers.{name}")
        if not isinstance(t.get("remote"), bool):
            raise SummaryError(f"tiers.{name}.remote: not a boolean")
        tier_kinds = {
            kind: {o: _count(n, "outcome count") for o, n in _mapping(c, "outcomes").items()}
            for kind, c in _mapping(t.get("kinds"), f"tiers.{name}.kinds").items()
        }
        tiers[name] = {
            "remote": t["remote"],
            "kinds": tier_kinds,
            "bytes_in": _count(t.get("bytes_in"), "bytes_in"),
            "bytes_out": _count(t.get("bytes_out"), "bytes_out"),
        }
    return {
        "format": FORMAT,
        "job": _str(body.get("job"), "job"),
        "run": _str(body.get("run"), "run"),
        "host": _str(body.get("host"), "host"),
        "rank": _rank(body.get("rank"), "rank"),
        "local_rank": _rank(body.get("local_rank"), "local_rank"),
        "started": _seconds(body.get("started"), "started"),
        "duration_s": _seconds(body.get("duration_s"), "duration_s"),
        "kinds": kinds,
        "tiers": tiers,
        "bytes_in": _count(body.get("bytes_in"), "bytes_in"),
        "bytes_out": _count(body.get("bytes_out"), "bytes_out"),
        "lookup_s": _seconds(body.get("lookup_s"), "lookup_s"),
        "write_behind_dropped": _count(body.get("write_behind_dropped", 0), "dropped"),
        # absent in summaries of objcache versions before it was recorded
        "time_saved_s": {
            kind: _seconds(s, f"time_saved_s.{kind}")
            for kind, s in _mapping(body.get("time_saved_s", {}), "time_saved_s").items()
        },
        # absent in summaries of objcache versions before it was recorded
        "env": {k: _field(v, f"env.{k}") for k, v in _mapping(body.get("env", {}), "env").items()},
        # absent in summaries of objcache versions before run groups
        "group": None if body.get("group") is None else _str(body.get("group"), "group"),
        # absent in summaries of objcache versions before phase times
        "phases": _phases(body.get("phases", {})),
        "recompiles": _recompiles(body.get("recompiles", [])),
        # absent in summaries of objcache versions before the prefetch's time line, and
        # None in runs without a prefetch
        "prefetch": _prefetch(body.get("prefetch")),
        # absent in summaries of objcache versions before key cards
        "miss_cards": {
            k: _count(n, f"miss_cards.{k}")
            for k, n in _mapping(body.get("miss_cards", {}), "miss_cards").items()
        },
    }
