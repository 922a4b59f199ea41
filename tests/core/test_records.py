"""Records through the core (TieredCache, Client) on real filesystem stores: a disk local
tier and a file:// remote tier shared by caches standing for separate hosts. Every backend's
conditional write is proven against its real server by tests/contract."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from objcache.client import Client, build_cache
from objcache.config.settings import Config
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.records import Change
from objcache.core.tier import Tier
from objcache.core.tiered import TieredCache
from objcache.core.tiered_records import get_record, update_record
from objcache.entry.codec import Codec
from objcache.entry.layout import Namespace
from tests.support.memory_backend import MemoryBackend

KIND = "pgo"
ENV = {"torch": "t"}


def host(tmp_path: Path, name: str, store: Path) -> TieredCache:
    config = Config(tiers=f"file://{store}", local_dir=tmp_path / name, prefetch=False)
    return build_cache(config, env_fields=ENV)


def add(element: str) -> Change:
    def change(current: bytes | None) -> bytes | None:
        members = set(json.loads(current)) if current else set()
        return None if element in members else json.dumps(sorted(members | {element})).encode()

    return change


def members(payload: bytes | None) -> list[str]:
    return list(json.loads(payload)) if payload else []


async def test_hosts_updating_one_record_leave_the_join(tmp_path: Path) -> None:
    store = tmp_path / "store"
    hosts = [host(tmp_path, f"h{i}", store) for i in range(8)]
    try:
        await asyncio.gather(
            *(update_record(h, KIND, "k", add(f"d{i}")) for i, h in enumerate(hosts))
        )
        for h in hosts:
            assert await h.flush(10) == 0
        fresh = host(tmp_path, "fresh", store)
        assert members(await get_record(fresh, KIND, "k")) == [f"d{i}" for i in range(8)]
        remote = [h.remotes[0].stats for h in hosts]
        assert sum(s.records["stored"] for s in remote) == 8
        # the local tier holds what this host wrote; the remote tier wins on a read
        assert members(await get_record(hosts[2], KIND, "k")) == [f"d{i}" for i in range(8)]
        await fresh.close()
    finally:
        for h in hosts:
            await h.close()


async def test_the_local_record_is_read_when_no_remote_tier_has_one(tmp_path: Path) -> None:
    cache = host(tmp_path, "h", tmp_path / "store")
    await update_record(cache, KIND, "k", add("local"))
    await cache.flush(10)
    assert await cache.remotes[0].delete(cache.namespace.object_key(KIND, "k"))
    assert members(await get_record(cache, KIND, "k")) == ["local"]
    await cache.close()


async def test_an_unreadable_record_is_a_counted_miss_replaced_by_the_next_write(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    cache = host(tmp_path, "h", store)
    okey = cache.namespace.object_key(KIND, "k")
    (store / okey).parent.mkdir(parents=True)
    (store / okey).write_bytes(b"OBJC garbage, not an entry")
    assert await get_record(cache, KIND, "k") is None
    assert cache.remotes[0].stats.misses["corrupt"] == 1
    await update_record(cache, KIND, "k", add("fresh"))
    await cache.flush(10)
    assert cache.stats.records_unreadable[KIND] == 1
    assert members(await get_record(cache, KIND, "k")) == ["fresh"]
    await cache.close()


async def test_a_store_without_records_is_counted_never_raised(tmp_path: Path) -> None:
    policy = RetryPolicy(timeout_s=1.0, retries=0)
    remote = Tier(MemoryBackend("mem://r"), policy, CircuitBreaker(3, 60))
    cache = TieredCache(None, [remote], Codec(), Namespace("e"))
    await update_record(cache, KIND, "k", add("x"))
    await cache.flush(5)
    assert remote.stats.records["unsupported"] == 1


def test_the_sync_client_updates_and_reads_records(tmp_path: Path) -> None:
    config = Config(tiers=f"file://{tmp_path / 'store'}", local_dir=tmp_path / "l", prefetch=False)
    client = Client(config)
    try:
        client.update_record(KIND, "k", add("a"))
        client.update_record(KIND, "k", add("b"))
        client.flush(10)
        assert members(client.get_record(KIND, "k")) == ["a", "b"]
    finally:
        client.close()
