"""The prefetch's section of ``objcache explain --time``: was a far store or the machine the
cause of a slow start? (docs/troubleshooting.md, "Was it the prefetch?").

From the time line a run summary carries (:mod:`objcache.observe.prefetch_timeline`): when
the prefetch started, got the manifest and ended, relative to the process's start; what it
fetched and how fast; how the compiles' lookups found their entries (served by the prefetch,
waited for an entry in flight, missed it); the longest waits; and one line of verdict.
"""

from __future__ import annotations

from typing import Any

from objcache.cli.common import human_size
from objcache.observe import prefetch_timeline as tl

#: Waits shown in text (``--json`` has every one the summary holds).
SHOWN_WAITS = 3
#: Waits shorter than this in all are not a cause.
NOISE_S = 0.01


def throughput(p: dict[str, Any]) -> float | None:
    """Bytes per second from the manifest's arrival to the last entry's (None: nothing
    fetched, or no time passed)."""
    begin = p.get("manifest_s")
    end = p.get("last_arrival_s")
    if not p.get("bytes") or begin is None or end is None or end <= begin:
        return None
    return float(p["bytes"]) / float(end - begin)


def verdict(p: dict[str, Any]) -> tuple[str, str]:
    """``(cause, sentence)``: ``store`` (lookups waited for entries in flight), ``manifest``
    (lookups came before the manifest), ``missed`` (most lookups the store answered were not
    prefetched), ``not the cause`` (the prefetch was done or served in time)."""
    lookups = p["lookups"]
    served, waited, missed = lookups[tl.SERVED], lookups[tl.WAITED], lookups[tl.MISSED]
    first, ended, wait_s = p.get("first_lookup_s"), p.get("ended_s"), p["wait_s"]
    if waited and wait_s >= NOISE_S:
        rate = throughput(p)
        speed = f" (it fetched at {human_size(rate)}/s)" if rate is not None else ""
        return "store", (
            f"the store was the bottleneck: lookups waited {wait_s:.2f} s for entries still "
            f"in flight{speed}"
        )
    if missed and missed >= served:
        reasons = p.get("missed_reasons", {})
        top = max(reasons.items(), key=lambda kv: (kv[1], kv[0]))[0] if reasons else ""
        manifest_s = p.get("manifest_s")
        if top == tl.BEFORE_MANIFEST and first is not None and manifest_s is not None:
            return "manifest", (
                f"the manifest arrived {manifest_s - first:.2f} s after the first lookup: "
                f"{missed} lookups fetched on their own (listing the store was slow)"
            )
        return "missed", (
            f"{missed} of {served + waited + missed} lookups the store answered missed the "
            f"prefetch ({top or 'no reason recorded'}): the load path fetched them"
        )
    if first is None:
        return "not the cause", "no lookup while the prefetch ran: not the cause"
    if ended is not None and ended <= first:
        return "not the cause", (
            f"the prefetch finished {first - ended:.2f} s before the first lookup: not the cause"
        )
    return "not the cause", (
        f"the prefetch served {served} lookups without a wait: not the cause; the machine's "
        "phases above are"
    )


def as_dict(p: dict[str, Any]) -> dict[str, Any]:
    """The section's figures for ``--json``: the summary's time line, its throughput and
    the verdict (cause and sentence)."""
    rate = throughput(p)
    cause, sentence = verdict(p)
    return {
        **p,
        "throughput_bytes_s": None if rate is None else round(rate, 1),
        "verdict": sentence,
        "cause": cause,
    }


def _at(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"


def lines(p: dict[str, Any] | None) -> list[str]:
    """The text section (store strings escaped by the caller); empty without a time line."""
    if p is None:
        return []
    out = ["", f"prefetch (times since {p['since']}):"]
    ended = _at(p["ended_s"]) if p["ended_s"] is not None else "not finished at exit"
    out.append(
        f"  started {_at(p['started_s'])}, manifest {_at(p['manifest_s'])}, ended {ended}; "
        f"first lookup {_at(p['first_lookup_s'])}"
    )
    rate = throughput(p)
    span = (p["last_arrival_s"] or 0.0) - (p["manifest_s"] or 0.0)
    tiers = ", ".join(f"{t} {v['n']}" for t, v in sorted(p["by_tier"].items()))
    fetched = (
        f"  fetched {p['fetched']} of {p['keys']} entries ({p['already_local']} already "
        f"local), {human_size(p['bytes'])}"
    )
    if rate is not None:
        fetched += f" in {span:.2f} s: {human_size(rate)}/s"
    out.append(fetched + (f" ({tiers})" if tiers else ""))
    others = [
        f"{n} {what}"
        for n, what in (
            (p["not_found"], "not found"),
            (p["elsewhere"], "left to another process"),
            (p["entries_left_out"], "past the first entries recorded one by one"),
            (p["errors"], "recording errors"),
        )
        if n
    ]
    if others:
        out.append("  also: " + ", ".join(others))
    lk = p["lookups"]
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(p["missed_reasons"].items()))
    out.append(
        f"  lookups: {lk[tl.SERVED]} served by the prefetch, {lk[tl.WAITED]} waited "
        f"({p['wait_s']:.2f} s in all), {lk[tl.MISSED]} missed it"
        + (f" ({reasons})" if reasons else "")
        + f", {lk[tl.LOCAL]} local already, {lk[tl.ABSENT]} in no tier"
    )
    for w in p["waits"][:SHOWN_WAITS]:
        out.append(
            f"    waited {w['s']:.3f} s  {w['kind']} {w['key']} at {w['at_s']:.2f} s "
            f"from {w['tier'] or '-'}"
        )
    out.append(f"  verdict: {verdict(p)[1]}")
    return out
