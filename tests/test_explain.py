"""``objcache explain``: nearest written card, grouping by cause, reading a store."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

from typer.testing import CliRunner

from objcache.backends import create_backend
from objcache.backends.base import Backend, PutMode
from objcache.cli import explain
from objcache.cli import main as cli
from objcache.config.urls import parse_tier_list
from objcache.entry.codec import Codec
from objcache.entry.layout import Namespace
from objcache.integrations.torch import keycards as capture
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
    e.misses += [explain.Miss(make(), f"r{i}", f"h{i}", "a differs") for i in range(3)]
    e.misses += [explain.Miss(make(), "r1", "h1", explain.FIRST_COMPILE)]
    causes = e.causes()
    assert [(c.cause, c.misses, len(c.hosts)) for c in causes] == [
        ("a differs", 3, 3),
        (explain.FIRST_COMPILE, 1, 1),
    ]
    assert explain.top_causes(e, 1) == [("a differs", 3, 3)]
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
        cards = await explain._written(backend, codec, "fx-graph", "g1", Counter())
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
