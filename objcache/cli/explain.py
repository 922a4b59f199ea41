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
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from objcache.backends.base import Backend
from objcache.cli.ops import Newest, bounded
from objcache.entry.codec import Codec
from objcache.entry.layout import LAYOUT_VERSION, Namespace, parse_object_key
from objcache.errors import EntryError, EntryTooLarge
from objcache.observe import keycards
from objcache.observe import run_summary as summary
from objcache.observe.keycards import Card, CardError, Difference, Written
from objcache.observe.plaintext import plain

FIRST_COMPILE = "first compile of this graph in the store"
SAME_KEY = "same key written by another run (the entry came later, or is gone)"
#: Most written cards read per graph (the newest first).
MAX_WRITTEN_PER_GRAPH = 256
#: Most differing components named in a cause.
CAUSE_NAMES = 3
#: Most differing components kept per miss (the cause counts them all).
MAX_DIFFERENCES = 16
#: Newest runs read by default (``--runs``).
DEFAULT_RUNS = 32
#: Most bytes of cards one command decodes, runs' misses and written cards together: the
#: read does not grow with what the store holds (an object over it is not started).
READ_BUDGET = 32 << 20
#: Most bytes of written cards kept between runs (the graphs read least recently go first).
WRITTEN_CACHE_BYTES = 8 << 20


@dataclass(frozen=True)
class Nearest:
    """The written card nearest a missed one: who wrote it and how many components agree."""

    key: str
    run: str
    host: str
    job: str
    equal: int


@dataclass
class Miss:
    """One missed lookup, explained; only what is shown is kept (a card can hold thousands of
    components, and a store holds as many cards as its writers planted)."""

    kind: str
    key: str
    #: how many components the missed card has
    components: int
    run: str
    host: str
    cause: str
    nearest: Nearest | None = None
    #: the first :data:`MAX_DIFFERENCES` differing components; ``more_differences`` the rest
    differences: list[Difference] = field(default_factory=list)
    more_differences: int = 0

    @classmethod
    def of(
        cls,
        card: Card,
        run: str,
        host: str,
        cause: str,
        near: Written | None = None,
        differences: list[Difference] | None = None,
    ) -> Miss:
        diffs = differences or []
        return cls(
            card.kind,
            card.key,
            len(card.components),
            run,
            host,
            cause,
            None
            if near is None
            else Nearest(
                near.card.key,
                near.run,
                near.host,
                near.job,
                keycards.equal_components(near.card, card),
            ),
            diffs[:MAX_DIFFERENCES],
            max(0, len(diffs) - MAX_DIFFERENCES),
        )

    def as_dict(self) -> dict[str, Any]:
        near = self.nearest
        return {
            "kind": self.kind,
            "key": self.key,
            "run": self.run,
            "host": self.host,
            "cause": self.cause,
            "nearest": None
            if near is None
            else {
                "key": near.key,
                "run": near.run,
                "host": near.host,
                "job": near.job,
                "equal": near.equal,
                "components": self.components,
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
            "more_differences": self.more_differences,
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
    #: runs listed but not read, by reason (older than --since, over the newest N, ...)
    not_read: Counter[str] = field(default_factory=Counter)
    #: objects read and the bytes they decoded to
    objects_read: int = 0
    bytes_read: int = 0

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
            "not_read": dict(self.not_read),
            "read": {"objects": self.objects_read, "bytes": self.bytes_read},
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
        return Miss.of(missed, run, host, FIRST_COMPILE)
    differences = keycards.diff(near.card, missed)
    cause = cause_of(differences) if differences else SAME_KEY
    return Miss.of(missed, run, host, cause, near, differences)


# --- reading a store ---------------------------------------------------------------------------


class _Reader:
    """Reads a store's cards within :data:`READ_BUDGET` decoded bytes, counting what it
    read and skipped into one :class:`Explanation`."""

    def __init__(self, backend: Backend, codec: Codec, result: Explanation) -> None:
        self.backend, self.codec, self.result = backend, codec, result

    @property
    def spent(self) -> bool:
        return self.result.bytes_read >= READ_BUDGET

    async def read(self, okey: str, cap: int, parse: Callable[[bytes], Any]) -> Any:
        """The parsed object at ``okey``, or the reason it was skipped (a str)."""
        try:
            data = await self.backend.get_capped(okey, cap + 4096)
        except EntryTooLarge:
            return "too_large"
        except Exception:
            return "unreadable"
        if data is None:
            return "gone"
        try:
            plain_bytes = self.codec.decode(data, okey, cap)
        except EntryError as exc:
            return exc.reason
        del data
        self.result.objects_read += 1
        self.result.bytes_read += len(plain_bytes)
        try:
            return parse(plain_bytes)
        except CardError:
            return "invalid"


async def runs_in_env(backend: Backend, env: str, job: str) -> set[str]:
    """The run ids of ``job`` with a summary in environment ``env`` (``--env``)."""
    found: set[str] = set()
    async for info in backend.list(f"{LAYOUT_VERSION}/{env}/run/"):
        parsed = parse_object_key(info.key)
        if parsed is not None and parsed[2].startswith(f"{job}/"):
            found.add(parsed[2][len(job) + 1 :])
    return found


async def _listed(
    backend: Backend,
    job: str,
    run: str | None,
    since: float,
    only: set[str] | None,
    newest: int,
    not_read: Counter[str],
) -> list[str]:
    """Object keys of the runs' misses to read, newest run first: at most ``newest`` of them
    kept while listing, whatever the listing yields; the rest counted in ``not_read``."""
    keep = Newest(newest)
    prefix = f"{LAYOUT_VERSION}/{keycards.CARDS_ENV}/{keycards.MISSES_KIND}/"
    async for info in backend.list(prefix):
        parsed = parse_object_key(info.key)
        if parsed is None or not parsed[2].startswith(f"{job}/"):
            continue
        run_id = parsed[2][len(job) + 1 :]
        if run is not None and run_id != run:
            continue
        started = summary.run_started(run_id)
        if since and (started is None or started < since):
            not_read["older than --since"] += 1
        elif only is not None and run_id not in only:
            not_read["not in --env"] += 1
        else:
            keep.offer(started or 0.0, run_id, info.key)
    if keep.left_out:
        not_read[f"over the newest {newest}"] += keep.left_out
    return [okey for _, _, okey in keep.newest_first()]


class _WrittenCache:
    """Written cards per (kind, graph), read once and kept while they fit
    :data:`WRITTEN_CACHE_BYTES` (the graphs read least recently dropped first)."""

    def __init__(self, reader: _Reader) -> None:
        self.reader = reader
        self._cards: OrderedDict[tuple[str, str], tuple[int, list[Written]]] = OrderedDict()
        self._bytes = 0

    async def get(self, kind: str, graph: str) -> list[Written] | None:
        """The graph's written cards, or None when the read budget is spent."""
        key = (kind, graph)
        if key in self._cards:
            self._cards.move_to_end(key)
            return self._cards[key][1]
        if self.reader.spent:
            return None
        before = self.reader.result.bytes_read
        cards = await _written(self.reader, kind, graph)
        size = self.reader.result.bytes_read - before
        self._cards[key] = (size, cards)
        self._bytes += size
        while self._bytes > WRITTEN_CACHE_BYTES and len(self._cards) > 1:
            _, (dropped, _) = self._cards.popitem(last=False)
            self._bytes -= dropped
        return cards


async def _written(reader: _Reader, kind: str, graph: str) -> list[Written]:
    card_kind = keycards.CARD_KIND[kind]
    ns = Namespace(keycards.CARDS_ENV)
    newest = Newest(MAX_WRITTEN_PER_GRAPH)
    async for info in reader.backend.list(ns.object_prefix(card_kind, graph)):
        newest.offer(info.mtime, info.key, info.key)
    keys = [k for _, _, k in newest.newest_first()]
    skipped = reader.result.skipped

    async def read(okey: str) -> Any:
        if reader.spent:
            return "over the read budget"
        return await reader.read(okey, keycards.MAX_CARD_BYTES, keycards.parse_written)

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
    since: float = 0.0,
    env: str | None = None,
    newest: int = DEFAULT_RUNS,
) -> Explanation:
    """Every missed card of ``job``'s runs (or of ``run``), each with its nearest written card
    in ``backend``; the runs' missed cards are read from ``runs`` (the summaries location)
    where given, else from ``backend``.

    Bounded whatever the store holds: of the runs started at or after ``since`` (epoch
    seconds) and, with ``env``, having a summary in that environment, the ``newest`` are read,
    the newest first, one at a time, until :data:`READ_BUDGET` decoded bytes are spent; of
    each only the explained misses are kept. What was not read is counted by reason."""
    result = Explanation(job)
    source = runs or backend
    only = await runs_in_env(source, env, job) if env else None
    keys = await _listed(source, job, run, since, only, newest, result.not_read)
    reader, cards = _Reader(source, codec, result), _WrittenCache(_Reader(backend, codec, result))
    for i, okey in enumerate(keys):
        if reader.spent:
            result.not_read[f"over the read budget ({READ_BUDGET >> 20} MiB)"] += len(keys) - i
            break
        got = await reader.read(okey, keycards.MAX_MISSES_BYTES, keycards.parse_misses)
        if isinstance(got, str):
            result.skipped[f"run: {got}"] += 1
            continue
        if f"{got.job}/{got.run}" != parse_object_key(okey)[2]:  # type: ignore[index]
            result.skipped["run: misplaced"] += 1
            continue
        if got.invalid:
            result.skipped["card: invalid"] += got.invalid
        result.runs.append(got.run)
        result.dropped += got.dropped
        for card in got.cards:
            written = await cards.get(card.kind, card.graph) if card.graph is not None else []
            if written is None:
                result.skipped["card: over the read budget"] += 1
                continue
            result.misses.append(explain_one(card, written, got.run, got.host))
        del got
    result.runs.sort()
    result.misses.sort(key=lambda m: m.run)
    return result


def causes_by_run(explanation: Explanation) -> dict[str, Counter[str]]:
    """Each run's explained misses counted by cause (``objcache report``'s column)."""
    out: dict[str, Counter[str]] = {}
    for miss in explanation.misses:
        out.setdefault(miss.run, Counter())[miss.cause] += 1
    return out


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
    if e.not_read:
        out.append(
            "  runs not read: " + ", ".join(f"{n} {r}" for r, n in sorted(e.not_read.items()))
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
            head = f"  {m.kind} {plain(m.key)} (run {plain(m.run)}, host {plain(m.host)})"
            out.append(head)
            if m.nearest is not None:
                near = m.nearest
                out.append(
                    f"    nearest written card: run {plain(near.run)} (host {plain(near.host)}), "
                    f"{near.equal}/{m.components} components equal; stored → this run:"
                )
            for d in m.differences:
                out.append(f"    {plain(d.describe())}")
            if m.more_differences:
                out.append(f"    ... and {m.more_differences} more components differ")
    return out


def render(explanation: Explanation, console: Console) -> None:
    from objcache.observe.plaintext import text

    for line in lines(explanation):
        console.print(text(line), soft_wrap=True)
