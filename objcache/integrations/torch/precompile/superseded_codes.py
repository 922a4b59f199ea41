"""Which of a precompile entry's compiled variants is a later dynamic-shape variant covering
an earlier static one (docs/torch.md, "Precompile entries", "A dynamic variant that covers a
static one").

A function first called at one input size and then at another is compiled twice by a cold
process: a static variant, then, after Dynamo's automatic-dynamic recompile, a variant with
symbolic sizes. torch's package keeps both, and torch checks the newer first: served both, a
new machine's first call at the static size would run the dynamic variant's kernels.

At save, the *later* variant is left out of the carried entry where it *covers* an earlier
static variant of the same code (the thirty-fourth adversarial review: the other way round, a
new machine whose first call was at the static size ran the dynamic variant's kernels, which
reduce in another order than the static kernels a compile of that first call makes:
``layer_norm``'s output differed bitwise from torch alone's). Covering means: the same
inputs by source (a tensor's dtype, device type and ``requires_grad`` too), each of the same
rank, every size the
later variant keeps static equal, every size it made symbolic at least 2 in the static
one (Dynamo specializes 0 and 1, so those get no such cover). The shape view is taken from
Dynamo's tracked fakes when the guards are serialized. Leaving the dynamic variant out never
changes a result: a new machine's first call at the static size runs what a compile of it
makes, and a call at another size fails the static variant's guards and is traced and
compiled as usual (a counted recompile, which Dynamo makes dynamic as it would have). The
writer's own process keeps every variant.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from typing import Any

#: A size torch keeps symbolic in a variant (``None``) or the static size it guards on.
Size = int | None
#: Per tracked input (its source; a tensor's dtype, device type and ``requires_grad``):
#: its sizes (a symbolic scalar is a one-element tuple).
Shapes = dict[str, tuple[Size, ...]]

_lock = threading.Lock()
#: Shapes of the variants serialized in this process, by the digest of their guards state.
_shapes: dict[bytes, Shapes] = {}


def _source_name(source: Any) -> str:
    name = source.name
    return str(name() if callable(name) else name)


def _size(value: Any) -> Size:
    import torch

    if isinstance(value, int | torch.SymInt) and not isinstance(value, bool):
        if isinstance(value, int):
            return value
        known = value.node.maybe_as_int()  # None where the size is symbolic
        return None if known is None else int(known)
    raise TypeError(type(value).__name__)


def shapes_of(output_graph: Any) -> Shapes | None:
    """The sizes of a frame's tracked inputs, or None where any is not a plain size (then
    the variant is never dropped nor used to drop another). Never raises."""
    try:
        import torch

        shapes: Shapes = {}
        for tracked in output_graph.tracked_fakes:
            fake = tracked.fake
            name = _source_name(tracked.source)
            if isinstance(fake, torch.Tensor):
                sizes = tuple(_size(s) for s in fake.size())
                # what else torch guards on per tensor: another of these never covers
                name += f" {fake.dtype} {fake.device.type} grad={fake.requires_grad}"
            else:
                sizes = (_size(fake),)
            if shapes.get(name, sizes) != sizes:
                return None
            shapes[name] = sizes
        return shapes
    except Exception:
        return None


def record(guards_state: bytes, shapes: Shapes | None) -> None:
    """Remember the shape view of a variant by its guards state (the bytes torch stores)."""
    if shapes is None:
        return
    with _lock:
        _shapes[hashlib.sha256(guards_state).digest()] = shapes


def _is_dynamic(shapes: Shapes) -> bool:
    return any(size is None for sizes in shapes.values() for size in sizes)


def covers(later: Shapes, static: Shapes) -> bool:
    """Whether a dynamic variant's shapes accept every input a static variant was compiled
    for (module docstring)."""
    if _is_dynamic(static) or not _is_dynamic(later) or later.keys() != static.keys():
        return False
    for name, sizes in later.items():
        seen = static[name]
        if len(seen) != len(sizes):
            return False
        for size, value in zip(sizes, seen, strict=True):
            if value is None or (value < 2 if size is None else value != size):
                return False
    return True


def without_superseded(code_entry: Any) -> tuple[Any, int]:
    """A copy of one code's ``_DynamoCodeCacheEntry`` without the dynamic variants that cover
    an earlier static one, nor the backends only they call; and how many it left out."""
    guarded = list(code_entry.guarded_codes)
    with _lock:
        views = [_shapes.get(hashlib.sha256(g.guards_state).digest()) for g in guarded]
    superseded = {
        i
        for i, view in enumerate(views)
        if view is not None
        and any(earlier is not None and covers(view, earlier) for earlier in views[:i])
    }
    if not superseded:
        return dataclasses.replace(code_entry), 0
    kept = [g for i, g in enumerate(guarded) if i not in superseded]
    called = {n for g in kept for n in g.dynamo_code.co_names}
    dropped = {n for i in superseded for n in guarded[i].dynamo_code.co_names}
    backends = [b for b in code_entry.backend_ids if b in called or b not in dropped]
    return (
        dataclasses.replace(code_entry, guarded_codes=kept, backend_ids=backends),
        len(superseded),
    )


def forget() -> None:
    """Drop every recorded view (the part's uninstall; tests)."""
    with _lock:
        _shapes.clear()
