"""Which Triton kernels a new machine compiles again under max-autotune (docs/benchmarks.md,
"GPU", item 9). Run on a GPU machine from the repository root with
PYTHONPATH=scripts/gpu_autotune_diag:$PWD and OUT set: the sitecustomize.py beside this file
logs every Triton compile of the workers (DIAG_TRITON_LOG)."""

import difflib
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.getcwd())
from bench.warm_start import Bench

OUT = Path(os.environ["OUT"])
root = Path(tempfile.mkdtemp(prefix="diag-"))


def brief(r):
    c = r.get("stats", {}).get("cache", {})
    return (
        f"first {r.get('first_step_s'):.2f} triton {r.get('triton_compiles')} "
        f"graphs {r.get('graphs')} match {r.get('match')} hits {c.get('hits')} "
        f"gets {c.get('gets')} pre {r.get('integration', {}).get('precompile')}"
    )


# 1. precompile on 2.11 when the writer's graphs come from the store
b = Bench(root, "block", {}, 0, "", "cuda", "")
s = f"file://{root}/pstore"
print(
    "plain cold:", brief(b.run(b.fresh("p0"), ["--objcache", "install"], {}, s).result), flush=True
)
on = {"OBJCACHE_PRECOMPILE": "1"}
print(
    "pre writer from store:",
    brief(b.run(b.fresh("p1"), ["--objcache", "install"], dict(on), s).result),
    flush=True,
)
print(
    "pre reader:",
    brief(b.run(b.fresh("p2"), ["--objcache", "install"], dict(on), s).result),
    flush=True,
)
# 2. max-autotune + Triton store: which kernels does a new machine compile again?
b.mode = "max-autotune-no-cudagraphs"
a = f"file://{root}/astore"
logs = {}
for label in ("cold", "new"):
    log = OUT / f"triton-{label}.jsonl"
    env = {"OBJCACHE_TRITON": "1", "DIAG_TRITON_LOG": str(log)}
    print(
        f"autotune {label}:",
        brief(b.run(b.fresh("at"), ["--objcache", "install"], env, a).result),
        flush=True,
    )
    logs[label] = [json.loads(line) for line in log.read_text().splitlines()]
cold, new = logs["cold"], logs["new"]
missed = [r for r in new if not r.get("hit")]
print("new machine compiled", len(missed), "of", len(new), flush=True)
by_name = {}
for r in cold:
    by_name.setdefault(r.get("name"), []).append(r)
for r in missed[:25]:
    same = by_name.get(r.get("name"), [])
    same_src = [c for c in same if c.get("src_hash") == r.get("src_hash")]
    print(
        f"- {r.get('name')} fn {r.get('fn_name')} cold-same-name {len(same)} "
        f"same-src {len(same_src)} sig {r.get('signature')[:120]} "
        f"const {r.get('constants')[:160]}"
    )
    if same and not same_src and same[0].get("fn_src") and r.get("fn_src"):
        d = list(
            difflib.unified_diff(
                same[0]["fn_src"].splitlines(), r["fn_src"].splitlines(), lineterm="", n=0
            )
        )
        print("   diff:", "\n   ".join(d[:14]))
