"""``objcache demo``: a cold compile, the same compile on a "new machine", then warm.

Three subprocesses compile and run one training step of a small model on the configured
tiers (``OBJCACHE_TIERS``) or the embedded default ``file://`` store, so it works on a laptop
without any cloud account:

1. **cold** — empty local dirs: every cache misses, everything is built and stored;
2. **new machine** — a fresh objcache local dir, a fresh ``TORCHINDUCTOR_CACHE_DIR`` and a
   fresh temp dir (where Inductor keeps precompiled headers): only the shared store is warm;
3. **warm** — the new machine again: torch's local caches are warm now.

Each run reports the wall time of its first step, hits per cache kind, bytes moved to and
from remote tiers, kernel g++ builds, and whether outputs and gradients match eager. The
model bakes a per-demo constant into its graph, so each demo's cold run really is cold.

The same module is the workload of the tests and of ``bench/warm_start.py``:
``python -m objcache.integrations.torch.demo --worker ...`` runs one compile and prints one
JSON result line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

RESULT_TAG = "OBJCACHE_RESULT "
STAGE_TAG = "objcache-demo: stage "
MODELS = ("tiny", "block")
#: Models from a model library: ``torchvision:<name>``, ``timm:<name>`` or
#: ``transformers:<model type>`` (not installed by objcache; no weights are downloaded: every
#: model is built with random weights, a transformers model from a small config of its type),
#: or torch's own stock modules: ``torch:transformer`` (``nn.TransformerEncoder``) and
#: ``torch:convnet`` (convolutions, batch norm, pooling).
LIBRARIES = ("torchvision", "timm", "transformers", "torch")
#: The ``torch:<name>`` models.
TORCH_MODELS = ("transformer", "convnet")
#: Sequence length and vocabulary of the transformers models' input (token ids).
TEXT_LENGTH = 32
TEXT_VOCAB = 1000
#: Image side of the library models' input (small: a CPU compile, not accuracy, is measured).
IMAGE_SIDE = 64


def model_name(value: str) -> str:
    """argparse type of ``--model``: a built-in model or ``<library>:<name>``."""
    library, sep, name = value.partition(":")
    in_library = bool(sep and library in LIBRARIES and name)
    if value in MODELS or (in_library and (library != "torch" or name in TORCH_MODELS)):
        return value
    raise argparse.ArgumentTypeError(
        f"unknown model {value!r}: use {', '.join(MODELS)}, torchvision:<name>, timm:<name>, "
        "transformers:<model type>, torch:transformer or torch:convnet"
    )


# --- the worker: one process, one compile -----------------------------------------------------


def make_input(name: str, batch: int | None = None) -> Any:
    """The model's input; ``batch`` overrides the default batch size (2 for block, 4 tiny)."""
    import torch

    generator = torch.Generator().manual_seed(1 if batch is None else 1000 + batch)
    if name.startswith("transformers:"):  # a batch of token-id sequences
        ids = (2 if batch is None else batch, TEXT_LENGTH)
        return torch.randint(0, TEXT_VOCAB, ids, generator=generator)
    if name == "torch:transformer":  # a batch of embedded sequences
        return torch.randn(2 if batch is None else batch, 16, 64, generator=generator)
    if ":" in name:  # a library model: a batch of small images
        size = (2 if batch is None else batch, 3, IMAGE_SIDE, IMAGE_SIDE)
        return torch.randn(size, generator=generator)
    if name == "tiny":
        return torch.randn(4 if batch is None else batch, 8, generator=generator)
    return torch.randn(2 if batch is None else batch, 16, 64, generator=generator)


def build_model(name: str, salt: float) -> tuple[Any, Any]:
    """``(module, input)``: ``tiny`` is a 2-layer MLP; ``block`` a 4-layer MLP + attention
    (:mod:`objcache.integrations.torch.demo_models`, at module level as torch's caching
    precompile needs).

    The ``forward`` methods close over nothing (no captured locals, no ``super()``): torch's
    PGO names a frame by its code *and* a hash of its closure cells, and on Python < 3.12 that
    hash differs in every process, so a closure's dynamic-shape profile never matches in the
    next process (see docs/torch.md, "Known limits").
    """
    import torch

    from objcache.integrations.torch.demo_models import Block, Salted, TextLogits, Tiny

    torch.manual_seed(0)
    if name.startswith("transformers:"):
        return TextLogits(_text_model(name.partition(":")[2]), salt), make_input(name)
    if ":" in name:
        return Salted(_library_model(name), salt), make_input(name)
    if name == "tiny":
        return Tiny(salt), torch.randn(4, 8)
    return Block(salt), torch.randn(2, 16, 64)


def tolerance(name: str) -> tuple[float, float]:
    """``(rtol, atol)`` for compiled vs eager. Library models are deep (dozens of fused
    norm/activation layers, gradients through all of them), where Inductor's reordered float
    sums differ from eager by more than a toy model's 1e-5 (timm's mobilenetv3_small_050:
    2.7e-5, the same in a cold compile without any cache)."""
    return (1e-3, 1e-4) if ":" in name else (1e-4, 1e-5)


def _library_model(name: str) -> Any:
    """A model from torchvision or timm, random weights, 10 classes."""
    library, _, model = name.partition(":")
    if library == "torch":
        return _torch_model(model)
    if library == "torchvision":
        import torchvision

        return torchvision.models.get_model(model, weights=None, num_classes=10)
    import timm

    kwargs: dict[str, Any] = {"pretrained": False, "num_classes": 10}
    if "vit" in model or "deit" in model:
        kwargs["img_size"] = IMAGE_SIDE  # vision transformers take their image size
    return timm.create_model(model, **kwargs)


def _torch_model(name: str) -> Any:
    """torch's own stock modules: an encoder of ``nn.TransformerEncoderLayer`` (d_model 64,
    4 heads, no dropout) or a small conv net (conv, batch norm, ReLU, pooling, 10 classes)."""
    from torch import nn

    if name == "transformer":
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


#: A small config for any transformers model type: the first of each group its config has.
_SMALL_TEXT = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "intermediate_size": 256,
    "vocab_size": TEXT_VOCAB,
    "max_position_embeddings": 128,
    "num_labels": 10,
}


def _text_model(model_type: str) -> Any:
    """A transformers sequence classifier of ``model_type`` from a small config, random
    weights, dropout off (a training step compared with eager must be deterministic)."""
    import importlib

    # imported by name: typed or not, installed or not, it is the user's library
    transformers: Any = importlib.import_module("transformers")
    # given to the config's constructor, so what it derives agrees (Llama's head_dim and
    # key/value heads), then set again for configs whose constructor drops them
    config = transformers.AutoConfig.for_model(model_type, **_SMALL_TEXT)
    for attr, value in _SMALL_TEXT.items():
        setattr(config, attr, value)
    for attr in list(vars(config)):
        dropout = "dropout" in attr or attr.endswith("_pdrop")
        if dropout and isinstance(getattr(config, attr), float):
            setattr(config, attr, 0.0)
    if getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = 0
    if getattr(config, "is_encoder_decoder", False) and config.decoder_start_token_id is None:
        config.decoder_start_token_id = config.pad_token_id  # T5's convention
    return transformers.AutoModelForSequenceClassification.from_config(config)


def _stage(name: str) -> None:
    print(f"{STAGE_TAG}{name}", file=sys.stderr, flush=True)


def _step(model: Any, x: Any) -> tuple[Any, list[Any]]:
    out = model(x)
    out.float().pow(2).mean().backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    return out.detach(), grads


def _infer(model: Any, x: Any) -> tuple[Any, list[Any]]:
    """An inference step: the forward alone, without autograd (a serving process's graph)."""
    import torch

    with torch.no_grad():
        return model(x).detach(), []


def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Compile and run one step; everything the parent reports, as a dict."""
    started = time.perf_counter()
    result: dict[str, Any] = {"ok": False, "model": args.model, "objcache": args.objcache}
    _stage("import torch")
    import copy

    import torch

    result["import_s"] = time.perf_counter() - started
    setup_started = time.perf_counter()
    # Import what objcache.install() imports in every mode, so that "first step" measures
    # compile + step alike with and without objcache (not who paid for the imports).
    import importlib

    from objcache.integrations.torch.watched import NOT_IMPORTED, WATCHED

    for name in WATCHED:
        if name not in NOT_IMPORTED:  # another package's (vLLM's): not what install() imports
            importlib.import_module(name)
    if args.compiler_imported:
        # what the first torch.compile() call imports (Inductor's compiler, 0.8 s on a
        # 2-vCPU machine), paid alike by every start: out of the first step when asked
        importlib.import_module("torch._inductor.compile_fx")
    if args.objcache == "install":
        import objcache

        objcache.install()
    if args.torch_mega_load:
        with open(args.torch_mega_load, "rb") as f:
            torch.compiler.load_cache_artifacts(f.read())
    if args.mega_load:
        from objcache.integrations.torch import mega

        result["mega_load"] = mega.load(args.mega_load)
    result["setup_s"] = time.perf_counter() - setup_started

    model, x = build_model(args.model, args.salt)
    inputs = [make_input(args.model, int(b)) for b in args.batches.split(",") if b] or [x]
    if args.device != "cpu":
        model = model.to(args.device)
        inputs = [xi.to(args.device) for xi in inputs]
        result["device"] = args.device
        result["device_name"] = torch.cuda.get_device_name() if "cuda" in args.device else ""
    step = _infer if args.inference else _step
    refs = [step(copy.deepcopy(model), xi) for xi in inputs]
    triton_compiles = _count_triton_compiles() if args.device != "cpu" else None
    _stage("compile")
    # "first step": torch.compile() (where a precompile entry is loaded, docs/torch.md) and
    # the first step at each batch size, where every compile happens; --eager: the same
    # first step without torch.compile (what compiling has to beat)
    t0 = time.perf_counter()
    compiled = model if args.eager else torch.compile(model, **_compile_options(args.mode))
    steps = [step(compiled, xi) for xi in inputs]
    if args.device != "cpu":
        torch.cuda.synchronize()
    result["first_step_s"] = time.perf_counter() - t0
    if triton_compiles is not None:
        result["triton_compiles"] = triton_compiles[0]
    _stage("check")
    pairs = [
        pair
        for (out, grads), (ref_out, ref_grads) in zip(steps, refs, strict=True)
        for pair in zip([out, *grads], [ref_out, *ref_grads], strict=True)
    ]
    errs = [float((a - b).abs().max()) for a, b in pairs]
    result["max_abs_err"] = max(errs)
    rtol, atol = tolerance(args.model)
    result["match"] = all(torch.allclose(a, b, rtol=rtol, atol=atol) for a, b in pairs)
    from torch._dynamo.utils import counters

    result["torch"] = {
        k: v
        for group in ("inductor", "aot_autograd")
        for k, v in counters[group].items()
        if "cache" in k or "bundler" in k
    }
    # graphs dynamo compiled (a recompile at a new batch size adds one)
    result["graphs"] = int(counters["stats"]["unique_graphs"])
    # where the compile time went, in torch's own figures, with or without objcache
    # (docs/architecture.md, "Phase times")
    from objcache.integrations.torch import phase_times

    result["phases"] = {k: list(v) for k, v in phase_times.snapshot().items()}
    if args.torch_mega_save:
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            with open(args.torch_mega_save, "wb") as f:
                f.write(saved[0])
    if args.mega_save:
        from objcache.integrations.torch import mega

        result["mega_save"] = mega.save(args.mega_save)
    _report_objcache(result)
    result["total_s"] = time.perf_counter() - started
    result["ok"] = True
    return result


def _compile_options(mode: str) -> dict[str, Any]:
    return {"mode": mode} if mode else {}


def _count_triton_compiles() -> list[int]:
    """A one-element counter of the Triton kernels this process really compiled (source to
    IR), not those loaded from Triton's cache directory or an FX entry's bundle: it counts
    the backend's first stage. Inductor compiles in this process only with
    ``TORCHINDUCTOR_COMPILE_THREADS=1``, which the GPU runs set (docs/benchmarks.md)."""
    count = [0]
    try:
        from triton.backends.nvidia.compiler import CUDABackend
    except ImportError:  # no NVIDIA backend: nothing counted, the key stays absent
        return count
    original = CUDABackend.make_ttir

    def make_ttir(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return original(*args, **kwargs)

    CUDABackend.make_ttir = staticmethod(make_ttir)
    return count


def _report_objcache(result: dict[str, Any]) -> None:
    import objcache.integrations.torch as integration

    if not integration.installed() and not _kernels_hooked():
        return
    from objcache.client import get_client
    from objcache.integrations.torch import kernels

    _stage("flush")
    kernels.wait_stored(60)
    client = get_client()
    client.flush()
    result["integration"] = integration.stats()
    result["stats"] = client.stats()
    result["run"] = client.observer.run_id
    prefetch = getattr(client, "prefetch_result", None)
    if prefetch is not None and prefetch.done() and not prefetch.cancelled():
        try:
            result["prefetch"] = prefetch.result()
        except Exception as exc:
            result["prefetch"] = {"error": repr(exc)}


def _kernels_hooked() -> bool:
    mod = sys.modules.get("torch._inductor.cpp_builder")
    return mod is not None and bool(getattr(mod.CppBuilder.build, "__objcache__", False))


def worker_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m objcache.integrations.torch.demo --worker")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--model", type=model_name, default="tiny")
    p.add_argument("--salt", type=float, default=1.0)
    p.add_argument(
        "--batches",
        default="",
        help="comma-separated batch sizes, one step at each (default: one step, batch 2/4)",
    )
    p.add_argument(
        "--objcache",
        choices=("off", "install", "auto"),
        default="install",
        help="off: torch only; install: objcache.install(); auto: the zero-code path decides",
    )
    p.add_argument(
        "--eager", action="store_true", help="run the step without torch.compile (a baseline)"
    )
    p.add_argument(
        "--inference", action="store_true", help="forward steps without autograd (no training)"
    )
    p.add_argument("--device", default="cpu", help="cpu, or cuda: model and inputs there")
    p.add_argument("--mode", default="", help="torch.compile's mode (e.g. max-autotune)")
    p.add_argument(
        "--compiler-imported",
        action="store_true",
        help="import Inductor's compiler (torch._inductor.compile_fx) before the first step",
    )
    p.add_argument("--mega-save", default="")
    p.add_argument("--mega-load", default="")
    p.add_argument("--torch-mega-save", default="")
    p.add_argument("--torch-mega-load", default="")
    return p


def worker_main(argv: Sequence[str] | None = None) -> int:
    args = worker_parser().parse_args(argv)
    try:
        result = run_worker(args)
    except Exception as exc:  # report, do not hide: the parent prints it
        import traceback

        traceback.print_exc()
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(RESULT_TAG + json.dumps(result, default=str), flush=True)
    return 0 if result.get("ok") else 1


# --- the parent: run workers ------------------------------------------------------------------


@dataclass
class Job:
    """One worker run: its result, wall time and the tail of its stderr."""

    result: dict[str, Any]
    wall_s: float
    returncode: int
    stderr_tail: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.result.get("ok"))


def run_job(
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    command: Sequence[str] | None = None,
    on_stage: Callable[[str], None] | None = None,
    timeout: float = 900.0,
) -> Job:
    """Run a worker in a subprocess and parse its result line."""
    cmd = [
        *(command or [sys.executable, "-m", "objcache.integrations.torch.demo"]),
        "--worker",
        *args,
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    tail: deque[str] = deque(maxlen=60)
    out: list[str] = []

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith(STAGE_TAG):
                if on_stage is not None:
                    on_stage(line[len(STAGE_TAG) :].strip())
            else:
                tail.append(line.rstrip())

    def read_stdout() -> None:
        assert proc.stdout is not None
        out.extend(proc.stdout)

    readers = [threading.Thread(target=f, daemon=True) for f in (read_stderr, read_stdout)]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        tail.append(f"worker timed out after {timeout:.0f}s")
    for reader in readers:
        reader.join(10)
    result: dict[str, Any] = {"ok": False, "error": "no result line"}
    for line in out:
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG) :])
    return Job(result, time.perf_counter() - started, proc.returncode, list(tail))


def machine_env(root: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a simulated machine whose local state lives under ``root``."""
    env = dict(os.environ if base is None else base)
    for sub in ("inductor", "triton", "tmp", "objcache-local"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    env.update(
        TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"),
        TRITON_CACHE_DIR=os.path.join(root, "triton"),
        TMPDIR=os.path.join(root, "tmp"),
        OBJCACHE_LOCAL_DIR=os.path.join(root, "objcache-local"),
    )
    env.pop("OBJCACHE_RUN_GROUP", None)  # another machine is another start
    return env


# --- summaries --------------------------------------------------------------------------------


def remote_bytes(result: Mapping[str, Any]) -> tuple[int, int]:
    """(bytes read from, bytes written to) remote tiers."""
    tiers = result.get("stats", {}).get("tiers", [])
    remote = [t for t in tiers if not t.get("local")]
    return sum(t["bytes_read"] for t in remote), sum(t["bytes_written"] for t in remote)


def objcache_hits(result: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """kind -> (hits, gets) as objcache served them."""
    cache = result.get("stats", {}).get("cache", {})
    gets, hits = cache.get("gets", {}), cache.get("hits", {})
    return {kind: (int(hits.get(kind, 0)), int(n)) for kind, n in sorted(gets.items())}


def gxx_builds(result: Mapping[str, Any]) -> int | None:
    kernels = result.get("integration", {}).get("kernels")
    return None if kernels is None else int(kernels.get("builds", 0))


def _fmt_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / 1024:.1f} KB"
    return f"{n / (1 << 20):.1f} MB"


_SHORT = {"fx-graph": "fx", "aot-autograd": "aot", "kernel": "kernel", "pgo": "pgo"}


def _hits_cell(result: Mapping[str, Any]) -> str:
    parts = [
        f"{_SHORT.get(kind, kind)} {h}/{n}"
        for kind, (h, n) in objcache_hits(result).items()
        if kind not in ("manifest",)
    ]
    return ", ".join(parts) or "-"


def _torch_cell(result: Mapping[str, Any]) -> str:
    t = result.get("torch", {})
    fx = int(t.get("fxgraph_cache_hit", 0))
    fx_all = fx + int(t.get("fxgraph_cache_miss", 0))
    aot = int(t.get("autograd_cache_hit", 0))
    aot_all = aot + int(t.get("autograd_cache_miss", 0))
    return f"fx {fx}/{fx_all}, aot {aot}/{aot_all}"


def main(argv: Sequence[str] | None = None) -> int:
    """The demo (``objcache demo [--model M] [--keep]`` calls this) or, with --worker, a worker."""
    argv = list(argv or [])
    if "--worker" in argv:
        return worker_main(argv)
    parser = argparse.ArgumentParser(prog="objcache demo", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model",
        type=model_name,
        default="block",
        help="tiny, block, or a library model: torchvision:<name>, timm:<name>",
    )
    parser.add_argument("--keep", action="store_true", help="keep the demo's temp dirs")
    parser.add_argument("--timeout", type=float, default=900.0)
    opts = parser.parse_args(argv)
    return _demo(opts.model, opts.keep, opts.timeout)


def _run_with_progress(
    console: Any, what: str, args: Sequence[str], env: Mapping[str, str], timeout: float
) -> Job:
    """Run one worker under a spinner showing its current stage and elapsed time."""
    started = time.perf_counter()
    stage = ["starting"]
    done = threading.Event()
    with console.status(what) as status:

        def on_stage(name: str) -> None:
            stage[0] = name

        def tick() -> None:
            while not done.is_set():
                elapsed = time.perf_counter() - started
                status.update(f"{what} — {stage[0]} ({elapsed:.0f}s)")
                done.wait(0.5)

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            return run_job(args, env, on_stage=on_stage, timeout=timeout)
        finally:
            done.set()
            ticker.join()


def _demo(model: str, keep: bool, timeout: float) -> int:
    from rich.console import Console
    from rich.table import Table

    from objcache.config.settings import Config

    console = Console()
    config = Config.from_env()
    tiers = ", ".join(t.display for t in config.effective_tiers())
    default = "" if config.tiers else " (embedded default: set OBJCACHE_TIERS to use yours)"
    console.print(f"[bold]objcache demo[/]: model [cyan]{model}[/], store {tiers}{default}")
    root = tempfile.mkdtemp(prefix="objcache-demo-")
    run_id = f"{random.randrange(1 << 30):08x}"
    salt = 1.0 + int(run_id, 16) * 1e-12
    cold_env = machine_env(os.path.join(root, "machine-a"))
    new_env = machine_env(os.path.join(root, "machine-b"))
    for env in (cold_env, new_env):
        env["OBJCACHE_JOB"] = f"objcache-demo-{run_id}"
        env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    args = ["--model", model, "--salt", repr(salt), "--objcache", "install"]
    plan = [
        ("cold", cold_env, "compiling from scratch (g++ for every kernel)"),
        ("new machine", new_env, "fresh local dirs, shared store"),
        ("warm", new_env, "same machine again"),
    ]
    jobs: list[tuple[str, Job]] = []
    try:
        for label, env, what in plan:
            job = _run_with_progress(console, f"{label}: {what}", args, env, timeout)
            jobs.append((label, job))
            if not job.ok:
                console.print(f"[red]{label} run failed:[/] {job.result.get('error', '')}")
                for line in job.stderr_tail[-20:]:
                    console.print(f"  {line}", highlight=False, markup=False)
                return 1
            console.print(f"  {label}: first step {job.result['first_step_s']:.1f}s")
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)

    table = Table(title="objcache demo: one training step, three machines' worth")
    for col in (
        "run",
        "first step",
        "torch local hits",
        "objcache hits/gets",
        "from remote",
        "to remote",
        "kernel g++ builds",
        "matches eager",
    ):
        table.add_column(
            col, justify="right" if col not in ("run", "objcache hits/gets") else "left"
        )
    for label, job in jobs:
        r = job.result
        down, up = remote_bytes(r)
        builds = gxx_builds(r)
        table.add_row(
            label,
            f"{r['first_step_s']:.1f} s",
            _torch_cell(r),
            _hits_cell(r),
            _fmt_bytes(down),
            _fmt_bytes(up),
            "-" if builds is None else str(builds),
            "[green]yes[/]" if r.get("match") else f"[red]no[/] ({r.get('max_abs_err'):.2g})",
        )
    console.print(table)
    cold, new = jobs[0][1].result, jobs[1][1].result
    speedup = cold["first_step_s"] / max(new["first_step_s"], 1e-9)
    console.print(
        f"The new machine's first step took {new['first_step_s']:.1f}s instead of "
        f"{cold['first_step_s']:.1f}s ({speedup:.1f}x), with "
        f"{gxx_builds(new) or 0} kernel builds."
    )
    ok = all(job.result.get("match") for _, job in jobs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
