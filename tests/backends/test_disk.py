"""``disk://``: LRU eviction by bytes, the backend's own access clock, quarantine."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from objcache.backends import fs_store as _fs
from objcache.backends.base import PutMode
from objcache.backends.disk import store as disk
from objcache.backends.disk.store import DiskBackend
from objcache.backends.fs_folders import LEASE_PREFIX, check_key
from objcache.backends.fs_store import QUARANTINE_DIR, FsStore
from objcache.backends.options import opt_int
from objcache.config.urls import parse_tier_url
from objcache.errors import BackendError, ConfigError, InvalidKey, TransientBackendError


def make(root: Path, query: str = "") -> DiskBackend:
    return DiskBackend(parse_tier_url(f"disk://{root}{query}"))


def bytes_on_disk(root: Path) -> int:
    return sum(
        os.path.getsize(os.path.join(d, n))
        for d, dirs, names in os.walk(root)
        if QUARANTINE_DIR not in d
        for n in names
    )


async def present(backend: DiskBackend, keys: list[str]) -> list[str]:
    return [k for k in keys if await backend.exists(k)]


async def test_present_answers_for_many_keys_as_exists_does(tmp_path: Path) -> None:
    backend = make(tmp_path)
    assert await backend.put("v1/e/k/a", b"x")
    assert await backend.put("v1/e/k/b", b"y")
    (tmp_path / "v1" / "e" / "k" / "folder").mkdir()
    valid = ["v1/e/k/a", "v1/e/k/b", "v1/e/k/c", "v1/e/k/folder", "v1/x/y"]
    assert await backend.present(valid) == {k for k in valid if await backend.exists(k)}
    # a key no call can address is not held (exists raises InvalidKey for it)
    assert await backend.present([*valid, "../a", "v1/.objcache-x"]) == {"v1/e/k/a", "v1/e/k/b"}


async def test_evicts_least_recently_read_first(tmp_path: Path) -> None:
    backend = make(tmp_path, "?max_bytes=10000")
    keys = [f"e/{i:02d}" for i in range(11)]
    for key in keys[:10]:
        assert await backend.put(key, b"x" * 1000)
    await backend.wait_idle()
    assert backend.total_bytes == 10_000  # at the limit, not over: nothing evicted
    assert await present(backend, keys) == keys[:10]
    assert await backend.get(keys[0]) is not None  # the oldest write is now recently read
    await backend.put(keys[10], b"x" * 1000)
    await backend.wait_idle()
    # Over the limit: down to 90% (9000 bytes) by dropping the two least recently *used*.
    assert await present(backend, keys) == [keys[0], *keys[3:]]
    assert backend.total_bytes == bytes_on_disk(tmp_path) == 9000
    await backend.close()


async def test_access_order_survives_a_restart(tmp_path: Path) -> None:
    """Hits are stamped into atime by the backend, so a new process evicts in LRU order."""
    first = make(tmp_path)
    keys = [f"r/{i}" for i in range(5)]
    for key in keys:
        await first.put(key, b"y" * 1000)
    for i, key in enumerate(keys):  # written an hour ago, oldest first
        then = time.time() - 3600 + i
        os.utime(tmp_path / key, (then, then))
    assert await first.get(keys[0]) == b"y" * 1000  # stamps atime = now
    await first.close()
    assert (tmp_path / keys[0]).stat().st_atime > time.time() - 60

    second = make(tmp_path, "?max_bytes=5000")
    await second.put("r/new", b"z" * 1000)
    await second.wait_idle()
    assert await present(second, [*keys, "r/new"]) == [keys[0], *keys[3:], "r/new"]
    await second.close()


async def test_hits_stamp_atime_at_most_once_a_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The LRU clock must not depend on the mount's atime policy (noatime, relatime)."""
    backend = make(tmp_path)
    await backend.put("k", b"v")
    stamps: list[tuple[int, int]] = []
    real_utime = os.utime

    def spy(target: int, *, ns: tuple[int, int]) -> None:
        stamps.append(ns)
        real_utime(target, ns=ns)

    monkeypatch.setattr(os, "utime", spy)
    assert await backend.get("k") == b"v"
    assert stamps == []  # just written: its atime is fresh
    hour_ago = time.time() - 3600
    real_utime(tmp_path / "k", (hour_ago, hour_ago))
    before = time.time_ns()
    assert await backend.get("k") == b"v"
    assert len(stamps) == 1
    assert stamps[0][0] >= before  # atime = now
    assert abs(stamps[0][1] / 1e9 - hour_ago) < 1  # mtime (the write time) is kept
    assert await backend.get("k") == b"v"
    assert len(stamps) == 1  # now fresh again
    await backend.close()


async def test_first_use_counts_entries_written_before(tmp_path: Path) -> None:
    (tmp_path / "old" / "ab").mkdir(parents=True)
    for i in range(3):
        (tmp_path / "old" / "ab" / f"k{i}").write_bytes(b"o" * 700)
    backend = make(tmp_path, "?max_bytes=1M")
    assert await backend.get("old/ab/k0") == b"o" * 700
    await backend.wait_idle()
    assert backend.total_bytes == 2100
    await backend.put("new", b"n" * 100)
    await backend.delete("old/ab/k1")
    assert backend.total_bytes == 1500
    await backend.close()


class SlowEvict:
    """Stands in for ``disk._evict``: each pass blocks until ``release`` is set; counts
    passes and the most that ran at once."""

    def __init__(self) -> None:
        self.release, self.evicting = threading.Event(), threading.Event()
        self.calls = self.active = self.most = 0
        self._lock = threading.Lock()
        self._real = disk._evict

    def __call__(self, *args: object) -> list[str]:
        with self._lock:
            self.calls += 1
            self.active += 1
            self.most = max(self.most, self.active)
        self.evicting.set()
        self.release.wait(60)
        try:
            return self._real(*args)  # type: ignore[arg-type]
        finally:
            with self._lock:
                self.active -= 1


@pytest.fixture
def slow_evict(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowEvict]:
    slow = SlowEvict()
    monkeypatch.setattr(disk, "_evict", slow)
    yield slow
    slow.release.set()


async def over_the_limit(tmp_path: Path, slow: SlowEvict) -> DiskBackend:
    """A 2000-byte disk tier given 3000 bytes: its eviction pass has started and blocks."""
    backend = make(tmp_path, "?max_bytes=2000")
    for i in range(3):
        await backend.put(f"k{i}", b"x" * 1000)
    await asyncio.to_thread(slow.evicting.wait, 60)
    assert slow.evicting.is_set()
    return backend


async def test_put_does_not_wait_for_eviction(tmp_path: Path, slow_evict: SlowEvict) -> None:
    release = slow_evict.release
    backend = await over_the_limit(tmp_path, slow_evict)
    try:
        for i in range(3, 6):  # eviction is blocked until released, puts are not
            assert await asyncio.wait_for(backend.put(f"k{i}", b"x" * 1000), 30)
    finally:
        release.set()
    await backend.wait_idle()
    assert bytes_on_disk(tmp_path) <= 2000
    await backend.close()


async def test_unlimited_tracks_nothing(tmp_path: Path) -> None:
    backend = make(tmp_path)
    assert backend.max_bytes == 0
    for i in range(20):
        await backend.put(f"u/{i}", b"u" * 1000)
        await backend.get(f"u/{i}")
    assert backend._task is None
    assert bytes_on_disk(tmp_path) == 20_000
    await backend.close()


async def test_quarantine_hides_the_entry(tmp_path: Path) -> None:
    backend = make(tmp_path, "?max_bytes=1M")
    await backend.put("v1/env/fx/ab/bad", b"garbage")
    await backend.put("v1/env/fx/ab/good", b"fine")
    assert await backend.quarantine("v1/env/fx/ab/bad") is True
    assert await backend.get("v1/env/fx/ab/bad") is None
    assert await backend.exists("v1/env/fx/ab/bad") is False
    assert [i.key async for i in backend.list()] == ["v1/env/fx/ab/good"]
    moved = list((tmp_path / QUARANTINE_DIR).iterdir())
    assert len(moved) == 1
    assert moved[0].name.endswith("-bad")
    assert moved[0].read_bytes() == b"garbage"
    assert await backend.quarantine("v1/env/fx/ab/bad") is False
    assert await backend.put("v1/env/fx/ab/bad", b"rebuilt") is True  # the key is free again
    await backend.wait_idle()
    assert backend.total_bytes == len(b"rebuilt") + len(b"fine")
    with pytest.raises(InvalidKey):
        await backend.quarantine("../x")
    await backend.close()


def test_quarantine_is_emptied_after_a_day(tmp_path: Path) -> None:
    store = FsStore(str(tmp_path), fsync=False, touch_on_read=True)
    (tmp_path / "k").write_bytes(b"bad")
    assert store.quarantine("k")
    qdir = tmp_path / QUARANTINE_DIR
    old_stamp = time.time_ns() - int((_fs.QUARANTINE_TTL_S + 60) * 1e9)
    (qdir / f"{old_stamp}-0123-old").write_bytes(b"older")
    assert store.scan_all() == {}
    assert [p.name.endswith("-k") for p in qdir.iterdir()] == [True]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0", 0), ("1048576", 1 << 20), ("512M", 512 << 20), ("10G", 10 << 30), ("2GiB", 2 << 30)],
)
def test_max_bytes_option(value: str, expected: int) -> None:
    assert opt_int(parse_tier_url(f"disk:///c?max_bytes={value}"), "max_bytes") == expected


@pytest.mark.parametrize("value", ["-1", "ten", "1.5G", "10X"])
def test_bad_max_bytes_is_a_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match="max_bytes"):
        make(Path("/c"), f"?max_bytes={value}")


_SEGMENTS = st.one_of(st.sampled_from(["", ".", "..", "...", "a", "\\", ".objcache-t"]), st.text())
_KEYS = st.one_of(st.text(max_size=60), st.lists(_SEGMENTS, min_size=1, max_size=6).map("/".join))


@given(_KEYS)
def test_accepted_keys_stay_inside_the_root(key: str) -> None:
    store = FsStore("/srv/cache", fsync=False, touch_on_read=False)
    try:
        check_key(key)
    except InvalidKey:
        return
    assert os.path.normpath(store.path(key)).startswith("/srv/cache/")
    assert os.path.relpath(store.path(key), "/srv/cache").replace(os.sep, "/") == key


def test_maintenance_restarts_on_a_new_event_loop(tmp_path: Path) -> None:
    """A loop that stops with maintenance in flight (the sync bridge's loop, copied into a
    forked child) must not block maintenance on the loop that replaces it."""
    backend = make(tmp_path, "?max_bytes=3000")
    old_loop = asyncio.new_event_loop()
    old_loop.run_until_complete(backend.put("k0", b"x" * 1000))  # starts the first scan
    old_loop.close()  # ... which never gets to run

    async def fill() -> None:
        for i in range(1, 6):
            await backend.put(f"k{i}", b"x" * 1000)
        await backend.wait_idle()

    asyncio.run(asyncio.wait_for(fill(), 60))
    # Eviction ran on the new loop (6000 bytes were written). A put racing the first scan can
    # stay unknown to the index until the next rescan, so allow one entry over the limit.
    assert bytes_on_disk(tmp_path) <= 4000
    assert (tmp_path / "k5").exists()


async def test_a_fast_path_hit_keeps_its_entry_from_eviction(tmp_path: Path) -> None:
    backend = make(tmp_path, "?max_bytes=3500")
    for key in ("a", "b", "c"):
        await backend.put(key, b"x" * 1000)
        await backend.wait_idle()
        await asyncio.sleep(0.02)
    assert backend.read_sync("a") == b"x" * 1000
    backend.note_hit("a", 1000)  # what TieredCache does after a fast-path hit
    await backend.put("d", b"x" * 1000)
    await backend.wait_idle()
    assert (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert backend.total_bytes == bytes_on_disk(tmp_path)
    await backend.close()


def test_a_quarantined_entry_is_named_by_time_key_digest_and_tail(tmp_path: Path) -> None:
    store = FsStore(str(tmp_path), fsync=False, touch_on_read=True)
    key = "v1/env/fx/ab/" + "t" * 150
    (tmp_path / "v1/env/fx/ab").mkdir(parents=True)
    (tmp_path / key).write_bytes(b"bad")
    before = time.time_ns()
    assert store.quarantine(key)
    after = time.time_ns()
    [moved] = (tmp_path / QUARANTINE_DIR).iterdir()
    stamp, digest, tail = moved.name.split("-", 2)
    assert before <= int(stamp) <= after, "the expiry reads the time from the name"
    assert digest == hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
    assert tail == "t" * 100 and moved.read_bytes() == b"bad"
    assert not (tmp_path / key).exists()
    assert store.quarantine(key) is False
    assert store.quarantine("v1/absent/folder/k") is False


def test_only_stale_temp_and_lease_files_are_swept(tmp_path: Path) -> None:
    store = FsStore(str(tmp_path), fsync=False, touch_on_read=True)
    now = time.time()
    names = {
        f"{_fs.TMP_PREFIX}stale": now - _fs.STALE_AFTER_S - 1,
        f"{LEASE_PREFIX}stale": now - _fs.STALE_AFTER_S - 1,
        f"{_fs.TMP_PREFIX}boundary": now - _fs.STALE_AFTER_S,
        f"{_fs.TMP_PREFIX}fresh": now - 60,
        f"{_fs.LOCK_PREFIX}old": now - _fs.STALE_AFTER_S - 1,
    }
    for name, mtime in names.items():
        (tmp_path / name).write_bytes(b"")
        os.utime(tmp_path / name, (mtime, mtime))
    directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(directory) as it:
            for entry in it:
                FsStore._drop_if_stale(directory, entry, now)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [f"{_fs.TMP_PREFIX}boundary", f"{_fs.TMP_PREFIX}fresh", f"{_fs.LOCK_PREFIX}old"]
        )
        store.sweep(directory)  # the same rule, a moment later: the boundary file is stale now
    finally:
        os.close(directory)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{_fs.LOCK_PREFIX}old",
        f"{_fs.TMP_PREFIX}fresh",
    ]


@pytest.fixture
def scans_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every directory scan of the disk tier fails."""

    def unreadable(*_: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(disk, "_scan", unreadable)


@pytest.mark.usefixtures("scans_fail")
async def test_a_failed_scan_falls_back_to_what_this_process_has_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(DiskBackend, "evict_backoff_s", 0.0)
    backend = make(tmp_path, "?max_bytes=3000")
    for i in range(5):  # the first put's scan fails; eviction still runs on what was seen
        await backend.put(f"k{i}", b"x" * 1000)
        await backend.wait_idle()
        await asyncio.sleep(0.01)
    assert bytes_on_disk(tmp_path) <= 3000 and (tmp_path / "k4").exists()
    assert backend.total_bytes == bytes_on_disk(tmp_path)
    await backend.close()


async def test_quarantine_takes_the_entry_out_of_the_byte_count(tmp_path: Path) -> None:
    backend = make(tmp_path, "?max_bytes=1M")
    await backend.put("a/bad", b"x" * 100)
    await backend.put("a/good", b"y" * 10)
    await backend.wait_idle()
    assert backend.total_bytes == 110
    assert await backend.quarantine("a/bad")
    assert backend.total_bytes == 10
    await backend.close()


def test_eviction_frees_exactly_the_excess_oldest_first(tmp_path: Path) -> None:
    store = FsStore(str(tmp_path), fsync=False, touch_on_read=True)
    for key in ("old", "mid", "new"):
        (tmp_path / key).write_bytes(b"x" * 10)
    sizes = {"new": 10, "old": 10, "mid": 10}
    used = {"new": 3.0, "old": 1.0, "mid": 2.0}
    assert disk._evict(store, sizes, used, 1) == ["old"], "one byte over frees one entry"
    assert disk._evict(store, sizes, used, 11) == ["old", "mid"]
    assert disk._evict(store, sizes, used, 0) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]


async def test_an_eviction_that_frees_nothing_backs_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    passes: list[int] = []

    def frees_nothing(store: FsStore, sizes: object, used: object, excess: int) -> list[str]:
        passes.append(excess)
        return []

    monkeypatch.setattr(disk, "_evict", frees_nothing)
    backend = make(tmp_path, "?max_bytes=1000")
    for i in range(5):
        await backend.put(f"k{i}", b"x" * 1000)
        await backend.wait_idle()
    assert len(passes) == 1, "no new pass until the back-off has passed"
    await backend.close()


def test_the_index_replays_changes_made_while_it_was_rebuilt() -> None:
    idx = disk._Index()
    idx.seen("kept", 7, 1.0)
    idx.begin_rebuild()
    idx.seen("written", 5, 2.0)
    idx.seen("empty", 0, 2.0)
    idx.gone("deleted")
    idx.finish_rebuild({"deleted": 3, "scanned": 4}, {"deleted": 0.5, "scanned": 0.5}, 7)
    assert idx.ready
    assert idx.sizes == {"scanned": 4, "written": 5, "empty": 0}
    assert set(idx.used) == set(idx.sizes) and idx.total == 9
    idx.seen("after", 1, 3.0)  # no longer journaled: a second rebuild starts from scratch
    idx.begin_rebuild()
    idx.finish_rebuild({}, {}, 0)
    assert idx.sizes == {}


def test_a_fast_path_read_error_is_a_typed_backend_error(tmp_path: Path) -> None:
    backend = make(tmp_path)

    def failing_read(key: str, max_bytes: int = 0) -> bytes | None:
        raise OSError(errno.EIO, "Input/output error")

    backend.store.read = failing_read  # type: ignore[method-assign]
    with pytest.raises(TransientBackendError) as raised:
        backend.read_sync("a/k")
    assert raised.value.tier == backend.name and "a/k" in str(raised.value)


def test_a_scan_takes_the_later_of_atime_and_this_process_s_clock(tmp_path: Path) -> None:
    store = FsStore(str(tmp_path), fsync=False, touch_on_read=True)
    for key, atime in (("seen", 100.0), ("unseen", 0.5)):
        (tmp_path / key).write_bytes(b"x" * 3)
        os.utime(tmp_path / key, (atime, atime))
    sizes, used, total = disk._scan(store, {"seen": 200.0, "gone": 300.0})
    assert sizes == {"seen": 3, "unseen": 3} and total == 6
    assert used == {"seen": 200.0, "unseen": 0.5}


async def test_the_index_is_rescanned_only_after_its_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = make(tmp_path, "?max_bytes=1M")
    await backend.put("mine", b"x" * 100)
    await backend.wait_idle()
    (tmp_path / "other").write_bytes(b"y" * 50)  # another process's write
    await backend.put("mine2", b"x" * 10)
    await backend.wait_idle()
    assert backend.total_bytes == 110, "no rescan before the interval"
    monkeypatch.setattr(DiskBackend, "rescan_interval_s", 0.0)
    await backend.put("mine3", b"x" * 1)
    await backend.wait_idle()
    assert backend.total_bytes == 161, "a due rescan counts what others wrote"
    await backend.close()


@pytest.mark.usefixtures("scans_fail")
async def test_a_failed_maintenance_pass_backs_off(tmp_path: Path) -> None:
    backend = make(tmp_path, "?max_bytes=1500")
    for i in range(4):
        await backend.put(f"k{i}", b"x" * 1000)
        await backend.wait_idle()
    assert bytes_on_disk(tmp_path) == 4000, "no eviction pass during the back-off"
    await backend.close()


async def test_a_tier_exactly_at_its_limit_is_not_evicted(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"k{i}").write_bytes(b"x" * 1000)
    backend = make(tmp_path, "?max_bytes=3000")
    assert await backend.put("empty", b"")  # starts the first scan, which finds 3000 bytes
    await backend.wait_idle()
    assert backend.total_bytes == bytes_on_disk(tmp_path) == 3000
    await backend.close()


async def test_a_miss_on_an_entry_deleted_behind_its_back_updates_the_count(
    tmp_path: Path,
) -> None:
    backend = make(tmp_path, "?max_bytes=1M")
    await backend.put("a", b"x" * 100)
    await backend.wait_idle()
    (tmp_path / "a").unlink()  # another process evicted it
    assert await backend.get("a") is None
    assert backend.total_bytes == 0
    await backend.close()


async def test_a_closed_tier_starts_no_maintenance(tmp_path: Path) -> None:
    """Writes that land after close() (a last write-through) leave eviction to the next
    process: no pass starts on a loop that is shutting down."""
    backend = make(tmp_path, "?max_bytes=1500")
    await backend.put("k0", b"x" * 1000)
    await backend.wait_idle()
    await backend.close()
    for i in range(1, 4):
        assert await backend.put(f"k{i}", b"x" * 1000)
    await backend.wait_idle()
    assert bytes_on_disk(tmp_path) == 4000


async def test_maintenance_passes_never_overlap(tmp_path: Path, slow_evict: SlowEvict) -> None:
    """Writes during a pass ask for one more pass after it, never a second one beside it."""
    backend = await over_the_limit(tmp_path, slow_evict)
    try:
        for i in range(3, 8):
            assert await backend.put(f"k{i}", b"x" * 1000)
        assert backend._pending  # one more pass asked for, to run after this one
        assert (slow_evict.most, slow_evict.calls) == (1, 1)
    finally:
        slow_evict.release.set()
    await backend.wait_idle()
    assert (slow_evict.most, slow_evict.calls) == (1, 2)  # the pending pass ran once, after
    assert bytes_on_disk(tmp_path) <= 2000
    await backend.close()


async def test_put_then_runs_in_the_writing_thread_whatever_happened(tmp_path: Path) -> None:
    seen: list[tuple[bool, str]] = []

    def then(stored: bool) -> None:
        seen.append((stored, threading.current_thread().name))

    backend = make(tmp_path / "ok")
    assert await backend.put_then("a/k", b"v", PutMode.OVERWRITE, then)
    assert await backend.get("a/k") == b"v"
    (tmp_path / "file").write_bytes(b"")
    broken = make(tmp_path / "file")  # its root is a file: every write fails
    with pytest.raises(BackendError, match="put a/k: "):  # the error names the operation
        await broken.put_then("a/k", b"v", PutMode.OVERWRITE, then)
    assert [stored for stored, _ in seen] == [True, False]
    assert all(name != threading.current_thread().name for _, name in seen)

    def fails(stored: bool) -> None:
        raise OSError(errno.EBADF, "Bad file descriptor")

    assert await backend.put_then("a/k2", b"v", PutMode.OVERWRITE, fails)  # stored all the same
    with pytest.raises(BackendError, match="quarantine a/k: "):
        await broken.quarantine("a/k")
    await backend.close()
    await broken.close()


async def test_a_failed_maintenance_pass_is_logged_naming_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(DiskBackend, "evict_backoff_s", 0.0)
    backend = make(tmp_path, "?max_bytes=1500")
    with caplog.at_level(logging.WARNING, logger="objcache"):
        real_scan = disk._scan
        monkeypatch.setattr(disk, "_scan", broken)
        await backend.put("k0", b"x" * 1000)
        await backend.wait_idle()
        monkeypatch.setattr(disk, "_scan", real_scan)
        monkeypatch.setattr(disk, "_evict", broken)
        await backend.put("k1", b"x" * 1000)
        await backend.wait_idle()
    failures = [r.getMessage() for r in caplog.records if "maintenance failed" in r.getMessage()]
    assert len(failures) == 2
    assert "scan: Input/output error" in failures[0]
    assert "evict: Input/output error" in failures[1]
    await backend.close()
