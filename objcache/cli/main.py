"""The ``objcache`` command line.

Exit codes (docs/operations.md, "Exit codes"): 0 success, and always for ``pull``/``warm``
(warming is best-effort: problems are warnings); 1 the command ran and found problems (a
failing tier, bad entries, entries that could not be copied or listed); 2 bad usage or
configuration, or a write refused by read-only (one line, no traceback); 130 interrupted.
Every remote call is bounded by its tier's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from objcache.backends import create_backend
from objcache.backends.base import Backend, TierSpec
from objcache.cli import ops
from objcache.config.fingerprint import env_id, fingerprint
from objcache.config.settings import Config
from objcache.config.urls import flag, parse_tier_list
from objcache.entry.codec import Codec
from objcache.entry.layout import KINDS
from objcache.errors import ConfigError, ObjcacheError
from objcache.observe.plaintext import text

T = TypeVar("T")
app = typer.Typer(
    help="objcache: tiered remote cache for torch.compile artifacts.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # click's plain help: typer's rich panels render every boolean flag as "--json <bool>"
    rich_markup_mode=None,
)
mega_app = typer.Typer(
    help="Mega-Cache bundles (torch.compiler.save/load_cache_artifacts): list and load; a "
    "bundle is saved in the compiling process with objcache.integrations.torch.mega.save(NAME).",
    rich_markup_mode=None,
)
app.add_typer(mega_app, name="mega")

#: Console width without a terminal: wide enough that no table cell is ever truncated.
UNWRAPPED_WIDTH = 100_000


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


def _print_json(data: Any) -> None:
    # ensure_ascii: no control character of a store string reaches stdout raw, C1 included
    # (docs/security.md, "What the CLI prints")
    sys.stdout.write(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=True) + "\n")


def _line(console: Console, line: str) -> None:
    """One line that may carry strings from a store: control characters escaped, never
    read as markup (docs/security.md, "What the CLI prints")."""
    console.print(text(line), soft_wrap=True)


class UserError(Exception):
    """Reported as one line, exit code 2."""


def _config() -> Config:
    from objcache.config import logs

    config = Config.from_env()
    logs.configure(config.log_level)
    return config


def _codec(config: Config) -> Codec:
    return config.codec()


def _tiers(config: Config, tier: str | None) -> list[TierSpec]:
    return parse_tier_list(tier, "--tier") if tier else list(config.effective_tiers())


def _write_targets(config: Config, tier: str | None, action: str) -> list[TierSpec]:
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
            _line(err, f"{action}: skipping read-only tier {s.display}")
    return writable


def _open(spec: TierSpec, config: Config) -> Backend:
    """The backend of ``spec`` with every call (each listing page too) bounded by the tier's
    deadline (``?timeout_ms=``, else OBJCACHE_TIMEOUT_MS), as in the cache itself: a
    command's tier, no retries, no breaker (docs/architecture.md, "Policies")."""
    from objcache.core.tier import Tier

    return Tier.for_command(create_backend(spec), timeout_ms=config.timeout_ms).bounded()


def _warn(message: str) -> None:
    _line(err, f"objcache: warning: {message}")


def _local_spec(config: Config) -> TierSpec:
    return TierSpec(f"disk://{config.local_dir}", "disk", "", str(config.local_dir), {})


def _run(coro: Coroutine[Any, Any, T]) -> T:
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
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            return await coro
        finally:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signal.SIGINT)

    try:
        result = asyncio.run(main())
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    if interrupted:
        raise KeyboardInterrupt
    return result


def _progress(total: int, what: str) -> tuple[Progress, Callable[[int], None]]:
    """A bar of objects done, bytes moved and their rate; the callback takes one object's
    bytes (see :mod:`objcache.cli.ops`)."""
    bar = Progress(
        TextColumn(f"[bold]{what}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[moved]} at {task.fields[rate]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=not err.is_terminal and not os.environ.get("OBJCACHE_PROGRESS"),
    )
    task = bar.add_task(what, total=total or None, moved=_size(0), rate=f"{_size(0)}/s")
    started = time.monotonic()
    moved = 0

    def advance(nbytes: int) -> None:
        nonlocal moved
        moved += nbytes
        rate = moved / max(time.monotonic() - started, 1e-3)
        bar.update(task, advance=1, moved=_size(moved), rate=f"{_size(rate)}/s")

    return bar, advance


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


async def _closing(backends: list[Backend], coro: Awaitable[T]) -> T:
    try:
        return await coro
    finally:
        for b in backends:
            await b.close()


# --- doctor ------------------------------------------------------------------------------


def _in_force(config: Config) -> dict[str, Any]:
    """What this process's configuration really puts in force (docs/operations.md)."""
    from objcache.config.settings import unknown_variables
    from objcache.integrations.torch import autoload

    environ = dict(os.environ)
    state: dict[str, Any] = {
        "enabled": autoload.enabled(environ),
        "environment": {"id": env_id(), **fingerprint()},
        **config.trust(),
        "unknown_variables": unknown_variables(environ),
    }
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        state["torch_parts"] = {"active": [], "off": {}, "torch": "not installed"}
    else:
        from objcache.integrations.torch import features

        parts = features.in_force(environ)  # docs/torch.md, "Feature detection"
        state["torch_parts"] = {
            "active": [p.part for p in parts if p.active],
            "off": {p.part: p.why for p in parts if not p.active},
        }
    from objcache.integrations import vllm

    state["vllm"] = vllm.doctor_state()
    return state


def _in_force_lines(state: dict[str, Any]) -> list[str]:
    signing, verification = state["signing"], state["verification"]
    lines = [
        "objcache: "
        + (
            "on in every process that imports torch"
            if state["enabled"]
            else "off in new processes (OBJCACHE_TIERS and OBJCACHE_ENABLE unset, or "
            "OBJCACHE_ENABLE=0)"
        ),
        "signing: "
        + (
            f"{signing['scheme']} ({', '.join(signing['key_ids'])})"
            if signing["key_ids"]
            else "none: new entries are unsigned"
        ),
        "verification: "
        + (
            f"unsigned entries refused; keys {', '.join(verification['key_ids'])}"
            if verification["unsigned_refused"]
            else "none: unsigned entries are accepted (digest checked)"
        ),
        "read-only: " + ("yes: no remote writes" if state["read_only"] else "no"),
    ]
    parts = state["torch_parts"]
    if parts.get("torch") == "not installed":
        lines.append("torch parts: torch is not installed")
    else:
        lines.append(f"torch parts active: {', '.join(parts['active']) or 'none'}")
        lines += [f"torch part off: {part}: {why}" for part, why in parts["off"].items()]
    from objcache.integrations import vllm

    lines.append(vllm.doctor_line(state["vllm"]))
    unknown = state["unknown_variables"]
    lines.append(
        "unknown variables: "
        + (
            ", ".join(f"{v} (did you mean {c}?)" if c else v for v, c in unknown.items())
            if unknown
            else "none"
        )
    )
    return lines


@app.command()
def doctor(tier: TierOpt = None, as_json: JsonOpt = False) -> None:
    """Say what is in force (enabled, torch parts, signing, verification, read-only, unknown
    variables), then check that every tier can be read, written in create mode and deleted."""
    config = _config()
    specs = [_local_spec(config), *_tiers(config, tier)]
    codec = _codec(config)
    state = _in_force(config)
    if not as_json:
        out.print(
            f"environment [bold]{env_id()}[/]: "
            + ", ".join(f"{k}={v}" for k, v in fingerprint().items())
        )
        for line in _in_force_lines(state):
            _line(out, line)
    table = Table("tier", "result", "create ms", "read ms", "delete ms", "detail")
    failed = 0

    async def check(spec: TierSpec) -> ops.ProbeResult:
        backend = _open(spec, config)
        write = not (config.read_only or flag(spec, "read_only"))
        try:
            return await asyncio.wait_for(
                ops.probe(backend, codec, write=write), config.timeout_ms / 1000 * 3
            )
        except (asyncio.TimeoutError, TimeoutError):
            return ops.ProbeResult(False, error=f"no answer within {config.timeout_ms * 3} ms")
        finally:
            await backend.close()

    async def check_all() -> list[ops.ProbeResult]:
        return list(await asyncio.gather(*(check(s) for s in specs)))

    reasons: list[str] = []
    abouts: list[str] = []  # a store's shape (base.Describes): one whole line each
    tiers: list[dict[str, Any]] = []
    for spec, result in zip(specs, _run(check_all()), strict=True):
        failed += not result.ok
        tiers.append(
            {
                "tier": spec.display,
                "ok": result.ok,
                "ms": result.steps,
                "error": result.error,
                "about": result.about,
            }
        )
        if result.about and result.ok:
            abouts.append(f"{spec.display}: {result.about}")
        if not result.ok:
            # errors name their tier already: the URL once per line
            detail = " ".join(result.error.removeprefix(f"{spec.display}: ").split())
            reasons.append(f"FAILED {spec.display}: {detail}")
        steps = [
            f"{result.steps[s]:.1f}" if s in result.steps else "-"
            for s in ("create", "read", "delete")
        ]
        table.add_row(
            text(spec.display),
            "[green]ok[/]" if result.ok else "[red]FAILED[/]",
            *steps,
            text(result.error or ("read-only" if "create" not in result.steps else "")),
        )
    if as_json:
        _print_json({**state, "tiers": tiers})
        raise typer.Exit(1 if failed else 0)
    out.print(table)
    for line in abouts + reasons:  # a table cell wraps and truncates: one whole line each
        _line(out, line)
    raise typer.Exit(1 if failed else 0)


# --- stats -------------------------------------------------------------------------------


@app.command()
def stats(
    as_json: JsonOpt = False,
    file: Annotated[Path | None, typer.Option(help="Stats file (default: last run's).")] = None,
) -> None:
    """Hits, misses by reason, bytes and latency per tier of the last objcache process."""
    from objcache.client import stats_file

    path = file or stats_file(_config())
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"no stats at {path}: run something with objcache enabled first") from None
    except ValueError:
        raise UserError(f"{path} is not an objcache stats file") from None
    if as_json:
        _print_json(data)
        return
    from objcache.observe.stats_lines import latency_cell, stamp_line, summary_lines

    for line in [stamp_line(data), *summary_lines(data)]:
        out.print(line, markup=False, highlight=False)
    table = Table(
        "tier",
        "hits",
        "misses by reason",
        "puts",
        "put errors",
        "read",
        "written",
        "get p50/p99 ms",
        "breaker",
    )
    for t in data.get("tiers", []):
        lat = t.get("get_latency", {})
        table.add_row(
            t["name"] + (" (local)" if t.get("local") else ""),
            str(t["hits"]),
            ", ".join(f"{k}={v}" for k, v in t["misses"].items()) or "-",
            str(t["puts"]),
            ", ".join(f"{k}={v}" for k, v in t["put_errors"].items()) or "-",
            _size(t["bytes_read"]),
            _size(t["bytes_written"]),
            latency_cell(lat),
            t.get("breaker", ""),
        )
    out.print(table)


# --- ls ----------------------------------------------------------------------------------


@app.command()
def ls(
    tier: TierOpt = None,
    kind: Annotated[str | None, typer.Option(help="Only this kind (fx-graph, pgo, ...).")] = None,
    env: Annotated[str | None, typer.Option(help="Environment id (default: this one).")] = None,
    all_envs: Annotated[bool, typer.Option("--all-envs", help="Every environment.")] = False,
    envs: Annotated[bool, typer.Option("--envs", help="List environments, not entries.")] = False,
    older_than: Annotated[float | None, typer.Option(help="Only entries older than DAYS.")] = None,
    min_size: Annotated[int, typer.Option(help="Only entries of at least BYTES.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """List entries (or environments) in a tier."""
    config = _config()
    spec = _tiers(config, tier)[0]
    backend = _open(spec, config)
    if envs:
        found = _run(_closing([backend], ops.environments(backend, _codec(config))))
        if as_json:
            _print_json(found)
            return
        table = Table("env", "entries", "bytes", "torch", "cpu_isa", "gpu", "this machine")
        for eid, info in sorted(found.items()):
            f = info["fields"]
            table.add_row(
                text(eid),
                str(info["entries"]),
                _size(info["bytes"]),
                text(f.get("torch", "?")),
                text(f.get("cpu_isa", "?")),
                text(f.get("gpu", "?")),
                "yes" if eid == env_id() else "",
            )
        out.print(table)
        return
    wanted_env = None if all_envs else (env or env_id())

    async def collect() -> list[ops.Entry]:
        return [e async for e in ops.entries(backend, env=wanted_env, kind=kind)]

    listed = _run(_closing([backend], collect()))
    if kind is not None and kind not in KINDS and not listed:
        raise UserError(_unknown_kind(kind))
    rows = [
        e
        for e in listed
        if e.info.size >= min_size and (older_than is None or e.age_days > older_than)
    ]
    if as_json:
        _print_json(
            [
                {
                    "env": e.env,
                    "kind": e.kind,
                    "key": e.key,
                    "size": e.info.size,
                    "mtime": e.info.mtime,
                }
                for e in rows
            ]
        )
        return
    table = Table("env", "kind", "key", "size", "age (days)")
    for e in sorted(rows, key=lambda e: (e.kind, e.key)):
        table.add_row(
            text(e.env), text(e.kind), text(e.key), _size(e.info.size), f"{e.age_days:.1f}"
        )
    out.print(table)
    out.print(f"{len(rows)} entries, {_size(sum(e.info.size for e in rows))}")


def _unknown_kind(kind: str) -> str:
    """One line for ``ls --kind`` of a kind objcache does not store and the tier does not
    hold (a client's own kinds are listed when present)."""
    import difflib

    close = difflib.get_close_matches(kind, KINDS, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return (
        f"--kind: unknown kind {kind!r}: the kinds objcache stores are {', '.join(KINDS)}, "
        f"and no entry of this tier has it{hint}"
    )


# --- push / pull -------------------------------------------------------------------------


def _copy(
    source: Backend,
    targets: list[Backend],
    env: str | None,
    what: str,
    config: Config,
    *,
    read_only: bool = False,
    as_json: bool = False,
) -> ops.CopyReport:
    """Copy this environment's entries (or all) and print the outcome; the caller decides
    what the outcome means for the exit code."""

    report = ops.CopyReport()
    keys: list[str] = []

    async def run() -> ops.CopyReport:
        keys.extend([e.info.key async for e in ops.entries(source, env=env)])
        if env:
            keys.append(f"v1/{env}/ENV.json")
        bar, advance = _progress(len(keys), what)
        with bar:
            return await ops.copy(
                source,
                targets,
                keys,
                _codec(config),
                advance,
                read_only=read_only,
                caps=config.max_entry_bytes,
                report=report,
            )

    try:
        _run(_closing([source, *targets], run()))
    except KeyboardInterrupt:
        # Ctrl-C (exit 130): each object is written whole or not at all, so what is there
        # is complete and a second run copies the rest (docs/operations.md, "Exit codes").
        if keys:
            done = report.copied + report.existed
            _line(
                err, f"{what}: interrupted: {done:,} of {len(keys):,} copied; run again to finish"
            )
        else:
            _line(err, f"{what}: interrupted while listing: nothing copied")
        raise
    if as_json:
        _print_json(
            {
                "command": what,
                "copied": report.copied,
                "bytes": report.bytes,
                "existed": report.existed,
                "refused": report.refused,
                "failed": report.failed,
                "errors": report.errors,
            }
        )
        return report
    out.print(
        f"{what}: {report.copied} copied ({_size(report.bytes)}), {report.existed} already there, "
        f"{report.refused} refused (corrupt/unsigned), {report.failed} failed"
    )
    for line in report.errors[:10]:
        _line(err, f"  {line}")
    return report


@app.command()
def push(
    tier: TierOpt = None,
    source: Annotated[
        Path | None, typer.Option(help="objcache local dir to push (default: OBJCACHE_LOCAL_DIR).")
    ] = None,
    inductor_dir: Annotated[
        Path | None, typer.Option(help="A TORCHINDUCTOR_CACHE_DIR to import first.")
    ] = None,
    bundle: Annotated[
        list[Path] | None, typer.Option(help="Mega-Cache bundle file(s) to import first.")
    ] = None,
    all_envs: Annotated[bool, typer.Option("--all-envs", help="Push every environment.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Seed remote tiers from a machine's caches (the CI pre-seeding path)."""
    config = _config()
    specs = _write_targets(config, tier, "push")
    if inductor_dir is not None or bundle:
        from collections import Counter

        from objcache.integrations.torch.seed import UnsafeDir, import_local

        skipped: Counter[str] = Counter()
        try:
            imported = import_local(
                inductor_dir=inductor_dir, bundles=list(bundle or []), skipped=skipped
            )
        except UnsafeDir as exc:
            raise UserError(f"push --inductor-dir: refused: {exc}") from None
        out.print(f"imported {imported} artifacts into the local tier")
        if skipped:
            reasons = ", ".join(f"{n} {why}" for why, n in sorted(skipped.items()))
            _warn(f"push --inductor-dir: left out (never published): {reasons}")
    src_dir = source or config.local_dir
    if not src_dir.is_dir():
        raise UserError(f"nothing to push: {src_dir} does not exist")
    src = _open(TierSpec(f"disk://{src_dir}", "disk", "", str(src_dir), {}), config)
    targets = [_open(s, config) for s in specs]
    report = _copy(
        src,
        targets,
        None if all_envs else env_id(),
        "push",
        config,
        read_only=config.read_only,
        as_json=as_json,
    )
    raise typer.Exit(1 if report.failed or report.refused else 0)


@app.command()
def pull(
    tier: TierOpt = None,
    job: Annotated[str | None, typer.Option(help="Fetch what this job's manifests list.")] = None,
    all_envs: Annotated[
        bool, typer.Option("--all-envs", help="Every environment, not only this one.")
    ] = False,
) -> None:
    """Warm the local tier: by job manifest, or everything for this environment.

    Best-effort: a missing bucket, a hung tier or entries that cannot be fetched are warnings
    and exit 0 (a cold start is slower, not broken); only bad usage or configuration exits 2."""
    config = _config()
    try:
        _pull(config, tier, job, all_envs)
    except ConfigError:
        raise
    except ObjcacheError as exc:
        _warn(f"pull: nothing warmed: {exc}")


def _pull(config: Config, tier: str | None, job: str | None, all_envs: bool) -> None:
    if job:
        from objcache.client import build_cache
        from objcache.core import manifest

        cache = build_cache(config if not tier else Config.from_env(tiers=tier))

        async def run() -> dict[str, Any]:
            try:
                return await manifest.prefetch(cache, job)
            finally:
                await cache.close(config.flush_timeout_s)

        result = _run(run())
        out.print(
            f"job {job}: {result['manifests']} manifests, {result['keys']} entries, "
            f"{result['fetched']} fetched, {result['already_local']} already local "
            f"in {result['seconds']} s"
        )
        if not result["manifests"]:
            _warn(f"pull: job {job} has no manifest in the configured tiers: nothing warmed")
        return
    spec = _tiers(config, tier)[0]
    local = _open(_local_spec(config), config)
    report = _copy(_open(spec, config), [local], None if all_envs else env_id(), "pull", config)
    if report.failed or report.refused:
        _warn(f"pull: {report.failed + report.refused} entries not warmed (listed above)")


app.command("warm", help="Same as pull.")(pull)


# --- gc / verify -------------------------------------------------------------------------


@app.command()
def gc(
    tier: TierOpt = None,
    keep_env: Annotated[
        list[str] | None,
        typer.Option(help="Delete every env but these (repeat). 'current' = this one."),
    ] = None,
    older_than: Annotated[
        float | None, typer.Option(help="Delete entries older than DAYS.")
    ] = None,
    max_bytes: Annotated[
        int | None, typer.Option(help="Then delete oldest until under BYTES.")
    ] = None,
    dry_run: DryRun = False,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete whole environments, old entries, or down to a size."""
    if keep_env is None and older_than is None and max_bytes is None:
        raise UserError("gc needs --keep-env, --older-than or --max-bytes")
    config = _config()
    # A dry run deletes nothing, so it may look at read-only tiers too.
    specs = _tiers(config, tier) if dry_run else _write_targets(config, tier, "gc")
    keep = None if keep_env is None else {env_id() if e == "current" else e for e in keep_env}

    async def plan_all() -> list[ops.GcPlan]:
        backends = [_open(s, config) for s in specs]
        return await _closing(
            backends,
            asyncio.gather(
                *(
                    ops.plan_gc(b, keep_envs=keep, older_than_days=older_than, max_bytes=max_bytes)
                    for b in backends
                )
            ),
        )

    plans = _run(plan_all())
    total = sum(len(p.delete) for p in plans)
    if as_json and (dry_run or not total):
        _print_json(
            [
                {
                    "tier": spec.display,
                    "delete": [e.info.key for e in plan.delete],
                    "delete_bytes": plan.delete_bytes,
                    "keep_bytes": plan.keep_bytes,
                    "deleted": 0,
                }
                for spec, plan in zip(specs, plans, strict=True)
            ]
        )
        return
    for spec, plan in zip(specs, plans, strict=True):
        _line(
            out,
            f"{spec.display}: {len(plan.delete)} entries ({_size(plan.delete_bytes)}) to delete, "
            f"{_size(plan.keep_bytes)} kept",
        )
    if dry_run or not total:
        for spec, plan in zip(specs, plans, strict=True):
            for e in plan.delete[:20]:
                _line(out, f"  {spec.display}: would delete {e.info.key}")
        return
    if not yes and not typer.confirm("delete them?"):
        raise typer.Exit(1)
    bar, advance = _progress(total, "gc")

    async def run() -> list[int]:
        backends = [_open(s, config) for s in specs]

        async def one(i: int, backend: Backend) -> int:
            return await ops.run_gc(backend, plans[i], advance, read_only=config.read_only)

        with bar:
            return await _closing(
                backends, asyncio.gather(*(one(i, b) for i, b in enumerate(backends)))
            )

    deleted = _run(run())
    if as_json:
        _print_json(
            [
                {
                    "tier": spec.display,
                    "delete": [e.info.key for e in plan.delete],
                    "delete_bytes": plan.delete_bytes,
                    "keep_bytes": plan.keep_bytes,
                    "deleted": n,
                }
                for spec, plan, n in zip(specs, plans, deleted, strict=True)
            ]
        )
        return
    out.print(f"deleted {sum(deleted)} entries")


@app.command()
def verify(
    tier: TierOpt = None,
    all_envs: Annotated[bool, typer.Option("--all-envs")] = False,
    delete: Annotated[bool, typer.Option("--delete", help="Delete bad entries.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Check every entry's digest (and signature, when signing keys are set)."""
    config = _config()
    spec = parse_tier_list(tier, "--tier")[0] if tier else _local_spec(config)
    # The local tier is this machine's own: a read-only configuration protects remote tiers.
    read_only = config.read_only and bool(tier)
    if delete:
        ops.refuse_read_only("verify --delete", [spec], read_only=read_only)
    backend = _open(spec, config)
    bar, advance = _progress(0, "verify")

    async def run() -> ops.VerifyReport:
        with bar:
            return await ops.verify(
                backend,
                _codec(config),
                env=None if all_envs else env_id(),
                delete=delete,
                progress=advance,
                read_only=read_only,
                caps=config.max_entry_bytes,
            )

    report = _run(_closing([backend], run()))
    if as_json:
        _print_json(
            {
                "tier": spec.display,
                "checked": report.checked,
                "bad": [{"key": k, "reason": r} for k, r in report.bad],
                "deleted": report.deleted,
            }
        )
        raise typer.Exit(1 if report.bad and not delete else 0)
    for key, reason in report.bad:
        out.print(Text.assemble(text(reason, "red"), " ", text(key)), soft_wrap=True)
    _line(
        out,
        f"{spec.display}: {report.checked} checked, {len(report.bad)} bad, "
        f"{report.deleted} deleted",
    )
    raise typer.Exit(1 if report.bad and not delete else 0)


# --- report ------------------------------------------------------------------------------


@app.command()
def report(
    job: Annotated[str, typer.Option(help="The job whose runs to report.")],
    since: Annotated[
        str | None, typer.Option(help="Only runs started this long ago or later (24h, 7d).")
    ] = None,
    env: Annotated[
        str | None, typer.Option(help="Only this environment id (default: every one).")
    ] = None,
    runs: Annotated[
        int,
        typer.Option(
            min=1,
            help="Read the newest N runs' summaries (at most 512 KiB each); older runs are "
            "counted, not read.",
        ),
    ] = 200,
    tier: TierOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One row per run of a job across hosts and environments: hits per kind, bytes, lookup
    time, misses and the top miss cause. Reads a bounded amount whatever the store holds: the
    newest --runs summaries, and for the cause column key cards as objcache explain reads them."""
    from objcache.cli import explain as why
    from objcache.cli import report as fleet

    config = _config()
    since_s = _since(since)
    # the summaries location, where one is configured (docs/operations.md, "Fleet report")
    source = config.summaries_url if tier is None else None
    backend = _open(source or _tiers(config, tier)[0], config)
    # written key cards are in the tiers, runs' missed cards beside the summaries
    cards = backend if source is None else _open(_tiers(config, tier)[0], config)
    bar, advance = _progress(0, "report")
    codec = _codec(config)

    async def run() -> fleet.Report:
        found = await report_rows()
        try:  # the column "top miss cause" from key cards, where the runs recorded any
            explained = await why.collect(
                cards, codec, job=job, runs=backend, since=_since_epoch(since_s), env=env or None
            )
        except Exception as exc:  # the counts from the summaries stand
            logging.getLogger("objcache").debug("report: key cards unreadable: %r", exc)
        else:
            fleet.explain_causes(found, why.causes_by_run(explained))
        return found

    async def report_rows() -> fleet.Report:
        with bar:
            return await fleet.collect(
                backend,
                codec,
                env=env or None,
                job=job,
                since_s=since_s,
                newest=runs,
                progress=advance,
                total=lambda n: bar.update(bar.task_ids[0], total=n),
            )

    result = _run(_closing([backend] if cards is backend else [backend, cards], run()))
    if as_json:
        _print_json(result.as_dict())
    else:
        fleet.render(result, out, _size)
    raise typer.Exit(0 if result.rows else 1)


def _since(since: str | None) -> float | None:
    """``--since`` in seconds, or a one-line error."""
    from objcache.cli import report as fleet

    try:
        return fleet.parse_duration(since) if since else None
    except ValueError as exc:
        raise UserError(f"--since: {exc}") from None


def _since_epoch(since_s: float | None) -> float:
    return 0.0 if since_s is None else time.time() - since_s


@app.command()
def explain(
    job: Annotated[str, typer.Option(help="The job whose missed lookups to explain.")],
    run: Annotated[str | None, typer.Option(help="Only this run (default: every run).")] = None,
    since: Annotated[
        str | None, typer.Option(help="Only runs started this long ago or later (24h, 7d).")
    ] = None,
    env: Annotated[
        str | None,
        typer.Option(help="Only runs with a summary in this environment id (default: any)."),
    ] = None,
    runs: Annotated[
        int, typer.Option(min=1, help="Read the newest N runs; older runs are counted, not read.")
    ] = 32,
    timing: Annotated[
        bool,
        typer.Option(
            "--time",
            help="Where a start's time went: --run (default: the newest run that did not "
            "start warm-local) phase by phase next to the nearest warm run of the job, the "
            "biggest difference first, and why the warm run skipped a phase.",
        ),
    ] = False,
    tier: TierOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Why each lookup of a job missed: the components of its key that differ from the
    nearest key a writer stored, misses grouped by cause (docs/troubleshooting.md). Reads a
    bounded amount whatever the store holds: the newest --runs runs, one at a time, newest
    first, at most 32 MiB of decoded key cards in all; what was not read is said on one line."""
    from objcache.cli import explain as why

    config = _config()
    since_epoch = _since_epoch(_since(since))
    backend = _open(_tiers(config, tier)[0], config)
    # a run's missed cards are beside its summary: in the summaries location where one is
    # configured (docs/operations.md, "Fleet report"); written cards are in the tiers
    source = config.summaries_url if tier is None else None
    runs_at = _open(source, config) if source is not None else backend
    closing = [backend] if runs_at is backend else [backend, runs_at]
    if timing:
        _explain_time(runs_at, closing, config, job, run, env, since, runs, as_json)
    result = _run(
        _closing(
            closing,
            why.collect(
                backend,
                _codec(config),
                job=job,
                run=run,
                runs=runs_at,
                since=since_epoch,
                env=env or None,
                newest=runs,
            ),
        )
    )
    if as_json:
        _print_json(result.as_dict())
    else:
        why.render(result, out)
    raise typer.Exit(0 if result.runs else 1)


def _explain_time(
    source: Backend,
    closing: list[Backend],
    config: Config,
    job: str,
    run: str | None,
    env: str | None,
    since: str | None,
    runs: int,
    as_json: bool,
) -> None:
    """``explain --time``: the run summaries read as ``report`` reads them, one run's phase
    times next to the nearest warm run's (objcache/cli/timing.py)."""
    from objcache.cli import report as fleet
    from objcache.cli import timing
    from objcache.observe.plaintext import text

    found = _run(
        _closing(
            closing,
            fleet.collect(
                source, _codec(config), env=env or None, job=job, since_s=_since(since),
                newest=runs,
            ),
        )
    )  # fmt: skip
    try:
        compared = timing.compare(found, run=run)
    except LookupError as exc:
        _warn(f"explain --time: {exc}")
        raise typer.Exit(1) from None
    if as_json:
        _print_json(compared.as_dict())
    else:
        for line in timing.lines(compared):
            out.print(text(line), soft_wrap=True)
    raise typer.Exit(0)


# --- mega / demo -------------------------------------------------------------------------


#: ``mega save`` from the command line: a bundle is torch's in-memory record of what the
#: process compiled, so only that process can save it (docs/torch.md, "Mega-Cache bundles").
MEGA_SAVE_IN_PROCESS = (
    "mega save: a bundle holds what the compiling process recorded, so it is saved in that "
    "process: call objcache.integrations.torch.mega.save(NAME) after torch.compile (docs/torch.md, "
    '"Mega-Cache bundles"); to seed a store from this machine\'s caches, run objcache push '
    "(--inductor-dir DIR for a TORCHINDUCTOR_CACHE_DIR)"
)


@mega_app.command("save", hidden=True)
def mega_save(name: str) -> None:
    """Refused: a bundle is saved in the process that compiled (objcache.mega.save)."""
    raise UserError(MEGA_SAVE_IN_PROCESS)


@mega_app.command("load")
def mega_load(name: str) -> None:
    """Load bundle NAME into torch's caches (refused when the environment differs)."""
    from objcache.integrations.torch import mega

    try:
        _line(out, mega.load(name))
    except mega.BundleError as exc:  # a missing, foreign or malformed bundle: one line, exit 2
        raise UserError(f"mega load: {exc}") from None


@mega_app.command("ls")
def mega_ls(as_json: JsonOpt = False) -> None:
    """List the bundles stored for this environment (exit 1 when a tier could not list)."""
    from objcache.integrations.torch import mega

    unlisted: list[str] = []
    if as_json:
        _print_json(
            [
                {"name": b.name, "size": b.size, "mtime": b.mtime, "tier": b.tier}
                for b in mega.list_infos(unlisted)
            ]
        )
    else:
        for line in mega.list_bundles(unlisted):
            _line(out, line)
    for name in unlisted:
        _warn(f"mega ls: {name}: could not list (deadline passed or the tier failed)")
    raise typer.Exit(1 if unlisted else 0)


@app.command()
def keygen(path: Path) -> None:
    """Write a new Ed25519 private key to PATH (mode 0600) for writers (CI), and print its
    public key, for OBJCACHE_VERIFY_KEYS on the fleet, as one line on stdout."""
    from objcache.entry.signing import generate_key_file

    try:
        public = generate_key_file(path)
    except FileExistsError:
        raise UserError(f"{path} exists; refusing to overwrite a key") from None
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None
    sys.stdout.write(public + "\n")


@app.command()
def demo(
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="block, tiny, or a model library's: torchvision:<name>, timm:<name> "
            "(that library must be installed).",
        ),
    ] = "block",
    keep: Annotated[bool, typer.Option("--keep", help="Keep the demo's temp dirs.")] = False,
) -> None:
    """Compile a small model cold, then on a "new machine", then warm; print the table."""
    import argparse
    import importlib.util

    from objcache.integrations.torch.demo import main as demo_main
    from objcache.integrations.torch.demo import model_name

    try:
        model_name(model)
    except argparse.ArgumentTypeError as exc:
        raise UserError(str(exc)) from None
    library = model.partition(":")[0] if ":" in model else ""
    if library and importlib.util.find_spec(library) is None:
        raise UserError(f"--model {model}: {library} is not installed (pip install {library})")
    raise typer.Exit(demo_main(["--model", model, *(["--keep"] if keep else [])]))


def _error(exc: Exception) -> None:
    # an error may quote a store's answer or a key from a listing
    err.print(Text.assemble(text("objcache: error:", "red"), " ", text(exc)))


def main() -> None:
    try:
        app()
    except (UserError, ConfigError) as exc:
        _error(exc)
        sys.exit(2)
    except ObjcacheError as exc:
        _error(exc)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
