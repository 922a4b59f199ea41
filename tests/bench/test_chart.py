"""bench/_chart.py renders a results JSON into a PNG (matplotlib, the bench extra)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from bench import _chart
from tests.support.paths import ROOT as REPO_ROOT

pytest.importorskip("matplotlib")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.parametrize("name", ["warm_start", "fleet_node", "fleet_sync"])
def test_docs_charts_render_from_their_json(tmp_path: Path, name: str) -> None:
    spec = json.loads((REPO_ROOT / "docs" / "img" / f"{name}.json").read_text())
    out = _chart.write(tmp_path / f"{name}.json", spec)
    width, height = png_size(out)
    assert width >= 800 and height >= 300
    assert json.loads((tmp_path / f"{name}.json").read_text()) == spec


def test_the_bench_scripts_chart_what_they_measured(tmp_path: Path) -> None:
    """Each script turns its own results into the chart spec written beside the docs."""
    import argparse

    from bench import fleet, warm_start

    docs = tmp_path / "docs" / "benchmarks.md"
    node = {"ranks": 8, "entries": 300, "rounds": 3}
    for i, (leases, prefetch) in enumerate(fleet.NODE_RUNS):
        node[f"{leases}-{'prefetch' if prefetch else 'no_prefetch'}"] = {"gets_per_entry": i + 1}
    out = _chart.write_beside(docs, "fleet_node", fleet.node_chart(node))
    assert out is not None and png_size(out)[0] >= 800
    spec = json.loads((tmp_path / "docs" / "img" / "fleet_node.json").read_text())
    assert [r[1] for r in spec["rows"]] == [1, 2, 3, 4] and spec["target"] == 1.05

    syncs = [
        {
            "rtt_ms": rtt,
            "rounds": 3,
            **{f"{c}_{w}": 1.0 + rtt for c in ("objcache", "aws") for w in ("push", "pull")},
        }
        for rtt in (0.0, 50.0)
    ]
    sync = fleet.sync_chart({"entries": 10, "bytes": 5e6}, syncs)
    assert [g[0] for g in sync["groups"]] == [
        "push, direct",
        "pull, direct",
        "push, +50 ms RTT",
        "pull, +50 ms RTT",
    ]
    assert png_size(_chart.write(tmp_path / "sync.json", sync))[0] >= 800

    class Sc:
        def __init__(self, name: str, step: float) -> None:
            self.name, self.step = name, step

        def median(self, key: str) -> float:
            assert key == "first_step_s"
            return self.step

    opts = argparse.Namespace(model="block", batches="4,6", section="warm_start_dynamic")
    warm = warm_start.chart_spec([Sc("warm-local", 2.5), Sc("objcache x", 2.4)], 3, opts)  # type: ignore[list-item]
    assert warm["rows"] == [["warm-local", 2.5], ["objcache x", 2.4]]
    assert "batches 4,6" in warm["title"]
