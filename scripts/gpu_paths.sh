#!/usr/bin/env bash
# The CUDA paths on a machine with an NVIDIA GPU (docs/benchmarks.md, "GPU"): a new machine
# warm from a file:// store with Triton kernels in FX entries, precompile entries and
# Mega-Cache bundles (bench/warm_start.py --device cuda), the Triton cache backend (a new
# machine with Inductor's FX cache off gets every kernel from objcache's Triton store), and
# torch.compile's max-autotune (the autotune remote cache). Each step's output goes to
# $OUT (or ./gpu-out); a failing step does not stop the others.
#   usage: scripts/gpu_paths.sh [block|autotune|triton|all]...
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
steps=("${@:-all}")
want() { [[ " ${steps[*]} " == *" $1 "* || " ${steps[*]} " == *" all "* ]]; }

{ nvidia-smi -L; $PY -c 'import torch, triton; print("torch", torch.__version__, "triton",
  triton.__version__, torch.cuda.get_device_name())'; $PY -m objcache.cli doctor; } \
  >"$OUT/doctor.txt" 2>&1
echo "doctor: exit $?"; tail -25 "$OUT/doctor.txt"

if want block; then
  # warm-local baseline, new machine, precompile entries, bundles, torch's Mega-Cache
  timeout 330 $PY bench/warm_start.py --runs "${RUNS:-2}" --model block --device cuda \
    --remote file --rtt-ms 0 --only 'new machine' --only bundle --only 'Mega-Cache' \
    --section warm-start-cuda --out "$OUT/bench.md" >"$OUT/block.txt" 2>&1
  echo "block: exit $?"; grep -E "round|ratio|failed|differs|Error" "$OUT/block.txt" | tail -30
fi

if want triton; then
  # machine A compiles with OBJCACHE_TRITON=1 into a file:// store; machine B, fresh dirs and
  # Inductor's FX cache off, must compile 0 Triton kernels: Triton's own cache is served
  timeout 200 $PY - >"$OUT/triton.txt" 2>&1 <<'EOF'
import json, os, tempfile
from objcache.demo.demo import machine_env, run_job
root = tempfile.mkdtemp(prefix="gpu-triton-")
store = f"file://{root}/store"
for label in ("a", "b"):
    env = machine_env(os.path.join(root, label))
    env.update(OBJCACHE_TIERS=store, OBJCACHE_TRITON="1", TORCHINDUCTOR_COMPILE_THREADS="1",
               TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    job = run_job(["--model", "block", "--device", "cuda", "--salt", "1.25"], env, timeout=240)
    r = job.result
    print(label, json.dumps({k: r.get(k) for k in ("ok", "error", "first_step_s",
          "triton_compiles", "match", "max_abs_err")}), flush=True)
    print(label, "stats", json.dumps(r.get("stats", {}))[:1500], flush=True)
    if not job.ok:
        print("\n".join(job.stderr_tail[-30:]))
EOF
  echo "triton: exit $?"; cat "$OUT/triton.txt" | cut -c1-600 | tail -20
fi

if want autotune; then
  timeout 540 $PY bench/warm_start.py --runs 1 --model block --device cuda \
    --mode max-autotune-no-cudagraphs --remote file --rtt-ms 0 --only 'new machine (file)' \
    --section warm-start-cuda-autotune --out "$OUT/bench-autotune.md" >"$OUT/autotune.txt" 2>&1
  echo "autotune: exit $?"; grep -E "round|ratio|failed|differs|Error" "$OUT/autotune.txt" | tail -20
fi
exit 0
