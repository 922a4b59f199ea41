"""What a precompile entry was compiled *with*: the backend and the compiler settings
(docs/torch.md, "Precompile entries: what a served entry still checks").

A precompile entry holds the code one backend produced under one set of compiler settings;
torch's own caching precompile serves it to any ``torch.compile`` of the same function,
whatever backend, mode or options it names and whatever the process set in
``torch._inductor.config`` (``fallback_random``, ``freezing``, custom passes) or Dynamo's
config. A normal compile would have produced other code there. Two checks close that:

* :func:`compiler_identity`: the backend a ``torch.compile(...)`` wrapper names, with its
  mode, options and ``dynamic``/``fullgraph`` choices, as a portable string. It is part of
  the entry's key (fixed when ``torch.compile()`` wraps the function).
* :func:`settings_digest`: Inductor's, AOTAutograd's and Dynamo's configs (the keys torch
  itself says affect compiled code: Inductor's as its FX-graph cache key takes them, Dynamo's
  and functorch's less the ``compile_ignored`` ones), custom passes by their ``uuid()``, and
  the float32 matmul precision. The writer records it beside each frame's guards when the
  frame is compiled (configs may change between ``torch.compile()`` and the first call); the
  reader compares it where torch checks guards, until it first holds, as a normal compile
  fixes its settings at the frame's first compile. The program's own kernels of torch's ops
  (:func:`.op_overrides.torch_overrides`) are part of it: AOTAutograd traces them with no
  guard.

Dynamo's debug overrides (:data:`DEBUG_OVERRIDES`, ``TORCH_COMPILE_OVERRIDE_BACKENDS``...)
choose another backend or settings for graphs by their number in one process: no entry is
saved or served while one is set (:func:`debug_overrides`).

Anything without a portable identity (a backend object with ``__call__``, a custom pass
object without ``uuid()``) gives None: the entry is neither served nor saved, and the
compile goes on normally. A lambda is named by what it does (its module, code, defaults and
closure: :func:`portable_guards.identity`).
"""

from __future__ import annotations

import enum
import hashlib
import importlib
import os
from typing import Any

from objcache.config import fingerprint
from objcache.integrations.torch.precompile import op_overrides, portable_guards

#: Config modules whose settings a served frame must have been compiled with.
CONFIG_MODULES = ("torch._inductor.config", "torch._functorch.config", "torch._dynamo.config")
#: Settings that only say whether or where to cache, never what code comes out: the
#: precompile part itself turns ``caching_precompile`` off around the writer's guards.
IGNORED = frozenset({"caching_precompile"})
#: Dynamo's ``compile_ignored`` settings that still decide the code a graph gets: another
#: backend, Inductor or Dynamo settings for the graphs a process numbers (a bisecting user's
#: ``TORCH_COMPILE_OVERRIDE_BACKENDS='>=0:eager'``). Numbers another process gives other
#: graphs: with one set, nothing is saved or served (:func:`debug_overrides`).
DEBUG_OVERRIDES = (
    "debug_backend_override",
    "debug_inductor_config_override",
    "debug_dynamo_config_override",
)
#: Inductor's custom pass settings: torch's FX-graph cache key takes them by ``uuid()``.
CUSTOM_PASSES = (
    "pre_grad_custom_pass",
    "post_grad_custom_pre_pass",
    "post_grad_custom_post_pass",
    "joint_custom_pre_pass",
    "joint_custom_post_pass",
    "_pre_fusion_custom_pass",
    "_post_fusion_custom_pass",
    "_fuse_ddp_communication_passes",
    "custom_partitioner_fn",
)


def _canonical(value: Any) -> str | None:
    """A portable rendering of one setting, or None where it has none."""
    uuid = getattr(value, "uuid", None)
    if callable(uuid) and not isinstance(value, type):
        try:
            return f"uuid:{type(value).__module__}.{type(value).__qualname__}:{uuid()!r}"
        except Exception:
            return None
    if isinstance(value, set | frozenset):
        parts = [_canonical(v) for v in value]
        if any(p is None for p in parts):
            return None
        return "set:{" + ",".join(sorted(p or "" for p in parts)) + "}"
    if isinstance(value, dict):
        items = [(_canonical(k), _canonical(v)) for k, v in value.items()]
        if any(k is None or v is None for k, v in items):
            return None
        return "dict:{" + ",".join(sorted(f"{k}={v}" for k, v in items)) + "}"
    if isinstance(value, list | tuple):
        parts = [_canonical(v) for v in value]
        if any(p is None for p in parts):
            return None
        return f"{type(value).__name__}:[" + ",".join(p or "" for p in parts) + "]"
    if isinstance(value, enum.Enum):
        return f"enum:{type(value).__module__}.{type(value).__qualname__}.{value.name}"
    if type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "device"):
        return f"{type(value).__name__}:{value}"
    return portable_guards.identity(value)


def _config_items(module_name: str) -> dict[str, Any]:
    module: Any = importlib.import_module(module_name)
    items = dict(module.save_config_portable(ignore_private_configs=False))
    for name in getattr(module, "_compile_ignored_keys", ()):
        items.pop(name, None)
    if module_name == "torch._inductor.config":
        for name in CUSTOM_PASSES:
            if hasattr(module, name):
                items[name] = getattr(module, name)
    return items


#: (torch's own hashes of the configs and the matmul precision, the digest they gave).
_memo: tuple[Any, str | None] | None = None


def _state() -> Any:
    """What changes whenever a setting :func:`settings_digest` covers changes: torch's cached
    ``get_hash()`` of each config (the same keys, less ``compile_ignored``), or None."""
    import torch

    try:
        hashes = tuple(importlib.import_module(m).get_hash() for m in CONFIG_MODULES)
    except Exception:
        return None
    return (
        *hashes,
        torch.get_float32_matmul_precision(),
        process_facts(),
        op_overrides.token(),
        debug_overrides(),
    )


def debug_overrides() -> tuple[str, ...]:
    """The names of Dynamo's debug overrides (:data:`DEBUG_OVERRIDES`) set in this process
    now; empty by default. Left out of torch's config hash (``compile_ignored``), so read at
    each check."""
    import sys

    config = sys.modules.get("torch._dynamo.config")
    return tuple(name for name in DEBUG_OVERRIDES if getattr(config, name, None))


#: The scaled-dot-product-attention backends torch can choose between.
SDP_BACKENDS = ("flash", "mem_efficient", "math", "cudnn")


def sdp_backends_off() -> tuple[str, ...]:
    """The attention backends the process turned off (``enable_flash_sdp(False)``, inside
    ``sdpa_kernel([...])``): which kernel implements a graph's
    ``scaled_dot_product_attention`` is chosen while AOTAutograd decomposes it, with no guard
    and in no key of torch's, so a graph compiled with flash attention on is otherwise served
    where a normal compile would take the math path. Empty with torch's defaults (every
    backend on), so such processes keep torch's keys."""
    import torch

    backends = getattr(torch.backends, "cuda", None)
    off = []
    for name in SDP_BACKENDS:
        enabled = getattr(backends, f"{name}_sdp_enabled", None)
        try:
            if enabled is not None and not enabled():
                off.append(name)
        except Exception:  # a reader that fails: named, so no key is shared on a guess
            off.append(f"{name}:unreadable")
    return tuple(off)


#: torch's global switches (``torch._C._get_<name>()``) that an aten kernel or decomposition
#: reads while AOTAutograd traces, or that Inductor reads while it lowers, with torch's
#: default: which math the attention decomposition reduces in (``allow_fp16_bf16_reduction_
#: math_sdp``), the attention backends beyond :data:`SDP_BACKENDS`, the oneDNN, cuDNN and
#: NNPACK paths and their deterministic modes, CPU reduced-precision reductions. None is in
#: a key of torch's or guarded.
ATEN_SWITCHES: tuple[tuple[str, object], ...] = (
    ("math_sdp_allow_fp16_bf16_reduction", False),
    ("fa3_sdp_enabled", False),
    ("fa4_sdp_enabled", False),
    ("overrideable_sdp_enabled", True),
    ("mkldnn_enabled", True),
    ("mkldnn_deterministic", False),
    ("cudnn_enabled", True),
    ("cudnn_deterministic", False),
    ("nnpack_enabled", True),
    ("cpu_allow_fp16_reduced_precision_reduction", False),
    ("cublas_allow_fp16_accumulation", False),
)


#: The smallest double above zero (denormal), and a quarter of the spacing of doubles at 1.0:
#: read from globals, so no compiler folds the sums in :func:`float_environment` before the
#: thread's mode can act on them.
_DENORMAL = 5e-324
_QUARTER_ULP = 2.0**-54


def float_environment() -> tuple[str, ...]:
    """How this thread's floating point differs from the default, as ``name=value`` (empty
    where it does not): ``flush_denormal=True`` (``torch.set_flush_denormal(True)``: the CPU's
    flush-to-zero and denormals-are-zero modes, which torch has no getter for) and
    ``rounding=up|down|zero`` (``fesetround`` through ctypes). Inductor folds constants with
    real kernels while it compiles, in the compiling thread: under such a mode a fold gives
    other bits (a denormal folds to zero: 0.0 baked in where a normal compile bakes in 0.1).
    Python's own float arithmetic runs on the same unit and obeys the same modes."""
    tiny, quarter = _DENORMAL, _QUARTER_ULP
    found = []
    if tiny * 2.0 == 0.0:
        found.append("flush_denormal=True")
    up, down = 1.0 + quarter > 1.0, -1.0 - quarter < -1.0
    if up or down:
        found.append(f"rounding={'up' if up else 'down'}")
    elif 1.0 + 3 * quarter == 1.0:  # nearest rounds it to the next double; toward zero does not
        found.append("rounding=zero")
    return tuple(found)


def cpu_gemm_geometry() -> str:
    """The CPU facts Inductor's C++ GEMM templates write into a kernel's source, where they can
    be chosen (``max_autotune`` or ``max_autotune_gemm`` on, ``CPP`` among
    ``max_autotune_gemm_backends``): the per-core L1d and L2 cache sizes its cache blocking
    reads (``torch.cpu.get_capabilities()``) and the thread count its thread blocking reads.
    Neither torch's key nor the environment names them, and a graph's entry carries the source
    with the blocking as constants (a writer with a 512 KB L2 served code off by 372 to a
    machine with 1 MB). Empty where no such template can be chosen, so those keys stay
    torch's."""
    import sys

    config = sys.modules.get("torch._inductor.config")
    torch = sys.modules.get("torch")
    if config is None or torch is None:
        return ""
    if not (getattr(config, "max_autotune", False) or getattr(config, "max_autotune_gemm", False)):
        return ""
    if "CPP" not in str(getattr(config, "max_autotune_gemm_backends", "")).upper().split(","):
        return ""
    try:
        return _cpu_blocking(torch)
    except Exception as exc:  # named, so no key is shared on a guess
        return f"unreadable:{type(exc).__name__}"


def _cpu_blocking(torch: Any) -> str:
    """What the C++ GEMM templates' cache and thread blocking read."""
    caps = torch.cpu.get_capabilities()
    l1d, l2 = caps.get("l1d_cache_size", "?"), caps.get("l2_cache_size", "?")
    return f"l1d={l1d},l2={l2},threads={torch.get_num_threads()}"


def aten_switches_changed() -> tuple[str, ...]:
    """``name=value`` for each of :data:`ATEN_SWITCHES` this process set away from torch's
    default (a switch this release lacks is skipped; one that fails to read is named, so no
    key is shared on a guess), and how the calling thread's floating point differs from the
    default (:func:`float_environment`). Empty with torch's defaults, so such processes keep
    torch's keys."""
    import sys

    c = getattr(sys.modules.get("torch"), "_C", None)
    changed = list(float_environment())
    for name, default in ATEN_SWITCHES:
        getter = getattr(c, f"_get_{name}", None)
        if getter is None:
            continue
        try:
            value = getter()
        except Exception:
            changed.append(f"{name}=?")
            continue
        if value != default:
            changed.append(f"{name}={value!r}")
    return tuple(changed)


def opt_einsum_state() -> str:
    """How ``torch.einsum`` orders a contraction of three operands or more in this process:
    the ``opt_einsum`` package's version (or none), ``enabled`` and ``strategy``
    (``torch.backends.opt_einsum``, read while a graph's ``einsum`` is traced)."""
    import sys

    backend = sys.modules.get("torch.backends.opt_einsum")
    if backend is None:
        return "unread"
    get = getattr(backend, "get_opt_einsum", None)
    package = get() if callable(get) else "?"
    version = "none" if package is None else str(getattr(package, "__version__", "?"))
    enabled, strategy = getattr(backend, "enabled", "?"), getattr(backend, "strategy", "?")
    return f"package={version},enabled={enabled},strategy={strategy}"


def process_facts() -> str:
    """What Dynamo folds into a trace as constants without a guard, because one process
    never changes it (docs/torch.md, "What a served entry depends on"): ``torch.distributed``'s
    backend, world size and rank once it is initialized, a fixed ``PYTHONHASHSEED`` (set
    order and ``hash()`` of a string read while tracing), cuBLAS's TF32 switch, the
    privateuse1 backend's name, the attention backends turned off, how ``torch.einsum`` orders
    its contractions (:func:`opt_einsum_state`), the autocast dtypes
    (``torch.get_autocast_dtype`` is folded; with autocast off torch's global-state guard
    does not compare them), and the CUDA devices' names and capabilities once CUDA is
    initialized (``torch.cuda.get_device_properties`` is folded too), the CPU count (C++
    kernels' OpenMP regions are dynamic where the thread count equals it) and
    ``ATEN_CPU_CAPABILITY`` where it asks for another level than ATen's (Inductor's vector
    ISA, read at each compile). Never raises."""
    import sys

    from objcache.integrations.torch.precompile.unguarded import hash_order

    parts = [f"hashseed={hash_order.fixed_seed() or 'per-process'}"]
    torch = sys.modules.get("torch")
    try:  # Dynamo's constant_fold_functions that one process never changes, less the guarded
        if torch is not None:
            parts.append(f"tf32={torch._C._get_cublas_allow_tf32()}")
            parts.append(f"privateuse1={torch._C._get_privateuse1_backend_name()}")
            # the attention backends a graph's sdpa lowers to, and the dtype
            # ``torch.get_autocast_dtype`` folds into a trace (autocast off: no guard reads it)
            parts.append(f"sdp_off={','.join(sdp_backends_off())}")
            parts.append(f"aten_switches={','.join(aten_switches_changed())}")
            parts.append(f"einsum={opt_einsum_state()}")
            # the C++ GEMM templates' blocking, whatever mode is in effect where facts are read
            parts.append(f"cpu_gemm={_cpu_blocking(torch)}")
            # Inductor's OpenMP regions: dynamic where its thread count is the CPU count
            parts.append(f"cpu_count={os.cpu_count()}")
            # the vector ISA Inductor picks at each compile (ATen's level was fixed at start)
            parts.append(f"aten_cpu_capability={fingerprint.vector_isa_asked_since()}")
            parts.extend(
                f"autocast_{device}={torch.get_autocast_dtype(device)}"
                for device in ("cpu", "cuda")
            )
            cuda = torch.cuda
            if cuda.is_initialized():  # without it, nothing read the devices' properties
                parts.extend(
                    f"cuda{i}={cuda.get_device_name(i)}:{cuda.get_device_capability(i)}"
                    for i in range(cuda.device_count())
                )
    except Exception as exc:  # a torch without one of these: say which, never fail
        parts.append(f"torch=unreadable:{type(exc).__name__}")
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            parts.append(f"dist={dist.get_backend()}:{dist.get_world_size()}:{dist.get_rank()}")
    except Exception as exc:  # a process group in a state of its own: never served
        parts.append(f"dist=unreadable:{type(exc).__name__}:{id(exc)}")
    return ";".join(parts)


def settings_digest() -> str | None:
    """Digest of the compiler settings in effect now, or None where one has no portable
    rendering or a debug override is set (:func:`debug_overrides`; computed again only when
    torch's config hashes, the process facts or the program's kernels of torch's ops
    change)."""
    global _memo
    state = _state()
    memo = _memo
    if state is not None and memo is not None and memo[0] == state:
        return memo[1]
    try:
        digest = _digest()
    except Exception:  # a setting or kernel that cannot be rendered: no portable settings
        return None
    if state is not None:
        _memo = (state, digest)
    return digest


def _digest() -> str | None:
    import torch

    if debug_overrides():
        return None
    h = hashlib.sha256()
    for module_name in CONFIG_MODULES:
        items = _config_items(module_name)
        for name in sorted(items):
            if name in IGNORED:
                continue
            rendered = _canonical(items[name])
            if rendered is None:
                return None
            h.update(f"{module_name}.{name}={rendered}\0".encode())
    h.update(f"matmul:{torch.get_float32_matmul_precision()}\0".encode())
    h.update(f"process:{process_facts()}\0".encode())
    overrides = op_overrides.torch_overrides()
    if overrides:  # none by default: the digest of a process without them is unchanged
        h.update(f"overrides:{overrides!r}\0".encode())
    return h.hexdigest()[:32]


def compiler_identity(context: Any) -> str | None:
    """The backend and choices of one ``torch.compile(...)`` wrapper (torch's
    ``_TorchDynamoContext``) as a portable string, or None."""
    from torch._dynamo.eval_frame import innermost_backend

    backend: Any = innermost_backend(context.callback)
    choices = (
        f"dynamic={getattr(context, '_dynamic', None)!r}"
        f":fullgraph={getattr(context, 'fullgraph', None)!r}"
        f":error_on_graph_break={getattr(context, 'error_on_graph_break', None)!r}"
    )
    name = getattr(backend, "compiler_name", None)
    if name == "inductor" and isinstance(getattr(backend, "config", None), dict):
        what = _canonical(backend.config)
        dynamic = getattr(backend, "dynamic", None)
        return None if what is None else f"inductor:{what}:{dynamic!r}:{choices}"
    if isinstance(name, str) and hasattr(backend, "compiler_fn"):
        fn = _canonical(backend.compiler_fn)
        kwargs = _canonical(getattr(backend, "kwargs", {}))
        dynamic = getattr(backend, "dynamic", None)
        if fn is None or kwargs is None:
            return None
        return f"backend:{name}:{fn}:{kwargs}:{dynamic!r}:{choices}"
    what = portable_guards.identity(backend)
    return None if what is None else f"callable:{what}:{choices}"
