"""One atomic write for every file objcache places outside a store (docs/security.md, "Files
objcache places outside a store"): below the caller's root no link is followed and no folder
others control is written through; a leftover of a killed start never blocks the next write;
the file appears whole, with its mode, or not at all."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from objcache.config import files
from objcache.config.files import publish_file
from objcache.errors import UnsafeFolder


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def test_the_file_appears_with_its_content_and_exactly_its_mode(
    tmp_path: Path, umask_077: None
) -> None:
    publish_file(tmp_path, ["a", "b", "f"], b"one", mode=0o644)
    final = tmp_path / "a" / "b" / "f"
    assert final.read_bytes() == b"one"
    assert stat.S_IMODE(final.stat().st_mode) == 0o644  # the umask does not narrow it
    for folder in (tmp_path / "a", tmp_path / "a" / "b"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    publish_file(tmp_path, ["a", "b", "f"], b"two", mode=0o600)  # replaced
    assert final.read_bytes() == b"two"
    assert stat.S_IMODE(final.stat().st_mode) == 0o600
    assert sorted(p.name for p in final.parent.iterdir()) == ["f"]


@pytest.mark.parametrize("sync_folder", [True, False])
def test_the_data_is_fsynced_before_it_is_named_and_the_folder_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync_folder: bool
) -> None:
    """A name never shows a file whose data a power cut could tear: the file is fsynced
    before it is linked or renamed to its name; the folder (the name's own durability) is
    fsynced unless the caller says a lost name is only a miss."""
    final = tmp_path / "a" / "f"
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        kind = "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        synced.append(f"{kind}:{'named' if final.exists() else 'unnamed'}")
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    publish_file(tmp_path, ["a", "f"], b"data", replace=False, sync_folder=sync_folder)
    assert final.read_bytes() == b"data"
    assert synced == (["file:unnamed", "folder:named"] if sync_folder else ["file:unnamed"])


def test_a_link_at_an_intermediate_folder_is_never_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "a").symlink_to(elsewhere)
    with pytest.raises(UnsafeFolder, match="symlink"):
        publish_file(root, ["a", "b", "f"], b"x")
    publish_file(root, ["c", "d", "f"], b"x")  # real folders: written
    (root / "c" / "d").rename(root / "c" / "moved")  # then swapped for a link
    (root / "c" / "d").symlink_to(elsewhere)
    with pytest.raises(UnsafeFolder, match="symlink"):
        publish_file(root, ["c", "d", "f"], b"y")
    assert list(elsewhere.iterdir()) == []
    assert isinstance(UnsafeFolder("x"), OSError)  # callers that shrug off OSError do here


def test_a_link_at_the_final_name_is_replaced_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "f").symlink_to(victim)
    publish_file(tmp_path / "root", ["f"], b"new")
    assert victim.read_text() == "precious"
    assert not (tmp_path / "root" / "f").is_symlink()
    assert (tmp_path / "root" / "f").read_bytes() == b"new"


def test_stale_temp_files_and_links_of_an_earlier_start_do_not_block(tmp_path: Path) -> None:
    """Containers reuse pids: whatever an earlier start (same pid) left at a predictable
    name, a file or a link, neither blocks the write nor is written through."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    folder = tmp_path / "a"
    folder.mkdir(mode=0o700)
    pid = os.getpid()
    for stale in (f".f.{pid}", f".f.{pid}.tmp", f".f.objcache.{pid}.tmp", f"f.{pid}.tmp"):
        (folder / stale).write_bytes(b"half")
    (folder / f".f.{pid}.0000000000000000").symlink_to(victim)
    publish_file(tmp_path, ["a", "f"], b"whole")
    assert (folder / "f").read_bytes() == b"whole"
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_a_folder_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "a"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(UnsafeFolder, match="writable by"):
        publish_file(tmp_path, ["a", "f"], b"x")
    assert list(folder.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another user's folder")
def test_a_folder_another_user_owns_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "a"
    folder.mkdir(mode=0o755)
    os.chown(folder, 12345, 12345)
    with pytest.raises(UnsafeFolder, match="owned by another user"):
        publish_file(tmp_path, ["a", "f"], b"x")
    assert list(folder.iterdir()) == []


def test_a_failure_mid_write_leaves_the_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish_file(tmp_path, ["f"], b"old")

    def half_then_enospc(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "write_all", half_then_enospc)
    with pytest.raises(OSError, match="No space"):
        publish_file(tmp_path, ["f"], b"new content")
    with pytest.raises(OSError, match="No space"):
        publish_file(tmp_path, ["g"], b"new content")
    assert (tmp_path / "f").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


@pytest.mark.parametrize("parts", [["..", "f"], ["a", ""], ["a/b", "f"], ["."], []])
def test_names_that_could_leave_the_root_are_refused(tmp_path: Path, parts: list[str]) -> None:
    with pytest.raises(ValueError):
        publish_file(tmp_path / "root", parts, b"x", create_root=True)
    assert not (tmp_path / "f").exists()
