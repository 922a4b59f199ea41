"""``objcache explain``: nearest written card, grouping by cause, reading a store."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from objcache.backends import create_backend
from objcache.backends.base import Backend, PutMode
from objcache.cli import explain
from objcache.cli import main as cli
from objcache.config.urls import parse_tier_list
from objcache.entry.codec import Codec
from objcache.entry.layout import Namespace
from objcache.integrations.torch.remote import keycard_capture as capture
from objcache.observe import keycards
from objcache.observe.keycards import Card, Written

NS = Namespace(keycards.CARDS_ENV)


def make(graph: str = "g1", env: str = "avx512", **flags: str) -> Card:
    comps: dict[str, tuple[str, str | None]] = {"gm": (graph, None)}
    for name in ("max_autotune", "freezing", "size_asserts"):
        value = flags.get(name, "False")
        comps[f"inductor_config.{name}"] = (f"h{value.lower()}", value)
    comps["env:cpu_isa"] = (keycards.env_hash(env), env)
    key = "f" + keycards.env_hash(json.dumps(sorted(comps.items())))
    return Card("fx-graph", key, comps)


def w(card: Card, run: str = "run-1-1-aa", host: str = "writer") -> Written:
    return Written(card, "job", run, host)


def test_nearest_is_the_card_with_most_components_equal() -> None:
    missed = make(max_autotune="True")
    far = w(make(max_autotune="False", freezing="True", env="avx2"), "run-1-1-a1")
    near = w(make(max_autotune="False"), "run-1-1-a2")
    assert explain.nearest(missed, [far, near], "run-9-9-bb") is near
    m = explain.explain_one(missed, [far, near], "run-9-9-bb", "reader")
    assert m.cause == "inductor_config.max_autotune differs"
    assert [d.describe() for d in m.differences] == ["inductor_config.max_autotune: False → True"]


def test_cards_the_missing_run_wrote_itself_are_left_out() -> None:
    missed = make()
    own = w(missed, "run-9-9-bb")
    assert explain.explain_one(missed, [own], "run-9-9-bb", "h").cause == explain.FIRST_COMPILE
    other = w(missed, "run-1-1-aa")
    assert explain.explain_one(missed, [own, other], "run-9-9-bb", "h").cause == explain.SAME_KEY


def test_misses_are_grouped_by_cause_biggest_first() -> None:
    e = explain.Explanation("job", runs=["r1", "r2", "r3"])
    e.misses += [explain.Miss.of(make(), f"r{i}", f"h{i}", "a differs") for i in range(3)]
    e.misses += [explain.Miss.of(make(), "r1", "h1", explain.FIRST_COMPILE)]
    causes = e.causes()
    assert [(c.cause, c.misses, len(c.hosts)) for c in causes] == [
        ("a differs", 3, 3),
        (explain.FIRST_COMPILE, 1, 1),
    ]
    text = "\n".join(explain.lines(e))
    assert text.index("3 misses on 3 host(s): a differs") < text.index(explain.FIRST_COMPILE)


def test_a_cause_names_at_most_three_components() -> None:
    diffs = [keycards.Difference(f"c{i}", None, ("h", "v")) for i in range(5)]
    assert explain.cause_of(diffs) == "c0, c1, c2 and 2 more differ"
    items = [keycards.Difference(f"example_inputs[{i}]", None, None) for i in (0, 2, 3)]
    assert explain.cause_of(items) == "example_inputs differs"


def store(tmp_path: Path) -> Backend:
    return create_backend(parse_tier_list(f"file://{tmp_path / 'store'}", "t")[0])


async def put_written(backend: Backend, codec: Codec, card: Card, run: str) -> None:
    graph, digest = keycards.written_key(card, run)
    okey = NS.candidate_key("fx-card", graph, digest)
    data = keycards.encode_written(card, "writer-job", run, "writer-host")
    await backend.put(okey, codec.encode(data, okey), PutMode.CREATE)


async def put_misses(backend: Backend, codec: Codec, job: str, run: str, cards: list[Card]) -> None:
    okey = NS.object_key(keycards.MISSES_KIND, f"{job}/{run}")
    data = keycards.encode_misses(job, run, "reader-host", cards, 2)
    await backend.put(okey, codec.encode(data, okey), PutMode.CREATE)


def test_explain_reads_runs_and_written_cards_from_a_store(tmp_path: Path) -> None:
    backend, codec = store(tmp_path), Codec()
    written = make(max_autotune="False")
    missed = [make(max_autotune="True"), make(graph="g2"), make(env="avx2")]

    async def seed() -> None:
        await put_written(backend, codec, written, "run-1-1-aa")
        await put_misses(backend, codec, "train", "run-2-2-bb", missed)
        await put_misses(backend, codec, "other", "run-3-3-cc", [make(graph="g3")])

    asyncio.run(seed())
    result = asyncio.run(explain.collect(backend, codec, job="train"))
    assert result.runs == ["run-2-2-bb"] and result.dropped == 2 and not result.skipped
    assert [m.cause for m in result.misses] == [
        "inductor_config.max_autotune differs",
        explain.FIRST_COMPILE,
        "env:cpu_isa differs",
    ]
    only = asyncio.run(explain.collect(backend, codec, job="train", run="run-9-9-zz"))
    assert only.runs == [] and only.misses == []

    runner = CliRunner()
    tier = f"file://{tmp_path / 'store'}"
    out = runner.invoke(cli.app, ["explain", "--job", "train", "--tier", tier, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["misses"] == 3 and data["dropped"] == 2
    assert {c["cause"] for c in data["causes"]} == {m.cause for m in result.misses}
    text = runner.invoke(cli.app, ["explain", "--job", "train", "--tier", tier])
    assert "inductor_config.max_autotune: False → True" in text.output
    assert "env: cpu_isa avx512 → avx2" in text.output
    assert explain.FIRST_COMPILE in text.output
    none = runner.invoke(cli.app, ["explain", "--job", "nobody", "--tier", tier])
    assert none.exit_code == 1


def test_gc_of_other_environments_keeps_the_shared_cards(tmp_path: Path) -> None:
    from objcache.cli import ops

    backend, codec = store(tmp_path), Codec()

    async def run() -> list[str]:
        await put_written(backend, codec, make(), "run-1-1-aa")
        other = Namespace("0123456789abcdef").object_key("fx-graph", "k")
        await backend.put(other, codec.encode(b"x", other), PutMode.CREATE)
        plan = await ops.plan_gc(backend, keep_envs={"fedcba9876543210"})
        return [e.env for e in plan.delete]

    assert asyncio.run(run()) == ["0123456789abcdef"]


def client_config(tmp_path: Path, name: str, **options: object) -> object:
    from objcache.config.settings import Config

    return Config(
        tiers=f"file://{tmp_path / 'store'}",
        local_dir=tmp_path / name,
        prefetch=False,
        job="train",
        **options,  # type: ignore[arg-type]
    )


def test_a_writer_stores_the_card_of_its_miss_beside_the_entry(tmp_path: Path) -> None:
    from objcache.client import Client

    keycards.reset()
    try:
        client = Client(client_config(tmp_path, "w"))  # type: ignore[arg-type]
        missed = make(max_autotune="True")
        keycards.record_miss(missed)
        client.put("fx-graph", "k", b"entry")
        capture.published(client, "fx-graph", "not-the-missed-key")  # no card: nothing
        capture.published(client, "fx-graph", missed.key)
        assert keycards.take_pending("fx-graph", missed.key) is None
        client.close()  # flushes the write-behind queue, then the run's misses
    finally:
        keycards.reset()
    backend, codec = store(tmp_path), Codec()

    async def read() -> tuple[list[Written], explain.Explanation]:
        reader = explain._Reader(backend, codec, explain.Explanation("train"))
        cards = await explain._written(reader, "fx-graph", "g1")
        return cards, await explain.collect(backend, codec, job="train")

    cards, result = asyncio.run(read())
    assert [w.card for w in cards] == [missed]
    assert cards[0].job == "train" and cards[0].run == client.observer.run_id
    # the run's own card is not its explanation: the miss is a first compile
    assert [m.cause for m in result.misses] == [explain.FIRST_COMPILE]


def test_a_read_only_run_writes_no_card(tmp_path: Path) -> None:
    from objcache.client import Client

    keycards.reset()
    try:
        client = Client(client_config(tmp_path, "r", read_only=True))  # type: ignore[arg-type]
        missed = make()
        keycards.record_miss(missed)
        assert client.get("fx-graph", "k") is None
        capture.published(client, "fx-graph", missed.key)
        client.close()
    finally:
        keycards.reset()
    assert not list((tmp_path / "store").rglob("*"))


def test_report_names_the_top_miss_cause_from_key_cards(tmp_path: Path) -> None:
    """`objcache report`'s column "top miss cause" says which key component differs, where a
    run recorded missed cards (its summary alone says only "absent")."""
    from objcache.observe import run_summary as summary

    backend, codec = store(tmp_path), Codec()
    run = summary.new_run_id(time.time())
    env = "0123456789abcdef"

    async def seed() -> None:
        await put_written(backend, codec, make(max_autotune="False"), "run-1-1-aa")
        await put_misses(backend, codec, "train", run, [make(max_autotune="True")])
        stats = {"lookups": 1, "hits": 0, "misses": {"absent": 1}, "kinds": {}}
        body = summary.build(stats, job="train", run=run, started=time.time(), ended=time.time())
        okey = Namespace(env).object_key(summary.KIND, f"train/{run}")
        await backend.put(okey, codec.encode(summary.encode(body), okey), PutMode.CREATE)

    asyncio.run(seed())
    tier = f"file://{tmp_path / 'store'}"
    out = CliRunner().invoke(cli.app, ["report", "--job", "train", "--tier", tier, "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)["runs"]
    assert [r["top_miss_cause"]["cause"] for r in rows] == ["inductor_config.max_autotune differs"]


# --- bounded reads: whatever the store holds ---------------------------------------------------


def _maximal_misses(job: str, run: str) -> bytes:
    """A misses object at its size cap, every card valid: what a hostile node can plant."""
    cards = []
    for c in range(5):
        comps: dict[str, tuple[str, str | None]] = {
            f"c{c}.{i:05d}." + "n" * 180: (f"{i:032x}", "v" * keycards.MAX_VALUE)
            for i in range(keycards.MAX_COMPONENTS - 64)
        }
        comps[keycards.GRAPH] = (f"g{c}", None)
        cards.append(Card("fx-graph", f"k{c}", comps))
    data = keycards.encode_misses(job, run, "planted", cards, 0)
    assert keycards.MAX_MISSES_BYTES * 0.8 < len(data) <= keycards.MAX_MISSES_BYTES
    return data


def _plant(tmp_path: Path, runs: list[str]) -> None:
    backend, codec = store(tmp_path), Codec()
    template = _maximal_misses("train", "RUN")

    async def seed() -> None:
        for run in runs:
            okey = NS.object_key(keycards.MISSES_KIND, f"train/{run}")
            data = template.replace(b'"run":"RUN"', f'"run":"{run}"'.encode())
            await backend.put(okey, codec.encode(data, okey), PutMode.CREATE)

    asyncio.run(seed())


# VmHWM, not getrusage's ru_maxrss: Linux carries the spawning process's peak across exec
# into ru_maxrss, so a child of a pytest that has loaded torch would report torch's peak
_RSS = """
import sys
from objcache.cli import main
try:
    main.app(sys.argv[1:], standalone_mode=False)
finally:
    with open("/proc/self/status") as f:
        hwm = [l.split()[1] for l in f if l.startswith("VmHWM:")]
    print("RSS", hwm[0], file=sys.stderr)
"""


def _cli_rss(args: list[str]) -> tuple[dict[str, Any], int]:
    """The command's JSON output and its peak RSS in bytes (run in its own process)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _RSS, *args, "--json"], capture_output=True, text=True, timeout=600
    )
    rss = [int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("RSS ")]
    assert rss and proc.stdout.startswith("{"), (proc.stdout[:500], proc.stderr[-2000:])
    return json.loads(proc.stdout), rss[0] * 1024


def test_explain_and_report_over_planted_maximal_misses_stay_bounded(tmp_path: Path) -> None:
    """64 misses objects at their cap (8 MiB of valid cards each): explain and report read
    within a budget that does not depend on the store, and say what they left unread."""
    now = int(time.time())
    runs = [f"run-{now - 60 - i}-{i}-{i:08x}" for i in range(64)]
    _plant(tmp_path, runs)
    tier = f"file://{tmp_path / 'store'}"
    data, rss = _cli_rss(["explain", "--job", "train", "--tier", tier])
    assert rss < 200 << 20, rss
    assert data["read"]["objects"] < 64 and data["not_read"], data["not_read"]
    _, rss = _cli_rss(["report", "--job", "train", "--tier", tier])
    assert rss < 200 << 20, rss


def test_explain_since_reads_none_of_the_older_runs(tmp_path: Path) -> None:
    now = int(time.time())
    old = [f"run-{now - 7200 - i}-{i}-{i:08x}" for i in range(8)]
    new = f"run-{now - 60}-99-abcdef01"
    backend, codec = store(tmp_path), Codec()

    async def seed() -> None:
        for run in [*old, new]:
            await put_misses(backend, codec, "train", run, [make(graph=run)])

    asyncio.run(seed())
    tier = f"file://{tmp_path / 'store'}"
    out = CliRunner().invoke(
        cli.app, ["explain", "--job", "train", "--since", "1h", "--tier", tier, "--json"]
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["runs"] == [new] and data["read"]["objects"] == 1
    assert data["not_read"] == {"older than --since": 8}
