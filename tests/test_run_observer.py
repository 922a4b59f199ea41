"""What a client leaves behind at exit (objcache/run_observer.py): with a summaries location,
the run's missed cards and its summary go there through one store client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from objcache import run_observer
from objcache.client import Client
from objcache.config.settings import Config
from objcache.observe import keycards


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
