"""Kernel placement in a process of its own (docs/architecture.md, "Kernels placed before
the compile").

Placing a prefetched kernel is a few dozen system calls (the local reads, the headers'
record check, the file published): about 3,100 for a transformer's 41 kernels. On a thread
of the compiling process each one lets go of the interpreter lock and takes it back from
the thread Dynamo traces on, which waits every time: measured on torch 2.15.0, a 2-vCPU
machine, the compiling thread made 880-1,100 voluntary context switches in its first step
against 20 with torch alone, and the step took ~0.2 s longer than one that started after
the placing was done. So the placing runs in a child interpreter, on the other core:

* **The parent** (:class:`PlaceProcess`, made with the client, where the placing thread
  was; its child started with the first key to place) sends the child, from a thread of its
  own, the configuration and the environment's
  fields (:func:`objcache.prefetch_process.start_message`), then the placing context (torch's
  cache dir, this machine's record prefix, the folder map: the parent has torch, the child
  never imports it), then each prefetched key of kind ``kernel`` or ``kernel-place`` as the
  prefetch brings it, a JSON line each, written in batches. What the child says comes back
  on its standard output: each binary placed (noted for the vector-ISA probe, as a binary
  placed in this process is), each headers' record checked (so the load path never checks
  one again), and the counters that changed.
* **The child** (``python -m objcache.integrations.torch.kernels.place_process``, with
  ``OBJCACHE_ENABLE=0``) opens the local tier only and runs the same
  :class:`~objcache.integrations.torch.kernels.kernel_places.Placer` as a thread would: the
  same checks, the same :func:`objcache.config.files.publish_file`. It exits when its parent
  closes the pipe (the parent ended, or stopped placement) and when its output cannot be
  written.

A child that cannot start, fails or says something unreadable places nothing more: the load
path fetches each kernel as without placement (counted ``place_process_ended``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import subprocess
import sys
import threading
from typing import IO, Any

from objcache.entry.layout import parse_object_key
from objcache.integrations.torch.kernels import kernel_headers, kernel_places, kernels
from objcache.prefetch_process import Relay, read_start, run_child, start_child, start_message

log = logging.getLogger("objcache.torch")

#: Longest line either side reads (a key, a placed path, a counters' change).
MAX_LINE = 64 << 10
#: Keys written to the child in one write.
BATCH = 512
#: What a counter's name may be (the child's own counters, relayed).
_COUNTER = re.compile(r"^[a-z][a-z0-9_:.-]{0,63}$")


class PlaceProcess:
    """The compiling process's side: the child, the keys it is sent, what it placed.
    :meth:`arrived` is the prefetch's listener (``kernel_places.start`` adds it)."""

    def __init__(self, client: Any, root: str) -> None:
        self.client = client
        self.root = root
        self.pid = os.getpid()
        self.queued = 0
        self.ended = False
        self.sent: queue.SimpleQueue[tuple[str, str] | None] = queue.SimpleQueue()
        #: The child, started with the first key to place (a start whose prefetch brings no
        #: kernel starts none)
        self.proc: subprocess.Popen[bytes] | None = None
        self.writer = threading.Thread(target=self._write, name="objcache-place-send", daemon=True)
        self.writer.start()

    def arrived(self, okey: str, payload: bytes | None) -> None:
        """A prefetched key (the client's loop thread: only queued)."""
        parsed = parse_object_key(okey)
        if parsed is None or self.ended or self.queued >= kernel_places.MAX_PENDING:
            return  # (a child ended: nothing more is sent, nothing more kept)
        _, kind, name = parsed
        if kind in (kernel_places.KIND, kernels.KIND):
            self.queued += 1
            self.sent.put((kind, name))

    def stop(self) -> None:
        """No more placements: the listener removed, the child's pipe closed (it exits). In
        a forked copy of this process only the copy's own end of the pipe is closed."""
        with contextlib.suppress(ValueError):
            self.client.cache.prefetch_listeners.remove(self.arrived)
        self.sent.put(None)
        proc = self.proc
        if os.getpid() != self.pid and proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()

    # --- the parent's threads ----------------------------------------------------------------

    def _write(self) -> None:
        first = self.sent.get()
        if first is None:
            return  # stopped before anything was to be placed
        try:
            proc = self.proc = start_child(__name__)
        except (OSError, ValueError) as exc:  # no child: the load path fetches each kernel
            self.ended = True
            kernels.warn_once("kernel placement", exc)
            return
        threading.Thread(target=self._read, name="objcache-place-read", daemon=True).start()
        pipe = proc.stdin
        assert pipe is not None
        try:
            client = self.client
            pipe.write(start_message(client.config, client.cache.env_fields, ""))
            # this machine's record prefix and folder map: computed here, beside the compile
            # but off its thread (the parent has torch imported; the child never does)
            prefix = _prefix()
            roots = kernels.machine_roots()
            context = {"root": self.root, "prefix": prefix, "roots": roots}
            pipe.write(json.dumps(context).encode() + b"\n")
            batch: list[tuple[str, str] | None] = [first]
            while True:
                while batch[-1] is not None and len(batch) < BATCH:
                    try:
                        batch.append(self.sent.get_nowait())
                    except queue.Empty:
                        break
                lines = [json.dumps(item).encode() + b"\n" for item in batch if item is not None]
                pipe.write(b"".join(lines))
                pipe.flush()
                if batch[-1] is None:
                    break
                batch = [self.sent.get()]
        except (OSError, ValueError):
            pass  # the child is gone: its output ends, and the reader says so
        finally:
            with contextlib.suppress(OSError, ValueError):
                pipe.close()

    def _read(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        out = proc.stdout
        try:
            while line := out.readline(MAX_LINE):
                try:
                    self._apply(json.loads(line))
                except (ValueError, TypeError, KeyError):
                    log.warning("objcache: the kernel placing process said something unreadable")
                    break
        except OSError:
            pass
        finally:
            self.ended = True
            with contextlib.suppress(OSError):
                out.close()
            if os.getpid() == self.pid:
                with contextlib.suppress(OSError):
                    proc.kill()
                proc.wait()
            kernels.count("place_process_ended")

    def _apply(self, message: dict[str, Any]) -> None:
        if "placed" in message:
            key, rel = (str(v) for v in message["placed"])
            if kernel_places.valid(rel):
                target = os.path.join(self.root, *rel.split("/"))
                kernels.note_output(kernels.Plan(key, target, False), placed=True)
        elif "checked" in message:
            key, held = message["checked"]
            if isinstance(held, bool):
                kernel_headers.learn(str(key), held)
        elif "counts" in message:
            for name, n in dict(message["counts"]).items():
                ok = isinstance(n, int) and 0 < n <= kernel_places.MAX_PENDING
                if ok and _COUNTER.match(str(name)):
                    kernels.count(str(name), n)
        else:
            raise ValueError(message)


def _prefix() -> str:
    """``<machine>-``; a machine with no digest gets one no record has (nothing placed)."""
    try:
        return f"{kernel_places.machine()}-"
    except Exception as exc:
        kernels.warn_once("kernel placement", exc)
        return "\0"


# --- the child ------------------------------------------------------------------------------


class _Relay(Relay):
    """What the child tells its parent (from the placing thread)."""

    def __init__(self, out: IO[bytes]) -> None:
        super().__init__(out)
        self.counts: dict[str, int] = {}
        self.verdicts: dict[str, bool] = {}

    def changes(self) -> None:
        """The records checked and the counters changed since the last call."""
        for key, held in kernel_headers.verdicts().items():
            if key not in self.verdicts:
                self.verdicts[key] = held
                self.send({"checked": [key, held]})
        now = kernels.counters()
        changed = {k: n - self.counts.get(k, 0) for k, n in now.items() if n != self.counts.get(k)}
        if changed:
            self.counts = now
            self.send({"counts": changed})


class _LocalReader:
    """The client's local read, over a cache of the local tier alone."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def get_local(self, kind: str, key: str) -> bytes | None:
        from objcache.core.reads import read_local_sync

        hit = read_local_sync(self.cache, kind, key)
        return None if hit is None else hit[0]


class _ChildPlacer(kernel_places.Placer):
    def __init__(self, client: Any, root: str, relay: _Relay, prefix: str) -> None:
        self.relay = relay
        super().__init__(client, root, prefix)

    def placed(self, key: str, rel: str, target: str) -> None:
        kernels.count("placed")
        self.relay.send({"placed": [key, rel]})

    def worked(self) -> None:
        self.relay.changes()


def main() -> int:
    from objcache.client import build_cache  # the child's one use of the client layer

    config, env_fields, _ = read_start()
    stdin = sys.stdin.buffer
    context = json.loads(stdin.readline(MAX_LINE))
    kernels.fix_roots([(str(path), str(tag)) for path, tag in context["roots"]])
    cache = build_cache(config, env_fields, local_only=True)
    relay = _Relay(sys.stdout.buffer)
    placer = _ChildPlacer(_LocalReader(cache), str(context["root"]), relay, str(context["prefix"]))
    while line := stdin.readline(MAX_LINE):
        kind, name = (str(v) for v in json.loads(line))
        if kind in (kernel_places.KIND, kernels.KIND):
            placer.queue.put((kind, name, None, 0))
    # the parent closed the pipe: what is queued is no longer wanted
    return 0


if __name__ == "__main__":
    run_child(main)
