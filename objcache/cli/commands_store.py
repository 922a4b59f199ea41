"""The commands on a store's entries: ``ls``, ``push``, ``pull`` (``warm``), ``gc`` and
``verify``: their options, the tiers they act on and what they print; the operations
themselves are in ``ops`` (docs/architecture.md, "Modules, top to bottom")."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from objcache.backends.base import Backend
from objcache.cli import common, ops
from objcache.cli.common import DryRun, JsonOpt, TierOpt, UserError, err, out
from objcache.config.fingerprint import env_id
from objcache.config.settings import Config
from objcache.config.urls import parse_tier_list
from objcache.entry.layout import KINDS
from objcache.errors import ConfigError, ObjcacheError
from objcache.observe.plaintext import text
from objcache.stores import disk_spec, local_spec, open_tier

# --- ls ----------------------------------------------------------------------------------


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
    config = common.load_config()
    spec = common.tier_specs(config, tier)[0]
    backend = open_tier(spec, config, mode="command")
    if envs:
        found = common.run_async(
            common.close_after([backend], ops.environments(backend, common.codec_of(config)))
        )
        if as_json:
            common.print_json(found)
            return
        table = Table("env", "entries", "bytes", "torch", "cpu_isa", "gpu", "this machine")
        for eid, info in sorted(found.items()):
            f = info["fields"]
            table.add_row(
                text(eid),
                str(info["entries"]),
                common.human_size(info["bytes"]),
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

    listed = common.run_async(common.close_after([backend], collect()))
    if kind is not None and kind not in KINDS and not listed:
        raise UserError(_unknown_kind(kind))
    rows = [
        e
        for e in listed
        if e.info.size >= min_size and (older_than is None or e.age_days > older_than)
    ]
    if as_json:
        common.print_json(
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
            text(e.env),
            text(e.kind),
            text(e.key),
            common.human_size(e.info.size),
            f"{e.age_days:.1f}",
        )
    out.print(table)
    out.print(f"{len(rows)} entries, {common.human_size(sum(e.info.size for e in rows))}")


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
    open_source: Callable[[], Backend],
    open_targets: Callable[[], list[Backend]],
    env: str | None,
    what: str,
    config: Config,
    *,
    read_only: bool = False,
    as_json: bool = False,
    processes: int = 1,
    schemes: Sequence[str] = (),
) -> ops.CopyReport:
    """Copy this environment's entries (or all) and print the outcome; the caller decides
    what the outcome means for the exit code. ``processes``: the copy's shards, each in a
    process of its own that opens the tiers itself (``objcache/cli/bulk_processes.py``);
    ``schemes``: those tiers' schemes, whose backends are imported before the fork."""
    from objcache.cli import bulk_processes
    from objcache.core.manifest import shard_of

    started = time.perf_counter()
    listed = 0
    bar, plan, done = common.growing_progress_bar(what)

    listing = threading.Lock()  # told by the threads that read the children's pipes

    def counted(n: int) -> None:
        nonlocal listed
        with listing:
            listed += n
        plan(n)

    def run_shard(
        index: int, count: int, planned: Callable[[int], None], progress: Callable[[int, int], None]
    ) -> dict[str, Any]:
        source, targets = open_source(), open_targets()
        report = ops.CopyReport()
        keys: list[str] = []
        sizes: dict[str, int] = {}

        async def run() -> ops.CopyReport:
            async for e in ops.entries(source, env=env):
                if shard_of(e.info.key, count) == index:
                    keys.append(e.info.key)
                    sizes[e.info.key] = e.info.size
            if env and shard_of(f"v1/{env}/ENV.json", count) == index:
                keys.append(f"v1/{env}/ENV.json")
            planned(len(keys))
            return await ops.copy(
                source,
                targets,
                keys,
                common.codec_of(config),
                lambda nbytes: progress(1, nbytes),
                read_only=read_only,
                caps=config.max_entry_bytes,
                report=report,
                sizes=sizes,
            )

        try:
            common.run_async(common.close_after([source, *targets], run()))
        except KeyboardInterrupt:
            # each object is written whole or not at all: the writes under way land (or
            # fail) before they are counted
            report.settle()
            raise bulk_processes.Interrupted([_report_fields(report, len(keys))]) from None
        return _report_fields(report, len(keys))

    count = bulk_processes.process_count(processes, schemes)
    try:  # the bar's thread starts once the children are forked
        results, failures = bulk_processes.run(count, run_shard, counted, done, forked=bar.start)
    except bulk_processes.Interrupted as exc:
        # Ctrl-C (exit 130): what is there is complete and a second run copies the rest
        # (docs/operations.md, "Exit codes")
        bar.stop()
        report = _merged_report(exc.results)
        if listed:
            copied = report.copied + report.existed
            common.print_line(
                err, f"{what}: interrupted: {copied:,} of {listed:,} copied; run again to finish"
            )
        else:
            common.print_line(err, f"{what}: interrupted while listing: nothing copied")
        raise
    finally:
        bar.stop()
    report = _merged_report(results)
    report.failed += len(failures)
    report.errors += [f"a process of the copy: {line}" for line in failures]
    if as_json:
        common.print_json(
            {
                "command": what,
                "copied": report.copied,
                "bytes": report.bytes,
                "existed": report.existed,
                "refused": report.refused,
                "failed": report.failed,
                "errors": report.errors,
                "processes": count,
                **common.rates(report.copied, report.bytes, time.perf_counter() - started),
            }
        )
        return report
    out.print(
        f"{what}: {report.copied} copied ({common.human_size(report.bytes)}), "
        f"{report.existed} already there, "
        f"{report.refused} refused (corrupt/unsigned), {report.failed} failed"
    )
    for line in report.errors[:10]:
        common.print_line(err, f"  {line}")
    return report


#: Errors a shard of a copy tells the parent at most.
_SHARD_ERRORS = 20


def _report_fields(report: ops.CopyReport, listed: int) -> dict[str, Any]:
    return {
        "copied": report.copied,
        "existed": report.existed,
        "refused": report.refused,
        "failed": report.failed,
        "bytes": report.bytes,
        "errors": report.errors[:_SHARD_ERRORS],
        "listed": listed,
    }


def _merged_report(results: list[dict[str, Any]]) -> ops.CopyReport:
    report = ops.CopyReport()
    for r in results:
        report.copied += int(r.get("copied", 0))
        report.existed += int(r.get("existed", 0))
        report.refused += int(r.get("refused", 0))
        report.failed += int(r.get("failed", 0))
        report.bytes += int(r.get("bytes", 0))
        report.errors += [str(e) for e in r.get("errors", [])]
    return report


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
    config = common.load_config()
    specs = common.write_targets(config, tier, "push")
    if inductor_dir is not None or bundle:
        from collections import Counter

        from objcache.integrations.torch.mega.seed import UnsafeDir, import_local

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
            common.warn(f"push --inductor-dir: left out (never published): {reasons}")
    src_dir = source or config.local_dir
    if not src_dir.is_dir():
        raise UserError(f"nothing to push: {src_dir} does not exist")
    report = _copy(
        lambda: open_tier(disk_spec(src_dir), config, mode="command"),
        lambda: [open_tier(s, config, mode="command") for s in specs],
        None if all_envs else env_id(),
        "push",
        config,
        read_only=config.read_only,
        as_json=as_json,
        processes=config.bulk_processes,
        schemes=[s.scheme for s in specs],
    )
    raise typer.Exit(1 if report.failed or report.refused else 0)


def pull(
    tier: TierOpt = None,
    job: Annotated[str | None, typer.Option(help="Fetch what this job's manifests list.")] = None,
    all_envs: Annotated[
        bool, typer.Option("--all-envs", help="Every environment, not only this one.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Warm the local tier: by job manifest, or everything for this environment.

    Best-effort: a missing bucket, a hung tier or entries that cannot be fetched are warnings
    and exit 0 (a cold start is slower, not broken); only bad usage or configuration exits 2."""
    config = common.load_config()
    try:
        _pull(config, tier, job, all_envs, as_json)
    except ConfigError:
        raise
    except ObjcacheError as exc:
        common.warn(f"pull: nothing warmed: {exc}")


def _pull(config: Config, tier: str | None, job: str | None, all_envs: bool, as_json: bool) -> None:
    if job:
        _pull_job(config, tier, job, as_json)
        return
    spec = common.tier_specs(config, tier)[0]
    report = _copy(
        lambda: open_tier(spec, config, mode="command"),
        lambda: [open_tier(local_spec(config), config, mode="command")],
        None if all_envs else env_id(),
        "pull",
        config,
        as_json=as_json,
        processes=config.bulk_processes,
        schemes=[spec.scheme],
    )
    if report.failed or report.refused:
        common.warn(f"pull: {report.failed + report.refused} entries not warmed (listed above)")


def _pull_job(config: Config, tier: str | None, job: str, as_json: bool) -> None:
    """``pull --job``: the job's entries, over a process per core
    (``objcache/cli/bulk_processes.py``)."""
    from objcache.cli import bulk_processes
    from objcache.client import build_cache
    from objcache.core import manifest

    bar, plan, done = common.growing_progress_bar("pull")

    def run_shard(
        index: int, count: int, planned: Callable[[int], None], progress: Callable[[int, int], None]
    ) -> dict[str, Any]:
        cache = build_cache(config if not tier else Config.from_env(tiers=tier))

        async def run() -> dict[str, Any]:
            try:
                # the machine is the pull's alone: as many fetches as a copy keeps in
                # flight, not a start-up prefetch's share (docs/benchmarks.md,
                # "Pre-seeding against s5cmd")
                return await manifest.prefetch(
                    cache,
                    job,
                    concurrency=ops.BULK_CONCURRENCY,
                    byte_budget=ops.BULK_BYTE_BUDGET,
                    progress=lambda n: progress(1, n),
                    planned=planned,
                    shard=(index, count),
                    streamed=True,
                )
            finally:
                await cache.close(config.flush_timeout_s)

        return common.run_async(run())

    schemes = [s.scheme for s in common.tier_specs(config, tier)]
    count = bulk_processes.process_count(config.bulk_processes, schemes)
    try:  # the bar's thread starts once the children are forked
        results, failures = bulk_processes.run(count, run_shard, plan, done, forked=bar.start)
    finally:
        bar.stop()
    for line in failures:
        common.warn(f"pull: {line}")
    result = bulk_processes.merge(results)
    if as_json:
        common.print_json(
            {
                "command": "pull",
                **result,
                **common.rates(result["fetched"], result["bytes"], result["seconds"]),
            }
        )
    else:
        out.print(
            f"job {job}: {result['manifests']} manifests, {result['keys']} entries, "
            f"{result['fetched']} fetched ({common.human_size(result['bytes'])}), "
            f"{result['already_local']} already local in {result['seconds']} s"
        )
    if not result.get("manifests"):
        common.warn(f"pull: job {job} has no manifest in the configured tiers: nothing warmed")


# --- gc / verify -------------------------------------------------------------------------


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
    config = common.load_config()
    # A dry run deletes nothing, so it may look at read-only tiers too.
    specs = common.tier_specs(config, tier) if dry_run else common.write_targets(config, tier, "gc")
    keep = None if keep_env is None else {env_id() if e == "current" else e for e in keep_env}

    async def plan_all() -> list[ops.GcPlan]:
        backends = [open_tier(s, config, mode="command") for s in specs]
        return await common.close_after(
            backends,
            asyncio.gather(
                *(
                    ops.plan_gc(b, keep_envs=keep, older_than_days=older_than, max_bytes=max_bytes)
                    for b in backends
                )
            ),
        )

    plans = common.run_async(plan_all())
    total = sum(len(p.delete) for p in plans)
    if as_json and (dry_run or not total):
        common.print_json(
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
        common.print_line(
            out,
            f"{spec.display}: {len(plan.delete)} entries ({common.human_size(plan.delete_bytes)}) "
            "to delete, "
            f"{common.human_size(plan.keep_bytes)} kept",
        )
    if dry_run or not total:
        for spec, plan in zip(specs, plans, strict=True):
            for e in plan.delete[:20]:
                common.print_line(out, f"  {spec.display}: would delete {e.info.key}")
        return
    if not yes and not typer.confirm("delete them?"):
        raise typer.Exit(1)
    bar, advance = common.progress_bar(total, "gc")

    async def run() -> list[int]:
        backends = [open_tier(s, config, mode="command") for s in specs]

        async def one(i: int, backend: Backend) -> int:
            return await ops.run_gc(backend, plans[i], advance, read_only=config.read_only)

        with bar:
            return await common.close_after(
                backends, asyncio.gather(*(one(i, b) for i, b in enumerate(backends)))
            )

    deleted = common.run_async(run())
    if as_json:
        common.print_json(
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


def verify(
    tier: TierOpt = None,
    all_envs: Annotated[bool, typer.Option("--all-envs")] = False,
    delete: Annotated[bool, typer.Option("--delete", help="Delete bad entries.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Check every entry's digest (and signature, when signing keys are set)."""
    config = common.load_config()
    spec = parse_tier_list(tier, "--tier")[0] if tier else local_spec(config)
    # The local tier is this machine's own: a read-only configuration protects remote tiers.
    read_only = config.read_only and bool(tier)
    if delete:
        ops.refuse_read_only("verify --delete", [spec], read_only=read_only)
    backend = open_tier(spec, config, mode="command")
    bar, advance = common.progress_bar(0, "verify")

    async def run() -> ops.VerifyReport:
        with bar:
            return await ops.verify(
                backend,
                common.codec_of(config),
                env=None if all_envs else env_id(),
                delete=delete,
                progress=advance,
                read_only=read_only,
                caps=config.max_entry_bytes,
            )

    report = common.run_async(common.close_after([backend], run()))
    if as_json:
        common.print_json(
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
    common.print_line(
        out,
        f"{spec.display}: {report.checked} checked, {len(report.bad)} bad, "
        f"{report.deleted} deleted",
    )
    raise typer.Exit(1 if report.bad and not delete else 0)
