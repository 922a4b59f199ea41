"""One stats file for a start made of several processes (docs/operations.md, "Monitoring").

A vLLM start is three Python processes (the front end, the engine core, its worker), a
training job one per rank, torch's compile workers more: each process's client leaves its
stats at exit (``OBJCACHE_STATS_FILE``), and the last writer used to replace the others'.
The first process of a start names its *run group* in the environment
(:data:`RUN_GROUP_ENV`), which every process it starts inherits; at exit each process merges
its stats into the file under a lock when the file holds the same group, and replaces it
otherwise (a new start, or another client of a process already in it). Counts add, latency
means are weighted by their counts, the ``p50``/``p99`` bounds keep the larger, per-tier
rows merge by tier name; ``processes`` lists who contributed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The environment variable naming this start's run group (inherited by child processes).
RUN_GROUP_ENV = "OBJCACHE_RUN_GROUP"
#: Largest stats file merged into (a bigger one is replaced, never parsed).
MAX_BYTES = 4 * 1024 * 1024

_LATEST = frozenset({"written_at", "pid", "host", "job", "env", "le_ms", "run_group"})


def run_group() -> str:
    """This process's run group, named now (and inherited by its children) if none is."""
    group = os.environ.get(RUN_GROUP_ENV, "").strip()
    if not group:
        group = f"{socket.gethostname()}-{os.getpid()}-{int(time.time() * 1000)}"
        os.environ[RUN_GROUP_ENV] = group
    return group


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def merge(old: Any, new: Any, key: str = "") -> Any:
    """``new`` merged into ``old`` (neither is changed): see the module docstring."""
    if isinstance(old, dict) and isinstance(new, dict):
        merged = {**old, **new}
        for k in old.keys() & new.keys():
            merged[k] = merge(old[k], new[k], k)
        if _number(old.get("mean_ms")) and _number(new.get("mean_ms")):
            a, b = old.get("count", 0), new.get("count", 0)
            if _number(a) and _number(b) and a + b:
                merged["mean_ms"] = round((old["mean_ms"] * a + new["mean_ms"] * b) / (a + b), 3)
        return merged
    if key in _LATEST:
        return new
    if _number(old) and _number(new):
        if key.endswith("_le"):
            return max(old, new)
        return old + new if key != "mean_ms" else new
    if isinstance(old, list) and isinstance(new, list):
        if all(isinstance(x, dict) and "name" in x for x in (*old, *new)):
            by_name = {x["name"]: x for x in old}
            for x in new:
                by_name[x["name"]] = merge(by_name[x["name"]], x) if x["name"] in by_name else x
            return list(by_name.values())
        if len(old) == len(new) and all(_number(x) for x in (*old, *new)):
            return [a + b for a, b in zip(old, new, strict=True)]
    return new


@contextlib.contextmanager
def _locked(target: Path) -> Iterator[None]:
    """An exclusive lock on the stats file's folder (no lock file is left beside it)."""
    fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(target: Path) -> dict[str, Any] | None:
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def combined(target: Path, mine: dict[str, Any], publish: Any) -> dict[str, Any]:
    """Merge ``mine`` (this process's stats) into ``target`` under its lock and write the
    result with ``publish(path, bytes, mode)``; returns what was written."""
    group = run_group()
    me = {"pid": mine.get("pid"), "host": mine.get("host"), "written_at": mine.get("written_at")}
    with _locked(target):
        old = _read(target)
        seen = old.get("processes", []) if old is not None else []
        again = any(isinstance(p, dict) and p.get("pid") == me["pid"] for p in seen)
        # a second client of the same process (a tool, a test's simulated machine) replaces
        # the file, as it did before run groups
        if old is not None and old.get("run_group") == group and not again:
            processes = [*old.get("processes", []), me]
            data: dict[str, Any] = merge({k: v for k, v in old.items() if k != "processes"}, mine)
        else:
            processes, data = [me], dict(mine)
        data.update(run_group=group, processes=processes)
        publish(target, json.dumps(data, indent=1).encode(), 0o600)
    return data
