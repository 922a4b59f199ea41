"""What every ``objcache`` command shares: the consoles and how a line or JSON reaches them,
the common options, the configuration, the tiers a command acts on (each opened by
:func:`objcache.stores.open_tier` in its ``"command"`` mode), the event loop a command runs
on, progress bars and sizes (docs/architecture.md, "Modules, top to bottom"). The commands
are in the ``commands_*`` modules beside this one; ``main`` gathers them into the
``objcache`` app."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from objcache.backends.base import Backend, TierSpec
from objcache.cli import ops
from objcache.config.settings import Config
from objcache.config.urls import flag, parse_tier_list
from objcache.entry.codec import Codec
from objcache.observe.plaintext import text

T = TypeVar("T")

#: Console width without a terminal: wide enough that no table cell is ever truncated.
UNWRAPPED_WIDTH = 100_000
#: The cyclic collector's first threshold while a command runs (Python's default is 700).
COMMAND_GC_THRESHOLD = 10_000


def _console(stderr: bool) -> Console:
    """Wrapped for a person at a terminal; without one (CI logs, pipes) every message is one
    line and tables are as wide as their cells, so nothing is wrapped or truncated."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, soft_wrap=True, width=UNWRAPPED_WIDTH)


out = _console(stderr=False)
err = _console(stderr=True)

TierOpt = Annotated[
    str | None,
    typer.Option("--tier", help="Tier URL to act on (default: the configured tiers)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Show what would happen; change nothing.")]


def print_json(data: Any) -> None:
    # ensure_ascii: no control character of a store string reaches stdout raw, C1 included
    # (docs/security.md, "What the CLI prints")
    sys.stdout.write(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=True) + "\n")


def print_line(console: Console, line: str) -> None:
    """One line that may carry strings from a store: control characters escaped, never
    read as markup (docs/security.md, "What the CLI prints")."""
    console.print(text(line), soft_wrap=True)


class UserError(Exception):
    """Reported as one line, exit code 2."""


def load_config() -> Config:
    from objcache.config import logs

    config = Config.from_env()
    logs.configure(config.log_level)
    return config


def codec_of(config: Config) -> Codec:
    return config.codec()


def tier_specs(config: Config, tier: str | None) -> list[TierSpec]:
    return parse_tier_list(tier, "--tier") if tier else list(config.effective_tiers())


def write_targets(config: Config, tier: str | None, action: str) -> list[TierSpec]:
    """The tiers a writing command acts on. Fails closed: a read-only configuration, a
    read-only ``--tier``, or configured tiers that are all read-only refuse ``action`` before
    anything is opened; read-only tiers among several configured ones are skipped, said once."""
    ops.refuse_read_only(action, [], read_only=config.read_only)
    if tier:
        specs = parse_tier_list(tier, "--tier")
        ops.refuse_read_only(action, specs)
        return specs
    specs = list(config.effective_tiers())
    writable = [s for s in specs if not flag(s, "read_only")]
    if not writable:
        ops.refuse_read_only(action, specs)
    for s in specs:
        if s not in writable:
            print_line(err, f"{action}: skipping read-only tier {s.display}")
    return writable


def warn(message: str) -> None:
    print_line(err, f"objcache: warning: {message}")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """``coro`` on a new event loop; Ctrl-C cancels it and ends in ``KeyboardInterrupt``
    (exit 130) even where a store's client turns that cancellation into a timeout of its own
    and the command runs on to its end (docs/operations.md, "Exit codes")."""
    interrupted = False

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()

        def on_sigint() -> None:
            nonlocal interrupted
            interrupted = True
            if task is not None:
                task.cancel()

        # not on this platform or thread: asyncio.run's own Ctrl-C handling stays
        previous = signal.getsignal(signal.SIGINT)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            return await coro
        finally:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signal.SIGINT)
                if previous is not None:  # as it was (a bulk copy's child ignores it)
                    signal.signal(signal.SIGINT, previous)

    # A bulk command makes many short-lived objects per entry (tasks, futures, requests):
    # the cyclic collector ran every 700 allocations and walked every module imported so
    # far, a sixth of push's and pull's CPU (docs/architecture.md, "Process model").
    # Frozen, the start-up's objects are never walked; collections come 15x less often.
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(COMMAND_GC_THRESHOLD, *threshold[1:])
    try:
        result = asyncio.run(main())
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
    if interrupted:
        raise KeyboardInterrupt
    return result


def progress_bar(total: int, what: str) -> tuple[Progress, Callable[[int], None]]:
    """A bar of objects done, bytes moved and both rates (bytes/s, objects/s); the callback
    takes one object's bytes (see :mod:`objcache.cli.ops`)."""
    bar, advance = _counting_bar(total, what)
    return bar, lambda nbytes: advance(1, nbytes)


def growing_progress_bar(
    what: str,
) -> tuple[Progress, Callable[[int], None], Callable[[int, int], None]]:
    """:func:`progress_bar` for work whose size is learnt as it goes, told from several
    threads: ``plan(n)`` adds ``n`` objects to the total, ``done(objects, nbytes)`` counts
    objects done."""
    bar, advance = _counting_bar(0, what)
    task = bar.task_ids[0]
    lock = threading.Lock()
    total = 0

    def plan(n: int) -> None:
        nonlocal total
        with lock:
            total += n
            bar.update(task, total=total or None)

    def done(objects: int, nbytes: int) -> None:
        with lock:
            advance(objects, nbytes)

    return bar, plan, done


def _counting_bar(total: int, what: str) -> tuple[Progress, Callable[[int, int], None]]:
    bar = Progress(
        TextColumn(f"[bold]{what}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[moved]} at {task.fields[rate]}, {task.fields[objects]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=not err.is_terminal and not os.environ.get("OBJCACHE_PROGRESS"),
    )
    task = bar.add_task(
        what, total=total or None, moved=human_size(0), rate=f"{human_size(0)}/s", objects="0/s"
    )
    started = time.monotonic()
    moved = done = 0

    def advance(objects: int, nbytes: int) -> None:
        nonlocal moved, done
        moved += nbytes
        done += objects
        seconds = max(time.monotonic() - started, 1e-3)
        rate, per_s = f"{human_size(moved / seconds)}/s", f"{done / seconds:,.0f} objects/s"
        bar.update(task, advance=objects, moved=human_size(moved), rate=rate, objects=per_s)

    return bar, advance


def rates(objects: int, nbytes: int, seconds: float) -> dict[str, Any]:
    """What a bulk command's ``--json`` reports of its pace: objects, bytes, seconds and
    both rates (the figures its progress bar shows)."""
    per_s = 1 / max(seconds, 1e-6)
    return {
        "objects": objects,
        "bytes": nbytes,
        "seconds": round(seconds, 3),
        "objects_per_s": round(objects * per_s, 1),
        "bytes_per_s": round(nbytes * per_s),
    }


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


async def close_after(backends: list[Backend], coro: Awaitable[T]) -> T:
    """``coro``'s result, closing ``backends`` after it; a warning names each backend whose
    listings skipped stored names that are not UTF-8 (docs/architecture.md, "Listings")."""
    try:
        return await coro
    finally:
        for b in backends:
            if b.undecodable_names:
                warn(
                    f"{b.name}: {b.undecodable_names} stored names skipped: not UTF-8, "
                    "no objcache key names them"
                )
            await b.close()
