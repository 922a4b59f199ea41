"""``objcache pull --job`` and ``objcache push`` over a process per core (docs/architecture.md,
"A bulk copy over processes").

One event loop spends about a millisecond and a half of CPU a small entry (the request and
its response, the digest, the worker-thread hops of the node lease and the local write), so a
pull on one process keeps one core busy while the others wait; s5cmd spreads its copies over
every core. Here the command forks before any event loop, thread or connection exists: each
process reads the job's manifests and fetches the entries whose key falls in its shard
(``manifest.shard_of``, a stable hash), and the node lease still leaves a key that another
process of the node is fetching to that process. Each child tells the parent, as JSON lines
on a pipe, how many entries it plans to fetch, what it fetched (batched) and its result; the
parent shows one progress bar, forwards Ctrl-C and prints one result.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

#: Processes at most: past a few, the store and the local disk are the limit, not the CPU.
MAX_PROCESSES = 4
#: Seconds between a child's progress messages.
RELAY_S = 0.1
#: Seconds an interrupted child gets to end its writes before it is killed.
CHILD_GRACE_S = 20.0
#: Seconds between the Ctrl-Cs passed on to a child that has not ended yet.
RESEND_S = 0.2


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what the shards had done by then (each a shard's result)."""

    def __init__(self, results: list[dict[str, Any]]) -> None:
        super().__init__()
        self.results = results


#: One shard's run: (index, count, planned, progress) -> its result; interrupted, it may
#: raise :class:`Interrupted` with its result so far.
RunShard = Callable[[int, int, Callable[[int], None], Callable[[int, int], None]], dict[str, Any]]


def process_count(asked: int = 0, schemes: Sequence[str] = ()) -> int:
    """Processes a pull takes: ``asked`` (``OBJCACHE_BULK_PROCESSES``), else one per core
    this process may run on, at most :data:`MAX_PROCESSES`; one where it cannot fork safely
    (no ``fork``, or a thread already runs: a forked child would hold that thread's locks
    without the thread). With more than one, the backends of ``schemes`` (the tiers the copy
    opens) are imported here, before the fork, so that every process inherits them instead
    of importing them again (S3's SDK: 0.2-0.3 s of CPU a process)."""
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return 1
    if asked > 0:
        count = min(asked, 4 * MAX_PROCESSES)
    else:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        count = max(1, min(cores, MAX_PROCESSES))
    if count > 1 and schemes:
        from objcache.backends import backend_class

        for scheme in dict.fromkeys(schemes):
            backend_class(scheme)  # a missing SDK: the same one-line error as without this
        if threading.active_count() > 1:  # an import started a thread: no fork
            return 1
    return count


def run(
    count: int,
    run_shard: RunShard,
    planned: Callable[[int], None],
    progress: Callable[[int, int], None],
    *,
    forked: Callable[[], None] = lambda: None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """``run_shard`` for each of ``count`` shards, shard 0 here and each other one in a
    forked child; returns the results of those that finished and one line for each that did
    not. ``planned`` and ``progress`` (objects, bytes) hear from every shard, from this
    thread and from the threads reading the children's pipes. Ctrl-C here is passed on to
    the children, which end their writes (each entry lands whole or not at all) before this
    raises :class:`Interrupted` with every shard's result so far. ``forked`` is called here
    once the children exist (where a thread may start)."""
    children: list[tuple[int, int]] = []
    for index in range(1, count):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: it never returns
            os.close(read_end)
            for _, inherited in children:
                os.close(inherited)
            _child(index, count, write_end, run_shard)
        os.close(write_end)
        children.append((pid, read_end))
    results: dict[int, dict[str, Any]] = {}  # a child's, final or (interrupted) so far
    failures: list[str] = []
    lock = threading.Lock()

    def hear(pid: int, fd: int) -> None:
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as pipe:
            for line in pipe:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if "planned" in message:
                    planned(int(message["planned"]))
                elif "done" in message:
                    objects, nbytes = message["done"]
                    progress(int(objects), int(nbytes))
                elif "result" in message:
                    with lock:
                        results[pid] = message["result"]
                elif "error" in message:
                    with lock:
                        failures.append(str(message["error"])[:300])

    readers = [
        threading.Thread(target=hear, args=child, daemon=True, name="objcache-pull-relay")
        for child in children
    ]
    for reader in readers:
        reader.start()
    forked()
    grace: float | None = None
    own: dict[str, Any] | None = None
    try:
        own = run_shard(0, count, planned, progress)
    except Interrupted as exc:
        own, grace = (exc.results[0] if exc.results else None), CHILD_GRACE_S
    except KeyboardInterrupt:
        grace = CHILD_GRACE_S
        raise
    finally:
        # Another failure here (a store that does not answer) is the children's too: each
        # ends by its own deadlines, uninterrupted.
        try:
            _reap(children, grace)
        except KeyboardInterrupt:  # while this waited for a child still copying
            _reap(children, CHILD_GRACE_S)
            grace = CHILD_GRACE_S
        finally:
            for reader in readers:
                reader.join(5)
    with lock:
        done = [r for r in (own, *results.values()) if r is not None]
    if grace is not None:
        raise Interrupted(done)
    assert own is not None
    with lock:
        silent = len(children) - len(results) - len(failures)
        if silent > 0:
            failures.append(f"{silent} process(es) of the copy ended without a result")
        return [own, *results.values()], failures


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One pull's result from its shards': counts summed, the job's figures from shard 0's."""
    if not results:
        return {}
    merged = dict(results[0])
    for field in ("fetched", "bytes", "already_local", "fetched_by_another_process", "ordered"):
        merged[field] = sum(int(r.get(field, 0)) for r in results)
    merged["seconds"] = max(float(r.get("seconds", 0)) for r in results)
    merged["processes"] = len(results)
    return merged


class _Relay:
    """A child's messages to the parent: progress batched every :data:`RELAY_S`."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.objects = self.bytes = 0
        self.last = time.monotonic()

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data) :]

    def planned(self, n: int) -> None:
        self.send({"planned": n})

    def progress(self, objects: int, nbytes: int) -> None:
        self.objects += objects
        self.bytes += nbytes
        if time.monotonic() - self.last >= RELAY_S:
            self.flush()

    def flush(self) -> None:
        if self.objects:
            self.send({"done": [self.objects, self.bytes]})
        self.objects = self.bytes = 0
        self.last = time.monotonic()


def _child(index: int, count: int, fd: int, run_shard: RunShard) -> NoReturn:
    # Ctrl-C only while the copy's event loop runs (``common.run_async`` takes it there and
    # puts this back): anywhere else it could land in a finaliser, which cannot stop; the
    # parent tells a child again until it has ended.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = 1
    relay = _Relay(fd)
    try:
        result = run_shard(index, count, relay.planned, relay.progress)
        relay.flush()
        relay.send({"result": result})
        code = 0
    except Interrupted as exc:  # what it had done, for the parent's count
        code = 130
        with contextlib.suppress(Exception):
            relay.flush()
            for result in exc.results:
                relay.send({"result": result})
    except KeyboardInterrupt:
        code = 130
    except BaseException as exc:  # the parent says it in one line; nothing prints here
        with contextlib.suppress(Exception):
            relay.send({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)  # never the parent's exit handlers, twice


def _stop(children: list[tuple[int, int]], signum: int) -> None:
    for pid, _ in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _reap(children: list[tuple[int, int]], grace: float | None) -> None:
    """Wait for every child: as long as it runs, or (``grace``: Ctrl-C) telling it to stop
    every :data:`RESEND_S` (a child ignores Ctrl-C outside its event loop, where it cannot
    stop cleanly) and killing it once ``grace`` seconds have passed."""
    deadline = None if grace is None else time.monotonic() + grace
    waiting = {pid for pid, _ in children}
    told = 0.0
    while waiting:
        if deadline is not None and time.monotonic() - told >= RESEND_S:
            _stop([(pid, -1) for pid in waiting], signal.SIGINT)
            told = time.monotonic()
        for pid in list(waiting):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG if deadline is not None else 0)
            except ChildProcessError:
                done = pid
            if done:
                waiting.discard(pid)
        if waiting and deadline is not None:
            if time.monotonic() > deadline:
                _stop([(pid, -1) for pid in waiting], signal.SIGKILL)
                deadline = None  # now a plain wait
            else:
                time.sleep(0.01)
