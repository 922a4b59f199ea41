"""Guarded candidates (issue 9): every guard variant of an FX graph / AOTAutograd key.

* layout and TieredCache: candidate folders, one LIST per tier, verified concurrent GETs;
* the torch hooks in-process, with picklable stand-ins for compiled graphs: torch's own
  ``find_guarded_entry`` picks the candidate whose guards pass, only that one is written
  through, and the flag off gives torch's one-value behaviour back;
* real compiles in subprocesses (``tests.support.guarded_worker``): two processes build two guard
  variants of one FX key, a third process on a fresh machine gets a remote hit with the flag
  on and a guard miss plus a recompile with it off.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from objcache.backends.base import ObjectInfo
from objcache.core.candidates import (
    adopt_candidate,
    candidate_digest,
    get_candidates,
    put_candidate,
)
from objcache.core.policy import CircuitBreaker, RetryPolicy
from objcache.core.tier import Tier, TierFlags
from objcache.core.tiered import TieredCache
from objcache.entry.caps import SizeCaps
from objcache.entry.codec import Codec
from objcache.entry.layout import Namespace, parse_object_key
from tests.support import torch_runs as ts
from tests.support.memory_backend import MemoryBackend
from tests.support.paths import ROOT

NS = Namespace("testenv")
CODEC = Codec()
KEY = "pt2:fx-graph-v1::fabc:c1"


# --- layout ------------------------------------------------------------------------------------


def test_candidate_folder_never_matches_single_values_or_other_keys() -> None:
    prefix = NS.object_prefix("fx-graph", KEY)
    single = NS.object_key("fx-graph", KEY)
    assert prefix == f"{single}!/"
    assert not single.startswith(prefix)
    # "!" in a user key is percent-encoded, so "<key>!" is never another key's folder.
    assert not NS.object_key("fx-graph", KEY + "!").startswith(prefix)
    assert not NS.object_prefix("fx-graph", KEY + "!").startswith(prefix)
    digest = candidate_digest(b"payload")
    okey = NS.candidate_key("fx-graph", KEY, digest)
    assert okey.startswith(prefix) and okey.count("/") == prefix.count("/")
    assert parse_object_key(okey) == ("testenv", "fx-graph", f"{KEY}/{digest}")
    assert parse_object_key(single) == ("testenv", "fx-graph", KEY)
    with pytest.raises(ValueError):
        NS.candidate_key("fx-graph", KEY, "../x")


# --- TieredCache -------------------------------------------------------------------------------


def tier(name: str) -> Tier:
    policy = RetryPolicy(timeout_s=1.0, retries=1, backoff_initial_s=0.001)
    return Tier(MemoryBackend(name), policy, CircuitBreaker(3, 60), TierFlags())


def mem(t: Tier) -> MemoryBackend:
    assert isinstance(t.backend, MemoryBackend)
    return t.backend


def seed_candidate(t: Tier, payload: bytes, key: str = KEY) -> str:
    okey = NS.candidate_key("fx-graph", key, candidate_digest(payload))
    mem(t).data[okey] = CODEC.encode(payload, okey)
    return okey


async def test_put_candidate_is_content_addressed_and_deduplicated() -> None:
    local, remote = tier("mem://local"), tier("mem://r")
    cache = TieredCache(local, [remote], CODEC, NS)
    a = await put_candidate(cache, "fx-graph", KEY, b"variant-a")
    again = await put_candidate(cache, "fx-graph", KEY, b"variant-a")
    b = await put_candidate(cache, "fx-graph", KEY, b"variant-b")
    await cache.flush(5)
    assert a == again != b
    stored = sorted(k for k in mem(remote).data if k.startswith(NS.object_prefix("fx-graph", KEY)))
    assert stored == sorted([a, b])
    # The second put of the same bytes is a CREATE of an existing object: nothing replaced.
    assert remote.stats.put_skipped_exists + mem(remote).calls["put"] >= 2
    assert NS.object_key("fx-graph", KEY) not in mem(remote).data


async def test_get_candidates_lists_every_tier_local_first_and_verifies() -> None:
    local, near, far = tier("mem://local"), tier("mem://near"), tier("mem://far")
    cache = TieredCache(local, [near, far], CODEC, NS)
    in_local = seed_candidate(local, b"L")
    both = seed_candidate(near, b"N")
    seed_candidate(far, b"N")  # same object in two tiers: fetched once, from the nearer
    only_far = seed_candidate(far, b"F")
    corrupt = NS.candidate_key("fx-graph", KEY, candidate_digest(b"X"))
    mem(near).data[corrupt] = CODEC.encode(b"X", corrupt)[:-1] + b"!"
    seed_candidate(far, b"other key", key=KEY + "2")  # another key's folder is not listed
    found = await get_candidates(cache, "fx-graph", KEY)
    assert found[0].okey == in_local and found[0].local
    assert {c.payload for c in found} == {b"L", b"N", b"F"}
    assert {c.okey: c.tier for c in found}[both] == "mem://near"
    assert {c.okey for c in found} == {in_local, both, only_far}
    # One LIST per tier, one GET per candidate (the corrupt one included, then refused),
    # plus one GET of the key's single value per tier, alongside the LISTs.
    assert [mem(t).calls["list"] for t in (local, near, far)] == [1, 1, 1]
    assert mem(far).calls["get"] == 1 + 1 and mem(near).calls["get"] == 2 + 1
    assert near.stats.misses["corrupt"] == 1
    # Nothing is written through until a candidate is adopted.
    assert set(mem(local).data) == {in_local}
    remote = next(c for c in found if c.okey == only_far)
    await adopt_candidate(cache, remote)
    await cache.flush(5)
    assert only_far in mem(local).data and only_far in cache.recorded


async def test_get_candidates_is_bounded_and_survives_a_broken_tier() -> None:
    local, broken, good = tier("mem://local"), tier("mem://broken"), tier("mem://good")
    mem(broken).fault = "permanent"
    cache = TieredCache(local, [broken, good], CODEC, NS)
    for i in range(20):
        seed_candidate(good, f"v{i}".encode())
    found = await get_candidates(cache, "fx-graph", KEY, limit=16)
    assert len(found) == 16
    assert mem(good).calls["get"] == 16 + 1
    assert broken.stats.misses["list"] == 1
    assert await get_candidates(cache, "fx-graph", "pt2:none") == []


async def test_the_single_value_of_a_key_comes_last_unless_already_a_candidate() -> None:
    """Seeded entries and writers with candidates off store one value per key."""
    local, remote = tier("mem://local"), tier("mem://r")
    cache = TieredCache(local, [remote], CODEC, NS)
    seed_candidate(remote, b"C")
    mem(remote).data[NS.object_key("fx-graph", KEY)] = CODEC.encode(
        b"S", NS.object_key("fx-graph", KEY)
    )
    found = await get_candidates(cache, "fx-graph", KEY)
    assert [c.payload for c in found] == [b"C", b"S"]
    assert found[-1].okey == NS.object_key("fx-graph", KEY)
    mem(remote).data[NS.object_key("fx-graph", KEY)] = CODEC.encode(
        b"C", NS.object_key("fx-graph", KEY)
    )
    cache2 = TieredCache(tier("mem://local2"), [remote], CODEC, NS)
    assert [c.payload for c in await get_candidates(cache2, "fx-graph", KEY)] == [b"C"]
    without = await get_candidates(cache2, "fx-graph", KEY, include_single=False)
    assert [c.okey for c in without] == [found[0].okey]


async def test_get_candidates_accounts_each_lookup_once() -> None:
    """Two lookups: each is one get and one hit of the kind, served (for the lookup) by the
    nearest tier holding a candidate; every fetched candidate counts a hit of its tier."""
    local, remote = tier("mem://local"), tier("mem://r")
    cache = TieredCache(local, [remote], CODEC, NS)
    seed_candidate(local, b"L")
    seed_candidate(remote, b"R1")
    seed_candidate(remote, b"R2")
    single = NS.object_key("fx-graph", KEY)
    mem(remote).data[single] = CODEC.encode(b"S", single)
    for _ in range(2):
        found = await get_candidates(cache, "fx-graph", KEY, concurrency=1)
        assert [c.payload for c in found][-1] == b"S"
    assert cache.stats.gets["fx-graph"] == 2 and cache.stats.hits["fx-graph"] == 2
    assert cache.stats.lookups_served_by == {"mem://local": 2}
    assert remote.stats.hits == 2 * 2 + 1  # two candidates per lookup; the single value once
    assert local.stats.hits == 2 + 1  # the single value was written through by the first
    last = found[-1]
    assert (last.okey, last.entry, last.local, last.mtime) == (single, b"", True, 0.0)
    assert last.tier == "mem://local"
    assert cache.stats.served_by == {"mem://local": 2 + 1, "mem://r": 2 * 2 + 1}
    assert cache.stats.lookup.total == 2 and 0.01 < cache.stats.lookup.sum_ms < 60_000
    assert all(c.mtime > 0 for c in found[:-1])


# --- torch hooks, in-process -------------------------------------------------------------------

torch = pytest.importorskip("torch")


class FakeGraph:
    """Stands in for a CompiledFxGraph: torch's find_guarded_entry reads only guards_expr."""

    def __init__(self, guards_expr: str) -> None:
        self.guards_expr = guards_expr


@pytest.fixture
def candidates_file_store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``installed_file_store`` (tests/integrations/torch/conftest.py) with guarded candidates
    at their default, on, whatever the environment says: unset before the install reads it."""
    monkeypatch.delenv("OBJCACHE_GUARDED_CANDIDATES", raising=False)
    store: Path = request.getfixturevalue("installed_file_store")
    return store


def _machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, **env: str) -> Path:
    """A fresh objcache local dir and Inductor dir on the same store."""
    from objcache.client import get_client, reset_client

    get_client().flush()
    reset_client()
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("OBJCACHE_LOCAL_DIR", str(tmp_path / f"local-{name}"))
    inductor = tmp_path / f"inductor-{name}"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    return inductor


def _fx_remote() -> Any:
    from torch._inductor import remote_cache

    cache = remote_cache.create_cache("fx-graph-v1", False, "FbX", "RemoteFxGraphCache")
    assert cache is not None
    return cache


def _put_variants(guards: list[str]) -> None:
    cache = _fx_remote()
    for expr in guards:
        raw = pickle.dumps(FakeGraph(expr))
        cache.put("fguarded", {"data": base64.b64encode(raw).decode(), "time_taken_ms": 1})


def _find(wanted: str) -> tuple[Any, list[str]]:
    from torch._inductor.codecache import FxGraphCache

    seen: list[str] = []

    def evaluate(expr: str, hints: Any) -> bool:
        seen.append(expr)
        return expr == wanted

    graph, _, _info = FxGraphCache.find_guarded_entry("fguarded", True, _fx_remote(), evaluate, [])
    return graph, seen


def _local_entries(inductor: Path) -> list[str]:
    from torch._inductor.codecache import FxGraphCache

    subdir = Path(FxGraphCache._get_tmp_dir_for_key("fguarded"))
    assert str(subdir).startswith(str(inductor))
    if not subdir.exists():
        return []
    return [pickle.loads((subdir / p).read_bytes()).guards_expr for p in os.listdir(subdir)]


def test_install_patches_both_guarded_caches_and_uninstall_restores(
    candidates_file_store: Path,
) -> None:
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    from torch._inductor.codecache import FxGraphCache, GuardedCache

    import objcache
    from objcache.integrations.torch.remote import guarded_candidates as candidates

    for cls in (FxGraphCache, AOTAutogradCache):
        assert candidates.patched(cls)
    objcache.uninstall()
    for cls in (FxGraphCache, AOTAutogradCache):
        assert not candidates.patched(cls)
        assert "iterate_over_candidates" not in cls.__dict__
        assert "find_guarded_entry" not in cls.__dict__
        assert cls.iterate_over_candidates.__func__ is (  # type: ignore[attr-defined]
            GuardedCache.iterate_over_candidates.__func__  # type: ignore[attr-defined]
        )
    objcache.install()
    assert candidates.patched(FxGraphCache)


def test_every_variant_is_offered_and_only_the_passing_one_is_written_through(
    candidates_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objcache.integrations.torch.remote import guarded_candidates as candidates

    _put_variants(["s0 > 8", "s0 <= 8"])
    inductor = _machine(candidates_file_store, monkeypatch, "b")
    before = candidates.counters.copy()
    graph, seen = _find("s0 <= 8")
    assert graph is not None and graph.guards_expr == "s0 <= 8"
    assert "s0 <= 8" in seen
    assert _local_entries(inductor) == ["s0 <= 8"]  # the failing variant is not written
    delta = candidates.counters - before
    assert delta["remote_hits:fx-graph"] == 1
    assert delta["candidates:fx-graph"] == len(seen)
    # Next lookup on this machine: torch's local entry passes, no remote candidate needed.
    graph, seen = _find("s0 <= 8")
    assert graph is not None and seen == ["s0 <= 8"]
    # A variant nobody built: the local entry, then every remote candidate not already
    # local (the written-through one is skipped), then a guard miss (None).
    before = candidates.counters.copy()
    graph, seen = _find("s0 == 3")
    assert graph is None and seen == ["s0 <= 8", "s0 > 8"]
    assert (candidates.counters - before)["skipped_local_duplicates:fx-graph"] == 1


def test_flag_off_keeps_torchs_single_remote_value(
    candidates_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objcache.client import get_client

    _machine(candidates_file_store, monkeypatch, "a", OBJCACHE_GUARDED_CANDIDATES="0")
    for expr in ("s0 > 8", "s0 <= 8"):  # flushed one by one: write-behind would coalesce
        _put_variants([expr])
        get_client().flush()
    inductor = _machine(candidates_file_store, monkeypatch, "b")
    monkeypatch.setenv("OBJCACHE_GUARDED_CANDIDATES", "0")
    graph, seen = _find("s0 <= 8")
    # One value per key (first writer wins): the other variant is a guard miss.
    assert graph is None and seen == ["s0 > 8"]
    # The single-value path writes a remote value through as torch reads it, before any
    # guard is evaluated; the next lookup finds it locally.
    assert _local_entries(inductor) == ["s0 > 8"]
    graph, seen = _find("s0 > 8")
    assert graph is not None and seen == ["s0 > 8"]


# --- real compiles in subprocesses -------------------------------------------------------------


def _compile(base: Path, machine: str, flag: str, shape: tuple[int, int]) -> dict[str, Any]:
    root = base / machine
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    for var in ("OBJCACHE_ENABLE", "OBJCACHE_READ_ONLY", "TORCHINDUCTOR_FORCE_DISABLE_CACHES"):
        env.pop(var, None)
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"),
        TMPDIR=str(root / "tmp"),
        OBJCACHE_LOCAL_DIR=str(root / "local"),
        OBJCACHE_TIERS=f"file://{base / 'store'}",
        OBJCACHE_GUARDED_CANDIDATES=flag,
        **ts.PLAIN_PATH,
        OBJCACHE_STATS_FILE=str(root / "stats.json"),
        OBJCACHE_TIMEOUT_MS="2000",
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        TORCHINDUCTOR_COMPILE_THREADS="1",
    )
    argv = [sys.executable, "-m", "tests.support.guarded_worker", *map(str, shape)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("GUARDED_RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[-1].split(" ", 1)[1])
    assert result["ok"]
    return result


@pytest.mark.compile
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_a_third_machine_gets_the_second_guard_variant_remotely(tmp_path: Path) -> None:
    """a: (8, 9) builds variant 1; b: (9, 10) misses its guards, builds variant 2 under the
    same FX key; c (fresh dirs, needs variant 2): a remote hit with candidates, a guard miss
    and a recompile with torch's one value per key. Kernels are shared by content, so only
    the first two processes run g++."""
    runs: dict[str, dict[str, Any]] = {}
    for flag in ("1", "0"):
        for machine, shape in (("a", (8, 9)), ("b", (9, 10)), ("c", (9, 10))):
            runs[machine + flag] = _compile(tmp_path, machine + flag, flag, shape)
    fx_keys = {k for r in runs.values() for k in r["keys"]["fx"]}
    aot_keys = {k for r in runs.values() for k in r["keys"]["aot"]}
    assert len(fx_keys) == 1 and len(aot_keys) == 1, (fx_keys, aot_keys)
    for flag in ("1", "0"):
        # b took a guard miss on a's entry and built a second variant of the same keys.
        b = runs["b" + flag]
        assert b["aot_autograd"].get("autograd_cache_guard_miss") == 1
        assert b["inductor"].get("fxgraph_cache_miss") == 1
    on, off = runs["c1"], runs["c0"]
    assert on["inductor"].get("fxgraph_cache_hit") == 1
    assert "fxgraph_cache_miss" not in on["inductor"]
    assert on["aot_autograd"].get("autograd_cache_hit") == 1
    assert on["objcache"]["candidates"]["remote_hits:fx-graph"] == 1
    assert on["objcache"]["candidates"]["remote_hits:aot-autograd"] == 1
    assert on["objcache"]["writethrough"]["writethrough:fx-graph"] == 1
    assert off["inductor"].get("fxgraph_cache_miss") == 1
    assert "fxgraph_cache_hit" not in off["inductor"]
    assert off["aot_autograd"].get("autograd_cache_guard_miss") == 1
    # Both variants sit in the store as their own objects under one candidate folder.
    fx_folders = list((tmp_path / "store").rglob("*fx-graph-v1*!"))
    assert len(fx_folders) == 1 and len(os.listdir(fx_folders[0])) == 2


class Dated(MemoryBackend):
    """A memory backend whose listing reports each object's own time (``mtimes``)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.mtimes: dict[str, float] = {}

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        async for info in super().list(prefix):
            yield ObjectInfo(info.key, info.size, self.mtimes.get(info.key, 0.0))


async def test_the_newest_candidates_are_the_ones_fetched_within_the_limit() -> None:
    remote = Tier(Dated("mem://r"), RetryPolicy(timeout_s=1.0), CircuitBreaker(3, 60))
    cache = TieredCache(tier("mem://local"), [remote], CODEC, NS)
    backend = remote.backend
    assert isinstance(backend, Dated)
    for age, payload in enumerate((b"newest", b"middle", b"oldest")):
        backend.mtimes[seed_candidate(remote, payload)] = 1000.0 - age
    found = await get_candidates(cache, "fx-graph", KEY, limit=2, include_single=False)
    assert [c.payload for c in found] == [b"newest", b"middle"]
    assert [c.mtime for c in found] == [1000.0, 999.0]
    assert await get_candidates(cache, "fx-graph", KEY, limit=0, include_single=False) == []
    assert remote.stats.hits == 2 and remote.stats.kinds["fx-graph"]["hit"] == 2


async def test_a_key_s_single_value_is_left_out_when_asked() -> None:
    local, remote = tier("mem://local"), tier("mem://r")
    cache = TieredCache(local, [remote], CODEC, NS)
    single = NS.object_key("fx-graph", KEY)
    mem(remote).data[single] = CODEC.encode(b"single", single)
    assert await get_candidates(cache, "fx-graph", KEY, include_single=False) == []
    assert mem(remote).calls["get"] == 0


async def test_write_only_tiers_hold_no_candidates_for_lookups() -> None:
    local, write_only = tier("mem://local"), tier("mem://wo")
    write_only.flags = TierFlags(write_only=True)
    cache = TieredCache(local, [write_only], CODEC, NS)
    seed_candidate(write_only, b"C")
    assert await get_candidates(cache, "fx-graph", KEY) == []
    assert mem(write_only).calls["list"] == 0


async def test_remote_candidates_are_capped_local_ones_are_not() -> None:
    """A remote candidate over its kind's size cap is refused unread past the cap; a local
    one was checked on its way in."""
    local, remote = tier("mem://local"), tier("mem://r")
    cache = TieredCache(local, [remote], CODEC, NS, caps=SizeCaps(per_kind={"fx-graph": 64}))
    big = os.urandom(200)
    in_local = seed_candidate(local, big)
    in_remote = seed_candidate(remote, big + b"!")
    found = await get_candidates(cache, "fx-graph", KEY, include_single=False)
    assert [c.okey for c in found] == [in_local]
    assert remote.stats.misses["too_large"] == 1 and in_remote in mem(remote).data


async def test_adopting_a_local_candidate_writes_nothing() -> None:
    """The key's single value, already written through, comes back with no entry bytes:
    adopting it must not overwrite the local entry."""
    local, remote = tier("mem://local"), tier("mem://r")
    cache = TieredCache(local, [remote], CODEC, NS)
    single = NS.object_key("fx-graph", KEY)
    mem(local).data[single] = CODEC.encode(b"single", single)
    [found] = await get_candidates(cache, "fx-graph", KEY)
    assert found.local and found.payload == b"single"
    puts = mem(local).calls["put"]
    await adopt_candidate(cache, found)
    await cache.flush(5)
    assert mem(local).calls["put"] == puts
    assert CODEC.decode(mem(local).data[single], single) == b"single"


def test_a_candidate_is_named_by_the_128_bit_digest_of_its_payload() -> None:
    import hashlib

    assert candidate_digest(b"payload") == hashlib.blake2b(b"payload", digest_size=16).hexdigest()
    assert len(candidate_digest(b"")) == 32
