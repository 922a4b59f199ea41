"""What a client leaves behind at exit (objcache/run_observer.py): with a summaries location,
the run's missed cards and its summary go there through one store client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from objcache import run_observer
from objcache.cli import main as cli
from objcache.client import Client
from objcache.config.settings import Config
from objcache.observe import keycards
from tests.support.waiting import wait_until


def test_missed_cards_and_summary_reach_the_summaries_location_through_one_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summaries = tmp_path / "summaries"
    env = {
        "OBJCACHE_TIERS": f"file://{tmp_path / 'store'}",
        "OBJCACHE_LOCAL_DIR": str(tmp_path / "local"),
        "OBJCACHE_SUMMARIES_URL": f"file://{summaries}",
        "OBJCACHE_PREFETCH": "0",
    }
    cards_key = "v1/keycards/misses/ab/job/run"
    monkeypatch.setattr(keycards, "misses_object", lambda job, run: (cards_key, b"cards"))
    opened: list[str] = []
    real_open = run_observer.open_tier

    def counting_open(spec: Any, config: Config, **kw: Any) -> Any:
        opened.append(spec.url)
        return real_open(spec, config, **kw)

    monkeypatch.setattr(run_observer, "open_tier", counting_open)
    client = Client(Config.from_env(env))
    assert client.get("fx-graph", "absent") is None  # a run that looked something up
    client.close()

    written = sorted(str(p.relative_to(summaries)) for p in summaries.rglob("*") if p.is_file())
    assert len(written) == 2, written
    assert any(w.startswith("v1/keycards/") for w in written), written
    assert any("/run/" in w for w in written), written
    assert opened == [f"file://{summaries}"]


def test_a_run_that_prefetched_leaves_its_time_line_for_explain_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first machine fills the store; a new one prefetches, looks one entry up and exits:
    its summary carries the prefetch's time line, and ``explain --time`` shows it."""
    store = f"file://{tmp_path / 'store'}"
    env = {"OBJCACHE_TIERS": store, "OBJCACHE_JOB": "train", "OBJCACHE_KEY_CARDS": "0"}
    first = Client(Config.from_env({**env, "OBJCACHE_LOCAL_DIR": str(tmp_path / "a")}))
    for i in range(3):
        first.put("fx-graph", f"k{i}", f"v{i}".encode())
    first.close()

    new = Client(Config.from_env({**env, "OBJCACHE_LOCAL_DIR": str(tmp_path / "b")}))
    prefetched = new.prefetch_result
    assert prefetched is not None
    wait_until(prefetched.done, what="the prefetch")
    assert new.get("fx-graph", "k1") == b"v1"
    new.close()

    out = CliRunner().invoke(
        cli.app, ["explain", "--time", "--job", "train", "--tier", store, "--json"]
    )
    assert out.exit_code == 0, out.output
    p = json.loads(out.output)["prefetch"]
    assert p["fetched"] == 3 and p["keys"] == 3 and p["bytes"] == 6
    assert p["lookups"]["served"] == 1 and p["cause"] == "not the cause", p
    assert p["started_s"] <= p["manifest_s"] <= p["ended_s"] <= p["first_lookup_s"]
    assert sorted(e["key"] for e in p["entries"]) == ["k0", "k1", "k2"]
