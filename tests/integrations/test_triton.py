"""Triton's kernel cache through objcache, without a GPU.

Triton compiles for ``sm_80`` here with the ptxas bundled in its wheel; only loading and
running the binary needs a GPU.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton")

from triton import knobs  # noqa: E402
from triton.runtime.cache import (  # noqa: E402
    FileCacheManager,
    RemoteCacheBackend,
    RemoteCacheManager,
)

import objcache.client  # noqa: E402
from objcache.bridge import BridgeTimeout  # noqa: E402
from objcache.client import Client  # noqa: E402
from objcache.config.settings import Config  # noqa: E402
from objcache.integrations import triton as ot  # noqa: E402
from objcache.observe.metrics import log_once  # noqa: E402
from tests.support.paths import ROOT as REPO  # noqa: E402

SUPPORT = REPO / "tests" / "support" / "triton_worker.py"
KEY = "POM5BUPIMUKVPXTBGU2HC7CKAH6V2SZFEQWAOSN2SRTHOUSEC2IA"
CHILDREN = {f"k.{ext}": f"{ext} bytes".encode() for ext in ("ttir", "ptx", "cubin", "json")}
GROUP = "__grp__k.json"
GROUP_DATA = json.dumps({"child_paths": sorted(CHILDREN)}).encode()
FIELDS = {"torch": "t", "triton": "3.7.1", "python": "3.11"}
TRITON_VARS = (ot.ENV_MANAGER, ot.ENV_BACKEND, ot.ENV_CACHE_DIR, ot.ENV_SWITCH)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No Triton knob leaks in or out; fresh verdicts, counters and log-once state."""
    for var in TRITON_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRITON_HOME", str(tmp_path / "home"))
    ot._verdicts.clear()
    ot.reset_stats()
    monkeypatch.setattr(log_once, "_seen", set())
    with knobs.cache.scope():
        yield
    ot.uninstall()


# --- an in-process client on a real file:// store ----------------------------------------


class Probe:
    """Counts what reaches the remote tier and the bridge."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.remote_gets = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.bridge_calls = 0
        self.delay_s = 0.0
        remote = client.cache.remotes[0]
        original_get = remote.backend.get_capped  # what the tier calls (size-capped reads)

        async def get(key: str, max_bytes: int) -> bytes | None:
            self.remote_gets += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                return await original_get(key, max_bytes)
            finally:
                self.in_flight -= 1

        remote.backend.get_capped = get  # type: ignore[method-assign]
        original_call = client.bridge.call

        def call(*args: Any, **kwargs: Any) -> Any:
            self.bridge_calls += 1
            return original_call(*args, **kwargs)

        client.bridge.call = call  # type: ignore[method-assign]


def make_client(tmp_path: Path, local: str = "local") -> Client:
    config = Config(tiers=f"file://{tmp_path / 'store'}", local_dir=tmp_path / local)  # type: ignore[arg-type]
    return Client(config)


@pytest.fixture
def triton_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Probe]:
    monkeypatch.setattr(objcache.client, "fingerprint", lambda: FIELDS)
    monkeypatch.setenv(ot.ENV_CACHE_DIR, str(tmp_path / "tc"))
    client = make_client(tmp_path)
    yield Probe(client)
    client.close()


def fresh_machine(tmp_path: Path, name: str) -> Probe:
    """Another client on the same store with an empty local tier."""
    return Probe(make_client(tmp_path, name))


def store_all(probe: Probe) -> None:
    backend = ot.backend_class()(KEY, client=probe.client)
    for name, data in CHILDREN.items():
        backend.put(name, data)
    backend.put(GROUP, GROUP_DATA.decode())  # RemoteCacheManager passes bytes; str also works
    assert probe.client.flush() == 0


def test_backend_is_a_triton_remote_cache_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ot.ENV_BACKEND, ot.BACKEND)
    cls = knobs.cache.remote_manager_class  # Triton's own resolution of the variable
    assert cls is ot.ObjcacheTritonBackend
    assert issubclass(cls, RemoteCacheBackend)
    assert cls.__name__ == "ObjcacheTritonBackend"


def test_artifacts_are_stored_under_key_slash_filename(triton_probe: Probe) -> None:
    store_all(triton_probe)
    for name, data in CHILDREN.items():
        assert triton_probe.client.get("triton", f"{KEY}/{name}") == data
    assert ot.stats()["puts"] == len(CHILDREN) + 1


def test_local_tier_answers_without_a_remote_round_trip(triton_probe: Probe) -> None:
    store_all(triton_probe)
    backend = ot.backend_class()(KEY, client=triton_probe.client)  # what Triton builds per lookup
    got = backend.get(list(CHILDREN))
    assert got == CHILDREN
    assert triton_probe.remote_gets == 0
    assert triton_probe.client.stats()["cache"]["served_by"] == {
        f"disk://{triton_probe.client.config.local_dir}": 4
    }


def test_files_of_one_get_are_fetched_concurrently_in_one_bridge_call(
    triton_probe: Probe, tmp_path: Path
) -> None:
    store_all(triton_probe)
    other = fresh_machine(tmp_path, "other-local")
    try:
        other.delay_s = 0.2
        got = ot.backend_class()(KEY, client=other.client).get(list(CHILDREN))
        assert got == CHILDREN
        assert other.bridge_calls == 1
        assert other.remote_gets == len(CHILDREN)
        assert other.max_in_flight == len(CHILDREN)  # all in flight at once
    finally:
        other.client.close()


def test_group_comes_with_all_children_in_one_call(triton_probe: Probe, tmp_path: Path) -> None:
    store_all(triton_probe)
    other = fresh_machine(tmp_path, "other-local")
    try:
        backend = ot.backend_class()(KEY, client=other.client)
        # RemoteCacheManager.get_group: the group file, then its children.
        assert backend.get([GROUP]) == {GROUP: GROUP_DATA}
        assert other.bridge_calls == 1
        assert backend.get(sorted(CHILDREN)) == CHILDREN
        assert other.bridge_calls == 1  # children were fetched with the group
        assert other.remote_gets == 1 + len(CHILDREN)
    finally:
        other.client.close()


def test_group_with_a_missing_child_is_a_miss(triton_probe: Probe) -> None:
    backend = ot.backend_class()(KEY, client=triton_probe.client)
    for name, data in list(CHILDREN.items())[:-1]:
        backend.put(name, data)
    backend.put(GROUP, GROUP_DATA)
    assert backend.get([GROUP]) == {}
    assert ot.stats()["incomplete_groups"] == 1
    backend.put(*list(CHILDREN.items())[-1])
    assert backend.get([GROUP]) == {GROUP: GROUP_DATA}


def test_corrupt_group_is_a_miss(triton_probe: Probe) -> None:
    backend = ot.backend_class()(KEY, client=triton_probe.client)
    backend.put(GROUP, b"not json")
    assert backend.get([GROUP]) == {}
    assert ot.stats()["incomplete_groups"] == 1


def test_dict_form_child_paths_are_accepted(triton_probe: Probe) -> None:
    # RemoteCacheManager.get_group passes child_paths as read: a dict for a default-form file.
    store_all(triton_probe)
    backend = ot.backend_class()(KEY, client=triton_probe.client)
    assert backend.get({name: "/elsewhere/" + name for name in CHILDREN}) == CHILDREN


def test_failures_are_counted_misses_logged_once(
    triton_probe: Probe, caplog: pytest.LogCaptureFixture
) -> None:
    backend = ot.backend_class()(KEY, client=triton_probe.client)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("tier exploded")

    working = triton_probe.client.bridge.call
    triton_probe.client.bridge.call = broken  # type: ignore[method-assign]
    triton_probe.client.put = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="objcache"):
        assert backend.get(["a", "b"]) == {}
        assert backend.get(["a"]) == {}
        assert backend.put("a", b"x") is None
    assert ot.stats()["errors"] == 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # one per kind of failure (get, put), not per call

    def slow(*args: Any, **kwargs: Any) -> Any:
        raise BridgeTimeout("deadline")

    triton_probe.client.bridge.call = slow  # type: ignore[method-assign]
    assert backend.get(["a"]) == {}
    assert ot.stats()["timeouts"] == 1
    triton_probe.client.bridge.call = working  # type: ignore[method-assign]


def materialize(probe: Probe, tmp_path: Path) -> Path:
    """This process compiles the kernel (its files go through ``put``) and Triton's
    RemoteCacheManager materializes them in its kernel folder, as it does."""
    kernel_dir = tmp_path / "tc" / KEY
    kernel_dir.mkdir(parents=True)
    backend = ot.backend_class()(KEY, client=probe.client)
    for name, data in {**CHILDREN, GROUP: GROUP_DATA}.items():
        backend.put(name, data)
        (kernel_dir / name).write_bytes(data)
    return kernel_dir


def test_files_already_in_the_triton_cache_dir_serve_when_objcache_cannot(
    triton_probe: Probe, tmp_path: Path
) -> None:
    kernel_dir = materialize(triton_probe, tmp_path)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("store down")

    working = triton_probe.client.bridge.call
    triton_probe.client.bridge.call = broken  # type: ignore[method-assign]
    backend = ot.backend_class()(KEY, client=triton_probe.client)
    assert backend.get([GROUP]) == {GROUP: GROUP_DATA}
    assert backend.get(sorted(CHILDREN)) == CHILDREN
    assert ot.stats()["cache_dir_hits"] == 1 + len(CHILDREN)
    # A group is only served complete, and nothing outside the kernel's folder is read.
    (kernel_dir / "k.cubin").unlink()
    backend = ot.backend_class()(KEY, client=triton_probe.client)
    assert backend.get([GROUP]) == {}
    assert backend.get(["../" + KEY + "/k.ptx", "k.ptx"]) == {"k.ptx": CHILDREN["k.ptx"]}
    triton_probe.client.bridge.call = working  # type: ignore[method-assign]


def test_files_only_in_the_triton_cache_dir_are_published(
    triton_probe: Probe, tmp_path: Path
) -> None:
    # Compiled by this process, then the store was garbage-collected and the local tier
    # emptied: the files it compiled are stored back.
    kernel_dir = materialize(triton_probe, tmp_path)
    assert triton_probe.client.flush() == 0
    shutil.rmtree(tmp_path / "store")
    shutil.rmtree(tmp_path / "local")
    backend = ot.backend_class()(KEY, client=triton_probe.client)
    assert backend.get([GROUP]) == {GROUP: GROUP_DATA}
    assert ot.stats()["republished"] == 1 + len(CHILDREN)
    assert triton_probe.client.flush() == 0
    shutil.rmtree(kernel_dir)  # the other machine has only the store
    other = fresh_machine(tmp_path, "other-local")
    try:
        fetched = ot.backend_class()(KEY, client=other.client)
        assert fetched.get([GROUP]) == {GROUP: GROUP_DATA}
        assert fetched.get(sorted(CHILDREN)) == CHILDREN
        assert other.client.stats()["cache"]["served_by"] == {
            f"file://{tmp_path / 'store'}": 1 + len(CHILDREN)
        }
    finally:
        other.client.close()


def test_objcache_is_asked_before_the_triton_cache_dir(triton_probe: Probe, tmp_path: Path) -> None:
    store_all(triton_probe)
    kernel_dir = tmp_path / "tc" / KEY
    kernel_dir.mkdir(parents=True)
    (kernel_dir / "k.ptx").write_bytes(b"stale")
    backend = ot.backend_class()(KEY, client=triton_probe.client)
    assert backend.get(["k.ptx"]) == {"k.ptx": CHILDREN["k.ptx"]}
    assert "cache_dir_hits" not in ot.stats()


def test_a_broken_configuration_is_a_miss(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OBJCACHE_TIERS", "nosuchscheme://x")
    objcache.client.reset_client()
    backend = ot.ObjcacheTritonBackend(KEY)  # as Triton builds it: the process-wide client
    assert backend.get(["a"]) == {}
    backend.put("a", b"x")
    assert ot.stats()["errors"] == 2


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: triton.language.constexpr):  # type: ignore[no-untyped-def]
    offs = triton.language.program_id(0) * BLOCK + triton.language.arange(0, BLOCK)
    mask = offs < n
    triton.language.store(
        out_ptr + offs, triton.language.load(x_ptr + offs, mask=mask) * 2, mask=mask
    )


def test_triton_compiles_when_objcache_is_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end through Triton's RemoteCacheManager: a broken objcache costs a compile."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    monkeypatch.setenv("OBJCACHE_TIERS", "nosuchscheme://x")
    monkeypatch.setenv(ot.ENV_CACHE_DIR, str(tmp_path / "tc"))
    objcache.client.reset_client()
    assert ot.install() is True
    src = ASTSource(
        scale_kernel,
        {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
        constexprs={"BLOCK": 64},
    )
    hits: list[bool] = []
    knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
    kernel = triton.compile(src, target=GPUTarget("cuda", 80, 32))
    assert kernel.asm["cubin"][:4] == b"\x7fELF"
    counters = ot.stats()
    # One failed lookup (the group file), then 8 failed puts: 7 files and the group.
    assert counters["errors"] == 1 + 8 and "puts" not in counters
    # Still broken: the files RemoteCacheManager materialized serve the next compile.
    again = triton.compile(src, target=GPUTarget("cuda", 80, 32))
    assert hits == [False, True]
    assert again.asm["cubin"] == kernel.asm["cubin"]
    assert ot.stats()["cache_dir_hits"] == 8


# --- Triton facts the design rests on ------------------------------------------------------


class DictBackend(RemoteCacheBackend):  # type: ignore[misc]
    store: dict[str, bytes] = {}

    def __init__(self, key: str) -> None:
        self.key = key

    def get(self, filenames: list[str]) -> dict[str, bytes]:
        return {f: self.store[f] for f in filenames if f in self.store}

    def put(self, filename: str, data: bytes) -> None:
        self.store[filename] = data


def test_default_manager_cannot_read_remote_group_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cache.py:244 writes list-form groups; cache.py:89 needs a dict: AttributeError.

    If this fails, Triton fixed the incompatibility: revisit the marker and docs/triton.md.
    """
    monkeypatch.setenv(ot.ENV_CACHE_DIR, str(tmp_path / "tc"))
    knobs.cache.remote_manager_class = DictBackend
    RemoteCacheManager(KEY).put_group("k.json", {"k.cubin": "/x/k.cubin"})
    group_file = tmp_path / "tc" / KEY / "__grp__k.json"
    assert json.loads(group_file.read_text()) == {"child_paths": ["k.cubin"]}
    with pytest.raises(AttributeError, match="'list' object has no attribute 'items'"):
        FileCacheManager(KEY).get_group("k.json")


def file_mode_dir(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory populated by Triton's default FileCacheManager."""
    monkeypatch.setenv(ot.ENV_CACHE_DIR, str(path))
    manager = FileCacheManager(KEY)
    child = manager.put(b"cubin", "k.cubin")
    manager.put_group("k.json", {"k.cubin": child})
    monkeypatch.delenv(ot.ENV_CACHE_DIR)


def test_dir_modes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ot.cache_dir_mode(tmp_path / "absent") == "empty"
    file_mode_dir(tmp_path / "f", monkeypatch)
    assert ot.cache_dir_mode(tmp_path / "f") == "file"
    monkeypatch.setenv(ot.ENV_CACHE_DIR, str(tmp_path / "r"))
    knobs.cache.remote_manager_class = DictBackend
    RemoteCacheManager(KEY).put_group("k.json", {"k.cubin": "/x"})
    assert ot.cache_dir_mode(tmp_path / "r") == "remote"  # list form, even without a marker
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / ot.MARKER).write_text("")
    assert ot.cache_dir_mode(tmp_path / "m") == "remote"


def test_the_marker_never_follows_a_link_at_a_predictable_temp_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    root = tmp_path / "r"
    root.mkdir()
    (root / f"{ot.MARKER}.{os.getpid()}.tmp").symlink_to(victim)
    ot._write_marker(root)
    assert victim.read_text() == "precious"
    assert ot.cache_dir_mode(root) == "remote"


# --- install / uninstall -------------------------------------------------------------------


def test_install_sets_the_knobs_and_a_dedicated_cache_dir(tmp_path: Path) -> None:
    assert ot.install() is True
    dedicated = tmp_path / "home" / ".triton" / "objcache"
    assert os.environ[ot.ENV_CACHE_DIR] == str(dedicated)
    assert knobs.cache.manager_class is RemoteCacheManager
    assert knobs.cache.remote_manager_class is ot.ObjcacheTritonBackend
    assert knobs.cache.dir == str(dedicated)
    assert (dedicated / ot.MARKER).is_file()
    assert ot.install() is True  # idempotent
    ot.uninstall()
    for var in (ot.ENV_MANAGER, ot.ENV_BACKEND, ot.ENV_CACHE_DIR):
        assert var not in os.environ
    assert knobs.cache.manager_class is None


def test_install_keeps_a_user_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ot.ENV_CACHE_DIR, str(tmp_path / "mine"))
    assert ot.install() is True
    assert os.environ[ot.ENV_CACHE_DIR] == str(tmp_path / "mine")
    assert (tmp_path / "mine" / ot.MARKER).is_file()
    ot.uninstall()
    assert os.environ[ot.ENV_CACHE_DIR] == str(tmp_path / "mine")


@pytest.mark.parametrize("var", [ot.ENV_MANAGER, ot.ENV_BACKEND])
def test_install_leaves_user_knobs_alone(var: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(var, "somewhere:Else")
    assert ot.install() is False
    assert os.environ[var] == "somewhere:Else"
    assert all(v not in os.environ for v in (ot.ENV_MANAGER, ot.ENV_BACKEND) if v != var)


def test_install_leaves_knobs_set_in_python_alone() -> None:
    knobs.cache.manager_class = FileCacheManager
    assert ot.install() is False
    assert ot.ENV_MANAGER not in os.environ


def test_install_refuses_a_default_manager_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    file_mode_dir(tmp_path / "shared", monkeypatch)
    monkeypatch.setenv(ot.ENV_CACHE_DIR, str(tmp_path / "shared"))
    with caplog.at_level(logging.WARNING, logger="objcache"):
        assert ot.install() is False
        assert ot.install() is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "FileCacheManager" in warnings[0]
    assert "\n" not in warnings[0]
    # Fallback: Triton keeps its default manager on its directory, which stays readable.
    assert ot.ENV_MANAGER not in os.environ and ot.ENV_BACKEND not in os.environ
    assert os.environ[ot.ENV_CACHE_DIR] == str(tmp_path / "shared")
    assert not (tmp_path / "shared" / ot.MARKER).exists()
    assert FileCacheManager(KEY).get_group("k.json") is not None


def test_backend_on_a_default_manager_dir_warns(
    triton_probe: Probe,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The knobs set by hand, pointing remote mode at a FileCacheManager directory.
    file_mode_dir(tmp_path / "shared", monkeypatch)
    monkeypatch.setenv(ot.ENV_CACHE_DIR, str(tmp_path / "shared"))
    with caplog.at_level(logging.WARNING, logger="objcache"):
        ot.backend_class()(KEY, client=triton_probe.client)
        ot.backend_class()(KEY, client=triton_probe.client)
    assert ot.stats()["mixed_dir"] == 2
    assert sum("FileCacheManager" in r.getMessage() for r in caplog.records) == 1


def test_switch_off_imports_no_triton() -> None:
    code = (
        "import sys, objcache.integrations.triton as t\n"
        "assert t.install_from_env() is False\n"
        "print('triton' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(ot.ENV_SWITCH, None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_install_from_env_never_raises(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> bool:
        raise OSError("read-only home")

    monkeypatch.setattr(ot, "install", broken)
    monkeypatch.setenv(ot.ENV_SWITCH, "1")
    with caplog.at_level(logging.WARNING, logger="objcache"):
        assert ot.install_from_env() is False
    assert "not installed" in caplog.text


def test_enabled_by_env() -> None:
    assert ot.enabled_by_env({"OBJCACHE_TRITON": "1"})
    assert ot.enabled_by_env({"OBJCACHE_TRITON": "yes"})
    assert not ot.enabled_by_env({"OBJCACHE_TRITON": "0"})
    assert not ot.enabled_by_env({})


# --- two machines, one store: real compiles in subprocesses --------------------------------


def run_machine(tmp_path: Path, name: str, rounds: int = 1) -> dict[str, Any]:
    """A fresh process with its own TRITON_CACHE_DIR and objcache local tier."""
    out = tmp_path / f"out-{name}"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OBJCACHE_TRITON": "1",
        "OBJCACHE_TIERS": f"file://{tmp_path / 'store'}",
        "OBJCACHE_LOCAL_DIR": str(tmp_path / f"local-{name}"),
        # Each lookup must reach the store on its own: no job-manifest prefetch.
        "OBJCACHE_PREFETCH": "0",
        "TRITON_CACHE_DIR": str(tmp_path / f"triton-{name}"),
        "TRITON_HOME": str(tmp_path / "home"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
    }
    proc = subprocess.run(
        [sys.executable, str(SUPPORT), str(out), str(rounds)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    result["out"] = out
    return result


def test_second_machine_compiles_nothing_and_gets_identical_binaries(tmp_path: Path) -> None:
    a = run_machine(tmp_path, "a")
    assert a["installed"] is True and a["manager"] == "RemoteCacheManager"
    (ra,) = a["rounds"]
    assert ra["cache_hit"] is False
    assert set(ra["stages_run"]) == {"ttir", "ttgir", "llir", "ptx", "cubin"}
    assert ra["ptxas_runs"] == 1
    files = len(ra["group"]) + 1  # the group file itself
    assert ra["triton"]["puts"] == files
    stored = list((tmp_path / "store").rglob("*"))
    assert sum(1 for p in stored if "/triton/" in str(p) and p.is_file()) == files

    b = run_machine(tmp_path, "b", rounds=2)
    first, second = b["rounds"]
    # Fresh TRITON_CACHE_DIR and fresh local tier: everything from the store, nothing built.
    assert first["cache_hit"] is True
    assert first["stages_run"] == {}
    assert first["ptxas_runs"] == 0
    assert "puts" not in first["triton"]
    assert first["triton"]["files_hit"] == first["triton"]["files_requested"] == files
    assert first["served_by"] == {f"file://{tmp_path / 'store'}": files}
    assert first["hash"] == ra["hash"] and first["asm"] == ra["asm"]
    for ext in ra["asm"]:
        name = f"asm.{ext}"
        assert (b["out"] / "0" / name).read_bytes() == (a["out"] / "0" / name).read_bytes()
    assert (b["out"] / "0" / "asm.cubin").read_bytes()[:4] == b"\x7fELF"
    # Same machine, another fresh TRITON_CACHE_DIR: the local tier answers, no remote call.
    assert second["cache_hit"] is True and second["stages_run"] == {}
    assert second["remote_gets"] == 0
    assert second["served_by"] == {f"disk://{tmp_path / 'local-b'}": files}
    assert second["asm"] == ra["asm"]
    assert (Path(second["cache_dir"]) / ot.MARKER).is_file()


def test_forked_child_does_not_inherit_held_locks(tmp_path: Path) -> None:
    with ot._verdicts_lock:  # held by the parent at fork time
        pid = os.fork()
        if pid == 0:  # child: would block forever on the inherited lock
            signal.alarm(10)
            try:
                ot.reset_stats()
                os._exit(0 if ot.claim_cache_dir(tmp_path / "child") else 1)
            finally:
                os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (tmp_path / "child" / ot.MARKER).is_file()
