"""The objcache CLI against a real file:// store and local tier, as a user runs it."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from objcache.client import Client
from objcache.config.settings import Config
from objcache.core.reads import read_local_sync

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "OBJCACHE_TIERS": f"file://{tmp_path}/store",
        "OBJCACHE_LOCAL_DIR": str(tmp_path / "local"),
        "OBJCACHE_STATS_FILE": str(tmp_path / "stats.json"),
        "OBJCACHE_PREFETCH": "0",
        "OBJCACHE_JOB": "clitest",
    }


@pytest.fixture
def run_cli(cli_env: dict[str, str]) -> Run:
    def _run(*args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "objcache.cli", *args],
            env={**cli_env, **(extra or {})},
            capture_output=True,
            text=True,
            timeout=120,
        )

    return _run


def populate(env: dict[str, str], n: int = 5) -> Client:
    client = Client(Config.from_env(env))
    for i in range(n):
        client.put("fx-graph", f"key-{i}", f"value-{i}".encode() * 100)
    client.get("fx-graph", "key-0")
    client.close()
    return client


def test_doctor_ok_and_failing_tier(run_cli: Run, tmp_path: Path) -> None:
    ok = run_cli("doctor")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok" in ok.stdout and "FAILED" not in ok.stdout
    bad = run_cli("doctor", extra={"OBJCACHE_TIERS": "file:///proc/objcache-cannot-write"})
    assert bad.returncode == 1
    assert "FAILED" in bad.stdout


def test_log_level_debug_logs_to_stderr(run_cli: Run) -> None:
    broken = {"OBJCACHE_TIERS": "file:///proc/objcache-cannot-write"}
    quiet = run_cli("doctor", extra=broken)
    assert "DEBUG" not in quiet.stderr
    loud = run_cli("doctor", extra={**broken, "OBJCACHE_LOG_LEVEL": "debug"})
    assert loud.returncode == 1
    assert " objcache DEBUG probe of file:///proc/objcache-cannot-write failed" in loud.stderr
    bad = run_cli("doctor", extra={"OBJCACHE_LOG_LEVEL": "LOUD"})
    assert bad.returncode == 2 and "log_level must be one of DEBUG" in bad.stderr


def test_doctor_names_a_failing_tier_once_per_line(run_cli: Run) -> None:
    url = "file:///proc/objcache-cannot-write"
    bad = run_cli("doctor", extra={"OBJCACHE_TIERS": url})
    failed = [line for line in bad.stdout.splitlines() if line.startswith("FAILED ")]
    assert len(failed) == 1 and failed[0].count(url) == 1, bad.stdout


def test_pull_from_a_missing_store_warns_and_exits_0(run_cli: Run, tmp_path: Path) -> None:
    r = run_cli("pull", "--tier", f"file://{tmp_path}/does-not-exist")
    assert r.returncode == 0, r.stdout + r.stderr
    bad_usage = run_cli("pull", "--tier", "sx3://b/p")
    assert bad_usage.returncode == 2


def test_tables_are_not_wrapped_without_a_terminal(run_cli: Run, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/{'a-long-directory-name-' * 6}store"
    r = run_cli("doctor", extra={"OBJCACHE_TIERS": url, "COLUMNS": ""})
    assert r.returncode == 0, r.stdout + r.stderr
    row = next((line for line in r.stdout.splitlines() if url in line), None)
    assert row is not None and "ok" in row, r.stdout


def test_boolean_flags_look_and_parse_like_flags() -> None:
    import typer.main
    from typer.testing import CliRunner

    from objcache.cli import main as cli

    runner = CliRunner()
    root = typer.main.get_group(cli.app)
    commands = [[name] for name in root.commands]
    commands += [["mega", name] for name in typer.main.get_group(cli.mega_app).commands]
    assert len(commands) > 10
    for command in [[], *commands]:
        shown = runner.invoke(cli.app, [*command, "--help"])
        assert shown.exit_code == 0, (command, shown.output)
        assert "<bool>" not in shown.output and "BOOLEAN" not in shown.output, shown.output
    assert "--json " in runner.invoke(cli.app, ["stats", "--help"]).output
    assert "--delete " in runner.invoke(cli.app, ["verify", "--help"]).output


def test_bad_config_is_one_line_exit_2(run_cli: Run) -> None:
    r = run_cli("ls", extra={"OBJCACHE_TIERS": "redis://h:1/0,sx3://b/p"})
    assert r.returncode == 2
    assert r.stderr.strip() == "objcache: error: unknown scheme 'sx3' in OBJCACHE_TIERS[1]"
    assert "Traceback" not in r.stderr


def test_ls_stats_verify_and_gc(run_cli: Run, cli_env: dict[str, str], tmp_path: Path) -> None:
    populate(cli_env)
    listing = run_cli("ls", "--json")
    assert listing.returncode == 0, listing.stderr
    keys = {e["key"] for e in json.loads(listing.stdout)}
    assert {f"key-{i}" for i in range(5)} <= keys
    envs = json.loads(run_cli("ls", "--envs", "--json").stdout)
    assert len(envs) == 1 and next(iter(envs.values()))["fields"]["python"]

    stats = json.loads(run_cli("stats", "--json").stdout)
    assert stats["cache"]["hits"] == {"fx-graph": 1}
    assert any(t["puts"] >= 5 for t in stats["tiers"])

    # Corrupt one entry at rest in the store: verify reports it, --delete removes it.
    victim = next((tmp_path / "store").rglob("key-3"))
    victim.write_bytes(victim.read_bytes()[:-3] + b"xyz")
    store = f"file://{tmp_path}/store"
    v = run_cli("verify", "--tier", store)
    assert v.returncode == 1 and "corrupt" in v.stdout and "1 bad" in v.stdout
    assert run_cli("verify", "--tier", store, "--delete").returncode == 0
    assert not victim.exists()

    dry = run_cli("gc", "--keep-env", "someotherenv", "--dry-run")
    assert dry.returncode == 0 and "would delete" in dry.stdout
    assert len(list((tmp_path / "store").rglob("key-*"))) == 4, "dry run deletes nothing"
    real = run_cli("gc", "--keep-env", "someotherenv", "--yes")
    assert real.returncode == 0
    assert list((tmp_path / "store").rglob("key-*")) == []


def test_gc_acts_on_every_configured_tier(
    run_cli: Run, cli_env: dict[str, str], tmp_path: Path
) -> None:
    tiers = f"file://{tmp_path}/store,file://{tmp_path}/second"
    populate({**cli_env, "OBJCACHE_TIERS": tiers})
    for store in ("store", "second"):
        assert len(list((tmp_path / store).rglob("key-*"))) == 5
    r = run_cli("gc", "--keep-env", "someotherenv", "--yes", extra={"OBJCACHE_TIERS": tiers})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("to delete") == 2 and "deleted" in r.stdout
    for store in ("store", "second"):
        assert list((tmp_path / store).rglob("key-*")) == [], store
    one = run_cli("gc", "--tier", f"file://{tmp_path}/store", "--older-than", "0", "--yes")
    assert one.returncode == 0 and one.stdout.count("to delete") == 1


def test_stats_summary_after_a_warm_run(
    run_cli: Run, cli_env: dict[str, str], tmp_path: Path
) -> None:
    populate(cli_env)  # the first machine: writes the store
    fresh = Client(Config.from_env({**cli_env, "OBJCACHE_LOCAL_DIR": str(tmp_path / "fresh")}))
    assert fresh.get("fx-graph", "key-1") is not None  # from the store
    assert fresh.get("fx-graph", "key-1") is not None  # now local
    assert fresh.get("fx-graph", "nope") is None
    fresh.close()
    r = run_cli("stats")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("stats of job clitest on ") and "(pid " in lines[0], lines[0]
    assert "UTC" in lines[0] and "ago), environment " in lines[0]
    store = f"file://{tmp_path}/store"
    assert lines[1] == f"lookups 3, hits 2 (66.7%): served locally 1, {store} 1, misses 1"
    assert "puts skipped by an open breaker 0" in r.stdout
    assert "None" not in r.stdout


def test_push_then_pull_into_a_fresh_machine(
    run_cli: Run, cli_env: dict[str, str], tmp_path: Path
) -> None:
    populate(cli_env, n=20)
    seeded = f"file://{tmp_path}/seeded"
    push = run_cli("push", "--tier", seeded)
    assert push.returncode == 0, push.stderr
    assert "20 copied" in push.stdout or "21 copied" in push.stdout
    again = run_cli("push", "--tier", seeded)
    assert "0 copied" in again.stdout
    fresh = str(tmp_path / "fresh-local")
    pull = run_cli("pull", "--tier", seeded, extra={"OBJCACHE_LOCAL_DIR": fresh})
    assert pull.returncode == 0, pull.stderr
    client = Client(Config.from_env({**cli_env, "OBJCACHE_TIERS": "", "OBJCACHE_LOCAL_DIR": fresh}))
    try:
        assert read_local_sync(client.cache, "fx-graph", "key-7") is not None
    finally:
        client.close()


def test_progress_shows_bytes_and_rate(
    run_cli: Run, cli_env: dict[str, str], tmp_path: Path
) -> None:
    populate(cli_env, n=4)
    r = run_cli("push", "--tier", f"file://{tmp_path}/seeded", extra={"OBJCACHE_PROGRESS": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    bar = next(line for line in r.stderr.splitlines() if line.startswith("push"))
    # +manifest, ENV
    assert re.search(r"\b6/6 [0-9.]+ (B|KiB) at [0-9.]+ (B|KiB|MiB)/s, [0-9,]+ objects/s", bar), bar


def test_pull_by_job_manifest(run_cli: Run, cli_env: dict[str, str], tmp_path: Path) -> None:
    populate(cli_env, n=3)  # closing the client writes the run's manifest for job clitest
    fresh = str(tmp_path / "fresh-local")
    r = run_cli("pull", "--job", "clitest", extra={"OBJCACHE_LOCAL_DIR": fresh})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 fetched" in r.stdout
    again = str(tmp_path / "another-fresh-local")
    progress = {"OBJCACHE_LOCAL_DIR": again, "OBJCACHE_PROGRESS": "1"}
    r = run_cli("pull", "--job", "clitest", "--json", extra=progress)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["fetched"] == report["objects"] == 3 and report["bytes"] > 0
    assert report["objects_per_s"] == round(3 / report["seconds"], 1)
    assert report["bytes_per_s"] == round(report["bytes"] / report["seconds"])
    bar = next(line for line in r.stderr.splitlines() if line.startswith("pull"))
    assert re.search(r"\b3/3 [0-9.]+ (B|KiB) at [0-9.]+ (B|KiB|MiB)/s, [0-9,]+ objects/s", bar), bar
    missing = run_cli("pull", "--job", "nosuchjob", extra={"OBJCACHE_LOCAL_DIR": fresh})
    assert missing.returncode == 0, "warming is best-effort: a boot script goes on cold"
    assert "warning: pull: job nosuchjob has no manifest" in missing.stderr


def test_demo_refuses_an_unknown_or_missing_model_in_one_line(run_cli: Run) -> None:
    unknown = run_cli("demo", "--model", "resnet18")
    assert unknown.returncode != 0
    assert "unknown model 'resnet18'" in unknown.stderr and "Traceback" not in unknown.stderr
    missing = run_cli("demo", "--model", "nosuchlibrary:x")
    assert missing.returncode != 0 and "unknown model" in missing.stderr
    if importlib.util.find_spec("timm") is None:  # the dev venv does not install it
        absent = run_cli("demo", "--model", "timm:resnet18")
        assert absent.returncode != 0 and "timm is not installed" in absent.stderr


def test_doctor_says_what_is_in_force_as_json(run_cli: Run, tmp_path: Path) -> None:
    from objcache.entry.signing import generate_key_file

    public = generate_key_file(tmp_path / "ci.pem")
    extra = {
        "OBJCACHE_ENABLE": "0",
        "OBJCACHE_TIER": f"file://{tmp_path}/typo",
        "OBJCACHE_VERIFY_KEYS": public,
        "OBJCACHE_SIGNING_KEY_FILE": str(tmp_path / "ci.pem"),
    }
    r = run_cli("doctor", "--json", extra=extra)
    assert r.returncode == 0, r.stdout + r.stderr
    state = json.loads(r.stdout)
    assert state["enabled"] is False
    assert state["torch_parts"]["active"] == []
    if state["torch_parts"].get("torch") != "not installed":
        assert state["torch_parts"]["off"]["FX"] == "OBJCACHE_ENABLE=0"
        assert state["torch_parts"]["off"]["Triton"] in (
            "OBJCACHE_ENABLE=0",
            "triton is not installed",
        )
    assert state["unknown_variables"] == {"OBJCACHE_TIER": "OBJCACHE_TIERS"}
    assert state["signing"]["scheme"] == "ed25519"
    [key_id] = state["signing"]["key_ids"]
    assert key_id.startswith("ed25519:") and state["verification"]["key_ids"] == [key_id]
    assert state["verification"]["unsigned_refused"] is True
    assert state["read_only"] is False
    assert public.removeprefix("ed25519:") not in r.stdout  # ids, never key material
    assert [t["ok"] for t in state["tiers"]] == [True, True]
    text = run_cli("doctor", extra=extra)
    assert "verification: unsigned entries refused; keys " + key_id in text.stdout
    assert "unknown variables: OBJCACHE_TIER (did you mean OBJCACHE_TIERS?)" in text.stdout


def test_doctor_is_honest_when_triton_is_off(run_cli: Run) -> None:
    r = run_cli("doctor", "--json", extra={"OBJCACHE_ENABLE": "1"})
    state = json.loads(r.stdout)
    assert "Triton" not in state["torch_parts"]["active"]


def test_a_misspelt_verify_variable_stops_every_command(run_cli: Run) -> None:
    r = run_cli("doctor", extra={"OBJCACHE_VERIFY_KEY": "ed25519:AAAA"})
    assert r.returncode == 2
    assert r.stderr.startswith(
        "objcache: error: OBJCACHE_VERIFY_KEY is not an objcache option; "
        "did you mean OBJCACHE_VERIFY_KEYS?"
    )


def test_every_command_that_prints_a_result_takes_json(
    run_cli: Run, cli_env: dict[str, str], tmp_path: Path
) -> None:
    populate(cli_env)
    store = f"file://{tmp_path}/store"
    pushed = run_cli("push", "--tier", f"file://{tmp_path}/other", "--json")
    assert pushed.returncode == 0, pushed.stderr
    push = json.loads(pushed.stdout)
    assert push["command"] == "push" and push["copied"] >= 5 and push["failed"] == 0
    verified = json.loads(run_cli("verify", "--tier", store, "--json").stdout)
    assert verified["tier"] == store and verified["checked"] >= 5 and verified["bad"] == []
    planned = json.loads(run_cli("gc", "--keep-env", "someotherenv", "--dry-run", "--json").stdout)
    assert [p["tier"] for p in planned] == [store]
    assert len(planned[0]["delete"]) >= 5 and planned[0]["deleted"] == 0
    dry = run_cli("gc", "--keep-env", "someotherenv", "--dry-run")
    lines = [line for line in dry.stdout.splitlines() if "would delete" in line]
    assert lines and all(line.startswith(f"  {store}: would delete v1/") for line in lines)
    bundles = run_cli("mega", "ls", "--json")
    assert bundles.returncode == 0 and json.loads(bundles.stdout) == []


def test_ls_refuses_a_misspelt_kind_and_lists_a_clients_own(
    run_cli: Run, cli_env: dict[str, str]
) -> None:
    populate(cli_env)
    typo = run_cli("ls", "--kind", "fxgraph")
    assert typo.returncode == 2, typo.stdout + typo.stderr
    assert typo.stderr.startswith(
        "objcache: error: --kind: unknown kind 'fxgraph': "
        "the kinds objcache stores are aot-autograd, "
    ), typo.stderr
    assert typo.stderr.rstrip().endswith("; did you mean 'fx-graph'?"), typo.stderr
    assert (
        len(typo.stderr.strip().splitlines()) == 1 and "fx-graph, isa-probe, kernel" in typo.stderr
    )
    assert run_cli("ls", "--kind", "fx-graph").stdout.count("key-") == 5
    client = Client(Config.from_env(cli_env))
    client.put("blob", "mine", b"a client's own kind")
    client.close()
    own = run_cli("ls", "--kind", "blob", "--json")
    assert own.returncode == 0 and [e["key"] for e in json.loads(own.stdout)] == ["mine"]


def test_every_kind_objcache_writes_is_in_the_central_list() -> None:
    from objcache.entry.layout import KINDS
    from tests.support.kinds import named_kinds, written_kinds

    assert written_kinds() | named_kinds() <= set(KINDS)


def test_mega_save_from_the_command_line_points_to_the_python_api(run_cli: Run) -> None:
    r = run_cli("mega", "save", "m")
    assert r.returncode == 2, r.stdout + r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("objcache: error: mega save: ") and "objcache.mega.save(NAME)" in line
    assert "nothing to save" not in line and "objcache push" in line
    shown = run_cli("mega", "--help")
    assert shown.returncode == 0 and "objcache.mega.save(NAME)" in shown.stdout
    assert not re.search(r"^\s+save\b", shown.stdout, re.MULTILINE), shown.stdout
    assert re.search(r"^\s+load\b", shown.stdout, re.MULTILINE), shown.stdout


def test_push_counts_an_entry_a_write_once_store_refuses_as_already_there() -> None:
    """A store that answers a write of a name it holds with an error, not "exists" (a
    read-only replica, a write-once bucket policy): what it holds is already there, and
    only what it lacks and refused is a failure."""
    import asyncio

    from objcache.backends.base import PutMode
    from objcache.cli import ops
    from objcache.entry.codec import Codec
    from objcache.entry.layout import Namespace
    from objcache.errors import PermanentBackendError
    from tests.support.memory_backend import MemoryBackend

    class WriteOnce(MemoryBackend):
        refuse_all = False

        async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
            if key in self.data or self.refuse_all:
                raise PermanentBackendError("AccessDenied", tier=self.name)
            return await super().put(key, data, mode)

    codec, namespace = Codec(), Namespace("e" * 16)
    keys = [namespace.object_key("fx-graph", f"k{i}") for i in range(3)]
    source, target = MemoryBackend("mem://source"), WriteOnce("mem://target")
    source.data = {k: codec.encode(k.encode(), k) for k in keys}
    target.data = {k: source.data[k] for k in keys[:2]}

    report = asyncio.run(ops.copy(source, [target], keys, codec))
    assert (report.copied, report.existed, report.failed) == (1, 2, 0), report
    assert set(target.data) == set(keys)

    refusing = WriteOnce("mem://refusing")
    refusing.refuse_all = True
    refusing.data = {keys[0]: source.data[keys[0]]}
    report = asyncio.run(ops.copy(source, [refusing], keys, codec))
    assert (report.copied, report.existed, report.failed) == (0, 1, 2), report


def test_a_copy_holds_large_entries_within_its_byte_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries of BUDGETED_BYTES and more hold their listed size of BULK_BYTE_BUDGET while
    copied (one over the budget goes alone); smaller ones are bounded by count only."""
    import asyncio

    from objcache.backends.base import PutMode
    from objcache.cli import ops
    from objcache.entry.codec import Codec
    from objcache.entry.layout import Namespace
    from tests.support.memory_backend import MemoryBackend

    monkeypatch.setattr(ops, "BUDGETED_BYTES", 100)
    monkeypatch.setattr(ops, "BULK_BYTE_BUDGET", 1000)
    held = peak = 0

    class Slow(MemoryBackend):
        async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
            nonlocal held, peak
            held += sizes[key]
            peak = max(peak, held)
            await asyncio.sleep(0.01)
            held -= sizes[key]
            return await super().put(key, data, mode)

    codec, namespace = Codec(), Namespace("e" * 16)
    keys = [namespace.object_key("fx-graph", f"k{i}") for i in range(12)]
    source, target = MemoryBackend("mem://source"), Slow("mem://target")
    source.data = {k: codec.encode(k.encode(), k) for k in keys}
    sizes = {k: 400 for k in keys[:10]}  # as listed: 2 at a time fit the budget
    sizes[keys[10]] = 5000  # over the budget: alone
    sizes[keys[11]] = 50  # under BUDGETED_BYTES: not counted against it
    report = asyncio.run(ops.copy(source, [target], keys, codec, sizes=sizes))
    assert report.copied == 12 and set(target.data) == set(keys)
    assert peak <= 5000 + 50, "the entry over the budget went alone (but for a small one)"
    held = peak = 0
    target.data.clear()
    asyncio.run(ops.copy(source, [target], keys[:10], codec, sizes=sizes))
    assert peak == 800, "two entries of 400 at a time within a budget of 1000"


@pytest.mark.parametrize("opened", ["as pull opens it", "bare"])
def test_an_interrupted_pull_counts_every_entry_it_wrote(tmp_path: Path, opened: str) -> None:
    """Ctrl-C landing after the local write of an entry, before its coroutine runs again:
    the entry is whole on disk, so the count an interrupted pull reports includes it. Pull
    writes through the command's deadline-bounded wrapper of the local tier: the count must
    survive it (it once went around it, and such an entry was on disk but not counted)."""
    import asyncio
    import threading

    from objcache.backends.base import PutMode
    from objcache.backends.disk.store import DiskBackend
    from objcache.cli import ops
    from objcache.config.urls import parse_tier_url
    from objcache.core.tier import Tier
    from objcache.entry.codec import Codec
    from objcache.entry.layout import Namespace
    from tests.support.memory_backend import MemoryBackend

    codec, namespace = Codec(), Namespace("e" * 16)
    okey = namespace.object_key("fx-graph", "k0")
    source = MemoryBackend("mem://source")
    source.data = {okey: codec.encode(b"graph", okey)}
    report = ops.CopyReport()
    stop: list[asyncio.Task[ops.CopyReport]] = []
    stopped = threading.Event()

    class CancelledAfterTheWrite(DiskBackend):
        """The worker thread that wrote the entry cancels the copy and holds on until the
        cancellation has ended it: the coroutine never sees the write's answer."""

        def _written(self) -> None:
            loop = stop[0].get_loop()
            loop.call_soon_threadsafe(stop[0].cancel)
            assert stopped.wait(30)

        async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
            return await super().put_then(key, data, mode, lambda _: self._written())

        async def put_then(self, key, data, mode, then):  # type: ignore[no-untyped-def]
            def after(stored: bool) -> None:
                then(stored)
                self._written()

            return await super().put_then(key, data, mode, after)

    disk = CancelledAfterTheWrite(parse_tier_url(f"disk://{tmp_path / 'local'}"))
    target = Tier.for_command(disk, timeout_ms=30_000).bounded() if opened != "bare" else disk

    async def main() -> None:
        task = asyncio.create_task(ops.copy(source, [target], [okey], codec, report=report))
        task.add_done_callback(lambda _: stopped.set())
        stop.append(task)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert stop[0].cancelled()
    report.settle()
    on_disk = asyncio.run(disk.get(okey))
    assert on_disk == source.data[okey]
    assert (report.copied, report.bytes, report.writing) == (1, len(on_disk), 0), report


@pytest.mark.parametrize("thread", ["answers after the deadline", "answered before it"])
def test_a_local_write_past_its_deadline_is_counted_once(thread: str) -> None:
    """The command's deadline ends the wait for a local write whose thread still runs: the
    entry is counted once at most (never as copied and as already there), and no write is
    left counted as under way, so an interrupted pull's wait for its writes still holds."""
    import asyncio
    import threading

    from objcache.cli import ops
    from objcache.entry.codec import Codec
    from objcache.entry.layout import Namespace
    from objcache.errors import TransientBackendError
    from tests.support.memory_backend import MemoryBackend

    codec, namespace = Codec(), Namespace("e" * 16)
    okey = namespace.object_key("fx-graph", "k0")
    source = MemoryBackend("mem://source")
    source.data = {okey: codec.encode(b"graph", okey)}
    late = thread == "answers after the deadline"
    go = threading.Event()
    writers: list[threading.Thread] = []

    class SlowLocal(MemoryBackend):
        async def put_then(self, key, data, mode, then):  # type: ignore[no-untyped-def]
            def write() -> None:
                go.wait(30)
                self.data[key] = data
                then(True)

            writers.append(threading.Thread(target=write))
            writers[0].start()
            if not late:
                go.set()
                writers[0].join(30)
            raise TransientBackendError("put: no answer within 5 ms", tier=self.name)

    target = SlowLocal("mem://local")
    report = asyncio.run(ops.copy(source, [target], [okey], codec))
    go.set()
    writers[0].join(30)
    assert target.data[okey] == source.data[okey]
    assert report.writing == 0, report
    if late:  # given up: what the store then says (here: it was already there by then)
        assert (report.copied, report.existed + report.failed) == (0, 1), report
    else:
        assert (report.copied, report.existed, report.failed) == (1, 0, 0), report


def test_ctrl_c_ends_a_command_even_when_a_store_client_swallows_the_cancellation() -> None:
    """A store's client may turn the cancellation Ctrl-C starts into a timeout of its own and
    return: the command still ends in KeyboardInterrupt (exit 130), not as if it had run."""
    import asyncio
    import signal

    from objcache.cli.common import run_async

    async def stubborn() -> str:
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGINT)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return "timed out"  # what such a client reports instead of the cancellation
        return "ran"

    with pytest.raises(KeyboardInterrupt):
        run_async(stubborn())


@pytest.mark.parametrize(
    "pointer", [b"[1, 2, 3]", b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe", b"{" * 70_000]
)
def test_a_hostile_mega_pointer_is_one_line_and_exit_2(
    run_cli: Run, cli_env: dict[str, str], pointer: bytes
) -> None:
    """Any fleet node can write a bundle's pointer: a list, JSON nested past Python's
    recursion limit, bytes that are not JSON, an oversized one."""
    from objcache.integrations.torch.mega import mega

    client = Client(Config.from_env(cli_env))
    try:
        mega.write_overwrite(client, mega.pointer_key("planted"), pointer)
    finally:
        client.close()
    r = run_cli("mega", "load", "planted")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("objcache: error: mega load: "), r.stderr


def test_push_refuses_an_inductor_dir_others_could_have_filled(
    run_cli: Run, tmp_path: Path
) -> None:
    """A symlinked or group-writable ``--inductor-dir`` is a one-line error, exit 2, and
    nothing is published."""
    real = tmp_path / "inductor"
    (real / "fxgraph" / "ab" / "fkey").mkdir(parents=True)
    (real / "fxgraph" / "ab" / "fkey" / "entry").write_bytes(b"\x80graph")
    link = tmp_path / "inductor-link"
    link.symlink_to(real)
    r = run_cli("push", "--inductor-dir", str(link))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "is a symlink" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    real.chmod(0o777)
    r = run_cli("push", "--inductor-dir", str(real))
    assert r.returncode == 2 and "writable by group or others" in r.stderr, r.stderr
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").rglob("*fkey*"))
