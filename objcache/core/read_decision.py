"""What a lookup makes of what the tiers answered (docs/architecture.md, "Read path").

Which remote tiers are asked, which hit is served and how long a hit from a farther tier
waits for nearer ones (the priority grace), what a node lease is let go of with, whether a
hit is written through and which tiers are back-filled. Pure, like the circuit breaker
(objcache/core/policy.py): no I/O, no asyncio, no clock of its own (times are given, in
monotonic seconds). :class:`objcache.core.tiered.TieredCache` asks the tiers, verifies what
they hand over and drives these decisions.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

#: The reason of a hit (a verified entry).
HIT = ""
#: A tier that answered that it has no entry under the key.
ABSENT = "absent"
#: A tier that handed over an entry that failed verification (digest, signature, binding).
REFUSED = "refused"
#: A tier skipped for its open breaker: still that tier's miss, with this reason.
BREAKER = "breaker"

#: The tier name a lookup without ``wait`` (prefetch) reports for a key another process of
#: the node is fetching: left to that process (objcache/core/fetch_once/leased_lookup.py).
LEASED_ELSEWHERE = "~leased-elsewhere"

#: What a node lease is let go of with (objcache/core/fetch_once/nodelease.py): the entry
#: landed in the local tier, every remote tier answered absent, or nothing the waiting
#: processes may share (an error, a timeout, a refusal, a write that failed: each of them
#: tries for itself).
LANDED = "hit"
SHARED_MISS = "miss"
UNSHARED = ""


class Ask(enum.Enum):
    """Whether a remote tier is asked for a key."""

    #: Asked, concurrently with the others.
    ASK = "ask"
    #: Cannot be read (write-only): not asked, and not its miss.
    SKIP = "skip"
    #: Its breaker is open: not asked; a :data:`BREAKER` miss of the tier, counted.
    BREAKER = "breaker"


def ask(readable: bool, breaker_open: bool) -> Ask:
    """Whether a remote tier that is ``readable``, with its breaker open or not, is asked."""
    if not readable:
        return Ask.SKIP
    return Ask.BREAKER if breaker_open else Ask.ASK


@dataclass(frozen=True)
class RaceOutcome:
    """How a race ended."""

    #: The served tier (its index in priority order), or None: a miss.
    winner: int | None
    #: The tiers before the winner that answered :data:`ABSENT`, in priority order: the
    #: back-fill candidates (:func:`after_race`).
    absent_nearer: tuple[int, ...]
    #: Each miss's reason, of the tiers that answered before the race ended.
    reasons: tuple[str, ...]


class Race:
    """The race of the ``tiers`` remote tiers asked for one key, in priority order (0: the
    nearest). Fed each tier's answer as it comes (:meth:`answer`); settled once it knows
    what to serve (:attr:`settled`, :meth:`outcome`).

    A hit from tier i wins as soon as every tier before it has answered. While a nearer
    tier is still running, the held hit waits for it at most ``grace_s`` after the last
    answer (:meth:`wait_s`); when no answer came within that (:meth:`grace_over`), the held
    hit wins. Entries under one key are verified and interchangeable, so a slow or hung near
    tier must not hold a far hit back for a whole deadline.
    """

    def __init__(self, tiers: int, grace_s: float) -> None:
        self.tiers = tiers
        self.grace_s = grace_s
        #: Tier index -> its answer's reason (:data:`HIT` for a hit), in the order they came.
        self._answers: dict[int, str] = {}
        #: The nearest tier that answered with a hit so far.
        self._best: int | None = None
        #: When the last answer came (monotonic seconds); the grace runs from there.
        self._last: float | None = None
        self._grace_over = False

    def answer(self, tier: int, reason: str, now: float) -> None:
        """Tier ``tier`` answered at ``now``: :data:`HIT`, or a miss's reason."""
        if not 0 <= tier < self.tiers or tier in self._answers:
            raise ValueError(
                f"tier {tier} cannot answer (of {self.tiers}, answered: {self._answers})"
            )
        self._answers[tier] = reason
        self._last = now
        if reason == HIT and (self._best is None or tier < self._best):
            self._best = tier

    def grace_over(self) -> None:
        """No answer came within :meth:`wait_s` while a hit was held: the held hit wins."""
        if self._best is None:
            raise ValueError("no hit is held: nothing has a grace")
        self._grace_over = True

    @property
    def settled(self) -> bool:
        """Whether the race knows what to serve: the answers still running are not waited
        for (cancelled)."""
        if len(self._answers) == self.tiers or self._grace_over:
            return True
        best = self._best
        return best is not None and all(j in self._answers for j in range(best))

    def wait_s(self, now: float) -> float | None:
        """How long to wait, from ``now``, for the next answer: None (no limit: each tier
        has its own deadline) while no hit is held, else what is left of the grace."""
        if self._best is None or self._last is None:
            return None
        return max(0.0, self._last + self.grace_s - now)

    def outcome(self) -> RaceOutcome:
        """What the race decided (only once :attr:`settled`)."""
        if not self.settled:
            raise ValueError("the race is still running")
        best = self._best
        absent = tuple(
            sorted(
                i for i, r in self._answers.items() if r == ABSENT and best is not None and i < best
            )
        )
        reasons = tuple(r for r in self._answers.values() if r != HIT)
        return RaceOutcome(best, absent, reasons)


def fetch_again(wait: bool, tier: str) -> bool:
    """Whether a lookup that joined a shared fetch, which answered ``tier``, starts one of its
    own: only one that waits (``wait``), when the fetch it joined (a prefetch's) left the key
    to another process of the node. Its own fetch waits for that process."""
    return wait and tier == LEASED_ELSEWHERE


def lease_outcome_of_miss(reasons: Sequence[str]) -> str:
    """What a lease is let go of with after a remote miss: :data:`SHARED_MISS` only when
    every tier answered absent (no tier asked, or one skipped, error or refusal: nothing
    shared; the waiting processes try for themselves)."""
    return SHARED_MISS if reasons and all(r == ABSENT for r in reasons) else UNSHARED


def lease_outcome_of_write(stored: bool) -> str:
    """What a write-through lets the lease go with: :data:`LANDED` when the entry is now in
    the local tier, else :data:`UNSHARED`."""
    return LANDED if stored else UNSHARED


@dataclass(frozen=True)
class AfterRace:
    """What a fetch does once its race ended."""

    #: Write the hit through to the local tier (which lets go of the lease once written).
    write_through: bool
    #: Let go of the held lease now, with this outcome; None: no lease held, or the
    #: write-through lets it go.
    release: str | None
    #: Which of the race's :attr:`RaceOutcome.absent_nearer` tiers (their indices in that
    #: tuple) are back-filled, in CREATE mode: one back-fill counted each.
    backfill: tuple[int, ...]


def after_race(
    hit: bool,
    reasons: Sequence[str],
    absent_writable: Sequence[bool],
    *,
    local: bool,
    leased: bool,
    read_only: bool,
) -> AfterRace:
    """What a fetch does with its race's end: ``hit`` or not, the misses' ``reasons`` (a
    skipped tier's too), whether each nearer tier that answered absent may be written
    (``absent_writable``); with a ``local`` tier or not, holding a lease or not, in
    read-only mode or not. A hit is written through to the local tier and back-filled into
    the nearer writable tiers that answered absent (never in read-only mode, never into a
    read-only tier)."""
    if not hit:
        return AfterRace(False, lease_outcome_of_miss(reasons) if leased else None, ())
    backfill = () if read_only else tuple(i for i, ok in enumerate(absent_writable) if ok)
    if local:
        return AfterRace(True, None, backfill)
    return AfterRace(False, UNSHARED if leased else None, backfill)
