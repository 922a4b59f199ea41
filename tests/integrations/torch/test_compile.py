"""Real torch.compile runs in subprocesses, sharing one cold compile.

Machines are simulated by directories: each has its own objcache local dir,
``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR`` and ``TMPDIR`` (Inductor keeps precompiled
headers under the temp dir); only the ``file://`` store is shared. ``g++`` runs are counted by
a PATH shim, independently of objcache's counters.

* A (cold): store + a tier that hangs; saves a Mega-Cache bundle.
* B (new machine): the zero-code ``.pth`` path; everything from the store, no g++.
* C (B's dirs; tiers: a closed Redis port and an erroring tier): torch's local caches serve
  everything.
* D (``ATEN_CPU_CAPABILITY`` one level below this CPU's): A's entries are not served.
* E (fresh machine whose store holds only A's bundle): the bundle alone avoids all g++.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

from tests.support import torch_runs as ts
from tests.support.isa import lower_isa

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
]

BUNDLE = "bundle-a"


class World:
    """The compile runs, each started on first use and shared by every test."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.store = base / "store"
        self.site = ts.make_site_dir(base / "site")

    def env(self, machine: str, tiers: str) -> tuple[dict[str, str], Path]:
        env = {**ts.compile_env(self.base / machine, tiers), **ts.PLAIN_PATH}
        shim_dir, log = ts.make_gxx_shim(self.base / machine / "shim")
        env["PATH"] = f"{shim_dir}{os.pathsep}{env.get('PATH', '')}"
        return env, log

    @cached_property
    def cold(self) -> dict[str, Any]:
        env, log = self.env("a", f"fault:///t?mode=hang,file://{self.store}")
        result = ts.run_compile(env, ["--mega-save", BUNDLE])
        result["gxx"] = ts.gxx_builds(log)
        return result

    @cached_property
    def new_machine(self) -> dict[str, Any]:
        _ = self.cold
        env, log = self.env("b", f"file://{self.store}")
        env["OBJCACHE_TEST_SITE_DIR"] = str(self.site)  # the .pth decides, not the worker
        result = ts.run_compile(env, ["--objcache", "auto"])
        result["gxx"] = ts.gxx_builds(log)
        return result

    @cached_property
    def offline(self) -> dict[str, Any]:
        _ = self.new_machine
        from tests.support.ports import free_port

        closed = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
        env, log = self.env("b", f"{closed},fault:///t?mode=error")
        env["OBJCACHE_LOCAL_DIR"] = str(self.base / "c-objcache-local")  # nothing cached there
        log.unlink(missing_ok=True)
        result = ts.run_compile(env)
        result["gxx"] = ts.gxx_builds(log)
        return result

    @cached_property
    def mega_machine(self) -> dict[str, Any]:
        _ = self.cold
        bundle_store = self.base / "bundle-store"
        for path in self.store.rglob(f"mega/*/{BUNDLE}"):
            target = bundle_store / path.relative_to(self.store)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
        env, log = self.env("e", f"file://{bundle_store}")
        env["OBJCACHE_PREFETCH"] = "0"
        result = ts.run_compile(env, ["--mega-load", BUNDLE])
        result["gxx"] = ts.gxx_builds(log)
        return result


def hits(result: dict[str, Any]) -> dict[str, tuple[int, int]]:
    from objcache.demo.demo_jobs import objcache_hits

    return objcache_hits(result)


def test_a_failing_tier_never_breaks_or_stalls_a_compile(world: World) -> None:
    cold = world.cold
    assert cold["match"], cold["max_abs_err"]
    assert cold["torch"].get("fxgraph_cache_miss") == 2
    hung = ts.tier_stats(cold, "fault:")
    assert hung["misses"].get("timeout", 0) + hung["misses"].get("breaker", 0) >= 1
    assert hung["breaker_opened"] >= 1  # after 5 failures it is skipped, not waited for
    assert sum(hung["put_errors"].values()) >= 1
    assert hung["misses"].get("timeout", 0) <= 5  # the stall is bounded by the breaker
    store = ts.tier_stats(cold, "file://")
    assert store["puts"] > 0
    assert not [k for k in cold["integration"]["hooks"] if k.startswith("errors:")]
    assert cold["integration"]["kernels"]["builds"] == len(cold["gxx"]) > 0
    assert "saved bundle 'bundle-a'" in cold["mega_save"]


def test_new_machine_gets_every_kind_remotely_and_runs_no_gxx(world: World) -> None:
    new = world.new_machine
    assert new["match"], new["max_abs_err"]
    got = hits(new)
    assert got["fx-graph"] == (2, 2)
    assert got["aot-autograd"] == (1, 1)
    assert got["pgo"] == (1, 1)
    kernel_hits, kernel_gets = got.get("kernel", (0, 0))
    assert kernel_hits == kernel_gets
    assert new["torch"].get("fxgraph_cache_hit") == 2
    assert new["torch"].get("autograd_cache_hit") == 1
    assert new["gxx"] == [], "\n".join(new["gxx"])
    kernels = new["integration"]["kernels"]
    assert kernels.get("builds", 0) == 0 and kernels["pch_deferred"] >= 1
    # kernels placed where torch looks while the prefetch ran; the rest fetched on load
    assert kernels.get("placed", 0) > 0 and kernels.get("place_refused", 0) == 0

    # each placed file is one torch then loaded: placed and fetched make A's kernels exactly
    def binaries(machine: str) -> set[str]:
        folder = world.base / machine / "inductor"
        return {p.name for p in [*folder.glob("*/*.so"), *folder.glob("*/*.o")]}

    assert binaries("b") == binaries("a")
    assert kernels.get("placed", 0) + kernels.get("fetched", 0) == len(binaries("a")), kernels
    assert new["integration"]["writethrough"] == {
        "writethrough:fx-graph": 2,
        "writethrough:aot-autograd": 1,
        "writethrough:pgo": 1,
    }
    store = ts.tier_stats(new, "file://")
    assert store["hits"] >= sum(h for h, _ in got.values())
    # A's run manifest was found and prefetched, but not the 150 MB precompiled header
    assert new["prefetch"]["keys"] >= kernel_gets
    assert store["bytes_read"] < 5 << 20, store["bytes_read"]
    assert new["first_step_s"] < world.cold["first_step_s"]


def test_written_through_entries_serve_the_next_run_with_every_tier_down(world: World) -> None:
    off = world.offline
    assert off["match"], off["max_abs_err"]
    assert off["torch"].get("fxgraph_cache_hit") == 2 and "fxgraph_cache_miss" not in off["torch"]
    assert off["torch"].get("autograd_cache_hit") == 1
    asked = off["stats"]["cache"]["gets"]
    for kind in ("fx-graph", "aot-autograd", "pgo", "kernel"):
        assert kind not in asked, f"{kind} was not served locally: {asked}"
    assert off["gxx"] == [], "\n".join(off["gxx"])
    assert (world.base / "b" / "inductor" / "dynamo").is_dir()  # PGO state written through


def test_entries_are_not_served_to_another_cpu_isa(world: World) -> None:
    from objcache.client import Client
    from objcache.config.fingerprint import env_id, fingerprint
    from objcache.config.settings import Config
    from objcache.entry.layout import decode_key

    _ = world.cold
    env_a = env_id()
    keys: dict[str, list[str]] = {}
    for kind in ("fx-graph", "kernel"):
        names = sorted(p.name for p in world.store.glob(f"v1/{env_a}/{kind}/*/*"))
        # "<key>!" folders hold guarded candidates; get_candidates also reads single values
        keys[kind] = sorted({decode_key(n.removesuffix("!")) for n in names})
        assert keys[kind], f"A stored no {kind} entries under {env_a}"
    cfg = Config.from_env(
        {}, tiers=f"file://{world.store}", local_dir=world.base / "d-local-here", prefetch=False
    )
    here = Client(cfg)
    try:  # control: this process has A's environment and is served
        assert all(here.get_candidates(k, key) for k, ks in keys.items() for key in ks)
    finally:
        here.close()
    # "another CPU" is a level below this machine's own, so ATen accepts it on any host:
    # avx512 -> avx2 on AVX-512 machines, avx2 -> default on AVX2-only ones.
    other = lower_isa(fingerprint()["cpu_isa"])
    if other is None:
        pytest.skip("this machine's ISA is ATen's lowest (default): no other level to force")

    env = {**ts.compile_env(world.base / "d", f"file://{world.store}"), **ts.PLAIN_PATH}
    env["ATEN_CPU_CAPABILITY"] = other
    code = (
        "import json, sys, torch, objcache\n"
        "from objcache.client import get_client\n"
        "from objcache.config.fingerprint import env_id, fingerprint\n"
        "keys = json.loads(sys.argv[1]); c = get_client()\n"
        "print(json.dumps({'isa': fingerprint()['cpu_isa'], 'env': env_id(),\n"
        "  'served': [k for kind, ks in keys.items() for k in ks if c.get_candidates(kind, k)]}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(keys)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["isa"] == other
    assert seen["env"] != env_a
    assert seen["served"] == []


def test_a_mega_bundle_alone_brings_graphs_and_kernels(world: World) -> None:
    e = world.mega_machine
    assert e["match"], e["max_abs_err"]
    assert "kernels" in e["mega_load"] and " 0 kernels" not in e["mega_load"]
    assert e["torch"].get("fxgraph_cache_hit") == 2
    assert e["torch"].get("autograd_cache_hit") == 1
    assert e["gxx"] == [], "\n".join(e["gxx"])
    kernel_hits, kernel_gets = hits(e)["kernel"]
    assert kernel_hits == kernel_gets > 0
    # the bundle and its pointer (read beside it, so a hung store costs one deadline); the
    # rest was local
    assert ts.tier_stats(e, "file://")["hits"] == 2
