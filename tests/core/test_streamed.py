"""A remote entry into the local tier as it arrives (objcache/core/streamed.py): whole and
verified, or nothing under its name; memory a few pieces, not the entry."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from pathlib import Path

import pytest

from objcache.backends import fs_store
from objcache.backends.base import PendingWrite, Sink, WritesInPieces
from objcache.core import manifest, streamed
from objcache.core.fetch_once.nodelease import NodeLeases
from objcache.core.manifest import Manifest
from objcache.core.policy import RetryPolicy
from objcache.core.tier import TierFlags
from objcache.core.tiered import TieredCache
from objcache.errors import TransientBackendError
from tests.support.memory_backend import MemoryBackend
from tests.support.tiers import CODEC, NS, disk_tier, tier
from tests.support.waiting import until

PIECE = 64 << 10


class Streaming(MemoryBackend):
    """A store whose bodies arrive in pieces of :data:`PIECE` bytes, as a network store's
    do; ``fail_after`` pieces of the next call, the connection is reset (once)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.fail_after: int | None = None
        self.handed = 0

    async def get_into(self, key: str, max_bytes: int, sink: Sink) -> bool:
        await self._enter("get")
        data = self.data.get(key)
        if data is None:
            return False
        if not await sink.begin(len(data)):
            await sink.piece(data)
            return True
        for at in range(0, len(data), PIECE):
            if self.fail_after is not None and at // PIECE == self.fail_after:
                self.fail_after = None
                raise TransientBackendError("connection reset mid-body", tier=self.name)
            self.handed += 1
            await sink.piece(data[at : at + PIECE])
        return True


def streaming_cache(root: Path) -> tuple[TieredCache, Streaming]:
    remote = tier("mem://store")
    store = Streaming("mem://store")
    remote.backend = store
    local = disk_tier(root / "local")
    leases = NodeLeases(str(root / "local"), hold_s=30)
    return TieredCache(local, [remote], CODEC, NS, leases=leases), store


def entry_in(store: MemoryBackend, key: str, payload: bytes) -> tuple[str, bytes]:
    okey = NS.object_key("fx-graph", key)
    store.data[okey] = CODEC.encode(payload, okey)
    return okey, store.data[okey]


def on_disk(root: Path, okey: str) -> bytes | None:
    path = root / "local" / okey
    return path.read_bytes() if path.exists() else None


def temp_files(root: Path) -> list[str]:
    return [
        name
        for _, _, names in os.walk(root / "local")
        for name in names
        if name.startswith(fs_store.TMP_PREFIX)
    ]


async def test_a_large_entry_lands_whole_and_verified_piece_by_piece(tmp_path: Path) -> None:
    cache, store = streaming_cache(tmp_path)
    payload = os.urandom(3 << 20)
    okey, entry = entry_in(store, "big", payload)
    assert await streamed.fetch(cache, okey) == (len(payload), "mem://store")
    assert on_disk(tmp_path, okey) == entry
    assert store.handed == -(-len(entry) // PIECE)  # in pieces, never whole
    assert cache.stats.write_through == 1 and cache.remotes[0].stats.hits == 1
    assert temp_files(tmp_path) == []
    assert cache.stats.node_leases["held"] == 1
    # the next process finds it local: no second GET
    again, _ = streaming_cache(tmp_path)
    again.remotes[0].backend = store
    assert await streamed.fetch(again, okey) == (len(payload), again.local.name)  # type: ignore[union-attr]
    assert store.calls["get"] == 1


async def test_a_small_entry_takes_the_ordinary_way(tmp_path: Path) -> None:
    cache, store = streaming_cache(tmp_path)
    okey, entry = entry_in(store, "small", b"graph" * 10)
    assert await streamed.fetch(cache, okey) == (50, "mem://store")
    assert on_disk(tmp_path, okey) == entry and store.handed == 0


@pytest.mark.parametrize("damage", ["a flipped byte", "cut short", "another key's entry"])
async def test_a_large_entry_that_does_not_verify_leaves_nothing(
    tmp_path: Path, damage: str
) -> None:
    cache, store = streaming_cache(tmp_path)
    okey, entry = entry_in(store, "big", os.urandom(2 << 20))
    if damage == "a flipped byte":
        bad = bytearray(entry)
        bad[len(entry) // 2] ^= 1
        store.data[okey] = bytes(bad)
    elif damage == "cut short":
        store.data[okey] = entry[: -PIECE // 2]
    else:
        other, _ = entry_in(store, "other", b"")
        store.data[okey] = CODEC.encode(os.urandom(2 << 20), other)
    assert await streamed.fetch(cache, okey) == (None, "")
    assert on_disk(tmp_path, okey) is None and temp_files(tmp_path) == []
    assert cache.remotes[0].stats.misses["corrupt"] == 1
    assert not cache.remotes[0].breaker_open() and cache.remotes[0].breaker.state == "closed"


async def test_an_entry_over_its_kind_s_cap_stops_at_its_header(tmp_path: Path) -> None:
    cache, store = streaming_cache(tmp_path)
    cache.caps = type(cache.caps)(default=1 << 20, per_kind={"fx-graph": 1 << 20})
    okey, entry = entry_in(store, "big", os.urandom(4 << 20))
    store.data[okey] = entry[: 1 << 20]  # a store that cuts at the cap + 1, as a ranged GET
    assert await streamed.fetch(cache, okey) == (None, "")
    assert store.handed <= 2, "refused as the header arrived, not after the whole"
    assert on_disk(tmp_path, okey) is None and temp_files(tmp_path) == []
    assert cache.remotes[0].stats.misses["too_large"] == 1


async def test_a_refused_entry_leaves_nothing_once_its_fetch_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal comes while the local file's opening still runs in its thread: the fetch
    answers only once that step has ended and its file is gone."""
    cache, store = streaming_cache(tmp_path)
    cache.caps = type(cache.caps)(default=1 << 20, per_kind={"fx-graph": 1 << 20})
    okey, entry = entry_in(store, "big", os.urandom(4 << 20))
    store.data[okey] = entry[: 1 << 20]
    local = cache.local_store
    assert isinstance(local, WritesInPieces)
    real_open = local.open_write

    def slow_open(key: str) -> PendingWrite:
        pending = real_open(key)  # the temp file is there
        time.sleep(0.2)  # a window for the loop to answer before the step ends
        return pending

    monkeypatch.setattr(local, "open_write", slow_open)
    assert await streamed.fetch(cache, okey) == (None, "")
    assert temp_files(tmp_path) == [] and on_disk(tmp_path, okey) is None


async def test_a_reset_mid_body_is_retried_from_the_start(tmp_path: Path) -> None:
    cache, store = streaming_cache(tmp_path)
    okey, entry = entry_in(store, "big", os.urandom(2 << 20))
    store.fail_after = 5
    assert await streamed.fetch(cache, okey) == (2 << 20, "mem://store")
    assert on_disk(tmp_path, okey) == entry and temp_files(tmp_path) == []
    assert store.calls["get"] == 2


async def test_a_local_write_that_fails_mid_entry_is_the_local_tier_s_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC half-way: nothing under the entry's name, no temp file, the local tier's put
    error counted, the remote tier's breaker untouched."""
    cache, store = streaming_cache(tmp_path)
    okey, _ = entry_in(store, "big", os.urandom(3 << 20))
    writes = 0
    real = fs_store._write_all

    def full_disk(fd: int, data: bytes | memoryview) -> None:
        nonlocal writes
        writes += 1
        if writes > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(fs_store, "_write_all", full_disk)
    assert await streamed.fetch(cache, okey) == (None, "")
    assert on_disk(tmp_path, okey) is None and temp_files(tmp_path) == []
    assert cache.local is not None and cache.local.stats.put_errors["error"] == 1
    assert cache.remotes[0].breaker.state == "closed"
    assert sum(cache.remotes[0].stats.misses.values()) == 0


async def test_a_pull_by_job_streams_and_reports_what_it_fetched(tmp_path: Path) -> None:
    cache, store = streaming_cache(tmp_path)
    big, big_entry = entry_in(store, "big", os.urandom(2 << 20))
    small, small_entry = entry_in(store, "small", b"s" * 300)
    mokey = NS.object_key(manifest.KIND, "job/run-1")
    store.data[mokey] = CODEC.encode(
        Manifest("job", frozenset({big, small}), 1.0).to_bytes(), mokey
    )
    result = await manifest.prefetch(cache, "job", streamed=True)
    assert (result["fetched"], result["bytes"]) == (2, (2 << 20) + 300)
    assert on_disk(tmp_path, big) == big_entry and on_disk(tmp_path, small) == small_entry
    assert sum(cache.stats.prefetch_fetched.values()) == 2
    await cache.flush(5)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("end", ["the remote tier's deadline", "a cancelled caller"])
async def test_an_end_during_a_slow_local_write_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    """A deadline (a counted miss) or a cancellation (the caller's) while a piece is being
    written: the write ends in its thread, then its file and descriptors go; no error
    reaches a caller that did not cancel."""
    cache, store = streaming_cache(tmp_path)
    cache.remotes[0].policy = RetryPolicy(timeout_s=0.3, retries=0)
    okey, _ = entry_in(store, "big", os.urandom(3 << 20))
    real = fs_store._write_all
    writing = threading.Event()

    def slow_disk(fd: int, data: bytes | memoryview) -> None:
        writing.set()
        time.sleep(0.5)
        real(fd, data)

    monkeypatch.setattr(fs_store, "_write_all", slow_disk)
    before = open_fds()
    if end == "the remote tier's deadline":
        assert await streamed.fetch(cache, okey) == (None, "")
        assert cache.remotes[0].stats.misses["timeout"] == 1
    else:
        task = asyncio.ensure_future(streamed.fetch(cache, okey))
        await until(writing.is_set, what="a piece being written")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await until(lambda: temp_files(tmp_path) == [] and open_fds() == before, what="clean-up")
    assert on_disk(tmp_path, okey) is None


async def test_a_local_tier_with_a_size_cap_takes_the_ordinary_write(tmp_path: Path) -> None:
    """``disk://...?max_size=``: its cap applies to a large entry as to any (not streamed)."""
    cache, store = streaming_cache(tmp_path)
    assert cache.local is not None
    cache.local.flags = TierFlags(max_size=1 << 20)
    okey, _ = entry_in(store, "big", os.urandom(2 << 20))
    await streamed.fetch(cache, okey)
    await cache.flush(5)
    assert on_disk(tmp_path, okey) is None and store.handed == 0
    assert cache.local.stats.put_errors["too_large"] == 1


async def test_a_streamed_entry_is_counted_as_the_local_tier_s_put(tmp_path: Path) -> None:
    cache, store = streaming_cache(tmp_path)
    okey, entry = entry_in(store, "big", os.urandom(2 << 20))
    await streamed.fetch(cache, okey)
    assert cache.local is not None
    assert (cache.local.stats.puts, cache.local.stats.bytes_written) == (1, len(entry))
