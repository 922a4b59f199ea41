"""Facts about a graph's own values that decide its compiled code and that torch's keys leave
out (docs/torch.md, "What a served entry depends on"):

* **a frozen parameter Inductor writes into the code as a literal**: with
  ``torch._inductor.config.freezing``, Inductor turns every 0-d constant into a number in the
  generated kernel (``GraphLowering.get_attr``), while torch's FX key names a frozen
  parameter by its values only where ``can_inline_constant`` says so (1-D, at most 8
  elements); a 0-d one (a temperature, CLIP's ``logit_scale``, a folded ``weight.sum()``)
  by its shape alone, so another checkpoint's machine was served the writer's number;
* **which inputs share memory**: AOTAutograd compiles a function whose inputs overlap (two
  views of one tensor, one of them mutated) to another graph (a synthetic base), but its key
  pickles each input's own metadata, never which inputs share a storage, so a first call
  with overlapping views was served the graph compiled for separate tensors;
* **how ``torch.einsum`` contracts**: with three operands or more it asks
  ``torch.backends.opt_einsum`` for a path (whether the ``opt_einsum`` package is installed,
  ``enabled``, ``strategy``) while AOTAutograd traces the graph's ``einsum``, and the path
  decides which products the compiled code computes (in float16 one order overflows where
  the other does not), while the AOTAutograd key names the ``einsum`` call only: a machine
  with the package was served the writer's left-to-right code (the eleventh review).

* **which frozen parameters share memory** (``freezing``): Inductor merges constants that
  share a storage as it lowers (``GraphLowering``'s constant deduplication), after the key
  was read, and the key names a frozen parameter by its metadata: a writer whose two
  parameters shared one storage (tied weights, a checkpoint loaded with ``assign=True``)
  served code reading one constant for both to a machine where they differ (the
  twenty-seventh review: off by 1.39 to 3.97);
* **the values of the frozen parameters a C++ GEMM template packs** (``freezing`` with a C++
  GEMM template among max-autotune's choices): the template packs a frozen weight into a
  new constant as it lowers, and that constant is stored with the entry, so a machine with
  another checkpoint computed with the writer's weights (the same review: off by 68.6).
  Only there are frozen CPU parameters named by a digest of their bytes (their reading costs
  about a second a GB); elsewhere a frozen parameter is read from the program's module as
  the code runs, as torch's key assumes.

Each is empty for a graph without such values, so those keep torch's keys.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

from objcache.integrations.torch.precompile import compile_settings

#: Frozen scalars are named up to this many per graph (more: by a digest of all).
MAX_NAMED = 64


def facts(gm: Any, example_inputs: Any) -> tuple[tuple[str, str], ...]:
    """``(("frozen_scalars", ...), ("input_aliasing", ...))``, each only where present."""
    found: list[tuple[str, str]] = []
    scalars = frozen_scalars(gm)
    if scalars:
        found.append(("frozen_scalars", scalars))
    aliasing = input_aliasing(example_inputs)
    if aliasing:
        found.append(("input_aliasing", aliasing))
    paths = einsum_paths(gm)
    if paths:
        found.append(("einsum_paths", paths))
    params = frozen_params(gm)
    sharing = _sharing(params)
    if sharing:
        found.append(("frozen_sharing", sharing))
    if params and _packs_frozen_weights():
        found.append(("frozen_values", frozen_values(params)))
    return tuple(found)


def frozen_params(gm: Any) -> list[tuple[str, Any]]:
    """``(attribute, tensor)`` of each frozen parameter ``gm`` reads (``freezing``)."""
    freezing_utils = sys.modules.get("torch._inductor.freezing_utils")
    is_frozen = getattr(freezing_utils, "is_frozen_param", None)
    graph = getattr(gm, "graph", None)
    if is_frozen is None or graph is None:
        return []
    found = []
    for node in graph.nodes:
        if node.op != "get_attr":
            continue
        value: Any = gm
        for part in str(node.target).split("."):
            value = getattr(value, part, None)
        if getattr(value, "shape", None) is not None and is_frozen(value):
            found.append((str(node.target), value))
    return found


def _packs_frozen_weights() -> bool:
    """Whether a C++ GEMM template may pack a frozen weight into a constant of its own."""
    config = sys.modules.get("torch._inductor.config")
    return bool(getattr(config, "freezing", False)) and bool(compile_settings.cpu_gemm_geometry())


def frozen_values(params: list[tuple[str, Any]]) -> str:
    """A digest of the bytes of the CPU frozen parameters (by attribute, in order); a tensor
    subclass (which may have no memory of its own) raises ``ValueError``: the key's
    unreadable case, a miss."""
    import torch

    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in params:
        if tensor.device.type != "cpu":
            continue
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or (
            tensor.layout is not torch.strided
        ):
            raise ValueError(f"frozen parameter {name} is a {type(tensor).__name__}")
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}\0".encode())
        flat = tensor.detach().contiguous().reshape(-1)
        if flat.numel():
            digest.update(_bytes_of(flat))
    return digest.hexdigest()


def _bytes_of(flat: Any) -> memoryview:
    """A contiguous CPU tensor's memory, read in place."""
    import ctypes

    if not flat.data_ptr():
        raise ValueError("a frozen parameter without memory of its own")
    nbytes = flat.numel() * flat.element_size()
    return memoryview((ctypes.c_char * nbytes).from_address(flat.data_ptr())).cast("B")


def einsum_paths(gm: Any) -> str:
    """How ``torch.einsum`` picks its contraction order here, where ``gm`` calls it:
    ``opt_einsum``'s presence and version, ``enabled`` and ``strategy``; empty otherwise."""
    # a subgraph's too: Dynamo puts a checkpointed block's code in a graph of its own
    modules = gm.modules() if callable(getattr(gm, "modules", None)) else (gm,)
    graphs = [getattr(module, "graph", None) for module in modules]
    if not any(
        node.op == "call_function" and getattr(node.target, "__name__", "") == "einsum"
        for graph in graphs
        if graph is not None
        for node in graph.nodes
    ):
        return ""
    return compile_settings.opt_einsum_state()


def frozen_scalars(gm: Any) -> str:
    """The values of the 0-d frozen parameters ``gm`` reads (Inductor inlines them)."""
    named = [
        f"{name}={value.item()!r}:{value.dtype}"
        for name, value in frozen_params(gm)
        if len(value.shape) == 0
    ]
    if len(named) > MAX_NAMED:
        return "sha256:" + hashlib.sha256("\0".join(named).encode()).hexdigest()[:32]
    return ",".join(named)


def input_aliasing(example_inputs: Any) -> str:
    """Which tensor inputs share a storage, and whether their memory overlaps: ``0~2``
    (inputs 0 and 2 overlap), ``1=3`` (same storage, apart); empty where none share."""
    if not isinstance(example_inputs, (list, tuple)):
        return ""
    return _sharing([(str(i), value) for i, value in enumerate(example_inputs)])


def _sharing(items: list[tuple[str, Any]]) -> str:
    """Which of the named tensors share a storage: ``a~b`` (their memory overlaps), ``a=b``
    (same storage, apart); empty where none share."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ""
    by_storage: dict[Any, list[tuple[str, Any]]] = {}
    for name, value in items:
        if not isinstance(value, torch.Tensor) or value.layout is not torch.strided:
            continue
        try:
            storage = value.untyped_storage()
        except Exception:  # a tensor without storage (a subclass, a functional wrapper)
            continue
        by_storage.setdefault(storage._cdata, []).append((name, value))
    pairs: list[str] = []
    for group in by_storage.values():
        for a in range(len(group)):
            for b in range(a + 1, len(group)):
                (i, x), (j, y) = group[a], group[b]
                pairs.append(f"{i}{'~' if _overlap(x, y) else '='}{j}")
    return ",".join(pairs)


def _overlap(x: Any, y: Any) -> bool:
    """Whether two tensors of one storage may touch the same element (by their extents;
    symbolic sizes, never read as numbers here, count as touching)."""
    ex, ey = _extent(x), _extent(y)
    if ex is None or ey is None:
        return True
    return ex[0] < ey[1] and ey[0] < ex[1] and ex[0] < ex[1] and ey[0] < ey[1]


def _extent(t: Any) -> tuple[int, int] | None:
    sizes, strides, start = tuple(t.shape), tuple(t.stride()), t.storage_offset()
    if not all(type(v) is int for v in (*sizes, *strides, start)):
        return None  # a symbolic size: reading it would specialise the trace
    if 0 in sizes:
        return (start, start)
    return (
        start,
        start + sum((size - 1) * stride for size, stride in zip(sizes, strides, strict=True)) + 1,
    )
