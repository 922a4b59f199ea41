"""The start-up prefetch from a network store in its own process (objcache/prefetch_process.py),
against a real redis-server."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from objcache.cli import main as cli
from objcache.client import Client
from objcache.config.settings import Config
from objcache.prefetch_process import wanted
from tests.support.servers import RedisServer
from tests.support.waiting import wait_until


def _env(redis_server: RedisServer) -> dict[str, str]:
    return {
        "OBJCACHE_TIERS": redis_server.contract_url(uuid.uuid4().hex[:12]),
        "OBJCACHE_JOB": "train",
        "OBJCACHE_KEY_CARDS": "0",
        "OBJCACHE_PREFETCH_PROCESS": "1",
    }


def _remote_reads(client: Client) -> int:
    tiers = [t for t in client.stats()["tiers"] if not t["local"]]
    return sum(t["hits"] + sum(t["misses"].values()) for t in tiers)


def test_only_a_network_store_s_prefetch_gets_a_process_of_its_own(tmp_path: Path) -> None:
    assert not wanted(Config.from_env({"OBJCACHE_TIERS": f"file://{tmp_path}"}))
    assert wanted(Config.from_env({"OBJCACHE_TIERS": "redis://127.0.0.1:1/0"}))
    off = {"OBJCACHE_TIERS": "redis://127.0.0.1:1/0", "OBJCACHE_PREFETCH_PROCESS": "0"}
    assert not wanted(Config.from_env(off))


def test_a_new_machine_prefetches_in_a_child_and_looks_up_locally_only(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A first machine fills the store; a new one's prefetch runs in a child process, into
    the same local tier (an entry of 1 MiB or more written as it arrives): its lookups read
    no remote tier, and its time line (built from what the child said) is what ``explain
    --time`` shows."""
    env = _env(redis_server)
    first = Client(Config.from_env({**env, "OBJCACHE_LOCAL_DIR": str(tmp_path / "a")}))
    for i in range(3):
        first.put("fx-graph", f"k{i}", f"v{i}".encode())
    big = os.urandom(2 << 20)
    first.put("fx-graph", "big", big)
    first.close()

    new = Client(Config.from_env({**env, "OBJCACHE_LOCAL_DIR": str(tmp_path / "b")}))
    child = new.prefetch_process
    assert child is not None and child.proc.pid != os.getpid()
    assert new.prefetch_result is not None
    result = new.prefetch_result.result(60)
    assert result["fetched"] == 4 and result["keys"] == 4
    wait_until(lambda: child.proc.poll() is not None, what="the child's exit")
    assert [new.get("fx-graph", f"k{i}") for i in range(3)] == [b"v0", b"v1", b"v2"]
    assert new.get("fx-graph", "big") == big
    assert _remote_reads(new) == 0  # every lookup local: the child fetched them
    child_tiers = new.stats()["prefetch_process"]["tiers"]  # what it fetched, for stats
    assert sum(t["hits"] for t in child_tiers if not t["local"]) == 5  # 4 entries, 1 manifest
    new.close()

    out = CliRunner().invoke(
        cli.app,
        ["explain", "--time", "--job", "train", "--tier", env["OBJCACHE_TIERS"], "--json"],
    )
    assert out.exit_code == 0, out.output
    p = json.loads(out.output)["prefetch"]
    assert p["fetched"] == 4 and p["keys"] == 4 and p["bytes"] == 6 + len(big)
    assert sorted(e["key"] for e in p["entries"]) == ["big", "k0", "k1", "k2"]


def test_a_child_that_dies_ends_every_wait_and_lookups_go_their_own_way(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _env(redis_server)
    first = Client(Config.from_env({**env, "OBJCACHE_LOCAL_DIR": str(tmp_path / "a")}))
    first.put("fx-graph", "k", b"v")
    first.close()
    # a child that exits before it says anything (a broken interpreter, a killed process)
    monkeypatch.setattr("objcache.prefetch_process.sys.executable", "/bin/false")
    new = Client(Config.from_env({**env, "OBJCACHE_LOCAL_DIR": str(tmp_path / "b")}))
    assert new.prefetch_result is not None
    with pytest.raises(RuntimeError, match="prefetch process ended"):
        new.prefetch_result.result(60)
    assert new.get("fx-graph", "k") == b"v"  # from the store, as without a prefetch
    assert _remote_reads(new) == 1
    new.close()


def test_the_childs_messages_wake_the_event_loop_once_for_all_that_arrived_meanwhile() -> None:
    """Each wake-up of the loop costs the compiling thread a hand-off of the interpreter
    lock: messages the reader passes while a wake-up is pending ride on it, in order."""
    import threading
    from typing import Any

    from objcache.prefetch_process import PrefetchProcess

    class Loop:
        def __init__(self) -> None:
            self.scheduled: list[Any] = []

        def call_soon_threadsafe(self, fn: Any) -> None:
            self.scheduled.append(fn)

    class Bridge:
        loop = Loop()

    relay = PrefetchProcess.__new__(PrefetchProcess)
    relay.bridge = Bridge()  # type: ignore[assignment]
    relay._inbox = __import__("queue").SimpleQueue()
    relay._inbox_lock = threading.Lock()
    relay._drain_scheduled = False
    seen: list[int] = []
    for i in range(100):
        relay._on_loop(seen.append, i)
    assert len(Bridge.loop.scheduled) == 1 and seen == []
    relay._on_loop(lambda _: 1 / 0, None)  # a failing message strands none after it
    relay._on_loop(seen.append, 100)
    Bridge.loop.scheduled.pop()()
    assert seen == list(range(101))
    relay._on_loop(seen.append, 101)  # after a drain: the next message wakes it again
    assert len(Bridge.loop.scheduled) == 1
