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
from typing import Any


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv]
    shapes = list(zip(sizes[::2], sizes[1::2], strict=True))
    started = time.perf_counter()
    import torch
    from torch._dynamo.utils import counters

    if os.environ.get("GUARDED_OBJCACHE", "1") == "1":
        import objcache

        objcache.install()
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    from torch._inductor.codecache import FxGraphCache

    keys: dict[str, list[str]] = {"fx": [], "aot": []}
    lookup_graph = FxGraphCache._lookup_graph
    aot_lookup = AOTAutogradCache._lookup

    def record_fx(key: str, *args: Any, **kwargs: Any) -> Any:
        keys["fx"].append(key)
        return lookup_graph(key, *args, **kwargs)

    def record_aot(key: str, *args: Any, **kwargs: Any) -> Any:
        keys["aot"].append(key)
        return aot_lookup(key, *args, **kwargs)

    FxGraphCache._lookup_graph = staticmethod(record_fx)  # type: ignore[method-assign]
    AOTAutogradCache._lookup = staticmethod(record_aot)  # type: ignore[method-assign]

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
        "keys": keys,
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
