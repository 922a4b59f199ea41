"""`make stress`: the timing- and concurrency-sensitive tests, run again and again on a busy
machine (docs/testing.md, "Flakes").

Each run is a fresh pytest process over the same files while a busy loop holds one core, so
threads, subprocesses and servers get less CPU than on a quiet machine, as on a CI runner
shared with other jobs. A test that waits on the clock instead of on a condition shows up
here long before it fails a submission. Prints one line per run and, at the end, every
failure with the first lines of its report; exits 1 when any run failed.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict

#: The files whose tests order threads, processes, servers or deadlines.
DEFAULT_FILES = (
    "tests/core/fetch_once/test_nodelease.py",
    "tests/core/fetch_once/test_node_single_flight.py",
    "tests/core/test_tiered.py",
    "tests/core/test_tier.py",
    "tests/core/test_writes.py",
    "tests/core/test_writebehind.py",
    "tests/core/fetch_once/test_leased_lookup.py",
    "tests/test_bridge.py",
    "tests/test_client_deadline.py",
    "tests/core/test_policy.py",
    "tests/core/test_records.py",
    "tests/integrations/torch/remote/test_pgo_join.py",
    "tests/core/test_manifest.py",
    "tests/backends/test_file.py",
    "tests/backends/test_disk.py",
    "tests/observe/test_prometheus.py",
)

#: Busy until this process (its parent) is gone: a stress run killed from outside (a timeout
#: around ``make stress``) must not leave a core taken for good.
BUSY_LOOP = "import os, sys\nparent = int(sys.argv[1])\nwhile os.getppid() == parent: pass"
FAILED = re.compile(r"^(FAILED|ERROR) (\S+)")


def busy_core() -> subprocess.Popen[bytes]:
    """A process that keeps one core busy until it is killed or this process ends."""
    return subprocess.Popen(
        [sys.executable, "-c", BUSY_LOOP, str(os.getpid())], start_new_session=True
    )


def run_once(files: list[str], extra: list[str]) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *extra, *files],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def failure_reports(output: str, lines: int) -> dict[str, list[str]]:
    """Test id -> the first ``lines`` assertion/error lines (``E ...``) of its report."""
    reports: dict[str, list[str]] = {}
    current: str | None = None
    for line in output.splitlines():
        header = re.match(r"^_{3,} (.+?) _{3,}$", line)
        if header:
            current = header.group(1)
            reports[current] = []
        elif current is not None and line.startswith("E ") and len(reports[current]) < lines:
            reports[current].append(line)
    return reports


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--no-busy", action="store_true", help="leave every core to pytest")
    parser.add_argument("--lines", type=int, default=6, help="lines of each failure shown")
    parser.add_argument("files", nargs="*", help=f"default: {' '.join(DEFAULT_FILES)}")
    args, extra = parser.parse_known_args()
    files = args.files or list(DEFAULT_FILES)
    busy = None if args.no_busy else busy_core()
    failures: dict[str, list[int]] = defaultdict(list)
    first_report: dict[str, list[str]] = {}
    bad_runs = 0
    try:
        for run in range(1, args.runs + 1):
            code, output, wall = run_once(files, extra)
            summary = next(
                (ln for ln in reversed(output.splitlines()) if " in " in ln and "=" not in ln),
                output.strip().splitlines()[-1] if output.strip() else "(no output)",
            )
            print(f"run {run:>2}/{args.runs}  {wall:6.1f} s  {summary.strip()}", flush=True)
            if code != 0:
                bad_runs += 1
                reports = failure_reports(output, args.lines)
                named = [m.group(2) for m in map(FAILED.match, output.splitlines()) if m]
                for test in named or [f"(exit {code})"]:
                    failures[test].append(run)
                for title, lines in reports.items():
                    first_report.setdefault(title, lines)
                if not named:
                    first_report.setdefault(f"(exit {code})", output.splitlines()[-args.lines :])
    finally:
        if busy is not None:
            os.killpg(busy.pid, signal.SIGKILL)
            busy.wait()
    print(f"\n{args.runs - bad_runs} of {args.runs} runs passed", flush=True)
    if not failures:
        return 0
    print("\nfailures (test: runs)")
    for test, runs in sorted(failures.items(), key=lambda item: -len(item[1])):
        print(f"  {test}: {', '.join(map(str, runs))}")
    print("\nfirst report of each")
    for title, lines in first_report.items():
        print(f"  {title}")
        for line in lines:
            print(f"    {line}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
