"""One Triton compile in a fresh process, as a real client of ObjcacheTritonBackend.

Run as ``python tests/support/triton_worker.py OUT_DIR [ROUNDS]`` with ``OBJCACHE_TRITON=1``
and the usual ``OBJCACHE_*`` / ``TRITON_CACHE_DIR`` variables. It compiles a vector-add
kernel for ``sm_80`` (no GPU needed: Triton's wheel bundles ptxas) ROUNDS times, each time in a
fresh ``TRITON_CACHE_DIR``, and writes ``OUT_DIR/result.json`` plus every artifact of each compiled
kernel (``OUT_DIR/<round>/asm.<ext>``), recording the evidence of whether anything was
compiled:

* ``cache_hit``: Triton's own compilation listener (``knobs.compilation.listener``);
* ``stages_run``: calls of each NVIDIA compiler stage (``make_ttir`` ... ``make_cubin``),
  counted by wrapping the stage table built by ``CUDABackend.add_stages``;
* ``ptxas_runs``: ``ptxas`` invocations that compile (``subprocess.run``);
* ``remote_gets``: calls reaching the remote tiers' backends;
* ``triton``: the backend's counters (``objcache.integrations.triton.stats()``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import triton
import triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia import compiler as nv
from triton.compiler import ASTSource

import objcache
from objcache.integrations import triton as objcache_triton

counts: Counter[str] = Counter()


@triton.jit  # type: ignore[untyped-decorator]
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def _instrument() -> None:
    original_add_stages = nv.CUDABackend.add_stages

    def add_stages(self: Any, stages: dict[str, Any], options: Any, language: Any) -> None:
        original_add_stages(self, stages, options, language)
        for name, stage in list(stages.items()):

            def counted(src: Any, metadata: Any, _stage: Any = stage, _name: str = name) -> Any:
                counts[f"stage:{_name}"] += 1
                return _stage(src, metadata)

            stages[name] = counted

    nv.CUDABackend.add_stages = add_stages

    original_run = subprocess.run

    def run(cmd: Any, *args: Any, **kwargs: Any) -> Any:
        argv = [str(a) for a in cmd] if isinstance(cmd, list | tuple) else []
        if argv and "ptxas" in Path(argv[0]).name and "--version" not in argv:
            counts["ptxas"] += 1
        return original_run(cmd, *args, **kwargs)

    subprocess.run = run  # type: ignore[assignment]


def _count_remote_gets(client: Any) -> None:
    for tier in client.cache.remotes:
        original: Callable[[str, int], Any] = tier.backend.get_capped  # what tiers call

        async def get(key: str, max_bytes: int, _original: Callable[..., Any] = original) -> Any:
            counts["remote_get"] += 1
            return await _original(key, max_bytes)

        tier.backend.get_capped = get


def compile_once(out: Path, client: Any) -> dict[str, Any]:
    """Compile the kernel once; what it took, and the artifacts under ``out``."""
    counts.clear()
    objcache_triton.reset_stats()
    served_before = Counter(client.stats()["cache"]["served_by"])
    seen: dict[str, Any] = {}

    def listener(**kw: Any) -> None:
        seen["cache_hit"] = kw["cache_hit"]

    knobs.compilation.listener = listener
    src = ASTSource(
        add_kernel,
        {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
        constexprs={"BLOCK": 128},
    )
    kernel = triton.compile(src, target=GPUTarget("cuda", 80, 32))
    out.mkdir(parents=True, exist_ok=True)
    asm = {}
    for ext, value in kernel.asm.items():
        data = value if isinstance(value, bytes) else value.encode()
        (out / f"asm.{ext}").write_bytes(data)
        asm[ext] = hashlib.sha256(data).hexdigest()
    client.flush()  # remote writes and local write-through are done when this returns
    served = Counter(client.stats()["cache"]["served_by"])
    served.subtract(served_before)
    return {
        "cache_dir": knobs.cache.dir,
        "cache_hit": seen.get("cache_hit"),
        "stages_run": {k[6:]: v for k, v in counts.items() if k.startswith("stage:")},
        "ptxas_runs": counts["ptxas"],
        "remote_gets": counts["remote_get"],
        "asm": asm,
        "hash": kernel.hash,
        "group": sorted(kernel.metadata_group),
        "triton": objcache_triton.stats(),
        "served_by": {k: v for k, v in served.items() if v},
    }


def main(out: Path, rounds: int) -> None:
    """Compile ``rounds`` times, each in a fresh ``TRITON_CACHE_DIR`` (``$TRITON_CACHE_DIR/N``)."""
    root = os.environ["TRITON_CACHE_DIR"]
    installed = objcache_triton.install_from_env()
    _instrument()
    client = objcache.get_client()
    _count_remote_gets(client)
    results = []
    for i in range(rounds):
        os.environ["TRITON_CACHE_DIR"] = os.path.join(root, str(i))
        results.append(compile_once(out / str(i), client))
    result = {
        "installed": installed,
        "manager": knobs.cache.manager_class.__name__ if knobs.cache.manager_class else None,
        "rounds": results,
    }
    (out / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1)
