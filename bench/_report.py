"""Write one benchmark's results into its own section of docs/benchmarks.md."""

from __future__ import annotations

import platform
import re
import time
from pathlib import Path


def write_section(path: Path, name: str, command: str, body: str) -> None:
    """Replace (or append) the section between ``<!-- bench:NAME -->`` markers."""
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    block = (
        f"{begin}\n_Measured {stamp} on {platform.machine()}, "
        f"{_cpu_count()} vCPU. Reproduce: `{command}`_\n\n{body.strip()}\n{end}"
    )
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _m: block, text) if pattern.search(text) else f"{text}\n{block}\n"
    path.write_text(text)


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
