"""Render a benchmark's results JSON (written next to its docs/benchmarks.md table) as a PNG.

    python -m bench._chart docs/img/warm_start.json      # writes docs/img/warm_start.png

Two shapes: ``"chart": "bars"`` (``rows``: [label, value], horizontal bars, an optional
``target`` line, bars whose label contains ``highlight`` (default "objcache") in blue) and
``"chart": "grouped"`` (``series`` names, ``groups``: [label, [value per series]]).
Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def render(spec: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 11})
    if spec["chart"] == "bars":
        labels = [r[0] for r in spec["rows"]]
        values = [float(r[1]) for r in spec["rows"]]
        fig, ax = plt.subplots(figsize=(9, 0.45 * len(labels) + 1.6))
        mark = spec.get("highlight", "objcache")
        colors = ["#2b7bba" if mark in label else "#9a9a9a" for label in labels]
        bars = ax.barh(labels, values, color=colors)
        ax.invert_yaxis()
        ax.bar_label(bars, fmt="%.2f", padding=3)
        ax.set_xlabel(spec["xlabel"])
        ax.set_xlim(0, max(values) * 1.15)
        if "target" in spec:
            ax.axvline(
                spec["target"], color="#c0392b", linestyle="--", label=f"target ({spec['target']})"
            )
            ax.legend(loc="lower right")
    else:
        groups = [g[0] for g in spec["groups"]]
        series = spec["series"]
        fig, ax = plt.subplots(figsize=(9, 4.8))
        width = 0.8 / len(series)
        for i, name in enumerate(series):
            xs = [g + i * width - 0.4 + width / 2 for g in range(len(groups))]
            vals = [float(g[1][i]) for g in spec["groups"]]
            bars = ax.bar(xs, vals, width, label=name, color=["#2b7bba", "#9a9a9a"][i % 2])
            ax.bar_label(bars, fmt="%.1f", padding=2)
        ax.set_xticks(range(len(groups)), groups)
        ax.set_ylabel(spec["ylabel"])
        ax.legend()
    ax.set_title(spec["title"], fontsize=11)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write(json_path: Path, spec: dict[str, Any]) -> Path:
    """Save ``spec`` as JSON and render it beside it (``.png``); what the bench scripts call."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(spec, indent=1) + "\n")
    return render(spec, json_path.with_suffix(".png"))


def write_beside(docs: Path, name: str, spec: dict[str, Any]) -> Path | None:
    """``write`` into ``docs/img/<name>.json`` next to the benchmarks page ``docs``; without
    matplotlib (no ``bench`` extra) only the JSON is written and None is returned."""
    json_path = docs.parent / "img" / f"{name}.json"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(spec, indent=1) + "\n")
        print(f"matplotlib missing (pip install 'objcache[bench]'): wrote {json_path} only")
        return None
    return write(json_path, spec)


def main(argv: list[str]) -> None:
    for name in argv:
        path = Path(name)
        print(render(json.loads(path.read_text()), path.with_suffix(".png")))


if __name__ == "__main__":
    main(sys.argv[1:])
