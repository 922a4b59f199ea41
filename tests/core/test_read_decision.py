"""What a lookup makes of the tiers' answers, decided without I/O (objcache/core/read_decision.py;
docs/architecture.md, "Read path"): each table row is a sequence of answers, with times, and
what the decision must be. No tier, no event loop, no clock: times are plain numbers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from objcache.core.read_decision import (
    ABSENT,
    BREAKER,
    HIT,
    LANDED,
    LEASED_ELSEWHERE,
    REFUSED,
    SHARED_MISS,
    UNSHARED,
    AfterRace,
    Ask,
    Race,
    RaceOutcome,
    after_race,
    ask,
    fetch_again,
    lease_outcome_of_miss,
    lease_outcome_of_write,
)

GRACE = 0.020


@pytest.mark.parametrize(
    ("readable", "breaker_open", "expected"),
    [
        (True, False, Ask.ASK),
        (True, True, Ask.BREAKER),
        (False, False, Ask.SKIP),
        (False, True, Ask.SKIP),  # a write-only tier is no breaker miss: it is never read
    ],
)
def test_which_remote_tiers_are_asked(readable: bool, breaker_open: bool, expected: Ask) -> None:
    assert ask(readable, breaker_open) is expected


#: A step of a race: (tier, reason, time) for an answer, or None for "the grace ran out".
Step = tuple[int, str, float] | None


@dataclass(frozen=True)
class RaceCase:
    tiers: int
    steps: list[Step]
    #: Whether the race is settled after each step.
    settled: list[bool]
    outcome: RaceOutcome


RACES = {
    "the nearest tier's hit wins at once": RaceCase(
        3, [(0, HIT, 0.0)], [True], RaceOutcome(0, (), ())
    ),
    "a far hit waits for every nearer tier, then back-fills those that answered absent": RaceCase(
        3,
        [(2, HIT, 0.0), (0, ABSENT, 0.001), (1, ABSENT, 0.002)],
        [False, False, True],
        RaceOutcome(2, (0, 1), (ABSENT, ABSENT)),
    ),
    "a far hit is taken once the nearer tiers missed, whatever their reason": RaceCase(
        3,
        [(1, HIT, 0.0), (0, "timeout", 0.5)],
        [False, True],
        RaceOutcome(1, (), ("timeout",)),
    ),
    "a farther tier still running is not waited for": RaceCase(
        3, [(0, ABSENT, 0.0), (1, HIT, 0.001)], [False, True], RaceOutcome(1, (0,), (ABSENT,))
    ),
    "a nearer hit replaces a held farther one": RaceCase(
        3,
        [(2, HIT, 0.0), (1, HIT, 0.001), (0, ABSENT, 0.002)],
        [False, False, True],
        RaceOutcome(1, (0,), (ABSENT,)),
    ),
    "a farther hit does not replace a held nearer one": RaceCase(
        3,
        [(1, HIT, 0.0), (2, HIT, 0.001), (0, "error", 0.002)],
        [False, False, True],
        RaceOutcome(1, (), ("error",)),
    ),
    "the held hit wins when the grace runs out": RaceCase(
        3,
        [(0, ABSENT, 0.0), (2, HIT, 0.001), None],
        [False, False, True],
        RaceOutcome(2, (0,), (ABSENT,)),
    ),
    "refused, failed nearer tiers and a farther absent one are no back-fill targets": RaceCase(
        4,
        [(3, ABSENT, 0.0), (0, REFUSED, 0.001), (1, "error", 0.002), (2, HIT, 0.003)],
        [False, False, False, True],
        RaceOutcome(2, (), (ABSENT, REFUSED, "error")),
    ),
    "a farther tier that answered absent first is counted, not back-filled": RaceCase(
        3,
        [(2, ABSENT, 0.0), (0, ABSENT, 0.001), (1, HIT, 0.002)],
        [False, False, True],
        RaceOutcome(1, (0,), (ABSENT, ABSENT)),
    ),
    "every tier missed: a miss with each reason, in the order they came": RaceCase(
        3,
        [(2, "too_large", 0.0), (0, ABSENT, 0.001), (1, REFUSED, 0.002)],
        [False, False, True],
        RaceOutcome(None, (), ("too_large", ABSENT, REFUSED)),
    ),
    "no tier asked: a miss at once": RaceCase(0, [], [], RaceOutcome(None, (), ())),
}


@pytest.mark.parametrize("case", RACES.values(), ids=RACES.keys())
def test_a_race_serves_the_nearest_hit_it_may(case: RaceCase) -> None:
    race = Race(case.tiers, GRACE)
    settled = []
    for step in case.steps:
        if step is None:
            race.grace_over()
        else:
            race.answer(*step)
        settled.append(race.settled)
    assert settled == case.settled
    assert race.settled
    assert race.outcome() == case.outcome


@pytest.mark.parametrize(
    ("steps", "now", "expected"),
    [
        ([], 5.0, None),  # nothing held: each tier's own deadline bounds the wait
        ([(1, ABSENT, 10.0)], 10.0, None),  # a miss holds nothing
        ([(1, HIT, 10.0)], 10.0, GRACE),
        ([(1, HIT, 10.0)], 10.015, GRACE - 0.015),
        ([(1, HIT, 10.0)], 10.5, 0.0),  # over: never a negative wait
        # each answer that leaves the race open starts the grace again
        ([(1, HIT, 10.0), (2, ABSENT, 10.01)], 10.01, GRACE),
        ([(2, HIT, 10.0), (1, HIT, 10.005)], 10.005, GRACE),
    ],
)
def test_a_held_hit_waits_the_grace_from_the_last_answer(
    steps: list[tuple[int, str, float]], now: float, expected: float | None
) -> None:
    race = Race(3, GRACE)
    for step in steps:
        race.answer(*step)
    waited = race.wait_s(now)
    if expected is None:
        assert waited is None
    else:
        assert waited == pytest.approx(expected, abs=1e-9)


def test_the_grace_is_the_races_own() -> None:
    race = Race(2, 0.5)
    race.answer(1, HIT, 3.0)
    assert race.wait_s(3.25) == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("misuse", "message"),
    [
        (lambda race: race.answer(3, HIT, 0.0), "cannot answer"),
        (lambda race: race.answer(-1, HIT, 0.0), "cannot answer"),
        (lambda race: (race.answer(0, ABSENT, 0.0), race.answer(0, HIT, 0.0)), "cannot answer"),
        (lambda race: race.grace_over(), "no hit is held"),
        (lambda race: (race.answer(0, ABSENT, 0.0), race.grace_over()), "no hit is held"),
        (lambda race: race.outcome(), "still running"),
        (lambda race: (race.answer(2, HIT, 0.0), race.outcome()), "still running"),
    ],
)
def test_a_race_refuses_what_cannot_happen(misuse: Callable[[Race], object], message: str) -> None:
    race = Race(3, GRACE)
    with pytest.raises(ValueError, match=message):
        misuse(race)


@pytest.mark.parametrize(
    ("reasons", "expected"),
    [
        ([ABSENT], SHARED_MISS),
        ([ABSENT, ABSENT, ABSENT], SHARED_MISS),
        ([], UNSHARED),  # no tier asked: nothing learned to share
        ([ABSENT, BREAKER], UNSHARED),
        ([ABSENT, "timeout"], UNSHARED),
        (["error", ABSENT], UNSHARED),
        ([REFUSED], UNSHARED),
        ([ABSENT, "too_large"], UNSHARED),
    ],
)
def test_only_absent_everywhere_is_a_shared_miss(reasons: list[str], expected: str) -> None:
    assert lease_outcome_of_miss(reasons) == expected


@pytest.mark.parametrize(("stored", "expected"), [(True, LANDED), (False, UNSHARED)])
def test_a_write_through_lets_the_lease_go_as_landed_only_once_stored(
    stored: bool, expected: str
) -> None:
    assert lease_outcome_of_write(stored) == expected


def test_the_lease_outcomes_are_the_node_lease_files_words() -> None:
    """objcache/core/fetch_once/nodelease.py publishes these strings for the other processes to
    read."""
    assert (LANDED, SHARED_MISS, UNSHARED) == ("hit", "miss", "")


@pytest.mark.parametrize(
    ("wait", "tier", "expected"),
    [
        (True, LEASED_ELSEWHERE, True),  # a lookup that joined a prefetch's skipped fetch
        (False, LEASED_ELSEWHERE, False),  # the prefetch itself leaves it to the other process
        (True, "", False),  # a miss is an answer
        (True, "mem://r", False),
        (True, "mem://local", False),
    ],
)
def test_a_waiting_lookup_fetches_again_only_what_was_left_to_another_process(
    wait: bool, tier: str, expected: bool
) -> None:
    assert fetch_again(wait, tier) is expected


def test_leased_elsewhere_is_no_tier_name() -> None:
    """A tier's name is its URL: the marker cannot be mistaken for one, nor for a miss."""
    assert "://" not in LEASED_ELSEWHERE and LEASED_ELSEWHERE != ""


@dataclass(frozen=True)
class AfterCase:
    hit: bool
    reasons: list[str]
    absent_writable: list[bool]
    local: bool
    leased: bool
    read_only: bool
    expected: AfterRace


AFTER = {
    "a hit is written through and back-filled into the writable nearer tiers": AfterCase(
        True, [ABSENT, ABSENT], [True, True], True, False, False, AfterRace(True, None, (0, 1))
    ),
    "a read-only nearer tier is not back-filled": AfterCase(
        True, [ABSENT, ABSENT], [False, True], True, False, False, AfterRace(True, None, (1,))
    ),
    "read-only mode back-fills nothing, and still writes through": AfterCase(
        True, [ABSENT], [True], True, False, True, AfterRace(True, None, ())
    ),
    "a held lease is let go of by the write-through": AfterCase(
        True, [], [], True, True, False, AfterRace(True, None, ())
    ),
    "without a local tier nothing is written through; a held lease is let go of now": AfterCase(
        True, [ABSENT], [True], False, True, False, AfterRace(False, UNSHARED, (0,))
    ),
    "without a local tier or a lease a hit is only back-filled": AfterCase(
        True, [ABSENT], [True], False, False, False, AfterRace(False, None, (0,))
    ),
    "a miss absent everywhere is shared through the lease": AfterCase(
        False, [ABSENT, ABSENT], [], True, True, False, AfterRace(False, SHARED_MISS, ())
    ),
    "a miss with an error is not shared": AfterCase(
        False, [ABSENT, "error"], [], True, True, False, AfterRace(False, UNSHARED, ())
    ),
    "a miss without a lease lets nothing go": AfterCase(
        False, [ABSENT], [], True, False, False, AfterRace(False, None, ())
    ),
}


@pytest.mark.parametrize("case", AFTER.values(), ids=AFTER.keys())
def test_what_a_fetch_does_once_its_race_ended(case: AfterCase) -> None:
    got = after_race(
        case.hit,
        case.reasons,
        case.absent_writable,
        local=case.local,
        leased=case.leased,
        read_only=case.read_only,
    )
    assert got == case.expected
