"""Call policies, in one place: deadlines, retries and the circuit breaker.

``call_with_policy`` runs one backend call under a hard deadline (``asyncio.timeout``),
retrying transient errors with jittered exponential backoff (tenacity) while time remains.
The breaker opens after N consecutive failures; while open, calls are skipped at no cost;
after a cool-down one probe call is let through (half-open) and its outcome closes or
re-opens the breaker.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from objcache.backends.shared import RANDOM
from objcache.errors import PartialOutage, TransientBackendError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    timeout_s: float = 3.0
    retries: int = 2
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 1.0


class CircuitBreaker:
    """Consecutive-failure breaker with a half-open probe. Event-loop-thread only."""

    def __init__(
        self,
        failures: int = 5,
        cooldown_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = failures
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False
        self._claims = 0  # probe slots claimed so far: which probe holds the slot

    @property
    def state(self) -> str:
        if self._opened_at is None:
            return "closed"
        if self._clock() - self._opened_at >= self.cooldown_s:
            return "half-open"
        return "open"

    def allow(self) -> bool:
        """Whether a call may go through now (claims the probe slot when half-open)."""
        state = self.state
        if state == "closed":
            return True
        if state == "half-open" and not self._probing:
            self._probing = True
            self._claims += 1
            return True
        return False

    @property
    def probe(self) -> int | None:
        """The probe in flight, if any (read right after :meth:`allow` returned True: the
        call's own, where it claimed the slot)."""
        return self._claims if self._probing else None

    def release(self, probe: int) -> None:
        """End ``probe`` without a verdict (a partial outage, a cancelled call) where it still
        holds the slot: the breaker stays as it is and the next call probes again. A slot left
        claimed would refuse every later call for good."""
        if self._probing and self._claims == probe:
            self._probing = False

    def success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._probing = False

    def failure(self) -> bool:
        """Record a failure; returns True when this failure opened the breaker."""
        self._failures += 1
        was_probe, self._probing = self._probing, False
        if was_probe or (self._opened_at is None and self._failures >= self.threshold):
            self._opened_at = self._clock()
            return not was_probe
        return False


class NoBreaker(CircuitBreaker):
    """A breaker that never opens: every call is tried (maintenance commands)."""

    def __init__(self) -> None:
        super().__init__(failures=0, cooldown_s=0.0)

    def allow(self) -> bool:
        return True

    def failure(self) -> bool:
        return False


def retried(error: BaseException) -> bool:
    """Whether a failed attempt is tried again: a transient error, but not a
    :class:`PartialOutage` (one server of a sharded store that failed or stayed silent is
    its keys' miss: trying it again would spend the rest of the deadline on it,
    docs/architecture.md, "Redis Cluster")."""
    return isinstance(error, (TransientBackendError, ConnectionError)) and not isinstance(
        error, PartialOutage
    )


async def call_with_policy(fn: Callable[[], Awaitable[T]], policy: RetryPolicy) -> T:
    """Run ``fn`` with retries of transient errors, all within ``policy.timeout_s``.

    Raises ``TimeoutError`` when the deadline passes, or the last error.
    """
    timeout = policy.timeout_s if policy.timeout_s > 0 else None
    if policy.retries <= 0:  # one attempt: no retry machinery per call (listing pages)
        return await within(fn(), timeout)

    async def attempts() -> T:
        # The first attempt without tenacity's machinery (about 25 us a call): nearly every
        # call succeeds at once, and a bulk command makes thousands (docs/architecture.md,
        # "Policies"). After a retried error the waits are tenacity's as before: the first
        # one here, the later ones with the multiplier doubled, which is
        # wait_random_exponential's schedule shifted by the attempt already made.
        try:
            return await fn()
        except Exception as exc:
            if not retried(exc):
                raise
        await asyncio.sleep(RANDOM.uniform(0, min(policy.backoff_max_s, policy.backoff_initial_s)))
        # imported at the first retry: a compile process that never retries never pays it
        from tenacity import (
            AsyncRetrying,
            retry_if_exception,
            stop_after_attempt,
            wait_exponential,
        )

        # wait_random_exponential's waits, drawn from objcache's own numbers (tenacity's draw
        # from Python's shared ``random``)
        ceiling = wait_exponential(
            multiplier=2 * policy.backoff_initial_s, max=policy.backoff_max_s
        )

        retrying = AsyncRetrying(
            stop=stop_after_attempt(policy.retries),
            wait=lambda state: RANDOM.uniform(0, ceiling(state)),
            retry=retry_if_exception(retried),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await fn()
        raise AssertionError("unreachable")  # pragma: no cover

    return await within(attempts(), timeout)


async def within(call: Awaitable[T], timeout: float | None) -> T:
    """``await call``, cancelled with ``TimeoutError`` after ``timeout`` seconds (None: no
    limit). Python 3.11's ``asyncio.timeout`` runs it in the caller's task, where
    ``asyncio.wait_for`` made a task of it: half the cost, on every call of every tier
    (docs/architecture.md, "Policies")."""
    if timeout is None:
        return await call
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await call
    return await asyncio.wait_for(call, timeout)  # pragma: no cover (Python 3.10)
