"""Filesystem-store behaviour shared by ``file://`` and ``disk://``: cross-process races, full
disks, symlink escapes, the no-hard-link fallback, temp-file hygiene, fsync policy.

Kept free of heavy imports: the multiprocessing test's spawned workers import this module.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from objcache.backends import _fs
from objcache.backends._fs import RESERVED, FsBackend
from objcache.backends.base import PutMode
from objcache.errors import InvalidKey, PermanentBackendError, TransientBackendError
from objcache.registry import create_backend
from objcache.urls import parse_tier_url

SCHEMES = pytest.mark.parametrize("scheme", ["file", "disk"])


def make(scheme: str, root: Path, query: str = "") -> FsBackend:
    backend = create_backend(parse_tier_url(f"{scheme}://{root}{query}"))
    assert isinstance(backend, FsBackend)
    return backend


def reserved_files(root: Path) -> list[str]:
    return [os.path.join(d, n) for d, _, names in os.walk(root) for n in names if RESERVED in n]


# --- 8 processes racing CREATE on the same keys ----------------------------------------

WORKERS, KEYS = 8, 50


def race_value(worker: int, key: int) -> bytes:
    """What ``worker`` writes under key number ``key``: 1-48 KiB, unique to the pair."""
    head = f"{worker}:{key}:".encode()
    return head + hashlib.sha256(head).digest() * (32 * (1 + (worker * 7 + key) % 48))


def race_writer(value: bytes) -> int:
    """Which worker wrote ``value``; raises if it is not exactly what that worker wrote."""
    w, k, _ = value.split(b":", 2)
    if value != race_value(int(w), int(k)):
        raise ValueError("torn or partial value")
    return int(w)


def _race_worker(roots: dict[str, str], worker: int, barrier: Any, out: Any) -> None:
    """Runs in a spawned process: CREATE all keys at once in every store, then read back."""

    async def run(scheme: str, root: str) -> tuple[str, int, list[int], list[int]]:
        backend = make(scheme, Path(root))
        keys = [f"race/{k % 5}/{k:02d}" for k in range(KEYS)]
        puts = (backend.put(keys[k], race_value(worker, k)) for k in range(KEYS))
        won = await asyncio.gather(*puts)
        bad = []
        for k, value in enumerate(await asyncio.gather(*(backend.get(key) for key in keys))):
            try:
                race_writer(value or b"missing")
            except ValueError:
                bad.append(k)
        await backend.close()
        return scheme, worker, [k for k in range(KEYS) if won[k]], bad

    barrier.wait()
    for scheme, root in roots.items():
        out.put(asyncio.run(run(scheme, root)))


def test_processes_racing_create_leave_one_complete_value(tmp_path: Path) -> None:
    """8 spawned processes CREATE the same 50 keys in a file:// and a disk:// store."""
    roots = {scheme: str(tmp_path / scheme) for scheme in ("file", "disk")}
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(WORKERS), ctx.Queue()
    procs = [
        ctx.Process(target=_race_worker, args=(roots, w, barrier, out)) for w in range(WORKERS)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in range(WORKERS * len(roots))]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    for scheme, root in roots.items():
        winners: dict[int, list[int]] = {k: [] for k in range(KEYS)}
        for _, worker, won, bad in (r for r in results if r[0] == scheme):
            assert bad == [], f"{scheme}: worker {worker} read torn values for keys {bad}"
            for k in won:
                winners[k].append(worker)
        for k in range(KEYS):
            assert len(winners[k]) == 1, f"{scheme}: key {k} won by {winners[k]}"
            stored = Path(root, "race", str(k % 5), f"{k:02d}").read_bytes()
            assert race_writer(stored) == winners[k][0]
        assert sum(len(names) for _, _, names in os.walk(root)) == KEYS
        assert reserved_files(Path(root)) == []


# --- full disk ---------------------------------------------------------------------------


def _half_then_enospc(fd: int, data: bytes) -> None:
    os.write(fd, data[: len(data) // 2])
    raise OSError(errno.ENOSPC, "No space left on device")


@SCHEMES
async def test_enospc_mid_write_keeps_previous_value(
    scheme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = make(scheme, tmp_path)
    await backend.put("k", b"old value")
    monkeypatch.setattr(_fs, "_write_all", _half_then_enospc)
    with pytest.raises(PermanentBackendError) as exc:
        await backend.put("k", b"new value " * 1000, PutMode.OVERWRITE)
    assert isinstance(exc.value.__cause__, OSError)
    assert exc.value.__cause__.errno == errno.ENOSPC
    with pytest.raises(PermanentBackendError):
        await backend.put("fresh", b"x" * 1000)
    monkeypatch.undo()
    assert await backend.get("k") == b"old value"
    assert await backend.exists("fresh") is False
    assert reserved_files(tmp_path) == []
    assert await backend.put("fresh", b"fits now") is True


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (needs root and a working mount, else the test is skipped)."""
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root on Linux")
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    cmd = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot run mount: {exc}")
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True, timeout=10)


@SCHEMES
async def test_real_full_disk_keeps_previous_value(scheme: str, tiny_tmpfs: Path) -> None:
    backend = make(scheme, tiny_tmpfs / "store")
    old = os.urandom(600 * 1024)
    assert await backend.put("k", old) is True
    with pytest.raises(PermanentBackendError) as exc:
        await backend.put("k", os.urandom(700 * 1024), PutMode.OVERWRITE)
    assert isinstance(exc.value.__cause__, OSError)
    assert exc.value.__cause__.errno == errno.ENOSPC
    with pytest.raises(PermanentBackendError):
        await backend.put("other", os.urandom(700 * 1024))
    assert await backend.get("k") == old
    assert await backend.exists("other") is False
    assert reserved_files(tiny_tmpfs) == []
    assert await backend.delete("k") is True  # the failed temp files freed their space
    assert await backend.put("other", b"y" * (900 * 1024)) is True


# --- keys, paths and symlinks --------------------------------------------------------------


@SCHEMES
@pytest.mark.parametrize("key", ["../escape", "a/../../escape", "/etc/passwd", "a/./b"])
async def test_traversal_keys_touch_nothing(scheme: str, key: str, tmp_path: Path) -> None:
    root = tmp_path / "root"
    backend = make(scheme, root)
    for call in (
        backend.put(key, b"v"),
        backend.put(key, b"v", PutMode.OVERWRITE),
        backend.get(key),
        backend.delete(key),
    ):
        with pytest.raises(InvalidKey):
            await call
    assert os.listdir(tmp_path) == []  # not even the root was created


@SCHEMES
async def test_symlinks_cannot_escape_the_root(scheme: str, tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    (root / "dirlink").symlink_to(outside)
    (root / "filelink").symlink_to(outside / "secret")
    backend = make(scheme, root)
    with pytest.raises(InvalidKey):
        await backend.get("dirlink/secret")
    with pytest.raises(InvalidKey):
        await backend.put("dirlink/new", b"v")
    with pytest.raises(InvalidKey):
        await backend.get("filelink")
    assert sorted(os.listdir(outside)) == ["secret"]
    assert [i.key async for i in backend.list()] == []  # symlinks are not entries


@SCHEMES
async def test_folders_are_created_0700_and_files_0600(scheme: str, tmp_path: Path) -> None:
    root = tmp_path / "root"
    backend = make(scheme, root)
    old = os.umask(0)  # the modes objcache asks for, not what a umask leaves of them
    try:
        await backend.put("a/b/c", b"v")
        await backend.put("a/b/d", b"v", PutMode.OVERWRITE)
    finally:
        os.umask(old)
    modes = {str(p.relative_to(root)): p.stat().st_mode & 0o777 for p in root.rglob("*")}
    assert modes == {"a": 0o700, "a/b": 0o700, "a/b/c": 0o600, "a/b/d": 0o600}
    assert root.stat().st_mode & 0o777 == 0o700


async def test_a_group_shared_store_creates_0770_and_0640(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    root.chmod(0o2770)  # group-writable: refused unless the store says it is group-shared
    with pytest.raises(PermanentBackendError, match="writable by its group"):
        await make("file", root).put("k", b"v")
    backend = make("file", root, "?shared=group")
    await backend.put("a/k", b"v")
    assert (root / "a").stat().st_mode & 0o777 == 0o770  # even under the usual umask 022
    assert (root / "a" / "k").stat().st_mode & 0o777 == 0o640
    root.chmod(0o777)
    with pytest.raises(PermanentBackendError, match="writable by others"):
        await make("file", root, "?shared=group").get("a/k")


@SCHEMES
@pytest.mark.parametrize("problem", ["another owner", "writable by others", "group-writable"])
async def test_a_root_others_control_is_refused_in_one_line(
    scheme: str, problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    if problem == "another owner":
        uid = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: uid + 1)
    else:
        root.chmod(0o777 if problem == "writable by others" else 0o770)
    backend = make(scheme, root)
    for call in (backend.put("k", b"v"), backend.get("k"), backend.exists("k")):
        with pytest.raises(PermanentBackendError) as exc:
            await call
        message = str(exc.value)
        assert "\n" not in message and str(root) in message and "refusing" in message
    assert os.listdir(root) == []


@SCHEMES
async def test_reserved_names_are_not_keys(scheme: str, tmp_path: Path) -> None:
    backend = make(scheme, tmp_path)
    for key in (".objcache-tmp-1-2", "a/.objcache-quarantine/x", "a/" + "s" * 256):
        with pytest.raises(InvalidKey):
            await backend.put(key, b"v")


@SCHEMES
async def test_key_that_is_a_folder_of_other_keys(scheme: str, tmp_path: Path) -> None:
    backend = make(scheme, tmp_path)
    await backend.put("a/b", b"v")
    assert await backend.get("a") is None
    assert await backend.exists("a") is False
    assert await backend.delete("a") is False
    with pytest.raises(PermanentBackendError):
        await backend.put("a", b"v")  # not "False": no entry named "a" exists
    with pytest.raises(PermanentBackendError):
        await backend.put("a/b/c", b"v")
    assert await backend.get("a/b") == b"v"


# --- publish mechanics ----------------------------------------------------------------------


@SCHEMES
async def test_without_hard_links_create_uses_placeholders(
    scheme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_link(src: str, dst: str, **kwargs: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    backend = make(scheme, tmp_path)
    assert await backend.put("k", b"first") is True
    assert backend.store.hardlinks is False
    assert await backend.put("k", b"second") is False
    assert await backend.get("k") == b"first"
    # A writer that claimed "p" and has not published yet: "p" is absent but taken.
    placeholder = tmp_path / "p"
    os.close(os.open(placeholder, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0))
    assert await backend.get("p") is None
    assert await backend.exists("p") is False
    assert [i.key async for i in backend.list()] == ["k"]
    assert await backend.put("p", b"late") is False
    assert await backend.put("p", b"forced", PutMode.OVERWRITE) is True
    assert await backend.get("p") == b"forced"


@SCHEMES
async def test_stale_temp_files_are_cleaned(scheme: str, tmp_path: Path) -> None:
    backend = make(scheme, tmp_path)
    await backend.put("d/k", b"v")
    stale, fresh = (
        tmp_path / "d" / f"{_fs.TMP_PREFIX}1-old",
        tmp_path / "d" / f"{_fs.TMP_PREFIX}2-new",
    )
    stale.write_bytes(b"partial")
    fresh.write_bytes(b"in progress")
    hour_ago = time.time() - _fs.STALE_AFTER_S - 60
    os.utime(stale, (hour_ago, hour_ago))
    assert [i.key async for i in backend.list()] == ["d/k"]
    assert not stale.exists()
    assert fresh.exists()  # a live writer's temp file is left alone


@SCHEMES
async def test_cancelled_put_leaves_no_trace(scheme: str, tmp_path: Path) -> None:
    backend = make(scheme, tmp_path)
    data = os.urandom(8 << 20)
    task = asyncio.ensure_future(backend.put("big", data))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(1000):  # the worker thread finishes the whole operation on its own
        if not reserved_files(tmp_path):
            break
        await asyncio.sleep(0.02)
    assert reserved_files(tmp_path) == []
    assert await backend.get("big") in (None, data)


@pytest.mark.parametrize(
    ("scheme", "query", "fsyncs"),
    [
        ("file", "", True),
        ("file", "?fsync=0", False),
        ("disk", "", False),
        ("disk", "?fsync=1", True),
    ],
)
async def test_fsync_policy(
    scheme: str, query: str, fsyncs: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd))[1])
    backend = make(scheme, tmp_path, query)
    await backend.put("k", b"v")
    await backend.put("k", b"w", PutMode.OVERWRITE)
    assert len(calls) == (2 if fsyncs else 0)


def test_os_errors_are_typed() -> None:
    for code in (errno.ESTALE, errno.EIO, errno.ETIMEDOUT, errno.EAGAIN):
        assert isinstance(_fs.os_error(OSError(code, "x"), "t", "get"), TransientBackendError)
    for code in (errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EDQUOT):
        err = _fs.os_error(OSError(code, "x"), "file:///c", "put k")
        assert type(err) is PermanentBackendError
        assert str(err) == "file:///c: put k: x"
