"""Warm-start benchmark: how long the first training step takes, per way of starting.

    python bench/warm_start.py [--runs 3] [--model block|tiny|torchvision:NAME|timm:NAME]
        [--remote file|redis|NAME=URL]...

Every run is a fresh process running the shared workload
(``python -m objcache.demo.demo --worker``: compile, one forward+backward step,
compare with eager). A "fresh machine" is a fresh set of local dirs: objcache local tier,
``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR`` and ``TMPDIR`` (where Inductor keeps
precompiled headers); only the remote store is shared.

Scenarios (medians of ``--runs`` runs each, interleaved round by round to spread noise). The
baseline of every ratio is torch's own warm local cache, never a cold start:

* torch alone, warm-local — objcache off, torch's caches on, the machine of an earlier cold
  run (the baseline: what a user's second run costs without objcache);
* objcache, warm-local — objcache installed, the machine of an earlier objcache run;
* objcache, new machine (<remote>) — objcache installed, fresh machine, warm store (and the
  job's prefetch manifest, recorded by the cold run); again behind a FaultProxy adding
  ``--rtt-ms`` (default 50) per round trip for every networked remote (a store a region
  away);
* objcache, new machine with precompile entries (<remote>) — the slot for Dynamo's own work
  carried by objcache (:func:`precompile_scenarios`);
* eager, first step — the same step without ``torch.compile`` (what compiling competes with);
* caches off — ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``, fresh machine;
* cold — torch's caches on, fresh machine;
* torch's built-in Redis remote cache (when ``--remote redis`` is given) — objcache off,
  ``TORCHINDUCTOR_{FX_GRAPH,AUTOGRAD}_REMOTE_CACHE=1`` on the same redis-server, fresh
  machine; again at the added RTT;
* Mega-Cache load then compile — ``torch.compiler.load_cache_artifacts`` of a cold run's
  artifacts, fresh machine;
* ``--guarded``: dynamic shapes across processes, guard variants served by guarded
  candidates, and the candidate lookup cost at 0/50 ms RTT (``bench/warm_start_guarded.py``);
* objcache bundle with install() — ``objcache.mega.load`` of a bundle (graphs and CPU
  kernels) saved by a process that ran ``objcache.install()``, fresh machine whose store holds
  only that bundle;
* objcache bundle, recipe only — the same, but both the saving and the loading process follow
  torch's Mega-Cache recipe without ``install()`` (``OBJCACHE_ENABLE=0``): the kernels come from
  the saved graphs themselves.

``--only TEXT`` (repeatable) keeps the scenarios whose name contains TEXT, plus the baseline
(torch alone, warm-local); preparation runs that no kept scenario needs are skipped.

Remote stores: ``--remote file`` (a temp ``file://`` dir), ``--remote redis`` (a throwaway
local ``redis-server``) and ``--remote s3`` (a throwaway SeaweedFS) are built in; any other
is ``--remote NAME=URL`` (e.g. ``--remote gcs=gs://bucket/prefix``), or one line in
:data:`REMOTES`. The markdown table
replaces the ``warm_start`` section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _chart  # noqa: E402
from bench._installed import compile_bytecode  # noqa: E402
from objcache.demo.demo_jobs import Job, machine_env, run_job  # noqa: E402
from objcache.demo.demo_worker import model_name  # noqa: E402
from tests.support.proxy import FaultProxy  # noqa: E402
from tests.support.torch_runs import gxx_builds, make_gxx_shim  # noqa: E402

#: Servers this bench started (stopped in main's finally).
_SERVERS: list[Any] = []
#: Latency proxies this bench started (closed before the servers).
_PROXIES: list[FaultProxy] = []


def _redis(root: Path) -> str:
    """A throwaway local redis-server."""
    from tests.support.servers import RedisServer

    server = RedisServer(unix_socket=False).start()
    _SERVERS.append(server)
    return server.url


def _s3(root: Path) -> str:
    """A throwaway SeaweedFS (a real S3 server) with one bucket."""
    from tests.support.cloud import s3_url
    from tests.support.servers import SeaweedS3

    server = SeaweedS3().start()
    _SERVERS.append(server)
    server.create_bucket("bench-warm-start")
    return s3_url(server, "warm", bucket="bench-warm-start")


#: Built-in remote stores: name -> URL for a bench root. Add GCS here (one line).
REMOTES: dict[str, Callable[[Path], str]] = {
    "file": lambda root: f"file://{root / 'store-file'}",
    "redis": _redis,
    "s3": _s3,
}


def behind_proxy(url: str, rtt_ms: float) -> str | None:
    """``url`` reached through a FaultProxy adding ``rtt_ms`` per round trip (None: no
    network to delay, as for ``file://``)."""
    parts = urlsplit(url)
    if parts.scheme in ("redis", "rediss"):
        proxy = FaultProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
        proxy.set_rtt_ms(rtt_ms)
        _PROXIES.append(proxy)
        auth = parts.netloc.rpartition("@")[0]
        netloc = f"{auth}@{proxy.host}:{proxy.port}" if auth else f"{proxy.host}:{proxy.port}"
        return urlunsplit(parts._replace(netloc=netloc))
    if parts.scheme == "s3":
        query = dict(parse_qsl(parts.query))
        endpoint = urlsplit(query.get("endpoint_url", ""))
        if not endpoint.hostname:
            return None  # real AWS: the RTT is already there
        proxy = FaultProxy(endpoint.hostname, endpoint.port or 80)
        proxy.set_rtt_ms(rtt_ms)
        _PROXIES.append(proxy)
        query["endpoint_url"] = proxy.url()
        return urlunsplit(parts._replace(query=urlencode(query, safe=":/")))
    return None


def torch_redis_env(url: str) -> dict[str, str]:
    """Environment turning on torch's own Redis remote caches (FX graph, AOTAutograd)."""
    parts = urlsplit(url)
    return {
        "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_REDIS_HOST": parts.hostname or "127.0.0.1",
        "TORCHINDUCTOR_REDIS_PORT": str(parts.port or 6379),
    }


#: Torch cache settings a run must not inherit from the bench's own environment.
TORCH_CACHE_VARS = (
    "TORCHINDUCTOR_FORCE_DISABLE_CACHES",
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE",
    "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
    "TORCHINDUCTOR_REDIS_HOST",
    "TORCHINDUCTOR_REDIS_PORT",
)
SECTION = "warm_start"
MAX_RUNS = 10
#: The scenario every ratio is taken against: torch's own warm local cache.
BASELINE = "torch alone, warm-local"
#: Ratio targets against the baseline (first step): a new machine from a store nearby, one
#: a region away (``--rtt-ms``), and a Mega-Cache bundle.
TARGET_NEW_MACHINE = 1.05
TARGET_FAR = 1.15
TARGET_BUNDLE = 1.3
#: ... and a new machine that also gets Dynamo's work (precompile entries), near and far.
TARGET_PRECOMPILE = 0.6
TARGET_PRECOMPILE_FAR = 0.7
BUNDLE_WITH_INSTALL = "objcache bundle with install(): load then compile"
BUNDLE_RECIPE = "objcache bundle, recipe only: load then compile"
#: objcache warm-local without key cards: the cards' cost is the warm-local row over this one.
NO_CARDS = "objcache, warm-local, key cards off"
#: Keeping key cards may slow a warm-local first step by at most 2%.
TARGET_CARDS = 1.02


@dataclass
class Scenario:
    name: str
    #: (machine dir, extra worker args, extra env) for run i
    setup: Callable[[int], tuple[Path, list[str], dict[str, str]]]
    jobs: list[Job] = field(default_factory=list)

    def median(self, key: str) -> float:
        return statistics.median(float(j.result[key]) for j in self.jobs)

    def median_wall(self) -> float:
        return statistics.median(j.wall_s for j in self.jobs)

    def paired_ratio(self, base: Scenario) -> float:
        """Median over rounds of this row's first step over the baseline's in the same round
        (rounds are interleaved, so a slow spell of the shared machine hits both)."""
        pairs = zip(self.jobs, base.jobs, strict=False)
        return statistics.median(
            float(a.result["first_step_s"]) / float(b.result["first_step_s"]) for a, b in pairs
        )

    def median_builds(self) -> str:
        """g++ runs that built something (a PATH shim counts them, objcache or not)."""
        return f"{statistics.median(int(j.result['gxx_builds']) for j in self.jobs):g}"

    def median_graphs(self) -> str:
        """Graphs Dynamo traced in the process (0 where a precompile entry carried them)."""
        return f"{statistics.median(int(j.result.get('graphs', 0)) for j in self.jobs):g}"


class Bench:
    def __init__(
        self,
        root: Path,
        model: str,
        remotes: dict[str, str],
        rtt_ms: float,
        batches: str = "",
        device: str = "cpu",
        mode: str = "",
        inference: bool = False,
    ) -> None:
        self.inference = inference
        self.device = device
        self.mode = mode
        self.root = root
        self.model = model
        self.batches = batches
        self.remotes = remotes
        self.rtt_ms = rtt_ms
        self.salt = 1.0 + random.randrange(1 << 30) * 1e-12
        self.n = 0
        #: Worker flags every run of this bench gets (baseline and objcache rows alike).
        self.worker_flags: list[str] = []

    def fresh(self, label: str) -> Path:
        self.n += 1
        path = self.root / f"m{self.n:03d}-{label}"
        path.mkdir(parents=True)
        return path

    def run(
        self,
        machine: Path,
        args: list[str],
        env_extra: dict[str, str],
        tiers: str = "",
    ) -> Job:
        env = machine_env(str(machine))
        for var in list(env):
            if var.startswith("OBJCACHE_") or var in TORCH_CACHE_VARS:
                env.pop(var)
        env["OBJCACHE_LOCAL_DIR"] = str(machine / "objcache-local")
        env["OBJCACHE_JOB"] = "bench-warm-start"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        if tiers:
            env["OBJCACHE_TIERS"] = tiers
        if self.batches:
            # torch keeps dynamic-shape profiles (PGO) only under a job id: give every run,
            # objcache or not, the same one
            env["TORCH_COMPILE_JOB_ID"] = "bench-warm-start"
        # each row measures what it names: precompile entries only where the row turns them
        # on, whatever the release's default (docs/torch.md, "Precompile entries")
        env["OBJCACHE_PRECOMPILE"] = "0"
        env.update(env_extra)
        shim_dir, log = make_gxx_shim(machine / f"shim-{time.monotonic_ns()}")
        env["PATH"] = f"{shim_dir}{os.pathsep}{env.get('PATH', '')}"
        worker_args = ["--model", self.model, "--salt", repr(self.salt), *self.worker_flags, *args]
        if self.batches:
            worker_args += ["--batches", self.batches]
        if self.inference:
            worker_args += ["--inference"]
        if self.device != "cpu":
            # Inductor compiles Triton kernels in this process, where the worker counts them
            env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
            worker_args += ["--device", self.device]
        if self.mode:
            worker_args += ["--mode", self.mode]
        job = run_job(worker_args, env, timeout=1200)
        job.result["gxx_builds"] = len(gxx_builds(log))
        if not job.ok:
            tail = "\n".join(job.stderr_tail[-30:])
            raise SystemExit(f"run failed: {job.result.get('error')}\n{tail}")
        if not job.result.get("match"):
            raise SystemExit(f"compiled output differs from eager: {job.result}")
        return job


def main() -> int:
    if "--guarded" in sys.argv[1:]:  # dynamic shapes across processes: bench/warm_start_guarded.py
        from bench.warm_start_guarded import main as guarded_main

        return guarded_main([a for a in sys.argv[1:] if a != "--guarded"])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help=f"runs per scenario (1..{MAX_RUNS})")
    parser.add_argument(
        "--model",
        type=model_name,
        default="block",
        help="block, tiny, or a library model: torchvision:<name>, timm:<name>",
    )
    parser.add_argument(
        "--batches",
        default="",
        help="train at these batch sizes, one step each (e.g. 4,6: dynamic shapes and PGO)",
    )
    parser.add_argument(
        "--remote", action="append", default=None, help="file, or NAME=URL (repeatable)"
    )
    parser.add_argument(
        "--rtt-ms", type=float, default=50, help="added round trip for the far rows (0: none)"
    )
    parser.add_argument(
        "--device", default="cpu", help="cpu, or cuda (the rows gain Triton compile counts)"
    )
    parser.add_argument("--mode", default="", help="torch.compile's mode, e.g. max-autotune")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--keep", action="store_true", help="keep the bench's temp dirs")
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        help="keep the scenarios whose name contains this (repeatable; warm-local always kept)",
    )
    parser.add_argument(
        "--section",
        default=SECTION,
        help=f"the docs section the table replaces (default {SECTION}; use another with --only)",
    )
    opts = parser.parse_args()
    compile_bytecode()  # as an installed objcache runs (bench/_installed.py)
    # A SIGTERM must still stop the servers and remove the temp dirs (finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs = max(1, min(MAX_RUNS, opts.runs))
    root = Path(tempfile.mkdtemp(prefix="objcache-bench-"))
    remotes: dict[str, str] = {}
    started = time.time()
    try:
        remotes.update(open_remotes(opts.remote, root))
        bench = Bench(root, opts.model, remotes, opts.rtt_ms, opts.batches, opts.device, opts.mode)

        def wanted(name: str) -> bool:
            return name == BASELINE or not opts.only or any(k in name for k in opts.only)

        scenarios = prepare_and_define(bench, wanted)
        if opts.only:
            scenarios = [sc for sc in scenarios if wanted(sc.name)]
        run_rounds(bench, scenarios, runs, started)
    finally:
        stop_servers()
        if not opts.keep:
            shutil.rmtree(root, ignore_errors=True)
    command = "python bench/warm_start.py " + shlex.join(
        a for a in sys.argv[1:] if not a.startswith("--out") and a != str(opts.out)
    )
    table = render(scenarios, runs, opts.model, command.strip(), opts.section, opts.batches)
    write_section(opts.out, table, opts.section)
    chart = _chart.write_beside(opts.out, opts.section, chart_spec(scenarios, runs, opts))
    if chart is not None:
        print(f"chart: {chart}")
    print(table)
    for name, ratio in ratios(scenarios).items():
        print(f"ratio vs {BASELINE}: {ratio:.2f}x  {name}")
    print(f"wrote the {opts.section} section of {opts.out}; command: {command.strip()}")
    return 0


def open_remotes(specs: list[str] | None, root: Path) -> dict[str, str]:
    """``--remote`` values (``file``, ``s3``, ``redis`` or ``NAME=URL``) as name -> URL,
    starting the built-in servers they name (:func:`stop_servers` stops them)."""
    remotes = {}
    for spec in specs or ["file"]:
        name, _, url = spec.partition("=")
        remotes[name] = url or REMOTES[name](root)
    return remotes


def stop_servers() -> None:
    """Close the proxies and stop the servers this process started."""
    for proxy in _PROXIES:
        proxy.close()
    for server in _SERVERS:
        server.stop()
    _PROXIES.clear()
    _SERVERS.clear()


def run_rounds(
    bench: Bench, scenarios: list[Scenario], runs: int, started: float, what: str = ""
) -> None:
    """``runs`` interleaved rounds of ``scenarios``: every other round runs the rows in
    reverse order, so no row always runs right after the baseline (a warm page cache) or
    last (a busier machine)."""
    for i in range(runs):
        for sc in scenarios if i % 2 == 0 else scenarios[::-1]:
            machine, args, env = sc.setup(i)
            tiers = env.pop("_TIERS", "")
            job = bench.run(machine, args, env, tiers)
            sc.jobs.append(job)
            print(
                f"[{time.time() - started:6.0f}s] {what}round {i + 1}/{runs} {sc.name}: "
                f"first step {job.result['first_step_s']:.2f}s, process {job.wall_s:.1f}s"
                + _triton_note(job.result),
                flush=True,
            )


def _triton_note(result: dict[str, Any]) -> str:
    """A GPU row's Triton compiles (the worker counts them off CPU), for the progress line."""
    if "triton_compiles" not in result:
        return ""
    return f", Triton compiles {result['triton_compiles']} on {result.get('device_name', '')}"


def new_machine_label(remote: str, rtt_ms: float = 0) -> str:
    """The name of the row "objcache, new machine" for a remote (and an added RTT)."""
    far = f", +{rtt_ms:g} ms RTT" if rtt_ms else ""
    return f"objcache, new machine ({remote}{far})"


def precompile_label(remote: str, rtt_ms: float = 0) -> str:
    """The name of the row "objcache, new machine with precompile entries"."""
    far = f", +{rtt_ms:g} ms RTT" if rtt_ms else ""
    return f"objcache, new machine with precompile entries ({remote}{far})"


def precompile_scenarios(
    bench: Bench, remote: str, url: str, wanted: Callable[[str], bool]
) -> list[Scenario]:
    """The rows "objcache, new machine with precompile entries (<remote>)": Dynamo's own work
    carried by objcache (torch's caching precompile, docs/torch.md "Precompile entries").

    One unmeasured run with ``OBJCACHE_PRECOMPILE=1`` on a fresh machine (its graphs and
    kernels come from the store the cold run filled) writes the job's precompile entries;
    every measured run is then a fresh machine with the same opt-in, near and (through
    :func:`behind_proxy`) a region away. No rows where the running torch has no caching
    precompile (the part is feature-detected, docs/torch.md).
    """
    labels = [precompile_label(remote), precompile_label(remote, bench.rtt_ms)]
    if not any(wanted(label) for label in labels) or not precompile_supported():
        return []
    on = {"OBJCACHE_PRECOMPILE": "1"}
    print(f"preparing: one objcache run writing precompile entries into {remote}", flush=True)
    job = bench.run(bench.fresh(f"precompile-save-{remote}"), ["--objcache", "install"], on, url)
    saved = job.result.get("integration", {}).get("precompile", {})
    print(f"preparing: precompile entries written: {saved}", flush=True)
    stores = [(labels[0], url)]
    far = behind_proxy(url, bench.rtt_ms) if bench.rtt_ms > 0 else None
    if far:
        stores.append((labels[1], far))
    return [
        Scenario(
            label,
            lambda i, u=store_url: (
                bench.fresh(f"precompile-{remote}"),
                ["--objcache", "install"],
                {"_TIERS": u, **on},
            ),
        )
        for label, store_url in stores
        if wanted(label)
    ]


def precompile_supported() -> bool:
    """Whether the torch this bench runs has caching precompile (as objcache detects it)."""
    from objcache.integrations.install import features

    failed = features.load(("precompile",))
    return not failed and not features.missing("precompile")


def prepare_and_define(bench: Bench, wanted: Callable[[str], bool]) -> list[Scenario]:
    """Unmeasured preparation runs (only those a ``wanted`` scenario needs), then the
    scenarios' run factories, the baseline first."""
    off_env = {"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    mega = "Mega-Cache load then compile"
    print("preparing: one cold torch run (warm-local machine, Mega-Cache artifacts)", flush=True)
    torch_machine = bench.fresh("torch-warm")
    artifacts = bench.root / "torch-mega.bin"
    save = ["--torch-mega-save", str(artifacts)] if wanted(mega) else []
    bench.run(torch_machine, ["--objcache", "off", *save], {})
    scenarios = [
        Scenario(BASELINE, lambda i: (torch_machine, ["--objcache", "off"], {})),
        Scenario(
            "eager, first step",
            lambda i: (bench.fresh("eager"), ["--objcache", "off", "--eager"], {}),
        ),
        Scenario(
            "caches off",
            lambda i: (bench.fresh("off"), ["--objcache", "off"], dict(off_env)),
        ),
        Scenario("cold", lambda i: (bench.fresh("cold"), ["--objcache", "off"], {})),
    ]
    first_remote = True
    for name, url in bench.remotes.items():
        # The store as it is, and a region away (behind a proxy adding the RTT).
        stores = [(new_machine_label(name), url, f"remote-{name}")]
        far = behind_proxy(url, bench.rtt_ms) if bench.rtt_ms > 0 else None
        if far:
            stores.append((new_machine_label(name, bench.rtt_ms), far, f"far-{name}"))
        bundles = first_remote and url.startswith("file://")
        rows = [label for label, _, _ in stores]
        rows += [precompile_label(name), precompile_label(name, bench.rtt_ms)]
        if first_remote:
            rows += ["objcache, warm-local", NO_CARDS]
        if bundles:
            rows += [BUNDLE_WITH_INSTALL, BUNDLE_RECIPE]
        needs_store = any(wanted(row) for row in rows)
        if not needs_store:
            if name == "redis":
                scenarios += torch_redis_scenarios(bench, url, wanted)
            first_remote = False
            continue
        print(f"preparing: one cold objcache run into {name} ({url})", flush=True)
        oc_machine = bench.fresh(f"objcache-{name}")
        bundle = f"bench-{name}"
        bench.run(oc_machine, ["--objcache", "install", "--mega-save", bundle], {}, url)
        if first_remote:
            scenarios.append(
                Scenario(
                    "objcache, warm-local",
                    lambda i, m=oc_machine, u=url: (m, ["--objcache", "install"], {"_TIERS": u}),
                )
            )
            # what keeping key cards costs a compile (docs/architecture.md, "Key cards")
            scenarios.append(
                Scenario(
                    NO_CARDS,
                    lambda i, m=oc_machine, u=url: (
                        m,
                        ["--objcache", "install"],
                        {"_TIERS": u, "OBJCACHE_KEY_CARDS": "0"},
                    ),
                )
            )
        for label, store_url, machine in stores:
            scenarios.append(
                Scenario(
                    label,
                    lambda i, u=store_url, m=machine: (
                        bench.fresh(m),
                        ["--objcache", "install"],
                        {"_TIERS": u},
                    ),
                )
            )
        scenarios += precompile_scenarios(bench, name, url, wanted)
        if name == "redis":
            scenarios += torch_redis_scenarios(bench, url, wanted)
        if bundles and (wanted(BUNDLE_WITH_INSTALL) or wanted(BUNDLE_RECIPE)):
            print("preparing: one cold run saving a bundle by the recipe alone", flush=True)
            recipe = f"bench-recipe-{name}"
            recipe_env = {"OBJCACHE_ENABLE": "0"}  # no zero-code install either
            recipe_args = ["--objcache", "off", "--mega-save", recipe]
            bench.run(bench.fresh("recipe-save"), recipe_args, recipe_env, url)
            bundle_store = bench.root / "bundle-only-store"
            src = Path(url[len("file://") :])
            for saved in (bundle, recipe):
                for path in src.rglob(f"mega/*/{saved}"):
                    dest = bundle_store / path.relative_to(src)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(path, dest)
            only_bundles = {"_TIERS": f"file://{bundle_store}", "OBJCACHE_PREFETCH": "0"}
            scenarios += [
                Scenario(
                    BUNDLE_WITH_INSTALL,
                    lambda i, b=bundle, e=only_bundles: (
                        bench.fresh("bundle"),
                        ["--objcache", "install", "--mega-load", b],
                        dict(e),
                    ),
                ),
                Scenario(
                    BUNDLE_RECIPE,
                    lambda i, b=recipe, e={**only_bundles, **recipe_env}: (
                        bench.fresh("bundle-recipe"),
                        ["--objcache", "off", "--mega-load", b],
                        dict(e),
                    ),
                ),
            ]
        first_remote = False
    scenarios.append(
        Scenario(
            mega,
            lambda i: (
                bench.fresh("mega"),
                ["--objcache", "off", "--torch-mega-load", str(artifacts)],
                {},
            ),
        )
    )
    return scenarios


def torch_redis_scenarios(
    bench: Bench, url: str, wanted: Callable[[str], bool] = lambda name: True
) -> list[Scenario]:
    """torch's own Redis remote cache on the same redis-server: the remote cache to beat."""
    if not wanted("torch built-in Redis remote cache"):
        return []
    print("preparing: one cold run into torch's built-in Redis remote cache", flush=True)
    near = torch_redis_env(url)
    bench.run(bench.fresh("torch-redis-seed"), ["--objcache", "off"], dict(near))
    scenarios = [
        Scenario(
            "torch built-in Redis remote cache",
            lambda i: (bench.fresh("torch-redis"), ["--objcache", "off"], dict(near)),
        )
    ]
    far_url = behind_proxy(url, bench.rtt_ms) if bench.rtt_ms > 0 else None
    if far_url:
        far = torch_redis_env(far_url)
        scenarios.append(
            Scenario(
                f"torch built-in Redis remote cache (+{bench.rtt_ms:g} ms RTT)",
                lambda i: (bench.fresh("torch-redis-far"), ["--objcache", "off"], dict(far)),
            )
        )
    return scenarios


def chart_spec(scenarios: list[Scenario], runs: int, opts: argparse.Namespace) -> dict[str, Any]:
    """The main comparison of this run as a bar chart (bench/_chart.py)."""
    sizes = f", batches {opts.batches}" if opts.batches else ""
    return {
        "chart": "bars",
        "title": f"torch.compile warm start on CPU (model {opts.model}{sizes}, median of {runs})",
        "xlabel": "first step: compile + one step per batch size (s)",
        "source": f"bench/warm_start.py, docs/benchmarks.md section {opts.section}",
        "rows": [[sc.name, round(sc.median("first_step_s"), 3)] for sc in scenarios],
    }


def render(
    scenarios: list[Scenario],
    runs: int,
    model: str,
    command: str,
    section: str = SECTION,
    batches: str = "",
) -> str:
    import torch

    base = next(s for s in scenarios if s.name == BASELINE)
    base_step, base_wall = base.median("first_step_s"), base.median_wall()
    gpu = next(
        (j.result["device_name"] for s in scenarios for j in s.jobs if j.result.get("device")),
        "",
    )
    where = f"{gpu} (GPU)" if gpu else "CPU"
    lines = [
        f"<!-- bench:{section} -->",
        f"_Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} vCPU "
        f"({_cpu()}), torch {torch.__version__}. Reproduce: `{command}`_",
        "",
        f"torch.compile warm start on {where}: model `{model}` ("
        + (
            f"one forward+backward step at each batch size {batches}, in that order; "
            "*first step* covers them all"
            if batches
            else "one forward+backward step"
        )
        + "), "
        f"median of {runs} runs per row, each a "
        "fresh process; a fresh machine is a fresh set of local dirs (objcache local tier, "
        "`TORCHINDUCTOR_CACHE_DIR`, `TMPDIR`), only the store is shared. *First step* is "
        "compile + step inside the process; *process* adds interpreter start, `import torch` "
        "and objcache setup. g++ builds are counted by a PATH shim; *graphs traced* are the "
        "graphs Dynamo traced (`unique_graphs`). The ratio is against "
        "torch alone on its own warm local cache (objcache off), never against a cold start.",
        "",
        "*paired* is the median over rounds of the row's first step over the baseline's in "
        "the same round (the targets are checked on it).",
        "",
        "| scenario | first step (s) | process (s) | first step vs torch warm-local "
        "| paired | g++ builds | graphs traced |" + (" Triton compiles |" if gpu else ""),
        "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if gpu else ""),
    ]
    for sc in scenarios:
        step = sc.median("first_step_s")
        triton = ""
        if gpu:
            counts = [int(j.result.get("triton_compiles", 0)) for j in sc.jobs]
            triton = f" {statistics.median(counts):g} |" if counts else " - |"
        lines.append(
            f"| {sc.name} | {step:.2f} | {sc.median_wall():.1f} | {step / base_step:.2f}x "
            f"| {sc.paired_ratio(base):.2f}x | {sc.median_builds()} | {sc.median_graphs()} |"
            + triton
        )
    lines.append("")
    for sc in scenarios:
        target = _target(sc.name)
        if target is not None:
            ratio = sc.median("first_step_s") / base_step
            paired = sc.paired_ratio(base)
            wall = sc.median_wall() / base_wall
            verdict = "meets" if paired <= target else "misses"
            lines.append(
                f"- {sc.name}: {ratio:.2f}x torch warm-local on the first step ({paired:.2f}x "
                f"paired), {wall:.2f}x on the whole process ({verdict} the {target}x target)."
            )
    cards = next((s for s in scenarios if s.name == "objcache, warm-local"), None)
    no_cards = next((s for s in scenarios if s.name == NO_CARDS), None)
    if cards is not None and no_cards is not None and cards.jobs and no_cards.jobs:
        cost = cards.paired_ratio(no_cards)
        verdict = "meets" if cost <= TARGET_CARDS else "misses"
        lines.append(
            f"- key cards: objcache warm-local with cards / without = {cost:.3f} paired "
            f"({verdict} the {TARGET_CARDS}x target)."
        )
    lines += ["", f"<!-- /bench:{section} -->"]
    return "\n".join(lines)


def _target(name: str) -> float | None:
    """The first-step ratio target of a row against the baseline (None: no target)."""
    if name.startswith("objcache, new machine with precompile entries"):
        return TARGET_PRECOMPILE_FAR if "RTT" in name else TARGET_PRECOMPILE
    if name.startswith("objcache, new machine"):
        return TARGET_FAR if "RTT" in name else TARGET_NEW_MACHINE
    if name.startswith("objcache bundle"):
        return TARGET_BUNDLE
    return None


def ratios(scenarios: list[Scenario]) -> dict[str, float]:
    """Each scenario's paired first-step ratio to the baseline (what ``make compat`` prints)."""
    base = next(s for s in scenarios if s.name == BASELINE)
    return {sc.name: sc.paired_ratio(base) for sc in scenarios}


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_section(path: Path, section: str, name: str = SECTION) -> None:
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
