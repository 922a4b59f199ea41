#!/usr/bin/env bash
# `make compat TORCH=<version> [COMPAT_VENV=<path>]` (docs/torch.md, "Release checklist"):
# a separate venv holding that torch and the Triton it pins, objcache's dev extras installed
# under this repo's constraints minus their torch/Triton pins, then the torch integration
# tests, `objcache doctor` (which parts are active) and `objcache demo`, run against this
# checkout. Not part of `make test`. Every step runs; the exit status says whether all passed,
# and <venv>/compat-summary.txt records each step's result and time.
set -uo pipefail

version=${1:?usage: scripts/compat.sh TORCH_VERSION [VENV]}
venv=${2:-/tmp/compat-$version}
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PY:-python3}
summary=$venv/compat-summary.txt
failed=0

if [[ ! -x $venv/bin/python ]]; then
    "$py" -m venv "$venv" || exit 1
fi
: >"$summary"

step() { # step NAME COMMAND...: run, time and record one step
    local name=$1 start rc
    shift
    start=$(date +%s)
    echo "== $name: $*"
    "$@"
    rc=$?
    printf '%s\trc=%s\t%ss\t%s\n' "$name" "$rc" "$(($(date +%s) - start))" "$*" | tee -a "$summary"
    ((rc == 0)) || failed=1
    return "$rc"
}

# The machine-wide pip constraint (if any) may cap torch: this venv is told exactly what to hold.
export PIP_CONSTRAINT=/dev/null # an empty value would not override the config file
pip=("$venv/bin/python" -m pip install -q)

step torch "${pip[@]}" "torch==$version" || exit 1
# The Triton this torch pins, from the installed wheel's metadata (CPU builds pin none).
triton_pin=$("$venv/bin/python" - <<'EOF'
from importlib.metadata import requires

for req in requires("torch") or []:
    name, _, marker = req.partition(";")
    if name.strip().startswith("triton") and "extra" not in marker:
        print(name.strip().replace(" ", ""))
        break
EOF
)
echo "torch $version pins: ${triton_pin:-no triton}"

constraints=$venv/compat-constraints.txt
grep -v -E '^(torch|triton)==' "$root/constraints.txt" >"$constraints"
echo "torch==$version" >>"$constraints"
if [[ -n $triton_pin ]]; then
    echo "$triton_pin" >>"$constraints"
else
    grep -E '^triton==' "$root/constraints.txt" >>"$constraints"
fi
step dev-extras "${pip[@]}" -c "$constraints" "$root[dev]" || exit 1
step versions "$venv/bin/python" -c \
    'import torch, importlib.metadata as m; print("torch", torch.__version__, "triton", m.version("triton"))'

cd "$root" || exit 1
export PYTHONPATH=$root # this checkout's objcache, in subprocesses too
work=$(mktemp -d "${TMPDIR:-/tmp}/objcache-compat.XXXXXX")
step doctor env OBJCACHE_TIERS="file://$work/store" OBJCACHE_LOCAL_DIR="$work/local" \
    "$venv/bin/python" -m objcache.cli doctor
step tests "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs \
    tests/integrations/install/test_{autoload,features,hooks,watched,zero_code_switch}.py \
    tests/demo/test_{demo,demo_worker}.py tests/integrations/test_patching.py \
    tests/integrations/torch/kernels/test_kernels.py tests/integrations/torch/mega/test_{mega,seed}.py \
    tests/integrations/torch/remote/test_{remote_cache_classes,serde,writethrough}.py tests/test_client.py \
    tests/integrations/torch/remote/test_pgo.py tests/mega/test_mega_recipe.py \
    tests/integrations/torch/remote/test_guarded_candidates.py tests/integrations/torch/test_compile.py \
    ${COMPAT_PYTEST_ARGS:-}
step demo "$venv/bin/python" -m objcache.cli demo
# A new machine against torch's own warm local cache (model block, one run each): the ratio
# of docs/torch.md's release matrix. About two cold compiles and two warm runs more;
# COMPAT_BENCH=0 skips it.
if [[ ${COMPAT_BENCH:-1} != 0 ]]; then
    step warm-start bash -c 'set -o pipefail; "$0" bench/warm_start.py --runs 1 --model block \
        --only "new machine (file)" --out "$1/benchmarks.md" --section compat | tee "$1/warm.log"' \
        "$venv/bin/python" "$work"
    grep '^ratio vs' "$work/warm.log" | sed 's/^/warm-start\t/' | tee -a "$summary"
fi
rm -rf "$work"

echo "== summary ($summary)"
cat "$summary"
exit "$failed"
