"""What a hostile store writer can do to the operator and to bulk commands (docs/security.md,
"What the CLI prints", "Files in shared folders", "Bulk commands").

- Strings from a store (key names from listings, kinds, env folders, ``ENV.json`` fields,
  run-summary hosts, kinds and reasons, Mega-Cache bundle names and contents) reach the
  terminal as plain text: no control byte, never rich markup; ``--json`` too.
- Every decode of stored bytes has a cap: a run summary decompresses at most
  ``summary.MAX_BYTES``, an ``ENV.json`` is read at most ``ops.ENV_FILE_MAX_BYTES``.
- The Prometheus textfile never follows a symlink planted in its (shared) folder.
- ``pull`` and ``push`` read and verify each entry with its kind's size cap.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from objcache.backends import create_backend
from objcache.backends.base import Backend, ObjectInfo, PutMode
from objcache.cli import ops
from objcache.client import Client
from objcache.config.settings import Config
from objcache.config.urls import parse_tier_list
from objcache.core.tier import Tier
from objcache.entry.caps import SizeCaps
from objcache.entry.codec import Codec
from objcache.entry.layout import MAX_PLAIN_SEGMENT, Namespace, encode_key
from objcache.observe import run_summary as summary
from objcache.observe.plaintext import plain
from objcache.observe.prometheus import TextfileExporter

Run = Callable[..., subprocess.CompletedProcess[bytes]]

#: Bytes no output may carry: C0 controls but newline, and DEL (C1 is checked once decoded).
CONTROL_BYTES = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]")
C1 = re.compile("[\x80-\x9f]")

TITLE = "\x1b]0;owned\x07"  # OSC: sets the terminal's title
CLEAR = "\x1b[2J"  # CSI: clears the screen
CSI_C1 = "\x9b31m"  # the one-byte C1 CSI
HOSTILE = [
    TITLE,
    CLEAR + "k",
    CSI_C1 + "k",
    "x[/]",
    "[bold red]x[/]",
    ":skull:",
    "bidi\u202eevil",
    "nul\x00byte",
    CLEAR * 30,  # long: 240 bytes once encoded, near the 255 a file name may have
]
JOB = "fuzzjob"
#: ops.ENV_FILE_MAX_BYTES, the largest ENV.json read
ENV_CAP = 64 << 10


def assert_clean(result: subprocess.CompletedProcess[bytes], *codes: int) -> None:
    """The command ended with one of ``codes``, without a traceback, and neither stream
    carries a control character."""
    out, err = result.stdout[-3000:], result.stderr[-3000:]
    shown = f"rc={result.returncode}\nstdout={out!r}\nstderr={err!r}"
    assert result.returncode in codes, shown
    for stream in (result.stdout, result.stderr):
        assert CONTROL_BYTES.search(stream) is None, shown
        assert C1.search(stream.decode()) is None, shown  # valid UTF-8 too
    assert b"Traceback" not in result.stderr, shown


def plant(root: Path, okey: str, data: bytes) -> None:
    """A file at ``okey`` in a ``file://`` store, folders 0700 as the store makes them."""
    path = root / okey
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_bytes(data)


def entry_at(root: Path, okey: str, payload: bytes = b"payload") -> None:
    plant(root, okey, Codec().encode(payload, okey))


def summary_at(root: Path, env: str, run: str, body: dict[str, Any] | bytes) -> None:
    okey = Namespace(env).object_key(summary.KIND, f"{JOB}/{run}")
    data = body if isinstance(body, bytes) else summary.encode(body)
    entry_at(root, okey, data)


def hostile_summary(run: str, **changes: Any) -> dict[str, Any]:
    stats = {
        "cache": {"gets": {k: 2 for k in HOSTILE[:6]}, "hits": {HOSTILE[0]: 1}},
        "tiers": [
            {
                "name": TITLE + "s3://b/p",
                "local": False,
                "kinds": {HOSTILE[3]: {"hit": 1, CLEAR + "reason": 1, "[red]x[/]": 2}},
                "bytes_read": 10,
            }
        ],
    }
    body = summary.build(
        stats, job=JOB, run=run, started=1_700_000_000.0, ended=1_700_000_001.0,
        environ={}, host=TITLE + CLEAR + CSI_C1 + "x[/]" + "\x1b[2J" * 100,
    )  # fmt: skip
    body.update(changes)
    return body


@pytest.fixture
def terminal_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "OBJCACHE_TIERS": f"file://{tmp_path}/store",
        "OBJCACHE_LOCAL_DIR": str(tmp_path / "local"),
        "OBJCACHE_STATS_FILE": str(tmp_path / "stats.json"),
        "OBJCACHE_PREFETCH": "0",
        "OBJCACHE_JOB": JOB,
        "OBJCACHE_RUN_SUMMARY": "0",
        "COLUMNS": "",
    }


@pytest.fixture
def run_cli_bytes(terminal_env: dict[str, str]) -> Run:
    def _run(*args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "objcache.cli", *args],
            env={**terminal_env, **(extra or {})},
            capture_output=True,
            timeout=120,
        )

    return _run


def corrupt_key(envid: str) -> str:
    return f"v1/{envid}/k{CLEAR}/00/{TITLE}corrupt"


def hostile_store(tmp_path: Path, env: dict[str, str]) -> str:
    """A store holding, in this environment, hostile names, kinds, summaries, bundles and
    ``ENV.json`` files; returns the environment id."""
    store = tmp_path / "store"
    client = Client(Config.from_env(env))
    for name in HOSTILE:  # valid entries, their names hostile once decoded from a listing
        client.put("fx-graph", name, b"value" * 50)
    envid = client.cache.namespace.env
    client.close()
    ns = Namespace(envid)
    for kind in (f"k{CLEAR}", "x[bold]", f"k{CSI_C1}"):  # hostile kind folders
        entry_at(store, f"v1/{envid}/{kind}/00/key")
    # a bad entry verify and pull name: its raw file name is hostile, not only once decoded
    plant(store, corrupt_key(envid), b"OBJC" + b"\x1b[2J" * 20)
    # a file name that is not UTF-8: listed with a lone surrogate (os.fsdecode)
    raw = os.fsencode(store / ns.object_key("fx-graph", "x")).replace(b"/x", b"/\xff\x9b")
    os.makedirs(os.path.dirname(raw), mode=0o700, exist_ok=True)
    with open(raw, "wb") as f:
        f.write(b"not an entry")
    # other environments: hostile folder names and ENV.json files of every wrong shape
    envs: dict[str, bytes] = {
        f"e{TITLE}": json.dumps({"torch": TITLE, "cpu_isa": "[/]", "gpu": CLEAR * 2000}).encode(),
        "elist": b"[1, 2]",
        "estring": b'"\\u001b[2J"',
        "enull": b"null",
        "etypes": json.dumps({"torch": {"x": [CLEAR]}, "gpu": None, "cpu_isa": 7}).encode(),
        "edeep": b"[" * 30_000 + b"]" * 30_000,  # under the cap, too deep for json
        "ebinary": b"\xff\xfe\x1b[2J",
        "ehuge": json.dumps({"torch": "x" * ENV_CAP}).encode(),
    }
    for name, body in envs.items():
        plant(store, f"v1/{name}/ENV.json", body)
        entry_at(store, f"v1/{name}/fx-graph/00/{encode_key(TITLE)}")
    # run summaries: hostile strings, wrong types, a bomb, all valid entries
    summary_at(store, envid, "run-1700000000-1-aa", hostile_summary("run-1700000000-1-aa"))
    summary_at(store, envid, "run-1700000001-1-bb", hostile_summary("run-1700000001-1-bb", host=7))
    summary_at(store, envid, "run-1700000002-1-cc", b'{"format": 1, "kinds": [1]}')
    summary_at(store, envid, "run-1700000003-1-dd", b"\x1b[2J" * 10_000)
    # Mega-Cache bundles: hostile names and recorded contents of wrong types
    for i, contents in enumerate(
        [
            {"artifacts": {TITLE: 1, "[/]": 2}, "kernels": 0, "missing_kernels": 0},
            {"artifacts": [CLEAR], "kernels": "x", "missing_kernels": None},
            {"artifacts": {CLEAR: "9" * 5000}, "kernels": 1, "missing_kernels": 0},
        ]
    ):
        name = f"b{i}{HOSTILE[i]}"
        entry_at(store, ns.object_key("mega", name), b"bundle")
        pointer = Namespace("bundles").object_key("mega", name)
        entry_at(store, pointer, json.dumps({"env": envid, "contents": contents}).encode())
    return envid


def test_every_command_prints_store_strings_as_plain_text(
    run_cli_bytes: Run, terminal_env: dict[str, str], tmp_path: Path
) -> None:
    envid = hostile_store(tmp_path, terminal_env)
    store = f"file://{tmp_path}/store"
    for args in (["ls"], ["ls", "--all-envs"], ["ls", "--kind", "x[bold]"], ["ls", "--envs"]):
        assert_clean(run_cli_bytes(*args), 0)
    listing = run_cli_bytes("ls", "--all-envs", "--json")
    assert_clean(listing, 0)
    keys = {e["key"] for e in json.loads(listing.stdout)}
    # A name too long for one path segment is listed as its mapped name (docs/architecture.md,
    # "Long keys"), escaped the same way.
    short = {h for h in HOSTILE if len(encode_key(h)) <= MAX_PLAIN_SEGMENT}
    assert short and short <= keys, "the names are escaped for the terminal, not changed"
    envs = run_cli_bytes("ls", "--envs", "--json")
    assert_clean(envs, 0)
    found = json.loads(envs.stdout)
    assert found[f"e{TITLE}"]["fields"]["torch"] == TITLE
    for name in ("elist", "estring", "enull", "edeep", "ebinary"):
        assert found[name]["fields"] == {"error": "unreadable ENV.json"}, name
    assert found["etypes"]["fields"]["cpu_isa"] == 7
    assert found["ehuge"]["fields"] == {"error": "ENV.json too large"}

    verify = run_cli_bytes("verify", "--tier", store)
    assert_clean(verify, 1)  # 1: it found the bad entry, and says so
    assert b"1 bad" in verify.stdout
    # the name that is not UTF-8 is no entry: skipped and counted, in one escaped line
    assert b"1 stored names skipped: not UTF-8" in verify.stderr
    assert plain(corrupt_key(envid)).encode() in verify.stdout

    for args in (["report", "--job", JOB], ["report", "--job", JOB, "--json"]):
        assert_clean(run_cli_bytes(*args, "--env", envid), 0)
    report = json.loads(run_cli_bytes("report", "--job", JOB, "--env", envid, "--json").stdout)
    hosts = [r["host"][: len(TITLE)] for r in report["runs"] if r["summary"]]
    assert hosts == [TITLE], "escaped for the terminal, as they are in JSON"
    assert report["total"]["skipped_reasons"] == {"invalid": 3}

    bundles = run_cli_bytes("mega", "ls")
    assert_clean(bundles, 0)
    assert bundles.stdout.count(b"\n") == 3, bundles.stdout

    pull = run_cli_bytes("pull", "--tier", store)
    assert_clean(pull, 0)  # the corrupt entry is a warning naming it, escaped
    assert plain(corrupt_key(envid)).encode() in pull.stderr
    assert_clean(run_cli_bytes("push", "--tier", f"file://{tmp_path}/seeded"), 0)
    assert_clean(run_cli_bytes("gc", "--keep-env", "other", "--dry-run", "--tier", store), 0)


def test_a_markup_or_control_name_in_an_error_is_one_plain_line(
    run_cli_bytes: Run, tmp_path: Path
) -> None:
    """An error that quotes a name (here a store root others can write) is printed plain."""
    root = tmp_path / f"s{TITLE}{CLEAR}[bold]x[red]"
    root.mkdir()
    root.chmod(0o777)
    r = run_cli_bytes("ls", "--tier", f"file://{root}")
    assert_clean(r, 1)
    assert r.stderr.startswith(b"objcache: error: ") and b"writable by others" in r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr


def test_a_summary_bomb_is_refused_before_decompression(tmp_path: Path) -> None:
    """A few KiB stored, 64 MiB once decompressed: refused as ``too_large`` by the codec's
    cap check, which runs before zstd sees a byte (a summary is at most MAX_BYTES)."""
    from objcache.cli import report

    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    run = "run-1700000000-1-aa"
    body = summary.encode(hostile_summary(run))
    bomb = body[:-1] + b"," + b'"pad":"' + b" " * (64 << 20) + b'"}'
    summary_at(store, "env", run, bomb)
    assert (store / Namespace("env").object_key(summary.KIND, f"{JOB}/{run}")).stat().st_size < (
        summary.MAX_BYTES
    )
    backend = create_backend(parse_tier_list(f"file://{store}", "t")[0])
    found = asyncio.run(report.collect(backend, Codec(), env="env", job=JOB))
    assert found.skipped == {"too_large": 1}


def test_an_env_file_over_its_cap_is_not_read(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    plant(store, "v1/e/ENV.json", b'{"torch": "' + b"x" * (ENV_CAP * 4) + b'"}')
    inner = create_backend(parse_tier_list(f"file://{store}", "t")[0])
    spy = Spy(inner)
    found = asyncio.run(ops.environments(spy))
    assert found["e"]["fields"] == {"error": "ENV.json too large"}
    assert spy.whole_reads == [] and spy.capped == [("v1/e/ENV.json", ENV_CAP)]
    assert ops.ENV_FILE_MAX_BYTES == ENV_CAP


# --- the Prometheus textfile ------------------------------------------------------------------


def test_the_prometheus_textfile_never_follows_a_planted_symlink(tmp_path: Path) -> None:
    """Symlinks at every name the writer could predict (prometheus_client's
    ``<path>.<pid>.<thread>``, the stats file's ``.<name>.<pid>``, the path itself) point
    outside the shared folder: none of their targets is written."""
    shared = tmp_path / "textfiles"
    shared.mkdir()
    prom = shared / "objcache.prom"
    victims = []
    names = [
        f"{prom.name}.{os.getpid()}.{threading.get_ident()}",
        f"{prom.name}.{os.getpid()}.{threading.main_thread().ident}",
        f".{prom.name}.{os.getpid()}",
        prom.name,
    ]
    for i, name in enumerate(names):
        victim = tmp_path / f"victim-{i}"
        victim.write_text("precious")
        victims.append(victim)
        if not (shared / name).is_symlink():
            os.symlink(victim, shared / name)
    exporter = TextfileExporter(prom, interval_s=0)
    assert exporter.write({"cache": {"gets": {"fx-graph": 3}}})
    assert [v.read_text() for v in victims] == ["precious"] * len(victims)
    assert not prom.is_symlink()
    assert 'objcache_lookups_total{kind="fx-graph"} 3.0' in prom.read_text()
    assert prom.stat().st_mode & 0o777 == 0o644 & ~_umask()
    left = {p.name for p in shared.iterdir()} - set(names)
    assert left == set(), "no temporary file left behind"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- bulk commands and the per-kind caps ------------------------------------------------------


class Spy(Backend):
    """A backend that records how each object was read: whole (``get``) or capped."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner.spec)
        self.inner = inner
        self.whole_reads: list[str] = []
        self.capped: list[tuple[str, int]] = []

    async def get(self, key: str) -> bytes | None:
        self.whole_reads.append(key)
        return await self.inner.get(key)

    async def get_capped(self, key: str, max_bytes: int) -> bytes | None:
        self.capped.append((key, max_bytes))
        return await self.inner.get_capped(key, max_bytes)

    async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
        return await self.inner.put(key, data, mode)

    async def exists(self, key: str) -> bool:
        return await self.inner.exists(key)

    async def delete(self, key: str) -> bool:
        return await self.inner.delete(key)

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        return self.inner.list(prefix)


CAPS = SizeCaps.parse("1G,pgo=16k", "test")
BIG = os.urandom(256 << 10)  # incompressible: 256 KiB stored, 16 times the pgo cap


def _stores(tmp_path: Path) -> tuple[Spy, Backend, str, str]:
    source = Spy(create_backend(parse_tier_list(f"file://{tmp_path / 'src'}", "t")[0]))
    target = create_backend(parse_tier_list(f"file://{tmp_path / 'dst'}", "t")[0])
    ns = Namespace("env")
    big, small = ns.object_key("pgo", "big"), ns.object_key("pgo", "small")

    async def seed() -> None:
        await source.put(big, Codec().encode(BIG, big))
        await source.put(small, Codec().encode(b"profile", small))

    asyncio.run(seed())
    return source, target, big, small


def test_copy_refuses_an_object_over_its_kinds_cap_without_reading_it(tmp_path: Path) -> None:
    """``pull``/``push`` (ops.copy) through the CLI's deadline wrapper: an object over the
    pgo cap at a pgo key is read capped, refused, and never written."""
    source, target, big, small = _stores(tmp_path)

    async def copy() -> ops.CopyReport:
        return await ops.copy(
            Tier.for_command(source, timeout_ms=10_000).bounded(),
            [target],
            [big, small],
            Codec(),
            caps=CAPS,
        )

    report = asyncio.run(copy())
    assert (report.copied, report.refused, report.failed) == (1, 1, 0), report.errors
    assert source.whole_reads == [], "never a plain get: it reads the whole object"
    assert set(source.capped) == {(big, 16 << 10), (small, 16 << 10)}
    assert asyncio.run(target.get(big)) is None and asyncio.run(target.get(small)) is not None


def test_copy_verifies_with_the_kinds_cap() -> None:
    """A zstd entry small on the wire whose payload is over the cap: refused by verify."""
    okey = Namespace("env").object_key("pgo", "bomb")
    entry = Codec().encode(b"\0" * (1 << 20), okey)
    assert len(entry) < 16 << 10
    source = Spy(_MemoryOne(okey, entry))
    report = asyncio.run(ops.copy(source, [], [okey], Codec(), caps=CAPS))
    assert report.refused == 1 and "over the 16384 cap" in report.errors[0]


def test_verify_reads_and_checks_with_the_kinds_cap(tmp_path: Path) -> None:
    source, _, big, _ = _stores(tmp_path)
    report = asyncio.run(
        ops.verify(Tier.for_command(source, timeout_ms=10_000).bounded(), Codec(), caps=CAPS)
    )
    assert report.checked == 2 and report.bad == [(big, "too_large")]
    assert source.whole_reads == []
    # Over this caller's caps is not corrupt: --delete leaves it to a machine with larger caps.
    kept = asyncio.run(
        ops.verify(
            Tier.for_command(source, timeout_ms=10_000).bounded(), Codec(), caps=CAPS, delete=True
        )
    )
    assert kept.bad == [(big, "too_large")] and kept.deleted == 0
    assert asyncio.run(source.exists(big))


def test_pull_applies_the_configured_caps(run_cli_bytes: Run, tmp_path: Path) -> None:
    """Through the CLI: OBJCACHE_MAX_ENTRY_BYTES reaches pull's reads."""
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    from objcache.config.fingerprint import env_id

    ns = Namespace(env_id())
    big, small = ns.object_key("pgo", "big"), ns.object_key("pgo", "small")
    entry_at(store, big, BIG)
    entry_at(store, small, b"profile")
    r = run_cli_bytes("pull", extra={"OBJCACHE_MAX_ENTRY_BYTES": "1G,pgo=16k"})
    assert_clean(r, 0)
    assert b"1 copied" in r.stdout and b"1 refused" in r.stdout, r.stdout
    assert (tmp_path / "local" / small).exists() and not (tmp_path / "local" / big).exists()


class _MemoryOne(Backend):
    """One object in memory (``get_capped`` checks the size, as the base class does)."""

    def __init__(self, okey: str, data: bytes) -> None:
        super().__init__(parse_tier_list("file:///nonexistent", "t")[0])
        self.okey, self.data = okey, data

    async def get(self, key: str) -> bytes | None:
        return self.data if key == self.okey else None

    async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
        raise AssertionError("nothing is written")

    async def exists(self, key: str) -> bool:
        return key == self.okey

    async def delete(self, key: str) -> bool:
        raise AssertionError("nothing is deleted")

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        for _ in ():
            yield ObjectInfo(self.okey, len(self.data), 0.0)
