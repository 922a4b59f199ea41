"""Entries damaged at rest (truncated, bit-flipped in the real store) and a full local disk:
never served, never written through or back-filled, counted as ``corrupt``."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from objcache.backends.fs_store import QUARANTINE_DIR
from objcache.client import Client
from objcache.config.settings import Config
from objcache.entry.codec import Codec
from tests.faults.conftest import Store, raw

KIND = "blob"


def truncate(entry: bytes) -> bytes:
    return entry[: len(entry) // 2]


def bitflip(entry: bytes) -> bytes:
    i = len(entry) - 100  # inside the stored payload
    return entry[:i] + bytes([entry[i] ^ 0x01]) + entry[i + 1 :]


def drop_header(entry: bytes) -> bytes:
    return entry[48:]


DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "truncated": truncate,
    "bit-flipped": bitflip,
    "headerless": drop_header,
}


def local_get(client: Client, okey: str) -> bytes | None:
    assert client.cache.local is not None
    backend = client.cache.local.backend
    return client.bridge.call(lambda: backend.get(okey), 10)


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_remote_entry_is_a_counted_miss_and_never_copied(
    proxied_store: Store, damage: str
) -> None:
    value = os.urandom(3000) + b"z" * 3000
    writer = proxied_store.client(timeout_ms=5000)
    writer.put(KIND, "key", value)
    assert writer.flush(10) == 0
    okey = writer.cache.namespace.object_key(KIND, "key")
    entry = proxied_store.raw_get(okey)
    assert entry is not None and Codec().decode(entry, okey) == value
    proxied_store.raw_put(okey, DAMAGE[damage](entry))

    # two remote tiers: the damaged store, and a healthy, empty file:// tier behind it that
    # a valid hit would be back-filled into... and a reader that must not copy anything
    reader = proxied_store.client(timeout_ms=2000)
    assert reader.get(KIND, "key") is None
    assert reader.flush(5) == 0
    tier = reader.stats()["tiers"][1]
    assert tier["misses"] == {"corrupt": 1}, tier["misses"]
    assert tier["hits"] == 0
    assert local_get(reader, okey) is None
    assert reader.cache.stats.write_through == 0
    assert proxied_store.raw_get(okey) == DAMAGE[damage](entry)  # not overwritten either


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_file_store_and_local_entries(tmp_path: Path, damage: str) -> None:
    store = tmp_path / "store"
    value = b"hello " * 2000

    def client(local: str) -> Client:
        return Client(
            Config.from_env(
                {},
                tiers=f"file://{store}",
                local_dir=tmp_path / local,
                prefetch=False,
                timeout_ms=2000,
                stats_file=tmp_path / "stats.json",
            )
        )

    writer = client("w")
    writer.put(KIND, "key", value)
    assert writer.flush(5) == 0
    okey = writer.cache.namespace.object_key(KIND, "key")
    path = store / okey
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    # damage the writer's local copy too: the local tier quarantines it, then the remote
    # copy is also damaged, so the lookup is a miss
    local_path = tmp_path / "w" / okey
    local_path.write_bytes(DAMAGE[damage](local_path.read_bytes()))
    assert writer.get(KIND, "key") is None
    stats = writer.stats()["tiers"]
    assert stats[0]["misses"].get("corrupt") == 1
    assert stats[1]["misses"] == {"corrupt": 1}
    assert not local_path.exists()  # quarantined, not served again
    assert list((tmp_path / "w" / QUARANTINE_DIR).iterdir())
    for c in (writer,):
        c.close()
        c.bridge.stop()


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs to fill needs root")
    mount = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_local_disk_full(tiny_disk: Path, tmp_path: Path) -> None:
    """Puts into a full local tier never raise and still reach the remote tier; nothing
    partial is left on the full disk; every read is a complete value or a miss."""
    remote = tmp_path / "remote"
    config = {
        "tiers": f"file://{remote}",
        "prefetch": False,
        "timeout_ms": 2000,
        "stats_file": tmp_path / "stats.json",
        "local_max_bytes": 0,  # no eviction: the disk fills up
    }
    client = Client(Config.from_env({}, local_dir=tiny_disk, **config))
    values = {f"k{i}": os.urandom(48 << 10) for i in range(24)}  # ~1.1 MiB > 512 KiB
    for k, v in values.items():
        client.put(KIND, k, v)
    assert client.flush(10) == 0
    local = client.stats()["tiers"][0]
    assert sum(local["put_errors"].values()) > 0, local  # the disk did fill up
    for k, v in values.items():
        assert client.get(KIND, k) == v  # local hit or remote hit, always complete
    # a remote hit's write-through (and its node lease) finishes in the background
    assert client.flush(10) == 0
    # nothing partial on the full disk: every file there is a complete, valid entry
    codec = Codec()
    for path in tiny_disk.rglob("*"):
        if path.is_file() and QUARANTINE_DIR not in path.parts and path.name != "ENV.json":
            assert not path.name.startswith("."), f"temp file left behind: {path}"
            codec.decode(path.read_bytes(), path.relative_to(tiny_disk).as_posix())
    # the remote tier got everything despite the local failures
    reader = Client(Config.from_env({}, local_dir=tmp_path / "reader", **config))
    assert all(reader.get(KIND, k) == v for k, v in values.items())
    for c in (client, reader):
        c.close()
        c.bridge.stop()


__all__ = ["raw"]
