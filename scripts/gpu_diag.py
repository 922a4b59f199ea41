"""Two machines on one file:// store on a GPU (cold, then new): each worker's whole result
as JSON under $OUT, to see which cache kinds hit and what Triton compiled (scripts/gpu_paths.sh)."""

from __future__ import annotations

import json
import os
import sys
import tempfile

from objcache.demo.demo_jobs import machine_env, run_job

out = os.environ.get("OUT", ".")
mode = sys.argv[1] if len(sys.argv) > 1 else ""
tag = mode or "default"
root = tempfile.mkdtemp(prefix="gpu-diag-")
for label in ("a", "b"):
    env = machine_env(os.path.join(root, label))
    env.update(OBJCACHE_TIERS=f"file://{root}/store", TORCHINDUCTOR_COMPILE_THREADS="1")
    args = ["--model", "block", "--device", "cuda", "--salt", "1.5"]
    job = run_job(args + (["--mode", mode] if mode else []), env, timeout=400)
    with open(os.path.join(out, f"diag-{tag}-{label}.json"), "w") as f:
        json.dump({"result": job.result, "tail": job.stderr_tail[-60:]}, f, indent=1, default=str)
    r = job.result
    print(
        tag,
        label,
        r.get("first_step_s"),
        "triton",
        r.get("triton_compiles"),
        "match",
        r.get("match"),
        "hits",
        r.get("stats", {}).get("cache", {}).get("hits"),
        "gets",
        r.get("stats", {}).get("cache", {}).get("gets"),
        "torch",
        r.get("torch"),
        flush=True,
    )
    print("integration", json.dumps(r.get("integration"))[:1200], flush=True)
