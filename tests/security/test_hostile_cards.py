"""Hostile key cards: huge, wrong types, control characters, unsigned where keys are
configured. Each is skipped and counted by ``objcache explain``, never printed raw, never a
crash (docs/security.md, "Key cards")."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner

from objcache.backends import create_backend
from objcache.backends.base import Backend, PutMode
from objcache.cli import explain
from objcache.cli import main as cli
from objcache.config.urls import parse_tier_list
from objcache.entry.codec import Codec
from objcache.entry.layout import Namespace
from objcache.observe import keycards
from objcache.observe.keycards import Card

NS = Namespace(keycards.CARDS_ENV)
KEY = b"k" * 32
ESC = "\x1b]0;owned\x07\x1b[2J"


def card(graph: str = "g1", flag: str = "False") -> Card:
    return Card(
        "fx-graph",
        "fkey" + flag,
        {"gm": (graph, None), "inductor_config.freezing": (f"h{flag.lower()}", flag)},
    )


def written_okey(graph: str, digest: str) -> str:
    return NS.candidate_key("fx-card", graph, digest)


async def put(backend: Backend, okey: str, entry: bytes) -> None:
    await backend.put(okey, entry, PutMode.CREATE)


def seed(tmp_path: Path, codec: Codec) -> Backend:
    backend = create_backend(parse_tier_list(f"file://{tmp_path / 'store'}", "t")[0])
    unsigned = Codec()

    async def run() -> None:
        # the one good written card, signed
        good = keycards.encode_written(card(flag="False"), "j", "run-1-1-aa", "writer")
        okey = written_okey("g1", "a" * 32)
        await put(backend, okey, codec.encode(good, okey))
        # unsigned where keys are configured
        okey = written_okey("g1", "b" * 32)
        await put(backend, okey, unsigned.encode(good, okey))
        # huge (over the cap once decoded: refused before decompression)
        huge = json.dumps({"format": 1, "pad": "x" * (keycards.MAX_CARD_BYTES + 10)}).encode()
        okey = written_okey("g1", "c" * 32)
        await put(backend, okey, codec.encode(huge, okey))
        # wrong types
        bad = json.dumps({"format": 1, "job": 3, "run": [], "host": {}, "card": "x"}).encode()
        okey = written_okey("g1", "d" * 32)
        await put(backend, okey, codec.encode(bad, okey))
        # not an entry at all
        await put(backend, written_okey("g1", "e" * 32), b"OBJC" + b"\x00" * 50)
        # a card of another graph filed under g1's folder
        other = keycards.encode_written(card(graph="g9"), "j", "run-1-1-ab", "w")
        okey = written_okey("g1", "f" * 32)
        await put(backend, okey, codec.encode(other, okey))
        # a valid card whose host and run carry terminal escapes (shown escaped)
        evil = keycards.encode_written(card(flag="True"), "j", f"run{ESC}", f"host{ESC}")
        okey = written_okey("g1", "0" * 32)
        await put(backend, okey, codec.encode(evil, okey))
        # the reader's run: one good missed card and one invalid one inside
        miss = json.loads(keycards.encode_misses("train", "run-2-2-bb", f"r{ESC}", [], 0))
        miss["cards"] = [card(flag="None").as_dict(), {"format": 1, "kind": "fx-graph"}]
        okey = NS.object_key(keycards.MISSES_KIND, "train/run-2-2-bb")
        await put(backend, okey, codec.encode(json.dumps(miss).encode(), okey))
        # runs that are not valid: unsigned, garbage, misplaced
        okey = NS.object_key(keycards.MISSES_KIND, "train/run-3-3-cc")
        await put(backend, okey, unsigned.encode(json.dumps(miss).encode(), okey))
        await put(backend, NS.object_key(keycards.MISSES_KIND, "train/run-4-4-dd"), b"junk")
        okey = NS.object_key(keycards.MISSES_KIND, "train/run-5-5-ee")
        await put(backend, okey, codec.encode(json.dumps(miss).encode(), okey))

    asyncio.run(run())
    return backend


def test_hostile_cards_are_skipped_and_counted(tmp_path: Path) -> None:
    codec = Codec(signing_keys=[KEY])
    backend = seed(tmp_path, codec)
    result = asyncio.run(explain.collect(backend, codec, job="train"))
    assert result.runs == ["run-2-2-bb"]
    assert dict(result.skipped) == {
        "card: unsigned": 1,
        "card: too_large": 1,
        "card: invalid": 2,  # wrong types; the invalid card inside the run
        "card: version": 1,
        "card: misplaced": 1,
        "run: unsigned": 1,
        "run: corrupt": 1,
        "run: misplaced": 1,
    }
    (miss,) = result.misses
    assert miss.cause == "inductor_config.freezing differs"


def test_hostile_strings_are_printed_escaped(tmp_path: Path) -> None:
    seed(tmp_path, Codec(signing_keys=[KEY]))
    runner = CliRunner()
    tier = f"file://{tmp_path / 'store'}"
    out = runner.invoke(
        cli.app,
        ["explain", "--job", "train", "--tier", tier],
        env={"OBJCACHE_SIGNING_KEY": KEY.decode(), "COLUMNS": "200"},
    )
    assert out.exit_code == 0, out.output
    assert "\x1b" not in out.output and "\x07" not in out.output
    assert "\\x1b]0;owned\\x07" in out.output
    assert "skipped:" in out.output
