"""Where a process's compile time went, in torch's own figures.

torch times every phase of a compile with ``dynamo_timed`` and keeps the durations in
``torch._dynamo.utils.compilation_time_metrics`` (a dict of phase name -> list of seconds),
always, whatever the logging settings: Dynamo's bytecode tracing, guard building, the
backend call (AOTAutograd and Inductor), the AOTAutograd cache's load, lowering and code
generation on a miss, module loads, g++ builds, the wait for parallel kernel builds, the
lazily compiled backward. objcache reads that dict when a run writes its summary; it adds
nothing to a compile (docs/architecture.md, "Phase times").

Recompiles come from the same place: torch keeps each frame compile's metrics (the last
64), with the guard that failed as ``recompile_reason``; a run keeps up to 16 of them,
redacted (:mod:`objcache.observe.recompile_reasons`: a guard can quote the value it
compared, a secret's among them; its structure is kept).

Run summaries carry the sums (:mod:`objcache.observe.run_summary`); ``objcache explain
--time`` compares a new machine's with a warm run's (:mod:`objcache.cli.timing`).
"""

from __future__ import annotations

import sys

#: Recompiles kept per run (the first ones: a recompile storm repeats its first reasons).
MAX_RECOMPILES = 16

#: Phases kept per run, the longest first (torch records about 40 kinds on a cold compile).
MAX_PHASES = 96


def snapshot() -> dict[str, tuple[float, int]]:
    """``"torch:<phase>" -> (seconds, times)`` of this process so far; empty when torch's
    Dynamo was never imported (this never imports torch)."""
    utils = sys.modules.get("torch._dynamo.utils")
    metrics = getattr(utils, "compilation_time_metrics", None)
    if not isinstance(metrics, dict):
        return {}
    out: dict[str, tuple[float, int]] = {}
    for name, times in list(metrics.items()):
        try:
            values = [float(t) for t in list(times)]
        except (TypeError, ValueError):
            continue
        out[f"torch:{str(name)[:200]}"] = (round(sum(values), 6), len(values))
    ranked = sorted(out.items(), key=lambda kv: -kv[1][0])[:MAX_PHASES]
    return dict(ranked)


def recompiles() -> list[tuple[str, str, float]]:
    """``(frame, reason, seconds)`` of this process's recompiles so far (torch's own
    ``recompile_reason``), at most :data:`MAX_RECOMPILES`; empty without Dynamo."""
    from objcache.observe.recompile_reasons import redact_reason

    utils = sys.modules.get("torch._dynamo.utils")
    metrics = getattr(utils, "get_compilation_metrics", None)
    if metrics is None:
        return []
    try:
        every = list(metrics())
    except Exception:
        return []
    out: list[tuple[str, str, float]] = []
    for m in every:
        reason = getattr(m, "recompile_reason", None)
        if not reason:
            continue
        where = f"{getattr(m, 'co_name', '?')} ({_basename(getattr(m, 'co_filename', ''))}"
        where += f":{getattr(m, 'co_firstlineno', 0)})"
        seconds = getattr(m, "entire_frame_compile_time_s", None)
        took = float(seconds) if isinstance(seconds, (int, float)) and seconds >= 0 else 0.0
        out.append((redact_reason(where, 120), redact_reason(str(reason)), round(took, 6)))
        if len(out) == MAX_RECOMPILES:
            break
    return out


def _basename(path: object) -> str:
    return str(path).replace("\\", "/").rsplit("/", 1)[-1] or "?"
