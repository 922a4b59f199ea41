"""``objcache explain --job NAME``: why each lookup of a job's runs missed, from key cards.

For every card a run recorded for a lookup that missed everywhere
(:mod:`objcache.observe.keycards`), the store is searched for the nearest card a writer
stored: same graph component first (the same model code traced the same way), then the most
components equal. The components that
differ are the miss's cause (``inductor_config.max_autotune: False → True``); a graph no
writer ever stored is "first compile of this graph in the store". Misses are grouped by
cause, the biggest first.

Everything read here is hostile input: objects are read capped, decoded by the codec (so an
unsigned card is refused where keys are configured), parsed strictly, and a bad one is
skipped and counted, never printed raw (docs/security.md, "What the CLI prints").
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from objcache.backends.base import Backend
from objcache.cli.ops import bounded
from objcache.entry.codec import Codec
from objcache.entry.layout import LAYOUT_VERSION, Namespace, parse_object_key
from objcache.errors import EntryError, EntryTooLarge
from objcache.observe import keycards
from objcache.observe.keycards import Card, CardError, Difference, Written
from objcache.observe.plaintext import plain

FIRST_COMPILE = "first compile of this graph in the store"
SAME_KEY = "same key written by another run (the entry came later, or is gone)"
#: Most written cards read per graph (the newest first).
MAX_WRITTEN_PER_GRAPH = 256
#: Most differing components named in a cause.
CAUSE_NAMES = 3


@dataclass
class Miss:
    """One missed lookup, explained."""

    card: Card
    run: str
    host: str
    cause: str
    nearest: Written | None = None
    differences: list[Difference] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        near = self.nearest
        return {
            "kind": self.card.kind,
            "key": self.card.key,
            "run": self.run,
            "host": self.host,
            "cause": self.cause,
            "nearest": None
            if near is None
            else {
                "key": near.card.key,
                "run": near.run,
                "host": near.host,
                "job": near.job,
                "equal": keycards.equal_components(near.card, self.card),
                "components": len(self.card.components),
            },
            "differences": [
                {
                    "component": d.name,
                    "written": _val(d.written),
                    "missed": _val(d.missed),
                    "line": d.describe(),
                }
                for d in self.differences
            ],
        }


def _val(entry: tuple[str, str | None] | None) -> dict[str, Any] | None:
    return None if entry is None else {"hash": entry[0], "value": entry[1]}


@dataclass
class Cause:
    cause: str
    misses: int
    hosts: set[str]
    runs: set[str]


@dataclass
class Explanation:
    job: str
    runs: list[str] = field(default_factory=list)
    misses: list[Miss] = field(default_factory=list)
    #: missed lookups a run counted but did not keep (over its cap of cards)
    dropped: int = 0
    #: objects skipped, by reason (unsigned, corrupt, invalid, too-large, misplaced ...)
    skipped: Counter[str] = field(default_factory=Counter)

    def causes(self) -> list[Cause]:
        """Misses grouped by cause, the biggest first."""
        groups: dict[str, Cause] = {}
        for m in self.misses:
            c = groups.setdefault(m.cause, Cause(m.cause, 0, set(), set()))
            c.misses += 1
            c.hosts.add(m.host)
            c.runs.add(m.run)
        return sorted(groups.values(), key=lambda c: (-c.misses, c.cause))

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "runs": self.runs,
            "misses": len(self.misses),
            "dropped": self.dropped,
            "skipped": dict(self.skipped),
            "causes": [
                {"cause": c.cause, "misses": c.misses, "hosts": len(c.hosts), "runs": len(c.runs)}
                for c in self.causes()
            ],
            "details": [m.as_dict() for m in self.misses],
        }


def cause_of(differences: list[Difference]) -> str:
    """The differing components, list items as one (``example_inputs[0]`` and
    ``example_inputs[2]`` are ``example_inputs``), so one change is one cause."""
    names: list[str] = []
    for d in differences:
        family = re.sub(r"\[\d+\]$", "", d.name)
        if family not in names:
            names.append(family)
    shown = ", ".join(names[:CAUSE_NAMES])
    more = f" and {len(names) - CAUSE_NAMES} more" if len(names) > CAUSE_NAMES else ""
    return f"{shown}{more} differ{'s' if len(names) == 1 else ''}"


def nearest(missed: Card, written: list[Written], run: str) -> Written | None:
    """The written card with the most components equal to ``missed`` (same graph assumed),
    leaving out the cards the missing run itself wrote after its miss."""
    best: tuple[int, str, str] | None = None
    found: Written | None = None
    for w in written:
        if w.run == run or w.card.kind != missed.kind:
            continue
        rank = (keycards.equal_components(w.card, missed), w.run, w.card.key)
        if best is None or rank > best:
            best, found = rank, w
    return found


def explain_one(missed: Card, written: list[Written], run: str, host: str) -> Miss:
    near = nearest(missed, written, run)
    if near is None:
        return Miss(missed, run, host, FIRST_COMPILE)
    differences = keycards.diff(near.card, missed)
    cause = cause_of(differences) if differences else SAME_KEY
    return Miss(missed, run, host, cause, near, differences)


# --- reading a store ---------------------------------------------------------------------------


async def _read(
    backend: Backend, codec: Codec, okey: str, cap: int, parse: Callable[[bytes], Any]
) -> Any:
    """The parsed object at ``okey``, or the reason it was skipped (a str)."""
    try:
        data = await backend.get_capped(okey, cap + 4096)
    except EntryTooLarge:
        return "too_large"
    except Exception:
        return "unreadable"
    if data is None:
        return "gone"
    try:
        return parse(codec.decode(data, okey, cap))
    except EntryError as exc:
        return exc.reason
    except CardError:
        return "invalid"


async def _misses(
    backend: Backend, codec: Codec, job: str, run: str | None, skipped: Counter[str]
) -> list[keycards.Misses]:
    found: list[str] = []
    prefix = f"{LAYOUT_VERSION}/{keycards.CARDS_ENV}/{keycards.MISSES_KIND}/"
    async for info in backend.list(prefix):
        parsed = parse_object_key(info.key)
        if parsed is None or not parsed[2].startswith(f"{job}/"):
            continue
        if run is None or parsed[2] == f"{job}/{run}":
            found.append(info.key)

    async def read(okey: str) -> Any:
        return await _read(backend, codec, okey, keycards.MAX_MISSES_BYTES, keycards.parse_misses)

    out: list[keycards.Misses] = []
    for okey, result in zip(sorted(found), await bounded(sorted(found), read, None), strict=True):
        if isinstance(result, str):
            skipped[f"run: {result}"] += 1
        elif f"{result.job}/{result.run}" != parse_object_key(okey)[2]:  # type: ignore[index]
            skipped["run: misplaced"] += 1
        else:
            if result.invalid:
                skipped["card: invalid"] += result.invalid
            out.append(result)
    return out


async def _written(
    backend: Backend, codec: Codec, kind: str, graph: str, skipped: Counter[str]
) -> list[Written]:
    card_kind = keycards.CARD_KIND[kind]
    ns = Namespace(keycards.CARDS_ENV)
    listed = [
        (info.mtime, info.key) async for info in backend.list(ns.object_prefix(card_kind, graph))
    ]
    listed.sort(reverse=True)
    keys = [k for _, k in listed[:MAX_WRITTEN_PER_GRAPH]]

    async def read(okey: str) -> Any:
        return await _read(backend, codec, okey, keycards.MAX_CARD_BYTES, keycards.parse_written)

    out: list[Written] = []
    for result in await bounded(keys, read, None):
        if isinstance(result, str):
            skipped[f"card: {result}"] += 1
        elif result.card.graph != graph or result.card.kind != kind:
            skipped["card: misplaced"] += 1
        else:
            out.append(result)
    return out


async def collect(
    backend: Backend,
    codec: Codec,
    *,
    job: str,
    run: str | None = None,
    runs: Backend | None = None,
) -> Explanation:
    """Every missed card of ``job``'s runs (or of ``run``), each with its nearest written card
    in ``backend``; the runs' missed cards are read from ``runs`` (the summaries location)
    where given, else from ``backend``."""
    result = Explanation(job)
    missed = await _misses(runs or backend, codec, job, run, result.skipped)
    written: dict[tuple[str, str], list[Written]] = {}
    for r in sorted(missed, key=lambda r: r.run):
        result.runs.append(r.run)
        result.dropped += r.dropped
        for card in r.cards:
            graph = card.graph
            if graph is None:
                result.misses.append(Miss(card, r.run, r.host, FIRST_COMPILE))
                continue
            if (card.kind, graph) not in written:
                written[(card.kind, graph)] = await _written(
                    backend, codec, card.kind, graph, result.skipped
                )
            result.misses.append(explain_one(card, written[(card.kind, graph)], r.run, r.host))
    return result


def causes_by_run(explanation: Explanation) -> dict[str, Counter[str]]:
    """Each run's explained misses counted by cause (``objcache report``'s column)."""
    out: dict[str, Counter[str]] = {}
    for miss in explanation.misses:
        out.setdefault(miss.run, Counter())[miss.cause] += 1
    return out


def top_causes(explanation: Explanation, limit: int = 3) -> list[tuple[str, int, int]]:
    """``(cause, misses, hosts)`` of the biggest causes: for ``objcache report``'s column."""
    return [(c.cause, c.misses, len(c.hosts)) for c in explanation.causes()[:limit]]


# --- rendering -------------------------------------------------------------------------------


def lines(explanation: Explanation) -> list[str]:
    """The text ``objcache explain`` prints; every string from the store escaped."""
    e = explanation
    hosts = {m.host for m in e.misses}
    out = [
        f"job {plain(e.job)}: {len(e.misses)} missed lookups with a key card in "
        f"{len(e.runs)} run(s) on {len(hosts)} host(s)"
    ]
    if e.dropped:
        out.append(f"  {e.dropped} more missed lookups were counted, not kept (over the cap)")
    if e.skipped:
        out.append(
            "  skipped: " + ", ".join(f"{n} {plain(r)}" for r, n in sorted(e.skipped.items()))
        )
    for cause in e.causes():
        plural = "es" if cause.misses != 1 else ""
        out.append("")
        out.append(
            f"{cause.misses} miss{plural} on {len(cause.hosts)} host(s): {plain(cause.cause)}"
        )
        for m in e.misses:
            if m.cause != cause.cause:
                continue
            head = f"  {m.card.kind} {plain(m.card.key)} (run {plain(m.run)}, host {plain(m.host)})"
            out.append(head)
            if m.nearest is not None:
                near = m.nearest
                equal = keycards.equal_components(near.card, m.card)
                out.append(
                    f"    nearest written card: run {plain(near.run)} (host {plain(near.host)}), "
                    f"{equal}/{len(m.card.components)} components equal; stored → this run:"
                )
            for d in m.differences:
                out.append(f"    {plain(d.describe())}")
    return out


def render(explanation: Explanation, console: Console) -> None:
    from objcache.observe.plaintext import text

    for line in lines(explanation):
        console.print(text(line), soft_wrap=True)
