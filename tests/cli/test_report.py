"""Run summaries and ``objcache report``: what each run records, how the report reads it, and
that hostile summaries are skipped and counted, never a crash."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from objcache.backends import create_backend
from objcache.backends.base import PutMode
from objcache.cli import main as cli
from objcache.cli import report
from objcache.client import Client, build_cache
from objcache.config.fingerprint import fingerprint
from objcache.config.settings import Config
from objcache.config.urls import parse_tier_list
from objcache.core.manifest import write_run
from objcache.entry.codec import Codec
from objcache.observe import run_summary as summary
from tests.support.cloud import s3_url
from tests.support.paths import ROOT
from tests.support.servers import SeaweedS3


def good_summary(**changes: Any) -> dict[str, Any]:
    stats = {
        "cache": {
            "gets": {"fx-graph": 4, "aot-autograd": 2},
            "hits": {"fx-graph": 3, "aot-autograd": 2},
            "lookup_ms_total": 12.5,
        },
        "tiers": [
            {"name": "disk:///l", "local": True, "kinds": {"fx-graph": {"absent": 4}}},
            {
                "name": "s3://b/p",
                "local": False,
                "kinds": {"fx-graph": {"hit": 3, "absent": 1}, "aot-autograd": {"hit": 2}},
                "bytes_read": 5000,
                "bytes_written": 100,
            },
        ],
    }
    body = summary.build(
        stats,
        job="train",
        run="run-1700000000-42-abcd",
        started=1_700_000_000.0,
        ended=1_700_000_010.0,
        environ={"RANK": "3", "LOCAL_RANK": "1"},
        host="node-7",
    )
    body.update(changes)
    return body


def test_summary_round_trips_with_rank_bytes_and_lookup_time() -> None:
    body = good_summary()
    parsed = summary.parse(summary.encode(body))
    assert parsed == body
    assert (parsed["rank"], parsed["local_rank"], parsed["host"]) == (3, 1, "node-7")
    assert (parsed["bytes_in"], parsed["bytes_out"]) == (5000, 100)  # remote tiers only
    assert parsed["lookup_s"] == 0.0125 and parsed["duration_s"] == 10.0
    row = report.Row.from_summary(parsed)
    assert (row.hits, row.lookups, row.cold) == (5, 6, False)
    assert row.misses == {"absent": 1}  # the remote tier's, not the local tier's


def test_local_hits_count_the_runs_lookups_only_and_never_exceed_them() -> None:
    body = good_summary()
    local = next(t for t in body["tiers"].values() if not t["remote"])
    # a lookup's guarded candidates are several local reads; other kinds are no lookups
    local["kinds"] = {"fx-graph": {"hit": 9}, "manifest": {"hit": 4}}
    row = report.Row.from_summary(summary.parse(summary.encode(body)))
    assert row.lookups == 6
    assert row.local_hits == 6


@pytest.mark.parametrize(
    "hostile",
    [
        b"x" * (summary.MAX_BYTES + 1),
        b"not json",
        b"[1, 2]",
        b"{}",
        summary.encode(good_summary(format=2)),
        summary.encode(good_summary(host=7)),
        summary.encode(good_summary(host="h" * 10_000)),
        summary.encode(good_summary(rank=-1)),
        summary.encode(good_summary(rank=True)),
        summary.encode(good_summary(bytes_in=-5)),
        summary.encode(good_summary(bytes_out=10**30)),
        summary.encode(good_summary(duration_s=float("nan"))),
        summary.encode(good_summary(started="yesterday")),
        summary.encode(good_summary(kinds={"fx-graph": {"lookups": 1, "hits": 2}})),
        summary.encode(good_summary(kinds={"fx-graph": {"lookups": "1", "hits": 0}})),
        summary.encode(good_summary(kinds={f"k{i}": {} for i in range(100)})),
        summary.encode(good_summary(tiers={"t": {"remote": "yes"}})),
        summary.encode(good_summary(tiers={"t": {"remote": True, "kinds": {"k": {"hit": -1}}}})),
        b"[" * 100_000 + b"]" * 100_000,
        summary.encode(good_summary(env={"torch": 7})),
        summary.encode(good_summary(env={"torch": "t" * 10_000})),
        summary.encode(good_summary(env={f"f{i}": "" for i in range(100)})),
        summary.encode(good_summary(env=["torch"])),
    ],
)
def test_hostile_summaries_are_refused(hostile: bytes) -> None:
    with pytest.raises(summary.SummaryError):
        summary.parse(hostile)


def test_rank_comes_from_torchrun_variables_only_when_numeric() -> None:
    assert summary.ranks({"RANK": "12", "LOCAL_RANK": "4"}) == (12, 4)
    assert summary.ranks({"RANK": "x"}) == (None, None)


def test_cold_means_fewer_than_half_of_the_lookups_hit() -> None:
    row = report.Row("r", 0.0, kinds={"fx-graph": {"lookups": 4, "hits": 1}})
    assert row.cold
    assert not report.Row("r", 0.0, kinds={"fx-graph": {"lookups": 4, "hits": 2}}).cold
    assert not report.Row("r", 0.0).cold  # no lookups: not flagged


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("30m", 1800), ("24h", 86400)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert report.parse_duration(text) == seconds


def test_parse_duration_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="not a duration"):
        report.parse_duration("yesterday")


def file_config(tmp_path: Path, name: str, **options: Any) -> Config:
    return Config(
        tiers=f"file://{tmp_path / 'store'}",
        local_dir=tmp_path / name,
        prefetch=False,
        job="train",
        **options,
    )


def test_a_warm_run_writes_a_summary_and_a_read_only_run_none(tmp_path: Path) -> None:
    cold = Client(file_config(tmp_path, "a"))
    assert cold.get("fx-graph", "k") is None
    cold.put("fx-graph", "k", b"v" * 500)
    cold.close()
    warm = Client(file_config(tmp_path, "b"))
    assert warm.get("fx-graph", "k") == b"v" * 500
    warm.close()
    reader = Client(file_config(tmp_path, "c", read_only=True))
    assert reader.get("fx-graph", "k") == b"v" * 500
    reader.close()
    idle = Client(file_config(tmp_path, "d"))
    idle.close()  # did nothing: no summary

    backend = create_backend(parse_tier_list(f"file://{tmp_path / 'store'}", "t")[0])
    found = asyncio.run(report.collect(backend, Codec(), env=cold.cache.namespace.env, job="train"))
    assert [(r.hits, r.lookups, r.cold) for r in found.rows] == [(0, 1, True), (1, 1, False)]
    assert not found.skipped
    # The run manifest of the cold run carries the same id as its summary.
    assert found.total()["runs_without_summary"] == 0


def test_report_skips_hostile_summaries_and_lists_old_manifests(tmp_path: Path) -> None:
    config = file_config(tmp_path, "w")
    cache = build_cache(config)
    job, now = "train", int(time.time())

    async def seed() -> None:
        target = cache.remotes[0]
        for i, body in enumerate([good_summary(), good_summary(bytes_in=-1)]):
            run = f"run-{now}-{i}-aa"
            body = {**body, "job": job, "run": run}
            okey = cache.namespace.object_key(summary.KIND, f"{job}/{run}")
            await target.put(okey, cache.codec.encode(summary.encode(body), okey), PutMode.CREATE)
        garbage = cache.namespace.object_key(summary.KIND, f"{job}/run-{now}-9-bb")
        await target.put(garbage, b"OBJC garbage", PutMode.CREATE)
        misplaced = cache.namespace.object_key(summary.KIND, f"{job}/run-{now}-8-cc")
        body = {**good_summary(), "job": job, "run": f"run-{now}-0-aa"}
        entry = cache.codec.encode(summary.encode(body), misplaced)  # a valid entry at this key
        await target.put(misplaced, entry, PutMode.CREATE)
        await write_run(cache, job, [cache.namespace.object_key("fx-graph", "k")])  # old style
        await write_run(cache, "other", [cache.namespace.object_key("fx-graph", "k")])
        await cache.close()

    asyncio.run(seed())
    env = cache.namespace.env
    runner = CliRunner()
    result = runner.invoke(
        cli.app,
        ["report", "--job", job, "--env", env, "--json", "--tier", f"file://{tmp_path / 'store'}"],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [r["summary"] for r in data["runs"]] == [True, False]
    total = data["total"]
    assert total["runs_without_summary"] == 1
    assert total["skipped"] == 3
    assert total["skipped_reasons"] == {"invalid": 1, "corrupt": 1, "misplaced": 1}
    table = runner.invoke(
        cli.app,
        ["report", "--job", job, "--env", env, "--tier", f"file://{tmp_path / 'store'}"],
        env={"COLUMNS": "200"},
    )
    assert "no summary (older objcache)" in table.output
    assert "3 summaries skipped" in table.output
    nothing = runner.invoke(cli.app, ["report", "--job", "nosuchjob", "--env", env])
    assert nothing.exit_code == 1


def test_since_filters_by_the_start_time_in_the_run_name(tmp_path: Path) -> None:
    cache = build_cache(file_config(tmp_path, "w"))

    async def seed() -> None:
        for started in (time.time() - 7200, time.time()):
            await write_run(cache, "train", ["v1/e/fx-graph/00/k"], summary.new_run_id(started))
        await cache.close()

    asyncio.run(seed())
    backend = create_backend(parse_tier_list(f"file://{tmp_path / 'store'}", "t")[0])
    env = cache.namespace.env
    every = asyncio.run(report.collect(backend, Codec(), env=env, job="train"))
    recent = asyncio.run(report.collect(backend, Codec(), env=env, job="train", since_s=3600))
    assert (len(every.rows), len(recent.rows)) == (2, 1)


# --- three processes against SeaweedFS ------------------------------------------------------

RUN = textwrap.dedent(
    """
    import sys
    import objcache
    client = objcache.get_client()
    found = [client.get(kind, key) for kind, key in KEYS]
    if sys.argv[1] == "cold":
        for kind, key in KEYS:
            client.put(kind, key, key.encode() * 300)
    print(client.cache.namespace.env, sum(f is not None for f in found))
    """
)
KEYS = [("fx-graph", f"graph-{i}") for i in range(4)] + [("aot-autograd", "fw"), ("autotune", "a")]


@pytest.mark.servers
def test_report_of_one_cold_and_two_warm_processes(seaweed_s3: SeaweedS3, tmp_path: Path) -> None:
    url = s3_url(seaweed_s3, f"report-{uuid.uuid4().hex[:8]}")
    job = "llama-train"
    code = f"KEYS = {KEYS!r}\n{RUN}"

    def run(role: str, rank: int) -> tuple[str, int]:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "OBJCACHE_TIERS": url,
            "OBJCACHE_JOB": job,
            "OBJCACHE_LOCAL_DIR": str(tmp_path / f"host-{rank}"),
            "OBJCACHE_STATS_FILE": str(tmp_path / f"stats-{rank}.json"),
            "OBJCACHE_PREFETCH": "0",
            "OBJCACHE_TIMEOUT_MS": "15000",
            "RANK": str(rank),
        }
        done = subprocess.run(
            [sys.executable, "-c", code, role],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        env_id, hits = done.stdout.split()
        return env_id, int(hits)

    env_id, hits = run("cold", 0)
    assert hits == 0
    assert run("warm", 1) == (env_id, len(KEYS))
    assert run("warm", 2) == (env_id, len(KEYS))

    runner = CliRunner()
    args = ["report", "--job", job, "--env", env_id, "--tier", url]
    result = runner.invoke(cli.app, [*args, "--json"], env={"OBJCACHE_TIERS": url})
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    runs = sorted(data["runs"], key=lambda r: r["rank"])
    assert [r["rank"] for r in runs] == [0, 1, 2]
    assert [(r["hits"], r["lookups"], r["cold"]) for r in runs] == [
        (0, 6, True),
        (6, 6, False),
        (6, 6, False),
    ]
    assert runs[0]["misses"] == {"absent": 6}
    assert runs[0]["bytes_out"] > 0 and runs[1]["bytes_in"] > 0
    assert runs[1]["kinds"]["fx-graph"] == {"lookups": 4, "hits": 4}
    assert data["total"]["cold_runs"] == 1 and data["total"]["hits"] == 12
    table = runner.invoke(cli.app, args, env={"COLUMNS": "160"})
    assert table.exit_code == 0 and "COLD" in table.output, table.output
    (tmp_path / "report.txt").write_text(table.output)
    if os.environ.get("OBJCACHE_REPORT_SAMPLE"):
        Path(os.environ["OBJCACHE_REPORT_SAMPLE"]).write_text(table.output)


# --- every environment of a job -------------------------------------------------------------


@pytest.fixture
def two_envs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, str]:
    """A run in this environment that writes an entry, then one whose torch and CPU ISA
    differ (faked through the fingerprint, as a second machine would report them) that only
    looks up: its environment holds nothing but its run summary. ``(store url, env, other)``."""
    writer = Client(file_config(tmp_path, "a"))
    assert writer.get("fx-graph", "k") is None
    writer.put("fx-graph", "k", b"v" * 500)
    writer.close()
    real = fingerprint()
    monkeypatch.setattr(
        "objcache.client.fingerprint", lambda: {**real, "torch": "9.9.9", "cpu_isa": "avx2"}
    )
    reader = Client(file_config(tmp_path, "b"))
    assert reader.get("fx-graph", "k") is None  # another environment: a miss
    assert reader.get("fx-graph", "k2") is None
    reader.close()
    env, other = writer.cache.namespace.env, reader.cache.namespace.env
    assert env != other
    return f"file://{tmp_path / 'store'}", env, other


def test_report_covers_every_environment_of_a_job_and_env_narrows(
    two_envs: tuple[str, str, str], tmp_path: Path
) -> None:
    url, env, other = two_envs
    runner = CliRunner()
    result = runner.invoke(cli.app, ["report", "--job", "train", "--json", "--tier", url])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["env"] is None
    assert sorted(r["env"] for r in data["runs"]) == sorted([env, other])
    theirs = next(r for r in data["runs"] if r["env"] == other)
    assert (theirs["env_fields"]["torch"], theirs["env_fields"]["cpu_isa"]) == ("9.9.9", "avx2")
    assert theirs["top_miss_cause"] == {"cause": "absent", "misses": 2}
    assert data["envs"][other]["fields"]["cpu_isa"] == "avx2"
    assert data["envs"][env]["fields"]["torch"] == fingerprint()["torch"]
    assert (data["envs"][other]["runs"], data["envs"][other]["lookups"]) == (1, 2)

    narrowed = runner.invoke(
        cli.app, ["report", "--job", "train", "--env", other, "--json", "--tier", url]
    )
    assert narrowed.exit_code == 0, narrowed.output
    assert [r["env"] for r in json.loads(narrowed.output)["runs"]] == [other]

    table = runner.invoke(
        cli.app, ["report", "--job", "train", "--tier", url], env={"COLUMNS": "220"}
    )
    assert table.exit_code == 0, table.output
    assert f"{other[:8]} torch 9.9.9 avx2" in table.output
    assert f"env {other}: torch 9.9.9, cpu_isa avx2" in table.output
    assert "top miss cause" in table.output and "absent (2)" in table.output
    if os.environ.get("OBJCACHE_REPORT_SAMPLE"):
        Path(os.environ["OBJCACHE_REPORT_SAMPLE"]).write_text(table.output)


def test_ls_envs_describes_an_environment_holding_only_run_summaries(
    two_envs: tuple[str, str, str],
) -> None:
    url, _, other = two_envs
    runner = CliRunner()
    result = runner.invoke(cli.app, ["ls", "--envs", "--json", "--tier", url])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert found[other]["fields"]["torch"] == "9.9.9"
    assert found[other]["fields"]["cpu_isa"] == "avx2"
    assert found[other]["fields"]["gpu"] == fingerprint()["gpu"]
    table = runner.invoke(cli.app, ["ls", "--envs", "--tier", url], env={"COLUMNS": "200"})
    row = next(line for line in table.output.splitlines() if other in line)
    assert "9.9.9" in row and "avx2" in row and "?" not in row


def test_the_processes_of_one_start_are_one_row(tmp_path: Path) -> None:
    """A vLLM start's three processes (one run group) are one row with their counts added;
    another start, or a summary without a group, is a row of its own."""
    config = file_config(tmp_path, "w")
    cache = build_cache(config)
    job, now = "serve", int(time.time())
    groups = ["node-7-100-1", "node-7-100-1", "node-7-100-1", "node-7-200-2", None]

    async def seed() -> None:
        target = cache.remotes[0]
        for i, group in enumerate(groups):
            run = f"run-{now + i}-{i}-aa"
            body = {**good_summary(), "job": job, "run": run, "group": group, "started": now + i}
            okey = cache.namespace.object_key(summary.KIND, f"{job}/{run}")
            await target.put(okey, cache.codec.encode(summary.encode(body), okey), PutMode.CREATE)
        await cache.close()

    asyncio.run(seed())
    where = ["--job", job, "--env", cache.namespace.env, "--tier", f"file://{tmp_path / 'store'}"]
    result = CliRunner().invoke(cli.app, ["report", *where, "--json"])
    assert result.exit_code == 0, result.output
    runs = json.loads(result.output)["runs"]
    assert [r["processes"] for r in runs] == [3, 1, 1]
    assert runs[0]["lookups"] == 3 * 6 and runs[0]["hits"] == 3 * 5
    assert runs[0]["bytes_in"] == 3 * 5000
    assert runs[0]["duration_s"] == 12.0  # first start to the last process's end
    table = CliRunner().invoke(cli.app, ["report", *where], env={"COLUMNS": "220"})
    assert "node-7 (3 processes)" in table.output


def test_report_reads_the_newest_runs_and_counts_the_rest(tmp_path: Path) -> None:
    """``--runs N`` reads the newest N summaries; older runs and those before ``--since`` are
    counted on one line, never read."""
    config = file_config(tmp_path, "w")
    cache = build_cache(config)
    job, now = "train", int(time.time())
    starts = [now - 7200, now - 300, now - 200, now - 100, now - 10]

    async def seed() -> None:
        target = cache.remotes[0]
        for i, started in enumerate(starts):
            run = f"run-{started}-{i}-aa"
            body = {**good_summary(), "job": job, "run": run, "started": started}
            okey = cache.namespace.object_key(summary.KIND, f"{job}/{run}")
            await target.put(okey, cache.codec.encode(summary.encode(body), okey), PutMode.CREATE)
        await cache.close()

    asyncio.run(seed())
    where = ["--job", job, "--tier", f"file://{tmp_path / 'store'}"]
    result = CliRunner().invoke(cli.app, ["report", *where, "--runs", "2", "--since", "1h"])
    assert result.exit_code == 0, result.output
    assert "runs not read: older than --since=1, over the newest 2=2" in result.output
    data = json.loads(
        CliRunner().invoke(cli.app, ["report", *where, "--runs", "2", "--json"]).output
    )
    assert [r["started"] for r in data["runs"]] == starts[-2:]
    assert data["total"]["not_read"] == {"over the newest 2": 3}
    helptext = CliRunner().invoke(cli.app, ["report", "--help"], env={"COLUMNS": "200"}).output
    assert f"default: {report.DEFAULT_RUNS}" in helptext
    from objcache.cli import explain

    helptext = CliRunner().invoke(cli.app, ["explain", "--help"], env={"COLUMNS": "200"}).output
    assert f"default: {explain.DEFAULT_RUNS}" in helptext
    assert f"{explain.READ_BUDGET >> 20} MiB" in " ".join(helptext.split())
