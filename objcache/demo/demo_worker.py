"""The compile workload of ``objcache demo``, the tests and ``bench/``: one process, one compile.

``python -m objcache.demo.demo --worker ...`` builds one model (a built-in one,
or one of a model library's, with random weights), compiles it, runs one step (a training
step, or inference), compares it with eager and prints everything the parent reports as one
JSON line tagged :data:`RESULT_TAG`; the stage it is in goes to stderr tagged
:data:`STAGE_TAG`. :mod:`.demo_jobs` runs it as a simulated machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from objcache.integrations.patching import is_marked

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
    (:mod:`objcache.demo.demo_models`, at module level as torch's caching
    precompile needs).

    The ``forward`` methods close over nothing (no captured locals, no ``super()``): torch's
    PGO names a frame by its code *and* a hash of its closure cells, and on Python < 3.12 that
    hash differs in every process, so a closure's dynamic-shape profile never matches in the
    next process (see docs/torch.md, "Known limits").
    """
    import torch

    from objcache.demo.demo_models import Block, Salted, TextLogits, Tiny

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


class _GcTime:
    """The time the cyclic collector took while inside, and how many full collections."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._started
        self.full += info.get("generation") == 2

    def __enter__(self) -> _GcTime:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


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

    from objcache.integrations.install.watched import NOT_IMPORTED, WATCHED

    for name in WATCHED:
        if name not in NOT_IMPORTED:  # another package's (vLLM's): not what install() imports
            importlib.import_module(name)
    if args.compiler_imported:
        # what the first torch.compile() call imports (Inductor's compiler, 0.8 s on a
        # 2-vCPU machine), paid alike by every start: out of the first step when asked
        importlib.import_module("torch._inductor.compile_fx")
    if args.objcache == "install":
        from objcache.integrations.install import install

        install()
    if args.torch_mega_load:
        with open(args.torch_mega_load, "rb") as f:
            torch.compiler.load_cache_artifacts(f.read())
    if args.mega_load:
        from objcache.integrations.torch.mega import mega

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
    if args.collect_first:
        # a full collection's place is decided by how many objects everything imported
        # left: one more module and it lands in the timed step of one start and not the
        # other's (docs/benchmarks.md, "Where a full collection lands")
        gc.collect()
    collections = _GcTime()
    # "first step": torch.compile() (where a precompile entry is loaded, docs/torch.md) and
    # the first step at each batch size, where every compile happens; --eager: the same
    # first step without torch.compile (what compiling has to beat)
    t0 = time.perf_counter()
    cpu0, thread0 = time.process_time(), time.thread_time()
    with collections:
        compiled = model if args.eager else torch.compile(model, **_compile_options(args.mode))
        steps = [step(compiled, xi) for xi in inputs]
        if args.device != "cpu":
            torch.cuda.synchronize()
    result["first_step_s"] = time.perf_counter() - t0
    # CPU in the step: the compiling thread's own, and the whole process's (every thread)
    result["first_step_cpu_s"] = time.thread_time() - thread0
    result["first_step_process_cpu_s"] = time.process_time() - cpu0
    result["gc_s"], result["gc_full"] = collections.seconds, collections.full
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
    from objcache.integrations.torch.timing import phase_times

    result["phases"] = {k: list(v) for k, v in phase_times.snapshot().items()}
    if args.torch_mega_save:
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            with open(args.torch_mega_save, "wb") as f:
                f.write(saved[0])
    if args.mega_save:
        from objcache.integrations.torch.mega import mega

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
    from objcache.integrations import cache_client
    from objcache.integrations.torch.kernels import kernels

    _stage("flush")
    kernels.wait_stored(60)
    client = cache_client.get_client()
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
    return mod is not None and is_marked(mod.CppBuilder.build)


def worker_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m objcache.demo.demo --worker")
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
    p.add_argument(
        "--collect-first",
        action="store_true",
        help="a full garbage collection before the timed step (both rows of a bench alike)",
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
