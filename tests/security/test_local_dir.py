"""Hostile neighbours on the node: the local dir (``disk://``) and its node leases.

Another user of the machine, or a member of this user's group when the user runs with umask
002, must neither plant an entry that this user's lookups serve nor make the cache create
or write anything outside its own folders (docs/security.md, "Local filesystem"). Node
leases (objcache/core/fetch_once/nodelease.py) go through the store's own folder walk, so they
keep the same promises as every other operation of the store.

The tests marked ``ROOT_ONLY`` run a second local user: a forked child process that
setuid's to another uid, possible only where the tests run as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from objcache.backends import fs_store as _fs
from objcache.backends.base import PutMode, TierSpec
from objcache.backends.disk.store import DiskBackend
from objcache.backends.fs_folders import LEASE_PREFIX
from objcache.backends.fs_store import FsStore
from objcache.config.urls import parse_tier_url
from objcache.core.fetch_once.nodelease import Claim, NodeLeases
from objcache.core.manifest import Manifest, ManifestError, prefetch
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.tier import Tier
from objcache.core.tiered import TieredCache
from objcache.entry.codec import Codec
from objcache.entry.layout import Namespace, parse_object_key, shard
from objcache.errors import PermanentBackendError
from tests.support.memory_backend import MemoryBackend

NS = Namespace("testenv")
CODEC = Codec()
VICTIM = "victim"
KEY = NS.object_key("fx-graph", VICTIM)

#: The second local user of the ROOT_ONLY tests (``nobody`` on most systems).
OTHER_UID = OTHER_GID = 65534
ROOT_ONLY = pytest.mark.skipif(
    os.geteuid() != 0, reason="a second local user needs root (setuid in a child process)"
)


def neighbour_key() -> str:
    """A user key whose entry shares the folder (shard) of VICTIM's."""
    n = 0
    while shard(f"other-{n}") != shard(VICTIM):
        n += 1
    return f"other-{n}"


OTHER = neighbour_key()
OTHER_KEY = NS.object_key("fx-graph", OTHER)


def rank(root: Path, remote: MemoryBackend) -> TieredCache:
    """A cache on the local dir ``root`` with node leases, as objcache.client builds one."""
    policy = RetryPolicy(timeout_s=5.0, retries=0)
    spec = TierSpec(url=f"disk://{root}", scheme="disk", location="", path=str(root))
    local = Tier(DiskBackend(spec), policy, CircuitBreaker(5, 60))
    remotes = [Tier(remote, policy, CircuitBreaker(5, 60))]
    return TieredCache(local, remotes, CODEC, NS, leases=NodeLeases(str(root), hold_s=5.0))


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def tree(root: Path) -> dict[str, int]:
    """Every path below ``root`` (relative) and its permission bits, symlinks not followed."""
    out: dict[str, int] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            out[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
    return out


def folders_of(okey: str) -> list[str]:
    """``v1``, ``v1/<env>``, ... : every folder holding ``okey``."""
    parts = okey.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


# --- keys that leave the store -----------------------------------------------------------

TRAVERSING = [
    "v1/../../../x",
    "v1/testenv/fx-graph/../x",
    "v1/testenv/fx-graph/ab/..",
    "v1/testenv/fx-graph/ab/.",
    "v1/./fx-graph/ab/x",
    "v1/testenv//ab/x",
    "v1/testenv/fx-graph/ab/",
    "v1/testenv/fx-graph/ab/x!/..",
    "v1/testenv/fx-graph/ab/x!/.",
]


@pytest.mark.parametrize("okey", TRAVERSING)
def test_object_keys_with_dot_or_empty_segments_do_not_parse(okey: str) -> None:
    assert parse_object_key(okey) is None


def test_object_keys_the_layout_makes_still_parse() -> None:
    assert parse_object_key(KEY) == ("testenv", "fx-graph", VICTIM)
    assert parse_object_key(NS.object_key("fx-graph", "..")) == ("testenv", "fx-graph", "..")
    candidate = NS.candidate_key("fx-graph", "k", "ab12")
    assert parse_object_key(candidate) == ("testenv", "fx-graph", "k/ab12")


@pytest.mark.parametrize("okey", TRAVERSING)
def test_a_manifest_listing_a_traversing_key_is_refused(okey: str) -> None:
    body = {"format": 1, "job": "j", "created": 1.0, "keys": [KEY, okey]}
    with pytest.raises(ManifestError):
        Manifest.from_bytes(json.dumps(body).encode())


def precious(tmp_path: Path) -> Path:
    """A file of this user's where the lease of ``v1/../../../x`` under
    ``tmp_path/a/b/local`` would be: two levels above the local dir."""
    root = tmp_path / "a" / "b" / "local"
    root.mkdir(parents=True, mode=0o700)
    target = tmp_path / "a" / (LEASE_PREFIX + "x")
    target.write_bytes(b"precious\n")
    return target


async def test_a_traversing_key_takes_no_lease_anywhere(tmp_path: Path) -> None:
    target = precious(tmp_path)
    claim, lease = await NodeLeases(str(tmp_path / "a/b/local"), hold_s=5).claim("v1/../../../x")
    assert (claim, lease) == (Claim.UNLEASED, None)
    assert target.read_bytes() == b"precious\n"
    assert set(tree(tmp_path)) == {"a", "a/b", "a/b/local", f"a/{target.name}"}


async def test_a_planted_manifest_cannot_make_prefetch_write_outside_the_local_dir(
    tmp_path: Path,
) -> None:
    """A writer of the remote store (no key needed: a manifest names entries, it is not
    run) lists a key that climbs out of the local dir: prefetch takes no lease for it (the
    lease would overwrite, then unlink, the file it lands on)."""
    target = precious(tmp_path)
    remote = MemoryBackend("mem://r")
    body = {"format": 1, "job": "j", "created": 1.0, "keys": ["v1/../../../x"]}
    name = NS.object_key("manifest", "j/run-1")
    remote.data[name] = CODEC.encode(json.dumps(body).encode(), name)
    cache = rank(tmp_path / "a/b/local", remote)
    await prefetch(cache, "j")
    await cache.close()
    assert target.read_bytes() == b"precious\n"
    outside = {p for p in tree(tmp_path) if not p.startswith("a/b/local")}
    assert outside == {"a", "a/b", f"a/{target.name}"}


# --- folders: 0700, never through a symlink, never one that others can write -------------


async def test_lease_folders_are_0700_and_lease_files_0600_under_umask_002(
    tmp_path: Path,
) -> None:
    root = tmp_path / "local"
    root.mkdir()
    root.chmod(0o755)
    with umask(0o002):
        claim, lease = await NodeLeases(str(root), hold_s=5).claim(KEY)
        assert claim is Claim.HELD and lease is not None
        modes = tree(root)
        await lease.release("")
    lease_file = f"{folders_of(KEY)[-1]}/{LEASE_PREFIX}{VICTIM}"
    assert modes == {**dict.fromkeys(folders_of(KEY), 0o700), lease_file: 0o600}


async def test_a_lookup_under_umask_002_leaves_only_private_folders(tmp_path: Path) -> None:
    """The issue's first reproduction up to the folders: one missed lookup with leases."""
    root = tmp_path / "local"
    root.mkdir()
    root.chmod(0o755)
    cache = rank(root, MemoryBackend("mem://r"))
    with umask(0o002):
        assert await cache.get("fx-graph", VICTIM) is None
    await cache.close()
    assert tree(root) == dict.fromkeys(folders_of(KEY), 0o700)


async def test_no_lease_where_the_store_refuses_the_local_dir(tmp_path: Path) -> None:
    """A world-writable local dir (anyone can plant ``v1``): the store refuses it, and so do
    the leases; a planted ``v1`` symlink leads nowhere."""
    root, outside = tmp_path / "local", tmp_path / "outside"
    root.mkdir()
    root.chmod(0o777)
    outside.mkdir(mode=0o700)
    (root / "v1").symlink_to(outside)
    claim, lease = await NodeLeases(str(root), hold_s=5).claim(KEY)
    assert (claim, lease) == (Claim.UNLEASED, None)
    remote = MemoryBackend("mem://r")
    remote.data[KEY] = CODEC.encode(b"value", KEY)
    cache = rank(root, remote)
    assert await cache.get("fx-graph", VICTIM) == b"value"
    await cache.close()
    assert list(outside.iterdir()) == []


async def test_a_lease_never_goes_through_a_symlinked_folder(tmp_path: Path) -> None:
    root, outside = tmp_path / "local", tmp_path / "outside"
    (root / "v1").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    outside.mkdir(mode=0o700)
    (root / "v1" / "testenv").symlink_to(outside)
    claim, lease = await NodeLeases(str(root), hold_s=5).claim(KEY)
    assert (claim, lease) == (Claim.UNLEASED, None)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
async def test_the_walk_refuses_a_sub_folder_others_can_write(tmp_path: Path, mode: int) -> None:
    """A folder left group- or world-writable (by an older objcache under umask 002, or by
    hand) is refused like such a root: nothing is written or leased in it."""
    root = tmp_path / "local"
    store = FsStore(str(root), fsync=False, touch_on_read=False)
    store.write(KEY, CODEC.encode(b"mine", KEY), PutMode.CREATE)
    folder = (root / KEY).parent
    folder.chmod(mode)
    with pytest.raises(PermanentBackendError, match="writable by"):
        store.write(OTHER_KEY, CODEC.encode(b"x", OTHER_KEY), PutMode.CREATE)
    claim, lease = await NodeLeases(str(root), hold_s=5).claim(OTHER_KEY)
    assert (claim, lease) == (Claim.UNLEASED, None)
    assert sorted(os.listdir(folder)) == [VICTIM]


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "walk"])
def test_an_entry_file_others_can_write_is_not_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, openat2: bool
) -> None:
    root = tmp_path / "local"
    store = FsStore(str(root), fsync=False, touch_on_read=False)
    store.write(KEY, CODEC.encode(b"mine", KEY), PutMode.CREATE)
    (root / KEY).chmod(0o620)
    if not openat2:
        monkeypatch.setattr(_fs._openat2, "usable", False)
    with pytest.raises(PermanentBackendError, match="writable by"):
        store.read(KEY)


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "walk"])
async def test_a_record_file_others_can_write_is_not_read_for_an_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, openat2: bool
) -> None:
    """A record update reads the local entry too (read-modify-write): a file someone else
    could have written there is refused as it is for a lookup, before its bytes reach the
    change (which unpickles a PGO profile)."""
    root = tmp_path / "local"
    store = FsStore(str(root), fsync=False, touch_on_read=False)
    store.write(KEY, CODEC.encode(b"mine", KEY), PutMode.CREATE)
    (root / KEY).chmod(0o620)
    if not openat2:
        monkeypatch.setattr(_fs._openat2, "usable", False)
    with pytest.raises(PermanentBackendError, match="writable by"):
        store.read_versioned(KEY)
    seen: list[bytes | None] = []

    def change(current: bytes | None) -> bytes | None:
        seen.append(current)
        return b"new"

    tier = Tier(
        DiskBackend(parse_tier_url(f"disk://{root}")),
        RetryPolicy(timeout_s=30, retries=0),
        CircuitBreaker(5, 60),
    )
    assert await tier.update_record(KEY, change) == "error"
    assert seen == []


async def test_a_refused_folder_does_not_stop_eviction(tmp_path: Path) -> None:
    """The least recently used entry sits in a folder an older objcache left group-writable:
    it is passed over (never touched), and the rest of the tier is still evicted."""
    root = tmp_path / "local"
    backend = DiskBackend(parse_tier_url(f"disk://{root}?max_bytes=3000"))
    await backend.put("a/old", b"x" * 1000)
    await backend.wait_idle()
    (root / "a").chmod(0o775)
    for i in range(4):
        await backend.put(f"b/k{i}", b"x" * 1000)
        await backend.wait_idle()
    entries = [p for p in root.rglob("*") if p.is_file() and LEASE_PREFIX not in p.name]
    assert (root / "a" / "old").exists()
    assert sum(p.stat().st_size for p in entries if ".objcache-" not in str(p)) <= 4000
    await backend.close()


# --- a second local user (root only) ------------------------------------------------------


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder under /tmp that another uid can reach (pytest's tmp_path is 0700)."""
    base = Path(tempfile.mkdtemp(prefix="objcache-neighbours-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_other_user(action: Callable[[], str], groups: list[int] | None = None) -> str:
    """What ``action`` returns when run by another local user: a forked child process that
    setuid's to OTHER_UID (supplementary ``groups``, umask 002) and makes only os calls."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # the child only makes system calls, then _exits
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_end)
            os.setgroups(groups or [])
            os.setgid(OTHER_GID)
            os.setuid(OTHER_UID)
            os.umask(0o002)
            out = action()
        except BaseException as exc:
            out = f"failed: {exc!r}"
        try:
            os.write(write_end, out.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        out = pipe.read().decode()
    os.waitpid(pid, 0)
    return out


def plant(path: Path, data: bytes) -> Callable[[], str]:
    """Write ``data`` at ``path``, creating folders: "planted", or the error's name."""

    def action() -> str:
        try:
            os.makedirs(path.parent, exist_ok=True)
            with open(path, "xb") as f:
                f.write(data)
        except OSError as exc:
            return type(exc).__name__
        return "planted"

    return action


@ROOT_ONLY
async def test_a_group_member_cannot_plant_an_entry_this_user_serves(shared_tmp: Path) -> None:
    """This user runs with umask 002 on a 0755 local dir; a member of its group without
    any key writes an unsigned entry for another key into the folder the lookup made."""
    root = shared_tmp / "local"
    root.mkdir()
    root.chmod(0o755)
    cache = rank(root, MemoryBackend("mem://r"))
    with umask(0o002):
        assert await cache.get("fx-graph", VICTIM) is None  # a miss: the lease made folders
        planted = CODEC.encode(b"planted pickle", OTHER_KEY)
        outcome = as_other_user(plant(root / OTHER_KEY, planted), groups=[os.getegid()])
        assert outcome == "PermissionError"
        assert await cache.get("fx-graph", OTHER) is None
    await cache.close()


@ROOT_ONLY
async def test_an_entry_planted_in_a_legacy_group_writable_folder_is_not_served(
    shared_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder an older objcache left 0775 lets a group member plant a file: neither the
    one-call read (openat2) nor the folder walk serves it."""
    root = shared_tmp / "local"
    root.mkdir()
    root.chmod(0o755)
    store = FsStore(str(root), fsync=False, touch_on_read=False)
    store.write(KEY, CODEC.encode(b"mine", KEY), PutMode.CREATE)
    for folder in folders_of(KEY):
        (root / folder).chmod(0o775)
    planted = CODEC.encode(b"planted pickle", OTHER_KEY)
    outcome = as_other_user(plant(root / OTHER_KEY, planted), groups=[os.getegid()])
    assert outcome == "planted"
    assert (root / OTHER_KEY).stat().st_uid == OTHER_UID
    with pytest.raises(PermanentBackendError, match="another user"):
        store.read(OTHER_KEY)  # one openat2 call: the file's owner is checked
    monkeypatch.setattr(_fs._openat2, "usable", False)
    with pytest.raises(PermanentBackendError, match="writable by its group"):
        store.read(OTHER_KEY)  # the walk refuses the folder first
    cache = rank(root, MemoryBackend("mem://r"))
    assert await cache.get("fx-graph", OTHER) is None
    await cache.close()


@ROOT_ONLY
async def test_the_walk_refuses_a_sub_folder_another_user_owns(shared_tmp: Path) -> None:
    root = shared_tmp / "local"
    store = FsStore(str(root), fsync=False, touch_on_read=False)
    store.write(KEY, CODEC.encode(b"mine", KEY), PutMode.CREATE)
    folder = (root / KEY).parent
    os.chown(folder, OTHER_UID, OTHER_GID)  # 0700, but not this user's
    with pytest.raises(PermanentBackendError, match="another user"):
        store.write(OTHER_KEY, CODEC.encode(b"x", OTHER_KEY), PutMode.CREATE)
    claim, lease = await NodeLeases(str(root), hold_s=5).claim(OTHER_KEY)
    assert (claim, lease) == (Claim.UNLEASED, None)
    assert sorted(os.listdir(folder)) == [VICTIM]


def squat(root: Path, target: Path) -> Callable[[], str]:
    """Make the local dir ``root`` first, mode 777, with a ``v1`` symlink to ``target``."""

    def action() -> str:
        root.mkdir()
        root.chmod(0o777)
        (root / "v1").symlink_to(target)
        return "squatted"

    return action


@ROOT_ONLY
async def test_another_user_who_made_the_local_dir_cannot_redirect_the_cache(
    shared_tmp: Path,
) -> None:
    """Another user created this user's local dir first (a predictable name under /tmp),
    mode 777, with ``v1`` pointing into a folder of this user: nothing is written there."""
    os.chmod(shared_tmp, 0o1777)  # like /tmp
    root, mine = shared_tmp / "local", shared_tmp / "mine"
    mine.mkdir(mode=0o700)
    assert as_other_user(squat(root, mine)) == "squatted"
    claim, lease = await NodeLeases(str(root), hold_s=5).claim(KEY)
    assert (claim, lease) == (Claim.UNLEASED, None)
    remote = MemoryBackend("mem://r")
    remote.data[KEY] = CODEC.encode(b"value", KEY)
    cache = rank(root, remote)
    assert await cache.get("fx-graph", VICTIM) == b"value"
    await cache.close()
    assert list(mine.iterdir()) == []
    assert not any(LEASE_PREFIX in p for p in tree(shared_tmp))
