"""``objcache doctor`` (what is in force, and whether every tier answers) and ``objcache
stats`` (the last process's hits, misses and latency per tier): the commands that look at
this machine's configuration and results (docs/architecture.md, "Modules, top to bottom")."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from objcache.backends.base import TierSpec
from objcache.cli import common, ops
from objcache.cli.common import JsonOpt, TierOpt, UserError, out
from objcache.config.fingerprint import env_id, fingerprint
from objcache.config.settings import Config
from objcache.config.urls import flag
from objcache.observe.plaintext import text
from objcache.stores import local_spec, open_tier

# --- doctor ------------------------------------------------------------------------------


def _in_force(config: Config) -> dict[str, Any]:
    """What this process's configuration really puts in force (docs/operations.md)."""
    from objcache.config.settings import unknown_variables
    from objcache.integrations.install import autoload

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
        from objcache.integrations.install import features

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


def doctor(tier: TierOpt = None, as_json: JsonOpt = False) -> None:
    """Say what is in force (enabled, torch parts, signing, verification, read-only, unknown
    variables), then check that every tier can be read, written in create mode and deleted."""
    config = common.load_config()
    specs = [local_spec(config), *common.tier_specs(config, tier)]
    codec = common.codec_of(config)
    state = _in_force(config)
    if not as_json:
        out.print(
            f"environment [bold]{env_id()}[/]: "
            + ", ".join(f"{k}={v}" for k, v in fingerprint().items())
        )
        for line in _in_force_lines(state):
            common.print_line(out, line)
    table = Table("tier", "result", "create ms", "read ms", "delete ms", "detail")
    failed = 0

    async def check(spec: TierSpec) -> ops.ProbeResult:
        backend = open_tier(spec, config, mode="command")
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
    for spec, result in zip(specs, common.run_async(check_all()), strict=True):
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
        common.print_json({**state, "tiers": tiers})
        raise typer.Exit(1 if failed else 0)
    out.print(table)
    for line in abouts + reasons:  # a table cell wraps and truncates: one whole line each
        common.print_line(out, line)
    raise typer.Exit(1 if failed else 0)


# --- stats -------------------------------------------------------------------------------


def stats(
    as_json: JsonOpt = False,
    file: Annotated[Path | None, typer.Option(help="Stats file (default: last run's).")] = None,
) -> None:
    """Hits, misses by reason, bytes and latency per tier of the last objcache process."""
    from objcache.client import stats_file

    path = file or stats_file(common.load_config())
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"no stats at {path}: run something with objcache enabled first") from None
    except ValueError:
        raise UserError(f"{path} is not an objcache stats file") from None
    if as_json:
        common.print_json(data)
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
            common.human_size(t["bytes_read"]),
            common.human_size(t["bytes_written"]),
            latency_cell(lat),
            t.get("breaker", ""),
        )
    out.print(table)
