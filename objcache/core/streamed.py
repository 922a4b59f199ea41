"""A remote entry into the local tier as it arrives (docs/architecture.md, "Streamed entries").

``objcache pull --job`` and the start-up prefetch in its own process (prefetches whose
entries nothing in their process serves) ask for each entry this way. The remote tier hands
the body in pieces where it can (:meth:`~objcache.backends.base.Backend.get_into`); a body
of :data:`STREAM_FROM` bytes or more goes to a temp file in the entry's local folder piece
by piece, each piece through the entry's check on the way
(:class:`~objcache.entry.codec.StreamCheck`: the header at once, the digest as the bytes
pass), in a worker thread while the next piece arrives, and is published under its name
only once the whole verifies; a smaller body is gathered and takes the ordinary way
(verified whole, written through). Nothing unverified is ever under an entry's name, and a
large entry costs a few pieces of memory, not its size twice over (the whole body, then
its payload).

Only where the answer is one remote tier's (one readable, its breaker closed) and the local
tier writes in pieces (``disk://``); anything else is :meth:`TieredCache.get_object`'s fetch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from objcache.backends.base import PendingWrite, PutMode, WritesInPieces
from objcache.backends.shared import blocking_pool
from objcache.core.fetch_once.leased_lookup import let_go
from objcache.core.fetch_once.nodelease import Lease
from objcache.core.read_decision import REFUSED, UNSHARED, after_race, lease_outcome_of_write
from objcache.core.tier import Tier
from objcache.entry.codec import HEADER_SIZE, StreamCheck
from objcache.errors import BackendError, EntryError

if TYPE_CHECKING:
    from objcache.core.tiered import TieredCache

#: Bodies at least this big are written to their local file as they arrive.
STREAM_FROM = 1 << 20
#: Bytes gathered before they are handed to the writing thread.
PIECE = 1 << 20
#: The first bytes of a body checked on arrival: the header and the longest signature.
HEAD_BYTES = HEADER_SIZE + 64


class LocalWriteFailed(Exception):
    """The local tier could not take a piece: its failure, not the remote tier's."""


class Landing:
    """One attempt's body (:class:`~objcache.backends.base.Sink`): gathered whole when small,
    else checked and written piece by piece; :meth:`finish` or :meth:`discard` ends it.
    ``len()`` is the bytes received. What refuses the entry or fails the local write
    (not the remote tier's doing) is kept in :attr:`error` and ends the transfer.

    The local file's work (its opening, each hand-over of pieces) runs in the blocking pool
    one step at a time, the loop receiving the next pieces meanwhile; a step is never
    cancelled half-way (a cancelled caller leaves it to end in its thread), and
    :meth:`discard` drops the file once the last step has ended, without waiting for it."""

    def __init__(self, store: WritesInPieces, check: StreamCheck, okey: str) -> None:
        self._store, self._check, self._okey = store, check, okey
        self.whole = b""
        self.pending: PendingWrite | None = None
        self.error: EntryError | LocalWriteFailed | None = None
        self._streaming = False
        self._received = 0
        self._held: list[tuple[bytes | memoryview, bool]] = []
        self._held_bytes = 0
        #: The last step handed to the blocking pool (a thread's own future).
        self._step: concurrent.futures.Future[None] | None = None
        self._discarded = False

    def __len__(self) -> int:
        return self._received

    @property
    def streaming(self) -> bool:
        """Whether the body goes to the local file as it arrives (else: :attr:`whole`)."""
        return self._streaming

    async def begin(self, size: int | None) -> bool:
        if size is None or size < STREAM_FROM:
            return False
        self._streaming = True
        await self._run(self._open)
        return True

    def _open(self) -> None:
        try:
            self.pending = self._store.open_write(self._okey)
        except (BackendError, OSError) as exc:
            raise LocalWriteFailed(str(exc)) from exc
        if self._discarded:  # dropped while this step ran
            self._drop()

    async def piece(self, data: bytes) -> None:
        self._received += len(data)
        if not self._streaming:
            self.whole += data
            return
        if self._check.length is None:
            # the header is checked on arrival (a refusal stops the transfer at its first
            # piece); the rest is checked in the writing thread
            head = memoryview(data)[:HEAD_BYTES]
            self._check.feed(head)
            self._held.append((head, True))
            self._held.append((memoryview(data)[HEAD_BYTES:], False))
        else:
            self._held.append((data, False))
        self._held_bytes += len(data)
        if self._held_bytes >= PIECE:
            await self._hand_over()

    async def _hand_over(self) -> None:
        """Give the held pieces to the blocking pool, once the previous step is done."""
        pieces, self._held, self._held_bytes = self._held, [], 0
        await self._run(functools.partial(self._write, pieces))

    async def _run(self, step: Callable[[], None]) -> None:
        """Wait for the previous step, then start ``step`` (its end is awaited by the next
        call, :meth:`finish` or nobody: the loop receives meanwhile)."""
        if self._step is not None:
            await asyncio.wrap_future(self._step)
        self._step = blocking_pool().submit(step)

    def _write(self, pieces: list[tuple[bytes | memoryview, bool]]) -> None:
        for data, checked in pieces:
            if not checked:
                self._check.feed(data)
            if self.pending is None:
                return  # dropped
            try:
                self.pending.write(data)
            except OSError as exc:
                raise LocalWriteFailed(str(exc)) from exc

    async def finish(self) -> int:
        """Every piece written and the whole verified (raises the entry's error): the
        payload's length."""
        await self._hand_over()
        assert self._step is not None
        await asyncio.wrap_future(self._step)
        self._check.finish()
        assert self._check.length is not None
        return self._check.length

    def discard(self) -> None:
        """Drop what was written (the attempt failed or the entry did not verify): at once
        where no step runs, else as the running one ends, in its thread."""
        self._discarded = True
        step = self._step
        if step is None or step.done():
            self._drop()
        else:
            step.add_done_callback(lambda _: self._drop())

    async def close(self) -> None:
        """:meth:`discard`, and the running step's end awaited: its file is gone when this
        returns (a cancelled wait leaves it to :meth:`discard`'s callback)."""
        self.discard()
        step = self._step
        if step is not None and not step.done():
            with contextlib.suppress(Exception):  # the step's own error: the attempt's, told
                await asyncio.shield(asyncio.wrap_future(step))
        self._drop()

    def _drop(self) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            with contextlib.suppress(OSError):
                pending.discard()


def only_remote(cache: TieredCache) -> Tier | None:
    """The one remote tier a fetch asks (one readable, its breaker closed), or None."""
    readable = [t for t in cache.remotes if t.readable]
    if len(readable) != 1 or readable[0].breaker_open():
        return None
    return readable[0]


async def fetch(cache: TieredCache, okey: str) -> tuple[int | None, str]:
    """``(bytes fetched, tier)`` of a prefetched entry nothing in this process serves, as
    ``cache.get_object(okey, wait=False, absent_locally=True)`` answers it but without the
    payload: ``(None, LEASED_ELSEWHERE)`` for a key another process of the node fetches,
    ``(None, "")`` on a miss. A lookup of the same key in this process meanwhile does not
    join it (``objcache pull --job`` and the prefetch process make none)."""
    tier = only_remote(cache)
    store = cache.local_store
    local = cache.local
    if (
        tier is None
        or local is None
        or not isinstance(store, WritesInPieces)
        or local.flags.max_size  # its cap is checked by the ordinary write
        or local.breaker_open()
    ):
        payload, name = await cache.get_object(okey, wait=False, absent_locally=True)
        return (None if payload is None else len(payload)), name
    lease: Lease | None = None
    if cache.leases is not None:
        found, lease, elsewhere = await cache.claim(okey, wait=False, absent_locally=True)
        if found is not None:
            return len(found), cache.local.name
        if elsewhere is not None:
            return None, elsewhere
    try:
        landed = await _land(cache, tier, store, okey, lease)
    except BaseException:
        if lease is not None:
            await lease.release(UNSHARED)
        raise
    if landed is None:
        return None, ""
    cache.recorded.add(okey)
    return landed, tier.name


async def _land(
    cache: TieredCache, tier: Tier, store: WritesInPieces, okey: str, lease: Lease | None
) -> int | None:
    """The entry's bytes from ``tier`` into the local tier: how many, or None (a miss,
    counted; the lease, if held, let go of with the miss's outcome)."""
    cap = cache.cap(okey)
    landing: Landing | None = None

    async def attempt() -> Landing | None:
        nonlocal landing
        if landing is not None:  # a retried attempt starts over
            await landing.close()
        landing = Landing(store, cache.codec.stream_check(okey, cap), okey)
        found = False
        try:
            found = await tier.backend.get_into(okey, cap, landing)
        except (EntryError, LocalWriteFailed) as exc:
            landing.error = exc  # the tier answered: not a failure of its own
        return landing if found or landing.error is not None else None

    size: int | None = None
    try:
        got, reason = await tier.get_with(okey, attempt)
        if got is not None:
            size = await _settle(cache, tier, okey, got, lease)
            reason = REFUSED
    except BaseException:  # cancelled: the file goes as its running step ends
        if landing is not None:
            landing.discard()
        raise
    if landing is not None:  # nothing of the attempt left once it is answered
        await landing.close()
    if size is not None:
        return size
    if lease is not None:
        then = after_race(False, [reason], [], local=True, leased=True, read_only=cache.read_only)
        if then.release is not None:
            await lease.release(then.release)
    return None


async def _settle(
    cache: TieredCache,
    tier: Tier,
    okey: str,
    landing: Landing,
    lease: Lease | None,
) -> int | None:
    """What an attempt received, verified and in the local tier: its payload's length, or
    None (refused, or the local write failed: counted)."""
    try:
        if landing.error is not None:
            raise landing.error
        if not landing.streaming:  # a small body: verified whole and written through
            payload = await cache.verify(tier, okey, landing.whole)
            if payload is None:
                return None
            tier.hit(okey)
            await cache.write_through(okey, landing.whole, lease)
            return len(payload)
        length = await landing.finish()
    except EntryError as exc:
        tier.refused(okey, exc)
        return None
    except LocalWriteFailed:
        assert cache.local is not None
        cache.local.put_skipped("error")
        return None
    tier.hit(okey)
    assert cache.local is not None and landing.pending is not None
    pending, landing.pending = landing.pending, None
    then = None if lease is None else functools.partial(let_go, lease)
    stored = await cache.local.publish(pending, PutMode.OVERWRITE, then)
    if stored:
        cache.stats.write_through += 1
    else:  # never published (the tier refused the write): its file goes
        with contextlib.suppress(OSError):
            pending.discard()
    if lease is not None:
        await lease.release(lease_outcome_of_write(stored))
    return length if stored else None
