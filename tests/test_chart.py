"""bench/_chart.py renders a results JSON into a PNG (matplotlib, the bench extra)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from bench import _chart

pytest.importorskip("matplotlib")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.parametrize("name", ["warm_start", "fleet_node", "fleet_sync"])
def test_docs_charts_render_from_their_json(tmp_path: Path, name: str) -> None:
    spec = json.loads((Path(__file__).parents[1] / "docs" / "img" / f"{name}.json").read_text())
    out = _chart.write(tmp_path / f"{name}.json", spec)
    width, height = png_size(out)
    assert width >= 800 and height >= 300
    assert json.loads((tmp_path / f"{name}.json").read_text()) == spec
