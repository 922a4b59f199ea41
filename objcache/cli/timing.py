"""``objcache explain --time --job NAME``: where a slow start's time went, next to a warm run.

Every run summary carries its phase times (docs/architecture.md, "Phase times"): torch's own
(``dynamo_timed``: Dynamo tracing, guards, the backend, cache loads, code generation on a
miss, module loads, g++ builds) and objcache's (lookup waits per tier, node leases, the
prefetch). This puts one run (``--run``, else the newest run that did not start warm on its
own machine) next to the nearest warm run of the same job in the same environment (its
local caches answered its lookups), the phases that differ most first, and says which
phases the warm run skipped and why, from the two runs' own counts (hits per kind, misses
by reason).

torch's phases nest (a frame compile holds Dynamo's tracing and the backend call, which
holds AOTAutograd and Inductor): the phases known to hold others are shown as totals, the
ranking is of the rest. A phase name torch adds in a later release is ranked as it comes.
The run's prefetch, which runs beside the compiles, has its own section
(:mod:`objcache.cli.prefetch_view`): whether a far store or the machine held the start back.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from objcache.cli import prefetch_view
from objcache.cli.report import Report, Row

#: The run's time outside compiles: its duration less the frame compiles and the first
#: backward's (derived here, not recorded).
OUTSIDE = "objcache:outside compiles"
#: What a process spends compiling, outermost: frame compiles (Dynamo and the backend) and
#: the lazily compiled backward, which runs outside them.
_COMPILING = ("torch:_compile.compile_inner", "torch:backward._backward_impl")

#: torch phases that hold others: shown as totals, never named as the cause.
TOTALS = {
    "torch:_compile.compile_inner": "frame compiles (Dynamo and the backend)",
    "torch:compile_attempt_0": "frame compile attempts",
    "torch:entire_frame_compile": "frame compiles",
    "torch:OutputGraph.call_user_compiler": "backend (AOTAutograd and Inductor)",
    "torch:create_aot_dispatcher_function": "AOTAutograd",
    "torch:compile_fx.<locals>.fw_compiler_base": "Inductor, forward graphs",
    "torch:compile_fx.<locals>.bw_compiler": "Inductor, backward graphs (at the first backward)",
    "torch:backward._backward_impl": "the first backward's compile",
    "torch:compile_fx_inner": "Inductor graph compiles",
    "torch:fx_codegen_and_compile": "Inductor code generation and compile (a miss)",
    "torch:GraphLowering.codegen": "code generation (a miss)",
    "torch:Scheduler.codegen": "kernel code generation (a miss)",
    "torch:aot_trace_joint_graph": "AOTAutograd tracing the joint graph",
}

#: Phases that, on some paths, run others inside them: on a new machine an AOTAutograd hit
#: loads its modules, and a module load builds the kernels it lacks. Where the children
#: account for half of the parent's difference or more, the parent is shown as a total.
CHILDREN = {
    "torch:AOTAutogradCache.inductor_load": (
        "torch:PyCodeCache.load_by_key_path",
        "torch:compile_file",
        "torch:async_compile.wait",
    ),
    "torch:PyCodeCache.load_by_key_path": ("torch:compile_file", "torch:async_compile.wait"),
}

#: What the ranked phases are, in a user's words.
LABELS = {
    "torch:bytecode_tracing": "Dynamo tracing the bytecode",
    "torch:build_guards": "building guards",
    "torch:AOTAutogradCache.inductor_load": "AOTAutograd cache hit: loading its compiled graphs",
    "torch:PyCodeCache.load_by_key_path": "loading compiled modules (Python, C++ .so)",
    "torch:compile_file": "g++ builds (kernels, vector-ISA probes)",
    "torch:async_compile.wait": "waiting for parallel kernel builds",
    "torch:GraphLowering.run": "lowering the graph (a miss)",
    "torch:Scheduler.__init__": "scheduling kernels (a miss)",
    "torch:inductor_codecache_torch_key": "hashing torch's sources for the cache key",
    "torch:CacheBase.get_system.triton_key": "hashing Triton for the cache key",
    "torch:precompile_load_guards": "precompile entry: loading guards",
    "torch:precompile_build_guards": "precompile entry: building guards",
    "objcache:lookup wait": "objcache lookups (the time compiles waited)",
    "objcache:node lease": "waiting for another process's fetch (node lease)",
    "objcache:prefetch (beside the compiles)": "prefetch (beside the compiles)",
    OUTSIDE: "outside compiles: start-up, imports, the steps themselves",
}

#: Which lookups say why a phase ran: phase -> entry kinds whose hits would have skipped it.
EVIDENCE = {
    "torch:compile_file": ("kernel", "isa-probe"),
    "torch:async_compile.wait": ("kernel", "fx-graph"),
    "torch:GraphLowering.run": ("fx-graph", "aot-autograd"),
    "torch:Scheduler.__init__": ("fx-graph", "aot-autograd"),
    "torch:bytecode_tracing": ("precompile",),
    "torch:build_guards": ("precompile",),
    "torch:PyCodeCache.load_by_key_path": ("fx-graph", "kernel"),
    "torch:AOTAutogradCache.inductor_load": ("aot-autograd",),
}

#: A phase shorter than this in both runs is noise, not shown.
NOISE_S = 0.01


def label(name: str) -> str:
    if name in TOTALS:
        return TOTALS[name]
    if name in LABELS:
        return LABELS[name]
    if name.startswith("objcache:get remote "):
        return f"GETs from {name[len('objcache:get remote ') :]}"
    if name.startswith("objcache:get local "):
        return f"GETs from the local tier {name[len('objcache:get local ') :]}"
    if name.startswith("torch:pgo."):
        return f"dynamic-shape profile ({name[len('torch:') :]})"
    return name.split(":", 1)[1] if ":" in name else name


@dataclass
class Phase:
    name: str
    label: str
    here_s: float
    warm_s: float
    total: bool
    #: Why the warm run skipped it (empty: it did not, or nothing says why).
    why: str = ""

    @property
    def difference_s(self) -> float:
        return self.here_s - self.warm_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "phase": self.name,
            "label": self.label,
            "this_run_s": round(self.here_s, 3),
            "warm_run_s": round(self.warm_s, 3),
            "difference_s": round(self.difference_s, 3),
            "total": self.total,
            "why": self.why,
        }


@dataclass
class Comparison:
    job: str
    run: Row
    warm: Row | None
    phases: list[Phase] = field(default_factory=list)
    #: Summaries left out, by reason (no phase times: an older objcache).
    skipped: Counter[str] = field(default_factory=Counter)
    #: Why no warm run was found, when none was.
    note: str = ""

    @property
    def ranked(self) -> list[Phase]:
        """The phases that are not totals, the biggest difference first."""
        return [p for p in self.phases if not p.total]

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "run": _run(self.run),
            "warm": None if self.warm is None else _run(self.warm),
            "phases": [p.as_dict() for p in self.phases],
            "skipped": dict(self.skipped),
            "note": self.note,
            # the run's prefetch time line, its throughput and verdict (None: no prefetch)
            "prefetch": None
            if self.run.prefetch is None
            else prefetch_view.as_dict(self.run.prefetch),
        }


def _run(row: Row) -> dict[str, Any]:
    return {
        "run": row.run,
        "host": row.host,
        "env": row.env,
        "started": row.started,
        "duration_s": row.duration_s,
        "warm_local": row.warm_local,
        "lookups": row.lookups,
        "hits": row.hits,
        "local_hits": row.local_hits,
        "recompiles": [{"frame": f, "reason": r, "s": t} for f, r, t in row.recompiles],
    }


def _counts(row: Row, kinds: tuple[str, ...]) -> str:
    parts = [
        f"{kind} {row.kinds[kind]['hits']}/{row.kinds[kind]['lookups']}"
        for kind in kinds
        if kind in row.kinds
    ]
    return ", ".join(parts)


def why_skipped(name: str, here: Row, warm: Row) -> str:
    """Why ``warm`` did not spend time in phase ``name`` where ``here`` did, from the runs'
    own counts."""
    if name.startswith("objcache:get remote ") or name == "objcache:lookup wait":
        if not warm.lookups:
            return (
                "the warm run asked objcache nothing: torch's own local caches answered "
                f"first; this run's local tier answered {here.local_hits} of its "
                f"{here.lookups} lookups, the rest waited on the remote tiers"
            )
        return (
            f"the warm run's local tier answered {warm.local_hits} of its {warm.lookups} "
            f"lookups; this run's answered {here.local_hits} of {here.lookups}, the rest "
            "waited on the remote tiers"
        )
    if name == OUTSIDE:
        return (
            "not a compile phase: start-up, imports, the steps, and work torch does at a "
            "compiled function's first call; a busier or slower machine shows here"
        )
    if name == "objcache:node lease":
        return (
            "a lookup the local tier did not answer takes this machine's lease for its key "
            "first (one fetch per machine, other processes wait for it); the warm run's "
            "were answered locally"
        )
    kinds = EVIDENCE.get(name)
    if kinds is not None:
        counts = _counts(here, kinds)
        misses = ", ".join(f"{r}={n}" for r, n in sorted(here.misses.items()))
        if counts:
            return (
                f"the warm run's own caches held the result; here objcache hits per kind: "
                f"{counts}" + (f" (misses: {misses})" if misses else "")
            )
        return (
            "the warm run's own caches held the result; this run asked objcache for none "
            f"of it ({', '.join(kinds)}: no lookup)"
        )
    return "the warm run's own caches held the result"


def compare(report: Report, *, run: str | None = None) -> Comparison:
    """``run`` (or the newest run that did not start warm-local) next to the nearest warm
    run of the same environment (else of any)."""
    with_phases = [r for r in report.rows if r.has_summary and r.phases is not None]
    skipped: Counter[str] = Counter({f"summary {r}": n for r, n in report.skipped.items()})
    older = sum(1 for r in report.rows if r.has_summary and r.phases is None)
    if older:
        skipped["no phase times (an older objcache)"] = older
    if run is not None:
        chosen = [r for r in with_phases if run in (r.runs or [r.run])]
        if not chosen:
            raise LookupError(f"run {run!r} of job {report.job!r} has no summary with phase times")
        target = chosen[0]
    else:
        slow = [r for r in with_phases if not r.warm_local] or with_phases
        if not slow:
            raise LookupError(f"job {report.job!r} has no run summary with phase times")
        target = max(slow, key=lambda r: (r.started, r.run))
    warm, note = _nearest_warm(target, with_phases)
    comparison = Comparison(report.job, target, warm, skipped=skipped, note=note)
    mine = with_outside(target)
    theirs = with_outside(warm) if warm is not None else {}
    for name in mine.keys() | theirs.keys():
        here_s, warm_s = mine.get(name, (0.0, 0))[0], theirs.get(name, (0.0, 0))[0]
        if max(here_s, warm_s) < NOISE_S:
            continue
        phase = Phase(name, label(name), here_s, warm_s, _holds_others(name, mine, theirs))
        # a phase the warm run skipped, or spent less than half as long in
        if warm is not None and not phase.total and here_s >= NOISE_S and warm_s < here_s / 2:
            phase.why = why_skipped(name, target, warm)
        comparison.phases.append(phase)
    comparison.phases.sort(key=lambda p: (p.total, -abs(p.difference_s), p.name))
    return comparison


def with_outside(row: Row) -> dict[str, tuple[float, int]]:
    """The run's phases and its time outside compiles (duration less the outermost compile
    phases; a folded group's processes overlap, so it is never below zero)."""
    phases = dict(row.phases or {})
    if row.duration_s is not None and any(name in phases for name in _COMPILING):
        compiling = sum(phases.get(name, (0.0, 0))[0] for name in _COMPILING)
        phases[OUTSIDE] = (max(0.0, row.duration_s - compiling), 1)
    return phases


def _holds_others(
    name: str, mine: dict[str, tuple[float, int]], theirs: dict[str, tuple[float, int]]
) -> bool:
    if name in TOTALS:
        return True
    children = CHILDREN.get(name)
    if not children:
        return False

    def diff(phase: str) -> float:
        return mine.get(phase, (0.0, 0))[0] - theirs.get(phase, (0.0, 0))[0]

    own = diff(name)
    # the largest child's difference: inside the parent when it accounts for at least half
    # of the parent's, and not much more (a child that took far longer ran elsewhere, in
    # the parallel compile workers; summed over threads, a nested one can exceed a little)
    inner = max((diff(c) for c in children), default=0.0)
    return own > 0 and 0.5 * own <= inner <= 1.5 * own


def _nearest_warm(target: Row, rows: list[Row]) -> tuple[Row | None, str]:
    warm = [r for r in rows if r is not target and r.warm_local]
    same_env = [r for r in warm if r.env == target.env]
    pool, note = same_env, ""
    if not same_env and warm:
        pool, note = warm, "no warm run in this run's environment: compared with another's"
    if not pool:
        return None, "no warm run of this job: each phase shown for this run alone"
    before = [r for r in pool if r.started <= target.started]
    return max(before or pool, key=lambda r: (r.started, r.run)), note


# --- rendering -------------------------------------------------------------------------------


def lines(c: Comparison) -> list[str]:
    """The text ``objcache explain --time`` prints (every store string escaped by the
    caller's :func:`~objcache.observe.plaintext.text`)."""
    here = c.run
    out = [
        f"job {c.job}: run {here.run} (host {here.host}, "
        f"{'warm-local' if here.warm_local else 'not warm-local'}, "
        f"{here.duration_s or 0:.1f} s, hits {here.hits}/{here.lookups})"
    ]
    if c.warm is not None:
        w = c.warm
        out.append(
            f"  against warm run {w.run} (host {w.host}, {w.duration_s or 0:.1f} s, "
            f"local tier answered {w.local_hits}/{w.lookups})"
        )
    if c.note:
        out.append(f"  {c.note}")
    if c.skipped:
        out.append("  skipped: " + ", ".join(f"{n} {r}" for r, n in sorted(c.skipped.items())))
    totals = [p for p in c.phases if p.total]
    if totals:
        out.append("")
        out.append("totals (each holds phases listed below it):")
        for p in sorted(totals, key=lambda p: -p.here_s):
            out.append(f"  {p.label}: {p.here_s:.2f} s here, {p.warm_s:.2f} s warm")
    out.append("")
    out.append("phases, the biggest difference first (this run / warm run / difference):")
    for p in c.ranked:
        out.append(f"  {p.here_s:8.2f} s {p.warm_s:8.2f} s {p.difference_s:+8.2f} s  {p.label}")
        if p.why:
            how = "skipped it" if p.warm_s < NOISE_S else "spent less"
            out.append(f"      the warm run {how}: {p.why}")
    out.extend(recompile_lines(c))
    out.extend(prefetch_view.lines(c.run.prefetch))
    return out


#: Recompile reasons shown in text (``--json`` has every one a summary holds).
SHOWN_RECOMPILES = 5


def recompile_lines(c: Comparison) -> list[str]:
    """The run's recompiles next to the warm run's, with the reasons the warm run did not
    have (torch's guard failures)."""
    here = c.run.recompiles
    warm = c.warm.recompiles if c.warm is not None else []
    if not here and not warm:
        return []
    out = ["", f"recompiles: {len(here)} in this run, {len(warm)} in the warm run"]
    theirs = {reason for _, reason, _ in warm}
    new = [(f, r, t) for f, r, t in here if r not in theirs]
    for frame, reason, took in new[:SHOWN_RECOMPILES]:
        out.append(f"  {took:6.2f} s  {frame}: {reason}")
    if len(new) > SHOWN_RECOMPILES:
        out.append(f"  ... {len(new) - SHOWN_RECOMPILES} more (--json has them)")
    return out
