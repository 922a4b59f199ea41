"""What a served precompile entry costs at every step: its portable guards run at each call.

    python bench/precompile_steady_state.py --rounds 3 --steps 40 [--size base]

Per model: one writer run fills a ``file://`` store with precompile entries
(``OBJCACHE_PRECOMPILE=1``); then, round by round, a new machine served those entries and a
new machine compiling the plain way (``OBJCACHE_PRECOMPILE=0``, FX/AOTAutograd entries from
the same store) each run the same training steps. The figure is the median step time over
``--steps`` steps after three warm-up steps; the ratio is the paired median of each round's
served run over the same round's plain run (1.00x: the guards cost nothing measurable).
Every served run must report its entry installed and no guard failure, and every run's
outputs equal eager's; a run where that does not hold is reported, not averaged.

Models: torch's own ``nn.TransformerEncoder`` and a conv net; with ``transformers``
installed, BERT and GPT-2 configs of their own type (small sizes, CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
import torch
import objcache

objcache.install()
from torch import nn
from objcache.integrations.torch.precompile import portable_guards, precompile_entry

# what the served check costs a call, timed around each call torch makes of it
CHECK = []
_check_for = portable_guards.check_for


def _timed_check_for(*args, **kwargs):
    check = _check_for(*args, **kwargs)

    def timed(f_locals):
        start = time.perf_counter()
        try:
            return check(f_locals)
        finally:
            CHECK.append(time.perf_counter() - start)

    return timed


portable_guards.check_for = _timed_check_for
torch.manual_seed(0)
name, steps, size = sys.argv[1], int(sys.argv[2]), sys.argv[3]
# "small": sub-millisecond steps, where the check's cost shows most; "base": a step of a
# few to tens of milliseconds on a CPU, nearer a real training step
width, layers, heads, seq, batch = (64, 2, 4, 16, 4) if size == "small" else (256, 4, 4, 128, 8)


def model_and_input():
    if name == "transformer":
        layer = nn.TransformerEncoderLayer(width, heads, 2 * width, batch_first=True, dropout=0.0)
        return nn.TransformerEncoder(layer, layers), (torch.randn(batch, seq, width),)
    if name == "convnet":
        net = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
            nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
        )
        return net, (torch.randn(8, 3, 32, 32),)
    import transformers

    if name == "bert":
        config = transformers.BertConfig(
            vocab_size=512, hidden_size=width, num_hidden_layers=layers,
            num_attention_heads=heads, intermediate_size=2 * width, attn_implementation="eager",
        )
        model = transformers.BertModel(config)
    else:
        config = transformers.GPT2Config(
            vocab_size=512, n_embd=width, n_layer=layers, n_head=heads,
            attn_implementation="eager",
        )
        model = transformers.GPT2Model(config)
    return model, (torch.randint(0, 512, (batch, seq)),)


model, args = model_and_input()
model.eval()


def first(out):
    if isinstance(out, torch.Tensor):
        return out
    return out[0] if isinstance(out, (tuple, list)) else out.last_hidden_state


compiled = torch.compile(model)
ref = first(model(*args))
times = []
ok = True
for i in range(3 + steps):
    start = time.perf_counter()
    out = first(compiled(*args))
    loss = out.float().square().mean()
    loss.backward()
    times.append(time.perf_counter() - start)
    ok = ok and bool(torch.allclose(out, ref, rtol=1e-4, atol=1e-4))
    model.zero_grad(set_to_none=True)
print("RESULT " + json.dumps({
    "median_step_s": sorted(times[3:])[len(times[3:]) // 2],
    "check_us": 1e6 * sorted(CHECK[3:])[len(CHECK[3:]) // 2] if len(CHECK) > 3 else None,
    "same": ok,
    "precompile": dict(precompile_entry.counters),
}))
"""


def run(
    model: str, root: Path, machine: str, precompile: bool, steps: int, size: str
) -> dict[str, Any]:
    home = root / machine
    home.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "OBJCACHE_TIERS": f"file://{root / 'store'}",
        "OBJCACHE_LOCAL_DIR": str(home / "local"),
        "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor"),
        "TRITON_CACHE_DIR": str(home / "triton"),
        "OBJCACHE_PRECOMPILE": "1" if precompile else "0",
        "OBJCACHE_JOB": f"steady-{model}",
        "PYTHONPATH": str(ROOT),
    }
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model, str(steps), size],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{model} {machine}: {out.stderr[-2000:]}")
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--model", action="append", help="default: every available model")
    parser.add_argument(
        "--size",
        choices=("small", "base"),
        default="small",
        help="small: width 64, 2 layers, 4x16 tokens (sub-ms steps); base: width 256, "
        "4 layers, 8x128 tokens",
    )
    args = parser.parse_args()
    models = args.model or ["transformer", "convnet"]
    if not args.model:
        try:
            import transformers  # noqa: F401

            models += ["bert", "gpt2"]
        except ImportError:
            print("transformers is not installed: torch's own models only", file=sys.stderr)
    print(
        f"| model ({args.size}) | served step | plain step | ratio (paired median) "
        "| the check a call | served runs clean |"
    )
    print("|---|---|---|---|---|---|")
    for model in models:
        with tempfile.TemporaryDirectory(prefix=f"steady-{model}-") as tmp:
            root = Path(tmp)
            run(model, root, "writer", True, 3, args.size)
            ratios, served, plain, checks, clean = [], [], [], [], 0
            for r in range(args.rounds):
                s = run(model, root, f"served{r}", True, args.steps, args.size)
                p = run(model, root, f"plain{r}", False, args.steps, args.size)
                if s.get("check_us") is not None:
                    checks.append(s["check_us"])
                counts = s["precompile"]
                good = (
                    s["same"]
                    and p["same"]
                    and counts.get("installed", 0) >= 1
                    and not any(k.startswith("guard_failed:") for k in counts)
                )
                clean += int(good)
                served.append(s["median_step_s"])
                plain.append(p["median_step_s"])
                ratios.append(s["median_step_s"] / p["median_step_s"])
                if not good:
                    print(f"  {model} round {r}: not clean: {counts}", file=sys.stderr)
            print(
                f"| {model} | {statistics.median(served) * 1e3:.2f} ms "
                f"| {statistics.median(plain) * 1e3:.2f} ms | {statistics.median(ratios):.3f}x "
                f"| {statistics.median(checks) if checks else 0:.0f} us "
                f"| {clean} of {args.rounds} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
