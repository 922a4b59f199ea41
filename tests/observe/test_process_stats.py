"""The processes of one start share one stats file (objcache/observe/process_stats.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from objcache.observe import process_stats
from objcache.observe.stats_lines import stamp_line
from tests.support.paths import ROOT


def test_counts_add_means_weigh_bounds_keep_the_larger_and_tiers_merge_by_name() -> None:
    a = {
        "pid": 1,
        "cache": {
            "gets": {"kernel": 3},
            "lookup": {"count": 1, "mean_ms": 10.0, "p99_ms_le": 20},
            "lookup_buckets": {"le_ms": [1, 2], "counts": [1, 0]},
        },
        "tiers": [{"name": "disk", "hits": 2, "local": True}],
    }
    b = {
        "pid": 2,
        "cache": {
            "gets": {"kernel": 1, "fx-graph": 2},
            "lookup": {"count": 3, "mean_ms": 2.0, "p99_ms_le": 5},
            "lookup_buckets": {"le_ms": [1, 2], "counts": [2, 1]},
        },
        "tiers": [{"name": "disk", "hits": 1, "local": True}, {"name": "s3", "hits": 4}],
    }
    m = process_stats.merge(a, b)
    assert m["pid"] == 2
    assert m["cache"]["gets"] == {"kernel": 4, "fx-graph": 2}
    assert m["cache"]["lookup"] == {"count": 4, "mean_ms": 4.0, "p99_ms_le": 20}
    assert m["cache"]["lookup_buckets"] == {"le_ms": [1, 2], "counts": [3, 1]}
    assert m["tiers"] == [
        {"name": "disk", "hits": 3, "local": True},
        {"name": "s3", "hits": 4},
    ]
    assert a["cache"]["gets"] == {"kernel": 3}  # inputs untouched


PROGRAM = """
import os, subprocess, sys
import objcache
client = objcache.get_client()
client.put("blob", "k-" + sys.argv[1], b"x")
assert client.get("blob", "k-" + sys.argv[1]) == b"x"
if sys.argv[1] == "parent":
    subprocess.run([sys.executable, __file__, "child"], check=True)
"""


def _run(tmp_path: Path, stats: Path, extra: dict[str, str] | None = None) -> None:
    script = tmp_path / "start.py"
    script.write_text(PROGRAM)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OBJCACHE_TIERS": f"file://{tmp_path / 'store'}",
        "OBJCACHE_LOCAL_DIR": str(tmp_path / "local"),
        "OBJCACHE_STATS_FILE": str(stats),
        "OBJCACHE_RUN_SUMMARY": "0",
        **(extra or {}),
    }
    env.pop(process_stats.RUN_GROUP_ENV, None)
    out = subprocess.run(
        [sys.executable, str(script), "parent"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "not an objcache option" not in out.stderr  # the group is objcache's own variable


def test_a_start_of_two_processes_leaves_both_stats(tmp_path: Path) -> None:
    stats = tmp_path / "stats.json"
    _run(tmp_path, stats)
    first = json.loads(stats.read_text())
    assert len(first["processes"]) == 2
    assert first["cache"]["gets"]["blob"] == 2  # one get each, merged
    assert "2 processes of one start" in stamp_line(first)

    _run(tmp_path, stats)  # the next start replaces it
    second = json.loads(stats.read_text())
    assert second["run_group"] != first["run_group"]
    assert len(second["processes"]) == 2 and second["cache"]["gets"]["blob"] == 2


def test_a_planted_stats_file_is_replaced_never_merged(tmp_path: Path) -> None:
    """Whatever sits in the file (not JSON, another group, oversized) is not merged."""
    stats = tmp_path / "stats.json"
    for planted in (b"\\x80not json", b'{"run_group": "other", "cache": {"gets": {"blob": 99}}}'):
        stats.write_bytes(planted)
        _run(tmp_path, stats)
        data = json.loads(stats.read_text())
        assert data["cache"]["gets"]["blob"] == 2 and len(data["processes"]) == 2
