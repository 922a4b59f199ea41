"""Cross-process single-flight in the local tier: one remote fetch per key per node.

Processes that share a local dir (the ranks of one node) coordinate through a lease file
beside the entry, ``<dir>/.objcache-lease-<name>`` (the reserved prefix keeps it out of
listings). See docs/architecture.md, "One remote fetch per node".

Lease files are reached as the local tier reaches its entries (docs/security.md, "Local
filesystem"): the key is checked first, then :meth:`FsFolders.open_lease` walks from the
root, which must pass the store's owner and mode check, one ``O_NOFOLLOW`` folder at a time
(folders created 0700, any folder another user owns or others can write refused), and
creates the file 0600 relative to its folder's fd. That fd is kept with the file: every
later look, unlink or reopen of the lease acts relative to it, never by path. Where any of
this fails there is no lease (``Claim.UNLEASED``): the lookup fetches on its own.

* The first process to miss a key creates the lease file and takes an exclusive
  ``flock`` on it, then writes its record: pid, host, deadline. It fetches and writes the
  entry through to the local tier, then writes the outcome (``hit`` or ``miss``) into the
  record, unlinks the file and closes it (which releases the lock).
* Every other process opens the same file and waits for the lock to be let go: a daemon
  thread blocks on a shared ``flock`` of the file, so the waiter wakes the moment the holder
  unlocks, without spending CPU meanwhile; it also looks every 16 ms (holder deadlines, and
  NFS, where a blocked lock may be granted late). Once the record holds an outcome it reads
  the entry locally (or shares the miss). With too many threads blocked already (holders
  that hang), a waiter polls instead, pausing an eighth of the time it has waited (1 to
  16 ms). The entry itself is published atomically by the local tier, so nothing partial is
  ever read.
* A holder that dies (``kill -9`` included) loses its lock with its process: the next poll
  takes the lock, sees a record without an outcome and takes the lease over.
* A holder that overran the deadline in its record (hung, or on another NFS client that
  crashed) has its file unlinked by a waiter, which then starts over on a fresh file.
* A waiter waits at most its own budget; then it fetches on its own. Nothing waits forever.

Every step is a few non-blocking syscalls, run in one worker-thread hop like every other
local-disk operation. :meth:`NodeLeases.lookup` also reads the entry in those hops (before
the lease file is opened, right after the lease is taken, and in the waking thread once
the holder's outcome says it landed), so a lookup costs the hops of a lookup without
single-flight: each hop is comparable to a loopback GET, and on a node whose ranks walk
the same keys in lockstep every extra one is paid on every key (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from objcache.backends.fs_folders import LEASE_PREFIX, FsFolders, check_key
from objcache.backends.shared import to_daemon_thread
from objcache.config.files import O_CLOEXEC, O_NOFOLLOW
from objcache.errors import BackendError

#: Size of the record; padded with spaces so the outcome overwrites it in one pwrite.
RECORD_BYTES = 256
#: Pause between two polls of a held lease: this fraction of the time waited so far,
#: within [POLL_FIRST_S, POLL_MAX_S]. (A fixed doubling to 16 ms overshot the typical
#: millisecond fetch by several ms per key: +11% wall for 8 ranks, docs/benchmarks.md.)
POLL_FRACTION = 0.125
POLL_FIRST_S = 0.001
POLL_MAX_S = 0.016


class _File:
    """An open lease file: its folder's fd, its name there and its own fd."""

    def __init__(self, directory: int, name: str, fd: int, path: str) -> None:
        self.directory = directory
        self.name = name
        self.fd = fd
        #: Where it is, for humans and tests; never opened by this path.
        self.path = path

    def close(self) -> None:
        try:
            os.close(self.fd)
        finally:
            os.close(self.directory)


class Claim(enum.Enum):
    """What :meth:`NodeLeases.claim` found."""

    #: The entry is in the local tier already: no lease file was opened (only from
    #: :meth:`NodeLeases.lookup` with ``look_first``).
    LOCAL = "local"
    #: This process holds the lease: fetch, then :meth:`Lease.release`.
    HELD = "held"
    #: Another process fetched the entry into the local tier: read it there.
    LANDED = "landed"
    #: Another process found no entry in any remote tier just now: a shared miss.
    MISSED = "missed"
    #: Another live process is fetching it (only without ``wait``).
    BUSY = "busy"
    #: Waited the whole budget, or the lease could not be used: fetch without one.
    UNLEASED = "unleased"


class Lease:
    """A held lease; :meth:`release` exactly once (a second call does nothing)."""

    def __init__(self, file: _File, took_over: bool) -> None:
        self.path = file.path
        self._name = file.name
        #: The lease file's fd and its folder's; both None once let go of.
        self._fd: int | None = file.fd
        self._dir: int | None = file.directory
        #: A write-through lets the lease go in its worker thread, the loop on a failure.
        self._lock = threading.Lock()
        #: A dead or overdue holder's record was found under the lock.
        self.took_over = took_over

    def release_sync(self, outcome: str) -> None:
        """Publish ``outcome`` (``hit``, ``miss`` or ``""`` for none), retire the file, unlock.
        Any thread; the first call wins."""
        with self._lock:
            fd, self._fd = self._fd, None
            directory, self._dir = self._dir, None
        if fd is None or directory is None:
            for left in (fd, directory):
                if left is not None:
                    os.close(left)
            return
        file = _File(directory, self._name, fd, self.path)
        try:
            # The outcome may not fit (a full disk): the file is retired all the same, and a
            # waiter that finds it retired without an outcome starts over.
            with contextlib.suppress(OSError):
                if outcome:
                    _write_record(fd, {**_owner(), "deadline": 0.0, "outcome": outcome})
            _retire(file)
        finally:
            file.close()

    async def release(self, outcome: str) -> None:
        if self._fd is not None or self._dir is not None:
            await to_daemon_thread(self.release_sync, outcome)

    def __del__(self) -> None:  # a lost lease must not keep its lock until exit
        for left in (self._fd, self._dir):
            if left is not None:
                with contextlib.suppress(OSError):
                    os.close(left)


@dataclass
class _Step:
    claim: Claim | None
    lease: Lease | None = None
    #: The holder's deadline (epoch seconds) when the lease is held by someone else.
    holder_deadline: float | None = None
    #: The file was retired (unlinked) without an outcome: open the path again.
    retired: bool = False
    #: The local entry, read in the same hop (LOCAL, LANDED).
    entry: bytes | None = None
    #: The step closed the file itself (a lease it took and let go of at once).
    closed: bool = False


#: A blocking read of one local entry: its bytes, or None when it is not there.
Read = Callable[[], bytes | None]


def _look(read: Read | None) -> bytes | None:
    """``read()``; a read that fails is a miss (the lookup goes on to the remote tiers)."""
    if read is None:
        return None
    try:
        return read()
    except Exception:
        return None


def poll_pause(waited_s: float) -> float:
    """Seconds to sleep before the next poll, having waited ``waited_s`` so far."""
    return min(POLL_MAX_S, max(POLL_FIRST_S, waited_s * POLL_FRACTION))


def lease_path(root: str, key: str) -> str:
    """Where the lease file of ``key`` (a valid local-tier key) is under ``root``; for
    humans and tests: leases themselves are opened through the folder walk."""
    directory, _, name = key.rpartition("/")
    return os.path.join(root, directory, LEASE_PREFIX + name)


class NodeLeases:
    """Lease files of one local-tier directory."""

    def __init__(self, root: str, *, hold_s: float, store: FsFolders | None = None) -> None:
        self.root = os.path.abspath(root)
        #: The local tier's folders (its store's walk and checks); its own if not given.
        self.store = store or FsFolders(self.root)
        #: How long a holder may take: its deadline is now + hold_s. Waiters wait at most
        #: this long too.
        self.hold_s = hold_s

    async def claim(self, key: str, *, wait: bool = True) -> tuple[Claim, Lease | None]:
        """Take the lease of ``key``, or wait for the process holding it (see module doc)."""
        claim, lease, _ = await self.lookup(key, wait=wait)
        return claim, lease

    async def lookup(
        self, key: str, *, read: Read | None = None, wait: bool = True, look_first: bool = True
    ) -> tuple[Claim, Lease | None, bytes | None]:
        """:meth:`claim`, with the local entry read in the same worker-thread hops.

        ``read`` is a blocking read of the entry (None when absent). It runs before the
        lease file is opened (``look_first``; a hit is ``Claim.LOCAL``), right after the
        lease is taken (the entry may have landed since the caller looked: the lease is
        let go of as a hit and the answer is ``Claim.LANDED``), and wherever another
        process's outcome says the entry landed, the waking thread included. The third
        element is what it read; None for LANDED means the entry was gone again (evicted).
        """
        try:
            check_key(key)  # before any file is opened: the key names a path below the root
        except BackendError:
            return Claim.UNLEASED, None, None
        started = time.monotonic()
        give_up = started + self.hold_s
        file: _File | None = None
        waker: _Waker | None = None
        try:
            while True:
                if file is None:
                    file, step = await to_daemon_thread(
                        _open_and_try, self.store, key, self.hold_s, read, look_first
                    )
                else:
                    step = await to_daemon_thread(_try, file, self.hold_s, read)
                if step.claim is not None:
                    if step.lease is not None or step.closed:
                        file = None  # owned by the lease now, or closed already
                    return step.claim, step.lease, step.entry
                assert file is not None  # only a step that found the entry opens no file
                if step.retired:  # retired without an outcome: start over
                    file.close()
                    file = None
                    continue
                if not wait:
                    return Claim.BUSY, None, None
                if step.holder_deadline is not None and time.time() > step.holder_deadline:
                    await to_daemon_thread(_retire, file)  # overdue holder
                    file.close()
                    file = None
                    continue
                now = time.monotonic()
                if now >= give_up:
                    return Claim.UNLEASED, None, None
                if waker is not None and waker.event.is_set():  # woke, still held: no spin
                    waker = None
                    await asyncio.sleep(POLL_FIRST_S)
                    continue
                if waker is None:
                    waker = _wake_on_release(file, read)
                if waker is None:  # too many threads blocked already: poll
                    await asyncio.sleep(poll_pause(now - started))
                    continue
                # Woken the moment the holder unlocks; polled too, for deadlines and for
                # NFS, where a blocked lock may be granted late.
                wait_s = min(POLL_MAX_S, give_up - now)
                if step.holder_deadline is not None:
                    wait_s = min(wait_s, max(0.0, step.holder_deadline - time.time()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waker.event.wait(), wait_s)
                # Read by the thread, under the shared lock; only once it is done (set last):
                # a poll can wake between its outcome and its read of the entry.
                if waker.event.is_set() and waker.outcome is not None:
                    return waker.outcome, None, waker.entry
        except (OSError, BackendError):
            # A lease is an optimisation: never fail it. BackendError: the store refused the
            # root or a folder (docs/security.md, "Local filesystem").
            return Claim.UNLEASED, None, None
        finally:
            if file is not None:
                file.close()


# --- waking a waiter when the holder unlocks -----------------------------------------------

#: Most threads one process keeps blocked on other processes' leases. A thread blocks until
#: the holder unlocks or dies; one of a live holder that hangs stays blocked until it does,
#: so past this many, waiters poll instead.
MAX_BLOCKED = 32
_blocked = 0
_blocked_lock = threading.Lock()


@dataclass
class _Waker:
    #: Set when the lock could be shared (the holder unlocked or died) or the file is gone.
    event: asyncio.Event
    #: The holder's outcome, read under the shared lock (saves the waiter a hop), if any.
    outcome: Claim | None = None
    #: The entry, read by the thread when the outcome says it landed (saves another hop).
    entry: bytes | None = None


def _wake_on_release(file: _File, read: Read | None = None) -> _Waker | None:
    """A :class:`_Waker` for the open lease ``file``; None when too many threads are
    blocked already.

    The thread opens its own file description (a shared lock on the file's fd itself would
    turn the waiter's own lock attempts into conversions), relative to its own copy of the
    folder's fd, and is a daemon: a hung holder never holds up this process's exit.
    """
    global _blocked
    with _blocked_lock:
        if _blocked >= MAX_BLOCKED:
            return None
        _blocked += 1
    try:
        directory = os.dup(file.directory)  # the waiter may close its own meanwhile
    except OSError:
        with _blocked_lock:
            _blocked -= 1
        return None
    fd, name = file.fd, file.name
    loop = asyncio.get_running_loop()
    waker = _Waker(asyncio.Event())

    def block() -> None:
        global _blocked
        try:
            # In the thread, not on the loop (a round trip on NFS). Should the waiter have
            # returned and its fd number been reused, the identities differ and no lock is
            # taken.
            st = os.fstat(fd)
            own = os.open(name, os.O_RDONLY | O_CLOEXEC | O_NOFOLLOW, dir_fd=directory)
            try:
                mine = os.fstat(own)
                if (mine.st_dev, mine.st_ino) == (st.st_dev, st.st_ino):
                    fcntl.flock(own, fcntl.LOCK_SH)  # granted once the holder lets go
                    waker.outcome = _outcome(_read_record(own))
                    if waker.outcome is Claim.LANDED:
                        waker.entry = _look(read)
            finally:
                os.close(own)  # releases the shared lock at once
        except OSError:
            pass  # the file went away (retired): the waiter's next look sees it
        finally:
            os.close(directory)
            with _blocked_lock:
                _blocked -= 1
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(waker.event.set)

    threading.Thread(target=block, name="objcache-lease-wait", daemon=True).start()
    return waker


# --- the synchronous steps (one worker-thread hop each) ----------------------------------


def _owner() -> dict[str, object]:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _open(store: FsFolders, key: str) -> _File:
    """The lease file of ``key``, opened (created) through the store's folder walk."""
    directory, name, fd = store.open_lease(key)
    return _File(directory, name, fd, lease_path(store.root, key))


def _open_and_try(
    store: FsFolders, key: str, hold_s: float, read: Read | None = None, look_first: bool = False
) -> tuple[_File | None, _Step]:
    """Look for the entry, then open the lease file and make a first attempt, in one
    worker-thread hop. No file is opened (None) when the entry is there already."""
    if look_first:
        entry = _look(read)
        if entry is not None:
            return None, _Step(Claim.LOCAL, entry=entry)
    file = _open(store, key)
    try:
        return file, _try(file, hold_s, read)
    except BaseException:
        file.close()
        raise


def _write_record(fd: int, record: dict[str, object]) -> None:
    body = json.dumps(record).encode()
    os.pwrite(fd, body.ljust(RECORD_BYTES), 0)


def _read_record(fd: int) -> dict[str, object]:
    """The record, or {} while it is empty or being written."""
    raw = os.pread(fd, RECORD_BYTES * 2, 0).strip()
    if not raw:
        return {}
    try:
        record = json.loads(raw)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _same_file(file: _File) -> bool:
    """Whether the lease file's name in its folder still names the file it has open."""
    try:
        st = os.stat(file.name, dir_fd=file.directory, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(file.fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _outcome(record: dict[str, object]) -> Claim | None:
    outcome = record.get("outcome")
    if outcome == "hit":
        return Claim.LANDED
    if outcome == "miss":
        return Claim.MISSED
    return None


def _done(claim: Claim, read: Read | None) -> _Step:
    """Another process's outcome, with the entry when it landed."""
    return _Step(claim, entry=_look(read) if claim is Claim.LANDED else None)


def _try(file: _File, hold_s: float, read: Read | None = None) -> _Step:
    """One attempt on the open lease ``file``."""
    fd = file.fd
    record = _read_record(fd)
    done = _outcome(record)
    if done is not None:
        return _done(done, read)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        deadline = record.get("deadline")
        if isinstance(deadline, (int, float)) and not isinstance(deadline, bool):
            return _Step(None, holder_deadline=float(deadline))
        return _Step(None)
    # Locked. Read again: the holder may have finished between the read and the lock.
    record = _read_record(fd)
    done = _outcome(record)
    if done is not None:
        return _done(done, read)
    if not _same_file(file):
        fcntl.flock(fd, fcntl.LOCK_UN)
        return _Step(None, retired=True)
    took_over = bool(record)  # a record without an outcome: its holder died or overran
    try:
        _write_record(fd, {**_owner(), "deadline": time.time() + hold_s})
    except OSError:  # a full disk: no lease, and no lease file left behind
        _retire(file)
        fcntl.flock(fd, fcntl.LOCK_UN)
        raise
    lease = Lease(file, took_over)
    entry = _look(read)  # it may have landed between the caller's look and the lock
    if entry is not None:
        lease.release_sync("hit")  # closes the file
        return _Step(Claim.LANDED, entry=entry, closed=True)
    return _Step(Claim.HELD, lease)


def _retire(file: _File) -> None:
    """Unlink the lease file if its name still names the file it has open (a waiter then
    starts over)."""
    with contextlib.suppress(OSError):
        if _same_file(file):
            os.unlink(file.name, dir_fd=file.directory)
