"""The start-up prefetch in its own process (docs/architecture.md, "The prefetch in its own
process").

A new machine's prefetch from a network store runs beside Dynamo's tracing. In the compiling
process its work (the store client's start, signed requests, responses parsed, entries
decoded and written) holds the interpreter lock a few milliseconds at a time for about half
a second of CPU per hundred entries, and Dynamo's tracing waits for it each time: on a
2-vCPU machine a start from a store 50 ms away was 0.5-0.7 s slower than warm for that
reason alone. So the prefetch runs in a child process, on another core, into the same local
tier; the compiling process keeps only local reads.

* **The child** (``python -m objcache.prefetch_process``) reads its configuration, the
  environment's fields and the job from its standard input (a length-prefixed pickle its
  parent wrote: nothing from a store), runs :func:`objcache.core.manifest.prefetch` with the
  node leases as any process of the node does, and tells its parent each step on its
  standard output, one JSON object a line: the plan (the manifest's keys, those it will
  fetch), each request and arrival (the parent's prefetch time line), each key done with
  (in the local tier, or not to be had), and the result. It exits when its parent closes
  the pipe (the parent ended) and never starts torch or objcache's integrations
  (``OBJCACHE_ENABLE=0``).
* **The parent** (:class:`PrefetchProcess`) relays the messages to its cache on the event
  loop: a lookup of a planned key waits, bounded, until the child brought it
  (:class:`objcache.core.prefetch_elsewhere.PrefetchElsewhere`), then reads the local tier
  as always; the prefetch's listeners (kernel placement) hear each key done with. A child
  that fails, says something unreadable or ends early ends every wait: lookups go their own
  way, as without a prefetch.

Only where a readable tier is a network store (``file://`` reads cost the compile little),
with ``OBJCACHE_PREFETCH_PROCESS`` on (the default).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copyreg
import io
import json
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
import types
from collections.abc import Callable
from typing import IO, Any, NoReturn

from objcache.bridge import Bridge
from objcache.config.settings import Config
from objcache.core.manifest import prefetch, tell
from objcache.core.prefetch_elsewhere import PrefetchElsewhere
from objcache.core.tiered import TieredCache
from objcache.observe.prefetch_timeline import PrefetchTimeline

log = logging.getLogger("objcache")

#: How long a lookup waits for the child's plan (its start, the store's client, the
#: manifest) before it goes its own way.
PLAN_WAIT_S = 1.0
#: Longest message line read from the child (a plan of the largest manifest fits).
MAX_LINE = 64 << 20
#: Largest start message (configuration and environment fields) a child reads.
MAX_START = 1 << 20
#: Schemes whose reads stay in the compiling process.
_LOCAL_SCHEMES = frozenset({"file", "disk"})


#: How a child starts: its module run with the folder this objcache was imported from first
#: on its path, in place of the working folder ``python -m`` would put there (a folder
#: others may write, where an ``objcache`` planted would run instead).
_BOOT = (
    "import runpy, sys; sys.path[0] = sys.argv[1]; name = sys.argv[2]; del sys.argv[1:3]; "
    "runpy.run_module(name, run_name='__main__', alter_sys=True)"
)


def child_command(module: str) -> list[str]:
    """The command that runs objcache's ``module`` as a child of this process."""
    home = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # beside objcache/
    return [sys.executable, "-c", _BOOT, home, module]


def start_child(module: str) -> subprocess.Popen[bytes]:
    """objcache's ``module`` started as a child that talks over its standard input and
    output, with objcache's integrations off (it never starts torch)."""
    env = dict(os.environ, OBJCACHE_ENABLE="0")
    return subprocess.Popen(
        child_command(module),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        close_fds=True,
    )


def wanted(config: Config) -> bool:
    """Whether a client of ``config`` prefetches from a child process."""
    return config.prefetch_process and any(
        spec.scheme not in _LOCAL_SCHEMES for spec in config.effective_tiers()
    )


class PrefetchProcess:
    """The parent's side: starts the child and relays what it says to ``cache``."""

    def __init__(self, cache: TieredCache, bridge: Bridge, config: Config, job: str) -> None:
        self.cache = cache
        self.bridge = bridge
        #: The prefetch's result (what :func:`prefetch` returns), once the child ended.
        self.future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        key_wait_s = max((t.policy.timeout_s for t in cache.remotes), default=1.0)
        self.elsewhere = PrefetchElsewhere(PLAN_WAIT_S, key_wait_s)
        self.timeline = PrefetchTimeline()
        self._result: dict[str, Any] | None = None
        #: What the reader thread passes to the loop, drained at one wake-up (:meth:`_on_loop`)
        self._inbox: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
        self._inbox_lock = threading.Lock()
        self._drain_scheduled = False
        start = start_message(config, cache.env_fields, job)
        self.proc = start_child(__name__)
        cache.prefetch_elsewhere = self.elsewhere
        cache.prefetch_timeline = self.timeline
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(start)
            self.proc.stdin.flush()
        except OSError:
            pass  # the child is gone: its output ends, and so does every wait
        self.thread = threading.Thread(
            target=self._read, name="objcache-prefetch-process", daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        """End the child (the process closes; an entry half written is never seen)."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.terminate()
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        self.thread.join(5)

    # --- the reader thread ----------------------------------------------------------------

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        try:
            while True:
                line = out.readline(MAX_LINE)
                if not line:
                    break
                try:
                    message = json.loads(line)
                except ValueError:
                    log.warning("objcache: the prefetch process said something unreadable")
                    break
                if isinstance(message, dict):
                    self._on_loop(self._apply, message)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                out.close()
            rc = self.proc.wait()
            self._on_loop(self._ended, rc)

    def _on_loop(self, fn: Any, arg: Any) -> None:
        """Run ``fn(arg)`` on the event loop, after what was passed before. Messages come a
        few per key: each wake-up of the loop is a system call on each side and a hand-off
        of the interpreter lock, which the compiling thread waits for; so one wake-up takes
        every message that arrived until the loop got to it."""
        self._inbox.put((fn, arg))
        with self._inbox_lock:
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing waits any more
            self.bridge.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._inbox_lock:
            self._drain_scheduled = False  # a message put from now on schedules another
        while True:
            try:
                fn, arg = self._inbox.get_nowait()
            except queue.Empty:
                return
            try:
                fn(arg)
            except Exception:  # one message's failure never strands the ones after it
                log.debug("objcache: prefetch process message failed", exc_info=True)

    # --- on the event loop ----------------------------------------------------------------

    def _apply(self, message: dict[str, Any]) -> None:
        try:
            self._apply_one(message)
        except (TypeError, ValueError, KeyError):
            log.debug("objcache: prefetch process message refused", exc_info=True)

    def _apply_one(self, message: dict[str, Any]) -> None:
        cache, timeline = self.cache, self.timeline
        if "plan" in message:
            keys = [str(k) for k in message["plan"]]
            missing = [str(k) for k in message["missing"]]
            timeline.manifest(keys, int(message["manifests"]), missing)
            cache.prefetched = set(keys)
            self.elsewhere.plan(missing)
            absent = set(missing)
            for okey in keys:
                if okey not in absent:
                    tell(cache, okey, None)
        elif "request" in message:
            timeline.request(str(message["request"]))
        elif "arrive" in message:
            okey, size, tier, elsewhere = message["arrive"]
            size = None if size is None else int(size)
            timeline.arrive(str(okey), size, str(tier), elsewhere=bool(elsewhere))
            if size is not None:
                cache.stats.prefetch_fetched[str(tier)] += 1
        elif "brought" in message:
            okey = str(message["brought"])
            pending = self.elsewhere.pending(okey)
            self.elsewhere.brought(okey)
            if pending:
                tell(cache, okey, None)
        elif "result" in message and isinstance(message["result"], dict):
            self._result = message["result"]
            tiers = message.get("tiers")
            if isinstance(tiers, list):
                self.elsewhere.tiers = tiers[:64]

    def _ended(self, rc: int) -> None:
        self.elsewhere.end()
        self.timeline.end()
        if self.future.done():
            return
        if self._result is not None:
            self.future.set_result(self._result)
        else:
            self.future.set_exception(RuntimeError(f"the prefetch process ended ({rc})"))


def read_only(items: dict[str, Any]) -> types.MappingProxyType[str, Any]:
    """A tier's options again, in the child."""
    return types.MappingProxyType(items)


def start_message(config: Config, env_fields: dict[str, str], job: str) -> bytes:
    """What a child of objcache's reads first (this one, and kernel placement's): the
    configuration as this process holds it (a tier's options are a read-only mapping, sent
    as its items), length-prefixed: :func:`read_start` reads it back."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = {
        **copyreg.dispatch_table,
        types.MappingProxyType: lambda m: (read_only, (dict(m),)),
    }
    pickler.dump((config, env_fields, job))
    data = buf.getvalue()
    return len(data).to_bytes(8, "big") + data


def read_start() -> tuple[Config, dict[str, str], str]:
    """The child's side of :func:`start_message`, from its standard input; a start out of
    form ends the child (status 2)."""
    stdin = sys.stdin.buffer
    size = int.from_bytes(stdin.read(8), "big")
    if not 0 < size <= MAX_START:
        raise SystemExit(2)
    # our parent's own objects over a pipe only it holds (never anything from a store)
    config, env_fields, job = pickle.loads(stdin.read(size))
    return config, env_fields, job


# --- the child ---------------------------------------------------------------------------


class Relay:
    """A child's messages to its parent, one JSON line each, on its standard output."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.out.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
            self.out.flush()
        except (OSError, ValueError):
            os._exit(0)  # the parent is gone: so is the reason to go on


class _RelayedTimeline(PrefetchTimeline):
    """A time line that also tells the parent each step, and each key done with."""

    def __init__(self, relay: Relay, cache: TieredCache) -> None:
        super().__init__()
        self.relay = relay
        self.cache = cache

    def manifest(self, keys: Any, manifests: int, missing: Any) -> None:
        keys, missing = list(keys), list(missing)
        super().manifest(keys, manifests, missing)
        self.relay.send({"plan": keys, "missing": missing, "manifests": manifests})

    def request(self, okey: str) -> None:
        super().request(okey)
        self.relay.send({"request": okey})

    def arrive(self, okey: str, size: int | None, tier: str, elsewhere: bool = False) -> None:
        super().arrive(okey, size, tier, elsewhere)
        self.relay.send({"arrive": [okey, size, tier, elsewhere]})
        if size is None or not self.cache.landing_pending(okey):
            self.relay.send({"brought": okey})  # else once its write-through ended


async def _run_child(config: Config, env_fields: dict[str, str], job: str, relay: Relay) -> None:
    from objcache.client import build_cache  # the child's one use of the client layer

    cache = build_cache(config, env_fields)
    cache.on_landed_key = lambda okey: relay.send({"brought": okey})
    try:
        # nothing here serves the entries: each lands as it arrives (a large one never
        # whole in memory, objcache/core/streamed.py); the parent reads them locally
        result = await prefetch(cache, job, timeline=_RelayedTimeline(relay, cache), streamed=True)
    finally:
        await cache.close()
    # its tiers' counts (errors, misses, breaker) for the parent's ``objcache stats``
    relay.send({"result": result, "tiers": cache.stats_dict()["tiers"]})


def _exit_with_parent(stdin: IO[bytes]) -> None:
    with contextlib.suppress(OSError):
        while stdin.read(1 << 16):
            pass
    os._exit(0)


def main() -> int:
    config, env_fields, job = read_start()
    threading.Thread(target=_exit_with_parent, args=(sys.stdin.buffer,), daemon=True).start()
    relay = Relay(sys.stdout.buffer)
    try:
        asyncio.run(_run_child(config, env_fields, job, relay))
    except Exception as exc:
        log.debug("objcache: the prefetch process failed", exc_info=True)
        print(f"objcache: prefetch process: {type(exc).__name__}", file=sys.stderr)
        return 1
    return 0


def run_child(main: Callable[[], int]) -> NoReturn:
    """A child's entry point: ``main``'s code as the exit status, its output flushed, no
    interpreter shutdown (a thread reading the parent's pipe may hold it)."""
    try:
        code = main()
    except Exception as exc:
        print(f"objcache: child process: {type(exc).__name__}", file=sys.stderr)
        code = 1
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_child(main)
