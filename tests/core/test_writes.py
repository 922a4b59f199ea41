"""The one write into the tiers, ``core.writes.write`` (docs/architecture.md, "Write path"):
its modes (CREATE, OVERWRITE), its remote paths (write-behind, direct, none) and the typed
result saying what was written where; and the batch calls the integrations use."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

import objcache.client
from objcache.backends.base import PutMode
from objcache.client import Client
from objcache.config.settings import Config
from objcache.core.reads import get_many
from objcache.core.writes import Remote, Written, put, write
from tests.core.test_tiered import CODEC, NS, make, mem, tier


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
