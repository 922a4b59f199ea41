"""``objcache report`` (a job's runs across hosts, one row each) and ``objcache explain``
(why a job's lookups missed; ``--time``: where a start's time went): the commands over a
fleet's run summaries and key cards. They open the stores and print; reading and rendering
are in ``report``, ``explain`` and ``timing`` (docs/architecture.md, "Modules, top to
bottom")."""

from __future__ import annotations

import logging
import time
from typing import Annotated

import typer

from objcache.backends.base import Backend
from objcache.cli import common
from objcache.cli.common import JsonOpt, TierOpt, UserError, out
from objcache.config.settings import Config
from objcache.stores import open_tier

# --- report ------------------------------------------------------------------------------


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

    config = common.load_config()
    since_s = _since(since)
    # the summaries location, where one is configured (docs/operations.md, "Fleet report")
    source = config.summaries_url if tier is None else None
    backend = open_tier(source or common.tier_specs(config, tier)[0], config, mode="command")
    # written key cards are in the tiers, runs' missed cards beside the summaries
    cards = (
        backend
        if source is None
        else open_tier(common.tier_specs(config, tier)[0], config, mode="command")
    )
    bar, advance = common.progress_bar(0, "report")
    codec = common.codec_of(config)

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

    result = common.run_async(
        common.close_after([backend] if cards is backend else [backend, cards], run())
    )
    if as_json:
        common.print_json(result.as_dict())
    else:
        fleet.render(result, out, common.human_size)
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

    config = common.load_config()
    since_epoch = _since_epoch(_since(since))
    backend = open_tier(common.tier_specs(config, tier)[0], config, mode="command")
    # a run's missed cards are beside its summary: in the summaries location where one is
    # configured (docs/operations.md, "Fleet report"); written cards are in the tiers
    source = config.summaries_url if tier is None else None
    runs_at = open_tier(source, config, mode="command") if source is not None else backend
    closing = [backend] if runs_at is backend else [backend, runs_at]
    if timing:
        _explain_time(runs_at, closing, config, job, run, env, since, runs, as_json)
    result = common.run_async(
        common.close_after(
            closing,
            why.collect(
                backend,
                common.codec_of(config),
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
        common.print_json(result.as_dict())
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

    found = common.run_async(
        common.close_after(
            closing,
            fleet.collect(
                source, common.codec_of(config), env=env or None, job=job, since_s=_since(since),
                newest=runs,
            ),
        )
    )  # fmt: skip
    try:
        compared = timing.compare(found, run=run)
    except LookupError as exc:
        common.warn(f"explain --time: {exc}")
        raise typer.Exit(1) from None
    if as_json:
        common.print_json(compared.as_dict())
    else:
        for line in timing.lines(compared):
            out.print(text(line), soft_wrap=True)
    raise typer.Exit(0)
