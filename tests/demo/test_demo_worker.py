"""The demo and bench worker (:mod:`objcache.demo.demo_worker`) without
compiling: its model names, and torch's stock models stepped eagerly."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def test_demo_models_are_built_in_or_from_a_library() -> None:
    """``--model`` takes tiny, block, torchvision:<name>, timm:<name>,
    transformers:<model type> or torch's stock modules; anything else is a
    one-line usage error, before torch is imported."""
    import argparse

    from objcache.demo.demo_worker import model_name

    for ok in (
        "tiny",
        "block",
        "torchvision:resnet18",
        "timm:vit_tiny_patch16_224",
        "transformers:bert",
        "torch:transformer",
        "torch:convnet",
    ):
        assert model_name(ok) == ok
    for bad in ("resnet18", "torchvision:", "hub:resnet18", ":x", "", "torch:resnet"):
        with pytest.raises(argparse.ArgumentTypeError, match="unknown model"):
            model_name(bad)


def test_torch_stock_models_compile_and_infer_like_eager(tmp_path: Path) -> None:
    """The matrix bench's torch-family models, training and inference steps (the worker's
    --inference), built and stepped eagerly: shapes and gradients as the bench needs."""
    import argparse

    from objcache.demo import demo_worker

    for name in demo_worker.TORCH_MODELS:
        model, x = demo_worker.build_model(f"torch:{name}", 1.0)
        out, grads = demo_worker._step(model, x)
        assert out.shape[0] == x.shape[0] and len(grads) == len(list(model.parameters()))
        out, grads = demo_worker._infer(model, demo_worker.make_input(f"torch:{name}", 3))
        assert out.shape[0] == 3 and grads == [] and not out.requires_grad
    args = demo_worker.worker_parser().parse_args(["--worker", "--inference"])
    assert isinstance(args, argparse.Namespace) and args.inference


def test_the_collector_s_time_in_the_timed_step_is_counted_and_only_there() -> None:
    import gc

    from objcache.demo import demo_worker

    before = len(gc.callbacks)
    with demo_worker._GcTime() as collector:
        gc.collect(0)
        gc.collect()
    assert collector.full == 1 and collector.seconds > 0
    assert len(gc.callbacks) == before
    gc.collect()
    assert collector.full == 1
    args = demo_worker.worker_parser().parse_args(["--worker", "--collect-first"])
    assert args.collect_first
