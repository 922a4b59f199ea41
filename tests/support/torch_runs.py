"""Helpers for the torch integration tests: compile subprocesses, fault tiers, a g++ counter.

Compiles run in subprocesses through :func:`run_compile`, which starts the shared workload
(``objcache.demo.demo --worker``) via :func:`bootstrap`. The bootstrap can
register the ``fault://`` test scheme (a tier that errors or hangs) and load
``objcache-autoload.pth`` from a site dir, exactly as site.py would for an installed
package. ``g++`` calls are counted by a shim put first on ``PATH``: the count is independent
of objcache's own counters.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from objcache.backends.base import Backend, ObjectInfo, PutMode, TierSpec
from objcache.errors import PermanentBackendError
from tests.support.paths import ROOT

PTH_SOURCE = ROOT / "setup.py"

BOOTSTRAP = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from tests.support.torch_runs import bootstrap; sys.exit(bootstrap(sys.argv[1:]))"
)


class FaultBackend(Backend):
    """``fault:///name?mode=error|hang``: a tier that never works (for tests only)."""

    @property
    def mode(self) -> str:
        return self.spec.options.get("mode", "error")

    async def _fail(self) -> None:
        if self.mode == "hang":
            await asyncio.sleep(3600)
        raise PermanentBackendError(f"{self.spec.url}: injected failure")

    async def get(self, key: str) -> bytes | None:
        await self._fail()
        return None

    async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
        await self._fail()
        return False

    async def exists(self, key: str) -> bool:
        await self._fail()
        return False

    async def delete(self, key: str) -> bool:
        await self._fail()
        return False

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        await self._fail()
        item: ObjectInfo
        for item in ():  # pragma: no cover - never reached
            yield item


def register_fault_backend() -> None:
    from objcache.config import registry

    registry.register("fault", "tests.support.torch_runs:FaultBackend")


def fault_spec(mode: str) -> TierSpec:
    return TierSpec(f"fault:///t?mode={mode}", "fault", "", "/t", {"mode": mode})


def bootstrap(argv: Sequence[str]) -> int:
    """Entry point of compile subprocesses (see :data:`BOOTSTRAP`)."""
    register_fault_backend()
    site_dir = os.environ.get("OBJCACHE_TEST_SITE_DIR")
    if site_dir:
        import site

        site.addsitedir(site_dir)  # processes objcache-autoload.pth like an installed package
    from objcache.demo.demo_worker import worker_main

    return worker_main(list(argv))


def pth_line() -> str:
    """The .pth line setup.py ships (read from setup.py without running it)."""
    import ast

    tree = ast.parse(PTH_SOURCE.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "PTH_LINE":
            value = ast.literal_eval(node.value)
            assert isinstance(value, str)
            return value
    raise AssertionError("setup.py defines no PTH_LINE")


def make_site_dir(path: Path) -> Path:
    """A site dir holding objcache-autoload.pth exactly as the wheel ships it."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "objcache-autoload.pth").write_text(pth_line())
    return path


def make_gxx_shim(directory: Path, *, delay_s: float = 0.0) -> tuple[Path, Path]:
    """A ``g++`` that logs its arguments, then runs the real one (``delay_s`` later: a slow
    build on purpose). Returns (bin dir, log)."""
    real = shutil.which("g++")
    assert real, "g++ is needed for the compile tests"
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "gxx.log"
    shim = directory / "g++"
    pause = f"sleep {delay_s}\n" if delay_s else ""
    shim.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\n{pause}exec "{real}" "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory, log


def gxx_builds(log: Path) -> list[str]:
    """Logged g++ runs that produced an output (not ``-E`` preprocessing, not ``-v``)."""
    if not log.exists():
        return []
    runs = [line for line in log.read_text().splitlines() if line.strip()]
    return [r for r in runs if " -o " in f" {r} " and " -E " not in f" {r} "]


def is_isa_probe(build: str) -> bool:
    """Whether a logged g++ run compiled one of torch's vector-ISA probes
    (``cpu_vec_isa.VecISA.check_build``: ``__*_chk_kernel*`` functions), not a kernel."""
    source = next((arg for arg in build.split() if arg.endswith(".cpp")), "")
    try:
        return re.search(r"\b__\w*_chk_kernel\w*\(", Path(source).read_text()) is not None
    except OSError:
        return False


#: The plain path (graphs, AOTAutograd entries, kernels, profiles; Dynamo traces as usual),
#: for a test whose subject is its lookups and counters: with precompile entries served
#: (``OBJCACHE_PRECOMPILE=1`` in the environment) a frame is not traced and those lookups
#: never happen. Precompile entries have their own files (docs/testing.md).
PLAIN_PATH = {"OBJCACHE_PRECOMPILE": "0"}


def compile_env(root: Path, tiers: str, *, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a fresh simulated machine under ``root`` using ``tiers``."""
    from objcache.demo.demo_jobs import machine_env

    env = machine_env(str(root), base)
    env.update(
        OBJCACHE_TIERS=tiers,
        OBJCACHE_TIMEOUT_MS="400",
        OBJCACHE_JOB="objcache-torch-test",
        OBJCACHE_STATS_FILE=str(root / "stats.json"),
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        TORCHINDUCTOR_COMPILE_THREADS=env.get("TORCHINDUCTOR_COMPILE_THREADS", "2"),
    )
    for var in ("OBJCACHE_ENABLE", "OBJCACHE_READ_ONLY", "TORCHINDUCTOR_FORCE_DISABLE_CACHES"):
        env.pop(var, None)
    return env


def run_compile(
    env: Mapping[str, str], args: Sequence[str] = (), *, timeout: float = 600.0
) -> dict[str, Any]:
    """Run the workload in a subprocess; returns its result dict (asserts it ran)."""
    from objcache.demo.demo_jobs import run_job

    command = [sys.executable, "-c", BOOTSTRAP.format(root=str(ROOT))]
    job = run_job(["--model", "tiny", *args], env, command=command, timeout=timeout)
    detail = "\n".join(job.stderr_tail[-40:])
    assert job.ok, f"compile subprocess failed: {job.result.get('error')}\n{detail}"
    result = dict(job.result)
    result["wall_s"] = job.wall_s
    result["stderr_tail"] = job.stderr_tail[-20:]  # objcache's warnings, for a failing test
    return result


def tier_stats(result: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    for tier in result.get("stats", {}).get("tiers", []):
        if str(tier["name"]).startswith(prefix):
            return dict(tier)
    raise AssertionError(f"no tier {prefix!r} in {json.dumps(result.get('stats'))[:500]}")


def store_hits(result: Mapping[str, Any], prefix: str) -> int:
    """Entries the store under ``prefix`` served the run: to its lookups, and to its
    start-up prefetch, in the process or in its own (objcache/prefetch_process.py)."""
    stats = result.get("stats", {})
    child = stats.get("prefetch_process", {}).get("tiers", [])
    return int(tier_stats(result, prefix)["hits"]) + sum(
        int(t["hits"]) for t in child if str(t["name"]).startswith(prefix)
    )


def python_c(code: str, env: Mapping[str, str]) -> str:
    """``python -c code`` in ``env``; its stdout (asserts it ran)."""
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


#: The deadline of the writer/reader tests' lookups on their ``file://`` store: they count
#: hits exactly, and a loaded 2-core machine took longer than ``compile_env``'s 400 ms to
#: read and check an entry (a counted miss, a flaky count); no test of these times a tier.
FILE_STORE_TIMEOUT_MS = "5000"


def file_store_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """This environment less its ``OBJCACHE_*``, with this tree importable, a ``file://`` store
    and a local tier under ``tmp_path``, and ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJCACHE_")}
    env.update(
        PYTHONPATH=str(ROOT),
        OBJCACHE_TIERS=f"file://{tmp_path / 'store'}",
        OBJCACHE_LOCAL_DIR=str(tmp_path / "local"),
        **settings,
    )
    return env


def zero_code_python(tmp_path: Path, program: str) -> str:
    """``program``'s output in a process where objcache is on through the zero-code path
    (the ``.pth`` of a site folder, ``OBJCACHE_ENABLE=1``, a local tier under ``tmp_path``)."""
    site_dir = make_site_dir(tmp_path / "site")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJCACHE_")}
    env.update(
        PYTHONPATH=str(ROOT), OBJCACHE_ENABLE="1", OBJCACHE_LOCAL_DIR=str(tmp_path / "local")
    )
    return python_c(f"import site; site.addsitedir({str(site_dir)!r})\n{program}", env)


def precompile_machine_env(path: Path, store: Path) -> dict[str, str]:
    """A fresh simulated machine at ``path`` (created) on the ``file://`` store ``store``,
    precompile entries on, no prefetch: the writer/reader tests' machines."""
    path.mkdir(parents=True)
    env = compile_env(path, f"file://{store}")
    env.update(
        OBJCACHE_PRECOMPILE="1",
        OBJCACHE_PREFETCH="0",
        PYTHONDONTWRITEBYTECODE="1",
        OBJCACHE_TIMEOUT_MS=FILE_STORE_TIMEOUT_MS,
    )
    return env


def run_script(path: Path, program: str, env: Mapping[str, str]) -> dict[str, Any]:
    """``program`` written to ``path/program.py`` and run there with ``path`` first on
    ``PYTHONPATH`` (its helper modules beside it); the dict it printed as ``RESULT <json>``
    (asserts it ran)."""
    (path / "program.py").write_text(program)
    run_env = {**env, "PYTHONPATH": os.pathsep.join([str(path), env.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, str(path / "program.py")],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=path,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result
