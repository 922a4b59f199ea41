"""Compile subprocess of the guarded-candidates tests and bench.

``python -m tests.support.guarded_worker H W [H W ...]`` compiles one tiny dynamic-shape function
(``adaptive_avg_pool2d`` to a fixed output size, as torch's own FxGraphCache guard tests do)
for inputs ``(1, 4, H, W)`` and prints one JSON line: torch's cache counters, the FX and
AOTAutograd keys looked up, and objcache's counters. Inductor adds guards while lowering
(whether each input size divides the output size), so inputs on different sides of those
guards share one FX key but need different compiled entries.

With ``GUARDED_OBJCACHE=0`` objcache is not installed (plain torch caches).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _local_keys(root: Path) -> dict[str, list[str]]:
    """The FX graph and AOTAutograd keys whose entries torch's local cache holds after the
    run (each compile or hit writes its entry there), read off its folders: patching
    torch's lookups to record them would make the program one that replaced torch's own
    functions, which keys every graph by its trace here."""
    fx = root / "fxgraph"
    return {
        "fx": sorted(p.name for p in fx.glob("*/*") if p.is_dir()),
        "aot": sorted(p.name for p in (root / "aotautograd").glob("*") if p.is_dir()),
    }


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv]
    shapes = list(zip(sizes[::2], sizes[1::2], strict=True))
    started = time.perf_counter()
    import torch
    from torch._dynamo.utils import counters

    if os.environ.get("GUARDED_OBJCACHE", "1") == "1":
        import objcache

        objcache.install()
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.adaptive_avg_pool2d(x, [5, 7])  # type: ignore[arg-type]

    compiled = torch.compile(fn, dynamic=True)
    ok = True
    for h, w in shapes:
        x = torch.rand(1, 4, h, w)
        ok = ok and bool(torch.allclose(compiled(x), fn(x), atol=1e-5))
    result: dict[str, Any] = {
        "ok": ok,
        "wall_s": round(time.perf_counter() - started, 3),
        "inductor": dict(counters["inductor"]),
        "aot_autograd": dict(counters["aot_autograd"]),
        "keys": _local_keys(Path(cache_dir())),
    }
    if os.environ.get("GUARDED_OBJCACHE", "1") == "1":
        from objcache.client import get_client
        from objcache.integrations.torch import stats

        client = get_client()
        client.flush()
        result["objcache"] = stats()
        result["cache"] = client.stats()["cache"]
    print("GUARDED_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
