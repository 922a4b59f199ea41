"""The prefetch's own time line, for ``objcache explain --time`` (docs/architecture.md,
"Prefetch time line").

A new machine's prefetch (:func:`objcache.core.manifest.prefetch`) runs beside Dynamo's
tracing. Whether it helped or held a start back is in its time line: when it started, when
the job's manifest arrived, when each entry was asked for and arrived (its bytes, the tier
that answered), and, for each lookup the compiles made while it ran, whether the entry was
already there (*served*), still in flight (*waited*, and for how long), or not prefetched
(*missed*, fetched on the load path). The run summary carries it (``prefetch``).

Bounded whatever the job: the first :data:`MAX_ENTRIES` entries asked for are kept one by
one, the rest counted; the :data:`MAX_WAITS` longest waits are kept. Recording never fails
or slows a lookup: each step is a few dictionary operations on the event loop, and an error
is swallowed and counted (``errors``).
"""

from __future__ import annotations

import functools
import heapq
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from objcache.entry.layout import parse_object_key

#: Entries kept one by one (the first asked for); the rest are counted in the aggregates.
MAX_ENTRIES = 200
#: Longest lookup waits kept.
MAX_WAITS = 10
#: Tiers counted by name (a summary's mappings hold at most 64).
MAX_TIERS = 16
#: Longest key prefix kept per entry (enough to find it in ``objcache ls``).
KEY_CHARS = 16
#: Longest tier name kept per entry and wait (the summary stays well under its byte cap).
TIER_CHARS = 120

#: What a lookup found, relative to the prefetch.
SERVED, WAITED, MISSED, LOCAL, ABSENT = "served", "waited", "missed", "local", "absent"
OUTCOMES = (SERVED, WAITED, MISSED, LOCAL, ABSENT)
#: Why a lookup the store answered was not served by the prefetch.
BEFORE_MANIFEST = "before the manifest arrived"
NOT_LISTED = "not in the manifest"
NOT_YET = "not requested yet"
NOT_FOUND = "the prefetch did not get it"
ELSEWHERE = "another process was fetching it"
REASONS = (BEFORE_MANIFEST, NOT_LISTED, NOT_YET, NOT_FOUND, ELSEWHERE)

# The state of a key the manifest listed.
_LOCAL, _QUEUED, _IN_FLIGHT, _ARRIVED, _FAILED, _LEFT = range(6)

F = TypeVar("F", bound=Callable[..., Any])


def _guarded(method: F) -> F:
    """Never raise into the prefetch or a lookup: an error is counted instead."""

    @functools.wraps(method)
    def run(self: PrefetchTimeline, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception:
            self.errors += 1
            return None

    return run  # type: ignore[return-value]


def process_age_s() -> float | None:
    """Seconds since this process started (Linux ``/proc``), or None where not known."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read().decode()
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        # the command name (field 2) may hold spaces: fields after its closing parenthesis
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        return age if 0 <= age < 1e9 else None
    except (OSError, ValueError, IndexError):
        return None


class PrefetchTimeline:
    """One process's prefetch, as it went (event loop thread only)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._t0 = clock()
        age = process_age_s()
        #: Times are seconds since the process started, else since this time line's start.
        self.since_process_start = age is not None
        self._origin = age if age is not None else 0.0
        self.started_s = self._now()
        self.manifest_s: float | None = None
        self.ended_s: float | None = None
        self.first_lookup_s: float | None = None
        self.keys = 0
        self.manifests = 0
        self.already_local = 0
        self.requested = 0
        self.fetched = 0
        self.bytes = 0
        self.not_found = 0
        self.elsewhere = 0
        self.last_arrival_s: float | None = None
        self.by_tier: dict[str, list[int]] = {}
        self.entries: list[dict[str, Any]] = []
        self.entries_left_out = 0
        self.lookups: Counter[str] = Counter()
        self.missed_reasons: Counter[str] = Counter()
        self.wait_s = 0.0
        self._waits: list[tuple[float, int, dict[str, Any]]] = []
        self.errors = 0
        self._state: dict[str, int] = {}
        self._entry_at: dict[str, int] = {}

    def _now(self) -> float:
        return self._origin + (self._clock() - self._t0)

    # --- the prefetch --------------------------------------------------------------------

    @_guarded
    def manifest(self, keys: Iterable[str], manifests: int, missing: Iterable[str]) -> None:
        """The job's manifests arrived: ``keys`` they list, ``missing`` of them not local."""
        self.manifest_s = self._now()
        self.manifests = manifests
        self._state = dict.fromkeys(keys, _LOCAL)
        for okey in missing:
            self._state[okey] = _QUEUED
        self.keys = len(self._state)
        self.already_local = sum(1 for s in self._state.values() if s == _LOCAL)

    @_guarded
    def request(self, okey: str) -> None:
        """The prefetch asks the tiers for ``okey`` now."""
        self._state[okey] = _IN_FLIGHT
        self.requested += 1
        if len(self.entries) < MAX_ENTRIES:
            kind, key = _kind_key(okey)
            self._entry_at[okey] = len(self.entries)
            self.entries.append(
                {"kind": kind, "key": key, "requested_s": round(self._now(), 4),
                 "arrived_s": None, "bytes": 0, "tier": ""}
            )  # fmt: skip
        else:
            self.entries_left_out += 1

    @_guarded
    def arrive(self, okey: str, size: int | None, tier: str, elsewhere: bool = False) -> None:
        """The prefetch's fetch of ``okey`` ended: ``size`` payload bytes from ``tier``, or
        None (not found, failed, or ``elsewhere``: left to another process's fetch)."""
        now = self._now()
        if size is None:
            self._state[okey] = _LEFT if elsewhere else _FAILED
            self.elsewhere += elsewhere
            self.not_found += not elsewhere
        else:
            self._state[okey] = _ARRIVED
            self.fetched += 1
            self.bytes += size
            self.last_arrival_s = now
            if tier in self.by_tier or len(self.by_tier) < MAX_TIERS:
                counts = self.by_tier.setdefault(tier, [0, 0])
                counts[0] += 1
                counts[1] += size
        at = self._entry_at.pop(okey, None)
        if at is not None:
            entry = self.entries[at]
            entry["tier"] = tier[:TIER_CHARS] if size is not None else ""
            if size is not None:
                entry["arrived_s"] = round(now, 4)
                entry["bytes"] = size

    @_guarded
    def end(self) -> None:
        self.ended_s = self._now()

    # --- lookups ---------------------------------------------------------------------------

    def state(self, okey: str) -> int | None:
        """The prefetch's state of ``okey`` when a lookup starts (None: not listed)."""
        try:
            return self._state.get(okey)
        except Exception:
            self.errors += 1
            return None

    @_guarded
    def lookup(
        self,
        kind: str,
        okey: str,
        state: int | None,
        seconds: float,
        tier: str,
        found: bool,
        local: str | None,
    ) -> None:
        """A lookup of ``okey`` ended after ``seconds``, answered by ``tier`` (``found``);
        ``state`` is :meth:`state` as it was when the lookup started."""
        at = self._now()
        if self.first_lookup_s is None:
            self.first_lookup_s = max(0.0, at - seconds)
        if state == _ARRIVED:
            outcome = SERVED
        elif state == _IN_FLIGHT:
            outcome = WAITED
        elif found and local is not None and tier == local:
            outcome = LOCAL  # on this machine already, or written by this run
        elif not found:
            outcome = ABSENT  # no tier had it: no prefetch could have helped
        else:
            outcome = MISSED
            self.missed_reasons[_why_missed(self.manifest_s is None, state)] += 1
        self.lookups[outcome] += 1
        if outcome == WAITED:
            self.wait_s += seconds
            wait = {
                "kind": kind,
                "key": _kind_key(okey)[1],
                "s": round(seconds, 4),
                "at_s": round(max(0.0, at - seconds), 4),
                "tier": tier[:TIER_CHARS],
            }
            item = (seconds, self.lookups[WAITED], wait)
            if len(self._waits) < MAX_WAITS:
                heapq.heappush(self._waits, item)
            elif seconds > self._waits[0][0]:
                heapq.heapreplace(self._waits, item)

    # --- the summary -----------------------------------------------------------------------

    def as_dict(self) -> dict[str, Any]:
        """What a run summary carries (``prefetch``): bounded, rounded."""

        def r(value: float | None) -> float | None:
            return None if value is None else round(max(0.0, value), 4)

        return {
            "since": "process start" if self.since_process_start else "prefetch start",
            "started_s": r(self.started_s),
            "manifest_s": r(self.manifest_s),
            "ended_s": r(self.ended_s),
            "first_lookup_s": r(self.first_lookup_s),
            "last_arrival_s": r(self.last_arrival_s),
            "manifests": self.manifests,
            "keys": self.keys,
            "already_local": self.already_local,
            "requested": self.requested,
            "fetched": self.fetched,
            "bytes": self.bytes,
            "not_found": self.not_found,
            "elsewhere": self.elsewhere,
            "by_tier": {t: {"n": n, "bytes": b} for t, (n, b) in self.by_tier.items()},
            "entries": [dict(e) for e in self.entries],
            "entries_left_out": self.entries_left_out,
            "lookups": {o: self.lookups[o] for o in OUTCOMES},
            "wait_s": round(self.wait_s, 4),
            "missed_reasons": {k: n for k, n in self.missed_reasons.items() if n},
            "waits": [w for _, _, w in sorted(self._waits, key=lambda i: (-i[0], i[1]))],
            "errors": self.errors,
        }


def _why_missed(before_manifest: bool, state: int | None) -> str:
    if before_manifest:
        return BEFORE_MANIFEST
    if state is None:
        return NOT_LISTED
    if state == _QUEUED:
        return NOT_YET
    if state == _LEFT:
        return ELSEWHERE
    return NOT_FOUND


def _kind_key(okey: str) -> tuple[str, str]:
    """The kind and a short key prefix of an object key (``v1/<env>/<kind>/.../<key>``)."""
    parsed = parse_object_key(okey)
    if not parsed:
        return "?", ""
    return parsed[1], parsed[2][:KEY_CHARS]
