"""Hostile neighbours and hostile objects against records (docs/security.md, "Records").

* A process on the node (a stopped rank, any reader of a shared ``file://`` store) holds a
  record's lock file: a record write polls it until the record's deadline, counts a
  conflict, and the process still exits.
* A writer of a store plants an oversized, undecodable or empty object at a record key, on
  every backend against its real server: an update never reads it whole, counts a miss
  and replaces it (a poisoned record never blocks its key).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from objcache.backends import create_backend
from objcache.backends import fs_store as _fs
from objcache.backends.base import Backend, PutMode
from objcache.backends.records_contract import Versioned
from objcache.config.urls import parse_tier_url
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.records import Change, Outcome, read_modify_write
from objcache.core.tier import Tier
from objcache.core.tiered import TieredCache
from objcache.core.tiered_records import get_record, update_record
from objcache.entry.caps import SizeCaps
from objcache.entry.codec import Codec
from objcache.entry.layout import Namespace
from tests.support.cloud import gcs_url, s3_url
from tests.support.proxy import FaultProxy
from tests.support.servers import FakeGCS, MotoS3, RedisServer, SeaweedS3

KIND = "pgo"
#: The pgo cap these tests run with, and the size of what a hostile writer plants.
CAP = 64 << 10
PLANTED = 4 << 20
#: How long a scenario subprocess may take before it counts as hung.
CEILING_S = 60.0

# --- a lock file held by another process -------------------------------------------------

HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys
    fds = []
    for path in sys.argv[1:]:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)  # read-only is enough for flock
        fcntl.flock(fd, fcntl.LOCK_EX)
        fds.append(fd)
    print("locked", flush=True)
    sys.stdin.read()  # until the process that started this one is gone
    """
)


def _hold_locks(paths: list[str]) -> subprocess.Popen[str]:
    """A process holding the flock of every path, until its stdin closes."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, *paths],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline() == "locked\n"
    return holder


def _lock_path(root: Path, okey: str) -> Path:
    folder, _, name = okey.rpartition("/")
    (root / folder).mkdir(parents=True, exist_ok=True, mode=0o700)
    return root / folder / (_fs.LOCK_PREFIX + name)


SCENARIO = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from pathlib import Path

    import objcache
    from objcache.config.settings import Config

    holder_code, local, store = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    config = Config(
        tiers=f"file://{store}", local_dir=local, prefetch=False, timeout_ms=1000,
        flush_timeout_s=3.0, stats_file=local.parent / "stats.json",
    )
    client = objcache.get_client(config)
    okey = client.cache.namespace.object_key("pgo", "frame")
    locks = []
    for root in (local, store):
        folder, _, name = okey.rpartition("/")
        (root / folder).mkdir(parents=True, exist_ok=True, mode=0o700)
        locks.append(str(root / folder / (".objcache-lock-" + name)))
    holder = subprocess.Popen(
        [sys.executable, "-c", holder_code, *locks],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline() == "locked\\n"

    def change(current):
        return b"profile"

    latencies = []
    for _ in range(3):  # three PGO puts, as torch makes one after each frame compile
        started = time.monotonic()
        client.update_record("pgo", "frame", change)
        latencies.append(time.monotonic() - started)
    local_tier = client.stats()["tiers"][0]
    print(json.dumps({
        "latencies": latencies,
        "deadline": client.call_timeout_s,
        "records": local_tier["records"],
    }), flush=True)
    # exit: the client closes at exit (flushing the remote update), the holder lives on
    """
)


def test_a_held_record_lock_bounds_each_pgo_put_and_the_process_still_exits(
    tmp_path: Path,
) -> None:
    scenario = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SCENARIO,
            HOLDER,
            str(tmp_path / "local"),
            str(tmp_path / "store"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        out, err = scenario.communicate(timeout=CEILING_S)
    except subprocess.TimeoutExpired:
        scenario.kill()  # its holder sees EOF on stdin and ends too
        out, err = scenario.communicate()
        pytest.fail(f"the process did not exit within {CEILING_S}s of its work: {out!r}")
    assert scenario.returncode == 0, err
    report = json.loads(out.splitlines()[-1])
    for latency in report["latencies"]:  # the sync deadline, never more (generous slack)
        assert latency < report["deadline"] + 5.0
    # a busy lock is a conflict: the update is dropped at its deadline, counted
    assert report["records"].get("dropped", 0) == 3, report


def test_a_held_record_lock_is_a_conflict_at_the_deadline(tmp_path: Path) -> None:
    store = _fs.FsStore(str(tmp_path), fsync=False, touch_on_read=False)
    holder = _hold_locks([str(_lock_path(tmp_path, "r/k"))])
    done = threading.Event()
    result: list[bool] = []

    def write() -> None:
        result.append(store.write_if_version("r/k", b"v", None, time.monotonic() + 0.5))
        done.set()

    try:
        threading.Thread(target=write, daemon=True).start()
        assert done.wait(CEILING_S), "the write waited on the lock past its deadline"
        assert result == [False]
        assert store.read("r/k") is None
    finally:
        holder.communicate("")
    # the holder gone, the same write goes through
    assert store.write_if_version("r/k", b"v", None, time.monotonic() + 5)
    assert store.read("r/k") == b"v"


async def test_an_update_on_a_held_lock_is_dropped_within_its_deadline(tmp_path: Path) -> None:
    """The store's conditional write waits on the lock up to the same deadline as the
    update: which of the two notices it first (a conflict counted, or none) is a race; that
    the update is dropped, after at most that one attempt, within its deadline is not."""
    backend = create_backend(parse_tier_url(f"file://{tmp_path}"))
    holder = _hold_locks([str(_lock_path(tmp_path, "r/k"))])
    started = time.monotonic()
    try:
        outcome, conflicts = await asyncio.wait_for(
            read_modify_write(backend, "r/k", lambda _: b"v", timeout_s=0.5),  # type: ignore[arg-type]
            CEILING_S,
        )
    finally:
        holder.communicate("")
    assert outcome is Outcome.DROPPED
    assert conflicts <= 1
    assert time.monotonic() - started < 0.5 + 5.0  # the deadline, never more (generous slack)


async def test_filesystem_calls_run_on_daemon_threads(tmp_path: Path) -> None:
    """asyncio's default executor joins its threads at exit: a call stuck in the kernel
    there keeps a finished process alive."""
    backend = create_backend(parse_tier_url(f"disk://{tmp_path}"))
    daemon: list[bool] = []
    read = backend.store.read  # type: ignore[attr-defined]

    def spy(*args: Any) -> Any:
        daemon.append(threading.current_thread().daemon)
        return read(*args)

    backend.store.read = spy  # type: ignore[attr-defined]
    await backend.get("k")
    await backend.close()
    assert daemon == [True]


# --- hostile objects at a record key, on every backend ----------------------------------


@dataclass
class Probe:
    """A backend and how many bytes of stored objects reached this process through it."""

    backend: Backend
    bytes_read: Callable[[], int]
    reset: Callable[[], None]


def _through(proxy: FaultProxy, make: Callable[[str], str]) -> Probe:
    backend = create_backend(parse_tier_url(make(proxy.url())))
    return Probe(backend, lambda: proxy.bytes_to_client, proxy.reset_counters)


BACKENDS = ["file", "disk", "redis", "seaweed", "moto", "gcs"]


@pytest.fixture(
    params=[
        pytest.param(name, marks=[] if name in ("file", "disk") else [pytest.mark.servers])
        for name in BACKENDS
    ]
)
async def hostile_probe(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault_proxy: Callable[[str, int], FaultProxy],
) -> AsyncIterator[Probe]:
    name: str = request.param
    unique = f"t{os.urandom(6).hex()}"
    if name in ("file", "disk"):
        read: list[int] = []
        read_all = _fs._read_all

        def counting(fd: int, size: int) -> bytes:
            data = read_all(fd, size)
            read.append(len(data))
            return data

        monkeypatch.setattr(_fs, "_read_all", counting)
        backend = create_backend(parse_tier_url(f"{name}://{tmp_path / 'store'}"))
        made = Probe(backend, lambda: sum(read), read.clear)
    else:
        servers = request.getfixturevalue("test_servers")
        if name == "redis":
            redis = servers(RedisServer)
            proxy = fault_proxy(redis.host, redis.port)
            made = _through(
                proxy, lambda _: f"redis://{proxy.host}:{proxy.port}/0?prefix={unique}/"
            )
        elif name == "gcs":
            gcs = servers(FakeGCS)
            proxy = fault_proxy(gcs.host, gcs.port)
            made = _through(proxy, lambda url: gcs_url(gcs, unique, endpoint=url))
        else:
            s3 = servers(SeaweedS3 if name == "seaweed" else MotoS3)
            host, _, port = s3.endpoint_url.removeprefix("http://").rpartition(":")
            proxy = fault_proxy(host, int(port))
            made = _through(proxy, lambda url: s3_url(s3, unique, endpoint_url=url))
    try:
        yield made
    finally:
        await made.backend.close()


def _cache(backend: Backend) -> tuple[TieredCache, Tier]:
    tier = Tier(backend, RetryPolicy(timeout_s=20.0, retries=0), CircuitBreaker(3, 60))
    caps = SizeCaps(per_kind={KIND: CAP})
    return TieredCache(None, [tier], Codec(), Namespace("e"), caps=caps), tier


def _recording(seen: list[bytes | None], new: bytes = b"fresh") -> Change:
    def change(current: bytes | None) -> bytes | None:
        seen.append(current)
        return new

    return change


async def test_an_oversized_record_is_not_read_and_the_next_writer_replaces_it(
    hostile_probe: Probe,
) -> None:
    cache, tier = _cache(hostile_probe.backend)
    okey = cache.namespace.object_key(KIND, "k")
    assert await hostile_probe.backend.put(okey, b"x" * PLANTED, PutMode.OVERWRITE)
    hostile_probe.reset()
    seen: list[bytes | None] = []
    await update_record(cache, KIND, "k", _recording(seen))
    assert await cache.flush(30) == 0
    # the planted object's size was known before its body: not read whole (one byte past
    # the cap at most, plus protocol overhead)
    assert hostile_probe.bytes_read() < CAP + (256 << 10), hostile_probe.bytes_read()
    assert seen == [None]
    assert tier.stats.misses["too_large"] == 1
    assert tier.stats.records["stored"] == 1, dict(tier.stats.records)
    assert await get_record(cache, KIND, "k") == b"fresh"
    assert await hostile_probe.backend.get(okey) is not None
    # and the writer after it reads the record it left, as usual
    await update_record(cache, KIND, "k", _recording(seen, b"fresher"))
    assert await cache.flush(30) == 0
    assert seen == [None, b"fresh"]
    assert await get_record(cache, KIND, "k") == b"fresher"


@pytest.mark.parametrize("planted", [b"OBJC garbage, not an entry", b""], ids=["garbage", "empty"])
async def test_an_undecodable_record_is_a_counted_miss_replaced_by_the_next_writer(
    hostile_probe: Probe, planted: bytes
) -> None:
    cache, tier = _cache(hostile_probe.backend)
    okey = cache.namespace.object_key(KIND, "k")
    await hostile_probe.backend.put(okey, planted, PutMode.OVERWRITE)
    seen: list[bytes | None] = []
    await update_record(cache, KIND, "k", _recording(seen))
    assert await cache.flush(30) == 0
    assert seen == [None]
    assert cache.stats.records_unreadable[KIND] == 1
    assert tier.stats.records["stored"] == 1, dict(tier.stats.records)
    assert await get_record(cache, KIND, "k") == b"fresh"


async def test_a_record_decodes_within_the_kind_cap_not_the_global_limit(tmp_path: Path) -> None:
    """A zstd bomb: a small entry whose payload claims far more than the kind's cap."""
    backend = create_backend(parse_tier_url(f"file://{tmp_path}"))
    cache, _ = _cache(backend)
    okey = cache.namespace.object_key(KIND, "k")
    bomb = cache.codec.encode(bytes(PLANTED), okey)
    assert len(bomb) < CAP
    await backend.put(okey, bomb, PutMode.OVERWRITE)
    seen: list[bytes | None] = []
    await update_record(cache, KIND, "k", _recording(seen))
    assert await cache.flush(30) == 0
    assert seen == [None]
    assert cache.stats.records_unreadable[KIND] == 1
    assert await get_record(cache, KIND, "k") == b"fresh"


async def test_a_record_change_runs_off_the_event_loop(tmp_path: Path) -> None:
    backend = create_backend(parse_tier_url(f"file://{tmp_path}"))
    cache, _ = _cache(backend)
    loop_thread = threading.get_ident()
    threads: list[int] = []

    def change(current: bytes | None) -> bytes:
        threads.append(threading.get_ident())
        return b"fresh"

    await update_record(cache, KIND, "k", change)
    assert await cache.flush(30) == 0
    assert threads and loop_thread not in threads


async def test_an_oversized_local_record_is_refused_before_it_is_read(tmp_path: Path) -> None:
    local = Tier(
        create_backend(parse_tier_url(f"disk://{tmp_path}")),
        RetryPolicy(timeout_s=20.0, retries=0),
        CircuitBreaker(3, 60),
    )
    cache = TieredCache(local, [], Codec(), Namespace("e"), caps=SizeCaps(per_kind={KIND: CAP}))
    okey = cache.namespace.object_key(KIND, "k")
    await local.backend.put(okey, b"x" * PLANTED, PutMode.OVERWRITE)
    assert await get_record(cache, KIND, "k") is None
    assert local.stats.misses["too_large"] == 1
    await update_record(cache, KIND, "k", _recording([]))
    assert await get_record(cache, KIND, "k") == b"fresh"
    await cache.close()


class _LegacyRecords:
    """A third-party record store written before the cap: get_versioned(key) only."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    async def get_versioned(self, key: str) -> Versioned | None:
        data = self.objects.get(key)
        return None if data is None else Versioned(data, _fs.content_version(data))

    async def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        current = self.objects.get(key)
        if (None if current is None else _fs.content_version(current)) != version:
            return False
        self.objects[key] = data
        return True


async def test_a_backend_without_the_cap_argument_still_has_oversized_records_replaced() -> None:
    store = _LegacyRecords()
    store.objects["r/k"] = b"x" * PLANTED
    seen: list[bytes | None] = []
    outcome, _ = await read_modify_write(
        store, "r/k", _recording(seen), timeout_s=20, max_bytes=CAP
    )
    assert outcome is Outcome.STORED
    assert seen == [None]
    assert store.objects["r/k"] == b"fresh"
