"""Per-module score of the last `make mutation` run, as the Markdown table in docs/testing.md.

Reads mutmut's result files (``mutants/**/*.py.meta``). A mutant counts as detected when a
test failed, hung past mutmut's deadline, or crashed the test process; "no tests" (no fast
test calls the mutated function) counts against the score; mutants an interrupted run
never reached ("not checked") are shown apart and left out of the score. ``--survivors`` lists every
mutant that is not detected, one per line, for docs/testing.md. ``--names [MODULE...]`` prints
their names on one line (those of the dotted MODULEs only, when given), for ``make mutation``
to run them again against the tests written since; ``--not-run [MODULE...]`` the names of
those not run yet. (Named mutants are always run again, so ``make mutation MODULES=...`` names
what is left rather than the modules' globs, which would re-run every mutant.)
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from mutmut.stats import status_by_exit_code

DETECTED = ("killed", "timeout", "segfault", "caught by type check")


def module_of(meta: Path, root: Path) -> str:
    return str(meta.relative_to(root)).removesuffix(".meta")


def results(root: Path) -> dict[str, dict[str, str]]:
    """module path -> mutant name -> status."""
    out: dict[str, dict[str, str]] = {}
    for meta in sorted(root.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        out[module_of(meta, root)] = {k: status_by_exit_code[v] for k, v in codes.items()}
    return out


def table(by_module: dict[str, dict[str, str]]) -> str:
    lines = [
        "| module | mutants | not run | killed | timeout | survived | no tests | score of run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for module, statuses in by_module.items():
        n = Counter(statuses.values())
        run = len(statuses) - n["not checked"]
        detected = sum(n[s] for s in DETECTED)
        score = f"{100 * detected / run:.1f}%" if run else "-"
        lines.append(
            f"| `{module}` | {len(statuses)} | {n['not checked']} | {n['killed']} "
            f"| {n['timeout']} | {n['survived']} | {n['no tests']} | {score} |"
        )
    return "\n".join(lines)


def named(
    by_module: dict[str, dict[str, str]], wanted: Callable[[str], bool], modules: list[str]
) -> list[tuple[str, str]]:
    """``(name, status)`` of every mutant whose status is ``wanted``, of ``modules`` (dotted
    prefixes) when given."""
    return [
        (name, status)
        for statuses in by_module.values()
        for name, status in statuses.items()
        if wanted(status) and (not modules or any(name.startswith(m + ".") for m in modules))
    ]


def undetected(
    by_module: dict[str, dict[str, str]], modules: list[str] | None = None
) -> list[tuple[str, str]]:
    """Every mutant run and not detected."""
    return named(by_module, lambda s: s not in (*DETECTED, "not checked"), modules or [])


def survivors(by_module: dict[str, dict[str, str]]) -> str:
    return "\n".join(f"{name}: {status}" for name, status in undetected(by_module))


def main(argv: list[str]) -> int:
    by_module = results(Path("mutants")) if Path("mutants").is_dir() else {}
    if argv[:1] == ["--names"]:  # for `make mutation`: re-run these against today's tests
        print(" ".join(name for name, _ in undetected(by_module, argv[1:])))
        return 0
    if argv[:1] == ["--not-run"]:  # for `make mutation MODULES=...`: the ones left to run
        print(" ".join(name for name, _ in named(by_module, "not checked".__eq__, argv[1:])))
        return 0
    if not by_module:
        print("no mutmut results under mutants/: run `make mutation` first", file=sys.stderr)
        return 1
    print(survivors(by_module) if "--survivors" in argv else table(by_module))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
