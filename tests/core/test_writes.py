"""The one write into the tiers, ``core.writes.write`` (docs/architecture.md, "Write path"):
its modes (CREATE, OVERWRITE), its remote paths (write-behind, direct, none) and the typed
result saying what was written where; and the batch calls the integrations use."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

import objcache.client
from objcache.backends.base import PutMode
from objcache.client import Client
from objcache.config.settings import Config
from objcache.core.reads import get_many
from objcache.core.tier import TierFlags
from objcache.core.tiered import TieredCache
from objcache.core.writes import Remote, Written, put, write
from tests.support.tiers import CODEC, NS, make, mem, seed, tier


async def test_write_behind_stores_locally_now_and_remotely_in_the_background() -> None:
    remote = tier("mem://remote")
    cache, local = make(remote)
    held = asyncio.Event()
    mem(remote).hold_until = held
    okey = NS.object_key("fx-graph", "k")
    written = await write(cache, okey, b"payload")
    assert written == Written(okey, local=True, remote=Remote.BEHIND, queued=True)
    assert CODEC.decode(mem(local).data[okey], okey) == b"payload"
    assert okey not in mem(remote).data, "the remote write waits behind"
    assert okey not in cache.recorded, "a raw write is not part of the run's manifest"
    held.set()
    assert await cache.flush(30) == 0
    assert CODEC.decode(mem(remote).data[okey], okey) == b"payload"


async def test_direct_writes_every_writable_remote_before_returning() -> None:
    near, far = tier("mem://near"), tier("mem://far")
    cache, _ = make(near, far)
    okey = NS.object_key("mega", "b")
    written = await write(cache, okey, b"v1", remote=Remote.DIRECT)
    assert (written.remote, written.stored, written.asked) == (Remote.DIRECT, 2, 2)
    assert written.everywhere and not written.queued
    assert okey in mem(near).data and okey in mem(far).data
    # a failing tier is counted in the result, not raised
    mem(far).fault = "permanent"
    partial = await write(cache, okey, b"v2", mode=PutMode.OVERWRITE, remote=Remote.DIRECT)
    assert (partial.stored, partial.asked, partial.everywhere) == (1, 2, False)


async def test_create_keeps_a_remote_object_and_overwrite_replaces_it() -> None:
    remote = tier("mem://remote")
    cache, local = make(remote)
    okey = NS.object_key("mega", "b")
    await write(cache, okey, b"first", remote=Remote.DIRECT)
    kept = await write(cache, okey, b"second", mode=PutMode.CREATE, remote=Remote.DIRECT)
    assert kept.everywhere, "an existing object under CREATE counts as stored"
    assert CODEC.decode(mem(remote).data[okey], okey) == b"first"
    assert CODEC.decode(mem(local).data[okey], okey) == b"second", "local always overwrites"
    await write(cache, okey, b"third", mode=PutMode.OVERWRITE, remote=Remote.DIRECT)
    assert CODEC.decode(mem(remote).data[okey], okey) == b"third"


async def test_none_writes_only_the_local_tier() -> None:
    remote = tier("mem://remote")
    cache, local = make(remote)
    okey = NS.object_key("fx-graph", "seeded")
    written = await write(cache, okey, b"x", remote=Remote.NONE)
    assert written == Written(okey, local=True, remote=Remote.NONE)
    assert await cache.flush(30) == 0
    assert okey in mem(local).data and mem(remote).data == {}


async def test_remote_only_and_read_only_writes() -> None:
    remote = tier("mem://remote")
    cache, local = make(remote)
    okey = NS.object_key("run", "summary")
    written = await write(cache, okey, b"s", local=False)
    assert not written.local and written.queued
    assert await cache.flush(30) == 0
    assert okey in mem(remote).data and okey not in mem(local).data

    ro, ro_local = make(tier("mem://ro"), read_only=True)
    direct = await write(ro, okey, b"s", remote=Remote.DIRECT)
    assert direct == Written(okey, local=True, remote=Remote.NONE), "read-only: no remote"
    assert okey in mem(ro_local).data


async def test_an_encoded_entry_is_stored_as_is() -> None:
    cache, local = make(tier("mem://remote"))
    okey = NS.object_key("fx-graph", "pushed")
    entry = CODEC.encode(b"payload", okey)
    await write(cache, okey, entry, encoded=True, remote=Remote.NONE)
    assert mem(local).data[okey] == entry


async def test_overwrite_through_write_behind_is_refused_and_the_result_is_frozen() -> None:
    cache, local = make(tier("mem://remote"))
    okey = NS.object_key("mega", "b")
    with pytest.raises(ValueError, match="CREATE"):
        await write(cache, okey, b"x", mode=PutMode.OVERWRITE)
    assert okey not in mem(local).data, "refused before anything is written"
    written = await write(cache, okey, b"x", remote=Remote.NONE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        written.local = False  # type: ignore[misc]


async def test_get_many_follows_into_a_second_round_and_put_many_stores_all() -> None:
    remote = tier("mem://remote")
    cache, _ = make(remote)
    items = {"k/group": b"k/a k/b", "k/a": b"A", "k/b": b"B"}
    await asyncio.gather(*(put(cache, "triton", k, p) for k, p in items.items()))

    def children(key: str, payload: bytes) -> list[str]:
        return payload.decode().split() if key == "k/group" else []

    found = await get_many(cache, "triton", ["k/group", "k/absent"], children)
    assert found == {"k/group": b"k/a k/b", "k/a": b"A", "k/b": b"B"}
    assert await get_many(cache, "triton", ["k/a"]) == {"k/a": b"A"}


def test_the_client_leaves_a_key_out_of_the_run_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the kernel hooks use for precompiled headers (no editing of the cache's set)."""
    monkeypatch.setattr(objcache.client, "fingerprint", lambda: {"torch": "t"})
    config = Config(tiers=f"file://{tmp_path / 'store'}", local_dir=tmp_path / "local")  # type: ignore[arg-type]
    client = Client(config)
    try:
        client.put("cpp-kernel", "pch", b"header")
        client.put("cpp-kernel", "so", b"kernel")
        client.leave_out_of_manifest("cpp-kernel", "pch")
        assert client.get("cpp-kernel", "pch") == b"header"  # a hit posted before the call
        client.leave_out_of_manifest("cpp-kernel", "pch")
        client.flush()  # a bridge call: everything posted before it has run
        assert client.cache.recorded == {client.object_key("cpp-kernel", "so")}
        written = client.write(client.object_key("mega", "b"), b"bundle", remote=Remote.DIRECT)
        assert written.everywhere and written.local
    finally:
        client.close()


async def test_writes_go_local_now_and_remote_behind() -> None:
    remote = tier("mem://r")
    mem(remote).hold_until = gate = asyncio.Event()  # the remote write cannot finish yet
    cache, local = make(remote)
    await asyncio.wait_for(put(cache, "fx-graph", "k", b"v"), 30)  # remote write does not block
    okey = NS.object_key("fx-graph", "k")
    assert okey in mem(local).data and okey not in mem(remote).data
    gate.set()
    assert await cache.flush(5) == 0
    assert CODEC.decode(mem(remote).data[okey], okey) == b"v"
    assert NS.env_file in mem(remote).data


async def test_create_mode_keeps_the_first_remote_writer() -> None:
    remote = tier("mem://r")
    okey = NS.object_key("fx-graph", "k")
    assert await remote.put(okey, CODEC.encode(b"first", okey), PutMode.CREATE)
    cache, _ = make(remote)
    await put(cache, "fx-graph", "k", b"second")
    await cache.flush(5)
    assert CODEC.decode(mem(remote).data[okey], okey) == b"first"
    assert remote.stats.put_skipped_exists == 1


async def test_write_only_and_size_limited_tiers() -> None:
    wo = tier("mem://wo", flags=TierFlags(write_only=True))
    small = tier("mem://small", flags=TierFlags(max_size=100))
    seed(wo, "k", b"v")
    cache, _ = make(wo, small)
    assert await cache.get("fx-graph", "k") is None
    assert mem(wo).calls["get"] == 0
    await put(cache, "fx-graph", "big", bytes(range(256)) * 4)
    await cache.flush(5)
    assert small.stats.put_errors["too_large"] == 1
    assert NS.object_key("fx-graph", "big") in mem(wo).data


async def remote_only(cache: TieredCache, kind: str, key: str, payload: bytes) -> bool:
    """The run summary's write (objcache/run_observer.py): queued for the remote tiers only."""
    okey = cache.namespace.object_key(kind, key)
    return (await write(cache, okey, payload, local=False)).queued


async def test_a_remote_only_write_queues_for_the_remote_tiers_only() -> None:
    remote = tier("mem://r")
    cache, local = make(remote)
    assert await remote_only(cache, "summary", "run-1", b"report")
    await cache.flush(5)
    okey = NS.object_key("summary", "run-1")
    assert CODEC.decode(mem(remote).data[okey], okey) == b"report"
    assert not mem(local).data
    reader, _ = make(tier("mem://r2"), read_only=True)
    assert not await remote_only(reader, "summary", "run-1", b"report")
    frozen, _ = make(tier("mem://r3", flags=TierFlags(read_only=True)))
    assert not await remote_only(frozen, "summary", "run-1", b"report")
    await reader.flush(5)
    await frozen.flush(5)
    assert not mem(reader.remotes[0]).data and not mem(frozen.remotes[0]).data


async def test_local_puts_overwrite_and_are_recorded_and_env_json_is_readable() -> None:
    remote = tier("mem://r")
    local = tier("mem://local")
    cache = TieredCache(local, [remote], CODEC, NS, env_fields={"torch": "2", "cuda": "12"})
    for payload in (b"first", b"second"):
        await put(cache, "fx-graph", "k", payload)
    okey = NS.object_key("fx-graph", "k")
    assert CODEC.decode(mem(local).data[okey], okey) == b"second"
    assert cache.recorded == {okey}
    await cache.flush(5)
    body = mem(remote).data[NS.env_file]
    assert body == json.dumps({"cuda": "12", "torch": "2"}, indent=1, sort_keys=True).encode()
    stats = cache.stats_dict()
    assert set(stats) == {"env", "cache", "write_behind_pending", "tiers"}
    assert stats["env"] == "testenv" and stats["write_behind_pending"] == 0
    assert [(t["breaker"], t["local"]) for t in stats["tiers"]] == [
        ("closed", True),
        ("closed", False),
    ]
