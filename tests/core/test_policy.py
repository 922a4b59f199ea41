"""Deadlines, retries and the circuit breaker."""

from __future__ import annotations

import asyncio
import time

import pytest

from objcache.core.policy import CircuitBreaker, RetryPolicy, call_with_policy
from objcache.errors import PartialOutage, PermanentBackendError, TransientBackendError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_n_failures_and_probes_after_cooldown() -> None:
    clock = Clock()
    b = CircuitBreaker(failures=3, cooldown_s=10, clock=clock)
    assert [b.failure() for _ in range(3)] == [False, False, True]
    assert b.state == "open" and not b.allow()
    clock.now = 10
    assert b.state == "half-open"
    assert b.allow() and not b.allow(), "exactly one probe passes while half-open"
    b.failure()  # the probe failed: open again for a full cool-down
    assert b.state == "open"
    clock.now = 20
    assert b.allow()
    b.success()
    assert b.state == "closed" and b.allow()


def test_a_probe_released_without_a_verdict_frees_only_its_own_slot() -> None:
    """A probe that ended with no verdict gives its slot back; a late release of an older
    probe leaves a newer probe's slot alone (one probe at a time)."""
    clock = Clock()
    b = CircuitBreaker(failures=1, cooldown_s=10, clock=clock)
    b.failure()
    clock.now = 10
    assert b.allow()
    first = b.probe
    assert first is not None
    b.release(first)
    assert b.state == "half-open" and b.probe is None
    assert b.allow()  # the next call probes
    second = b.probe
    b.failure()  # that probe failed: open again
    clock.now = 20
    assert b.allow()
    third = b.probe
    assert second is not None and third not in (None, second)
    b.release(second)  # an older probe's late release
    assert b.probe == third and not b.allow()


def test_success_resets_the_consecutive_count() -> None:
    b = CircuitBreaker(failures=2, cooldown_s=1, clock=Clock())
    b.failure()
    b.success()
    b.failure()
    assert b.state == "closed"


async def test_transient_errors_are_retried_within_the_deadline() -> None:
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise TransientBackendError("503")
        return "ok"

    policy = RetryPolicy(timeout_s=2, retries=2, backoff_initial_s=0.001, backoff_max_s=0.01)
    assert await call_with_policy(flaky, policy) == "ok"
    assert calls == 3


@pytest.mark.parametrize(
    "error",
    [
        PermanentBackendError("AccessDenied"),
        # one node of a cluster: its keys' miss, not worth the rest of the deadline
        PartialOutage("get: TimeoutError: Timeout reading from 10.0.0.7:6379"),
    ],
)
async def test_permanent_errors_and_partial_outages_are_not_retried(error: Exception) -> None:
    calls = 0

    async def denied() -> None:
        nonlocal calls
        calls += 1
        raise error

    with pytest.raises(type(error)):
        await call_with_policy(denied, RetryPolicy(retries=5, backoff_initial_s=0.001))
    assert calls == 1


async def test_deadline_bounds_a_hanging_call() -> None:
    async def hang() -> None:
        await asyncio.sleep(60)

    started = time.perf_counter()
    with pytest.raises((asyncio.TimeoutError, TimeoutError)):
        await call_with_policy(hang, RetryPolicy(timeout_s=0.2))
    assert time.perf_counter() - started < 10  # the call itself hangs for 60 s


async def always_transient(calls: list[float]) -> None:
    calls.append(time.perf_counter())
    raise TransientBackendError("503")


async def test_retries_stop_after_the_configured_count() -> None:
    calls: list[float] = []
    policy = RetryPolicy(timeout_s=5, retries=3, backoff_initial_s=0.001, backoff_max_s=0.002)
    with pytest.raises(TransientBackendError):
        await call_with_policy(lambda: always_transient(calls), policy)
    assert len(calls) == 4, "one call and three retries"


async def test_backoff_waits_between_attempts_up_to_its_cap() -> None:
    # Jittered: each wait is uniform in [0, min(cap, initial * 2**n)]. Ten waits of up to
    # 50 ms all but never sum to under 50 ms, and without the cap they would outlast 5 s.
    calls: list[float] = []
    capped = RetryPolicy(timeout_s=5, retries=10, backoff_initial_s=0.05, backoff_max_s=0.05)
    with pytest.raises(TransientBackendError):
        await call_with_policy(lambda: always_transient(calls), capped)
    assert len(calls) == 11 and calls[-1] - calls[0] >= 0.05


async def test_backoff_grows_from_the_initial_wait() -> None:
    # Waits of at most 2, 4 and 8 ms, each drawn from the initial wait doubled: the waits
    # asked for are read, not timed (a busy machine stretches any sleep).
    asked: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        asked.append(delay)
        await real_sleep(0)

    calls: list[float] = []
    quick = RetryPolicy(timeout_s=30, retries=3, backoff_initial_s=0.001, backoff_max_s=10)
    with pytest.MonkeyPatch.context() as m:
        m.setattr("objcache.core.policy.asyncio.sleep", sleep)
        with pytest.raises(TransientBackendError):
            await call_with_policy(lambda: always_transient(calls), quick)
    assert len(calls) == 4 and len(asked) == 3
    assert all(0 <= wait <= 0.001 * 2 ** (n + 1) for n, wait in enumerate(asked)), asked


async def test_a_zero_timeout_means_no_deadline() -> None:
    async def slow() -> str:
        await asyncio.sleep(0.05)
        return "ok"

    assert await call_with_policy(slow, RetryPolicy(timeout_s=0)) == "ok"
