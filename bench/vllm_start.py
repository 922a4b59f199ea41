"""vLLM start-up benchmark: process start to first token, per way of starting.

    make vllm                      # its own venv (.venv-vllm), then this script
    python bench/vllm_start.py --python .venv-vllm/bin/python [--rounds 2] [--aot both|on|off]

Each start is a fresh ``python bench/vllm_child.py MODEL`` in the vLLM venv: ``LLM(...)`` with
default settings (``skip_tokenizer_init``, token-id prompt), 8 greedy tokens. A *machine* is a
directory holding its own ``HOME``, ``VLLM_CACHE_ROOT``, ``TORCHINDUCTOR_CACHE_DIR``,
``TMPDIR`` and objcache local dir; only the ``file://`` store is shared. The model is a tiny
random-weight Llama written once into the work directory (no hub access).

Rows, for vLLM's default AOT compile and again with ``VLLM_USE_AOT_COMPILE=0``:

* cold, vLLM + torch alone: a fresh machine, objcache off (once, to fill the warm machine);
* warm-local, vLLM + torch alone: that machine again (the baseline of every ratio);
* objcache, new machine (file://): a fresh machine each round, the store filled by one
  objcache cold start.

Rounds interleave warm-local and new machine (paired); the ratio is median over median.
Every start's token ids must equal the cold start's. The markdown table replaces the
``vllm_start`` section of ``docs/benchmarks.md``; a chart is written beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _chart, _report
from bench._installed import compile_bytecode

ROOT = Path(__file__).resolve().parent.parent
CHILD = ROOT / "bench" / "vllm_child.py"
MODEL_SCRIPT = """
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
LlamaForCausalLM(cfg).save_pretrained(sys.argv[1], safe_serialization=True)
"""


def make_model(python: str, work: Path) -> Path:
    model = work / "model"
    if not (model / "config.json").exists():
        subprocess.run([python, "-c", MODEL_SCRIPT, str(model)], check=True, capture_output=True)
    return model


def start(python: str, model: Path, machine: Path, store: str | None, aot: bool) -> dict[str, Any]:
    """One start on ``machine``: seconds from process start to first token, token ids, and
    objcache's stats when it was on."""
    for sub in ("home", "vllm", "inductor", "tmp", "local"):
        (machine / sub).mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OBJCACHE_", "VLLM_", "TORCH"))}
    env.update(
        HOME=str(machine / "home"),
        VLLM_CACHE_ROOT=str(machine / "vllm"),
        TORCHINDUCTOR_CACHE_DIR=str(machine / "inductor"),
        TMPDIR=str(machine / "tmp"),
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"),
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_USE_AOT_COMPILE="1" if aot else "0",
    )
    if store is not None:
        env.update(
            OBJCACHE_TIERS=store,
            OBJCACHE_LOCAL_DIR=str(machine / "local"),
            OBJCACHE_JOB="vllm-bench",
            OBJCACHE_STATS_FILE=str(machine / "stats.json"),
        )
    began = time.time()
    out = subprocess.run(
        [python, str(CHILD), str(model)], env=env, capture_output=True, text=True, timeout=900
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        (machine / "failed.log").write_text(out.stdout + out.stderr)
        raise SystemExit(f"start failed on {machine} (log: {machine / 'failed.log'})")
    result = json.loads(lines[-1][len("RESULT ") :])
    stats_path = machine / "stats.json"
    return {
        "s": result["first_token_at"] - began,
        "tokens": result["tokens"],
        "stats": json.loads(stats_path.read_text()) if stats_path.exists() else None,
    }


def scenario_set(
    python: str, model: Path, work: Path, aot: bool, rounds: int, log: Any
) -> dict[str, Any]:
    tag = "aot" if aot else "no-aot"
    store = f"file://{work / f'store-{tag}'}"
    cold = start(python, model, work / f"warm-{tag}", None, aot)
    log(f"[{tag}] cold, torch alone: {cold['s']:.1f} s")
    seed = start(python, model, work / f"seed-{tag}", store, aot)
    log(f"[{tag}] cold, objcache (fills the store): {seed['s']:.1f} s")
    warm: list[float] = []
    new: list[float] = []
    same = seed["tokens"] == cold["tokens"]
    last: dict[str, Any] = {}
    for r in range(rounds):
        w = start(python, model, work / f"warm-{tag}", None, aot)
        last = start(python, model, work / f"new-{tag}-{r}", store, aot)
        warm.append(w["s"])
        new.append(last["s"])
        same = same and w["tokens"] == cold["tokens"] == last["tokens"]
        log(f"[{tag}] round {r + 1}: warm-local {w['s']:.1f} s, new machine {last['s']:.1f} s")
    return {
        "aot": aot,
        "cold": cold["s"],
        "warm": warm,
        "new": new,
        "ratio": statistics.median(new) / statistics.median(warm),
        "tokens_equal": same,
        "new_stats": last.get("stats"),
    }


def table(results: list[dict[str, Any]], rounds: int) -> str:
    lines = [
        "| vLLM compile | cold, vLLM + torch alone | warm-local, vLLM + torch alone (baseline) "
        "| objcache, new machine (file://) | new / warm-local | token ids equal cold's |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {'AOT compile (default)' if r['aot'] else 'VLLM_USE_AOT_COMPILE=0'} "
            f"| {r['cold']:.1f} s | {statistics.median(r['warm']):.1f} s "
            f"| {statistics.median(r['new']):.1f} s | **{r['ratio']:.2f}x** "
            f"| {'yes' if r['tokens_equal'] else 'NO'} |"
        )
    lines.append("")
    lines.append(
        f"Medians of {rounds} paired rounds (warm-local, then a new machine). Rounds: "
        + "; ".join(
            f"{'AOT' if r['aot'] else 'no AOT'}: warm "
            + ", ".join(f"{x:.1f}" for x in r["warm"])
            + " / new "
            + ", ".join(f"{x:.1f}" for x in r["new"])
            for r in results
        )
        + " s."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--aot", choices=("both", "on", "off"), default="both")
    p.add_argument("--work", type=Path, default=None, help="work dir (default: a temp dir)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    p.add_argument("--section", default="vllm_start")
    opts = p.parse_args(argv)
    compile_bytecode()  # as an installed objcache runs (bench/_installed.py)
    work = opts.work or Path(tempfile.mkdtemp(prefix="objcache-vllm-"))
    work.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, flush=True)

    model = make_model(opts.python, work)
    modes = {"both": (True, False), "on": (True,), "off": (False,)}[opts.aot]
    results = [scenario_set(opts.python, model, work, aot, opts.rounds, log) for aot in modes]
    for r in results:
        log(f"ratio vs warm-local ({'AOT' if r['aot'] else 'no AOT'}): {r['ratio']:.2f}x")
    (work / "results.json").write_text(json.dumps(results, indent=1))
    command = f"make vllm VLLM_ROUNDS={opts.rounds}"
    _report.write_section(opts.out, opts.section, command, table(results, opts.rounds))
    spec = {
        "chart": "grouped",
        "title": "vLLM (CPU) start: process start to first token, tiny Llama",
        "ylabel": "seconds",
        "series": ["objcache, new machine", "vLLM + torch alone, warm-local"],
        "groups": [
            [
                "AOT compile" if r["aot"] else "VLLM_USE_AOT_COMPILE=0",
                [statistics.median(r["new"]), statistics.median(r["warm"])],
            ]
            for r in results
        ],
    }
    _chart.write_beside(opts.out, opts.section, spec)
    if opts.work is None:
        shutil.rmtree(work, ignore_errors=True)
    if not all(r["tokens_equal"] for r in results):
        raise SystemExit("token ids differ from the cold start's")


if __name__ == "__main__":
    main()
