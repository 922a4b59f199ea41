"""The environment fingerprint: what must match for a compiled artifact to be reusable.

Torch's own keys omit the CPU vector ISA (an AVX-512 entry is served to an AVX2 process and
computes wrong results) and say nothing about the GPU or CUDA build. objcache namespaces
every entry by a short hash of this fingerprint (docs/architecture.md, "Environments").

Asking torch costs an ``import torch`` (2-3 s), which a process that compiles pays anyway
but a CLI run (``objcache pull`` at boot, ``objcache push`` in CI) would pay every time.
So the fields torch reports are cached per machine in the user's cache directory, under a
key made of every input that decides them: the torch install (its ``version.py``: path,
bytes and mtime), the CPU's feature flags, the GPU driver's device list, and the
environment variables torch reads for them (``ATEN_CPU_CAPABILITY``, the visible-device
lists, ``CUDA_DEVICE_ORDER``). A change to any of them is a cache miss and torch is asked
again; a process that has already imported torch always asks it directly and refreshes
the cache. ``OBJCACHE_FINGERPRINT_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from objcache.config.files import publish_file

#: Fields in the order they are shown to users.
FIELDS = (
    "torch",
    "triton",
    "cuda",
    "hip",
    "gpu",
    "cpu_isa",
    "python",
    "sympy",
    "networkx",
    "machine",
)
#: The fields that come from torch (and so from an ``import torch``).
TORCH_FIELDS = ("torch", "cuda", "hip", "gpu", "cpu_isa")
#: How :data:`TORCH_FIELDS` are rendered, in the cache key: a cache written by an objcache that
#: rendered them otherwise (``cpu_isa`` without Inductor's extensions, or without AMX tiles
#: refused by the kernel) is never read.
FIELDS_FORMAT = b"torch-fields-3"
#: Environment variables torch reads when it reports the device and the vector ISA.
TORCH_ENV = (
    "ATEN_CPU_CAPABILITY",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "PYTORCH_NVML_BASED_CUDA_CHECK",
)


def _torch_fields() -> dict[str, str]:
    try:
        import torch
    except ImportError:
        return {"torch": "none", "cuda": "none", "hip": "none", "gpu": "none", "cpu_isa": "none"}
    fields = {
        "torch": str(torch.__version__),
        "cuda": str(torch.version.cuda or "none"),
        "hip": str(getattr(torch.version, "hip", None) or "none"),
        "gpu": "none",
        "cpu_isa": _cpu_isa(torch),
    }
    # Only ask for the GPU name when CUDA was built in and a device is visible; never
    # initialise CUDA in a process that does not already use it through a fork.
    try:
        if torch.cuda.is_available():
            fields["gpu"] = torch.cuda.get_device_name(0)
    except Exception:  # pragma: no cover - broken drivers
        fields["gpu"] = "unknown"
    return fields


#: The x86 extensions beyond ATen's AVX-512 level that Inductor's vector ISA and its CPU GEMM
#: micro-kernels choose by (``VecAVX512VNNI``, ``VecAMX``, the AMX FP16 and AVX-512 BF16
#: kernels): source written for one of them does not build, or faults, where it is absent.
X86_EXTENSIONS = (
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
)
#: The Arm features Inductor's vector ISA (``VecSVE(128|256)``, ``VecNEON``) and its compiler
#: flags choose by.
ARM_EXTENSIONS = ("sve", "sve2", "bf16", "sve_max_length")


def _cpu_isa(torch: Any) -> str:
    """The vector ISA ATen and Inductor use here: ATen's dispatch level (honours
    ``ATEN_CPU_CAPABILITY``), then the extensions Inductor's finer vector classes pick by on
    that level (``avx512 avx512_vnni amx_tile ...``): two AVX-512 machines with and without
    AMX get the same ATen level and other kernels from Inductor."""
    try:
        capability = str(torch.backends.cpu.get_cpu_capability()).lower()
    except Exception:
        capability = os.environ.get("ATEN_CPU_CAPABILITY", "default").lower()
    return " ".join([capability, *_vector_extensions(torch, capability)])


def _vector_extensions(torch: Any, capability: str) -> list[str]:
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        if not capability.startswith("avx512"):
            return []  # Inductor's AVX2 and scalar classes look at none of them
        names: tuple[str, ...] = X86_EXTENSIONS
    elif machine in ("aarch64", "arm64"):
        names = ARM_EXTENSIONS
    else:
        return []
    try:
        found = torch.cpu.get_capabilities()
    except Exception:  # named, so no environment is shared on a guess
        return ["extensions=unreadable"]
    picked = []
    refused = any(found.get(name) is True for name in names if name.startswith("amx")) and (
        not _amx_permitted(torch)
    )
    for name in names:
        value = found.get(name)
        if value is True and refused and name.startswith("amx"):
            picked.append(f"{name}=unpermitted")  # the CPU has it, the kernel refuses its use
        elif value is True:
            picked.append(name)
        elif value not in (None, False, 0):
            picked.append(f"{name}={value}")
    return picked


def _amx_permitted(torch: Any) -> bool:
    """Whether this process may use AMX tiles: Linux grants them per process on request
    (``arch_prctl(ARCH_REQ_XCOMP_PERM)``, refused by kernels before 5.16 and by some
    sandboxes); Inductor asks the same way (``torch.cpu._init_amx()``) and writes AMX kernels
    only where granted, so two machines with one CPU and another kernel compile other code."""
    try:
        return bool(torch.cpu._init_amx())
    except Exception:
        return False


def _installed_version(name: str) -> str:
    """The installed distribution's version (its metadata: nothing is imported), or "none"."""
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "none"


def _read(path: str, limit: int = 1 << 16) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


def _cpu_flags() -> bytes:
    """The first CPU's model and feature flags (what ATen's ISA dispatch looks at)."""
    lines = _read("/proc/cpuinfo", 1 << 20).splitlines()
    wanted = (b"model name", b"flags", b"Features", b"isa")
    picked = [line for line in lines[:64] if line.split(b":")[0].strip() in wanted]
    return b"\n".join(picked) or platform.processor().encode()


def _gpu_inventory() -> bytes:
    """What the GPU drivers report, cheaply (no CUDA initialisation)."""
    parts = [_read("/proc/driver/nvidia/version")]
    for root in ("/proc/driver/nvidia/gpus", "/sys/class/kfd/kfd/topology/nodes"):
        try:
            names = sorted(os.listdir(root))
        except OSError:
            continue
        for name in names:
            parts.append(name.encode())
            parts.append(_read(os.path.join(root, name, "information")))
            parts.append(_read(os.path.join(root, name, "name")))
    return b"\0".join(parts)


def torch_inputs_key() -> str | None:
    """A hash of everything that decides :data:`TORCH_FIELDS`, computed without importing
    torch; None when torch is not installed where it can be found."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    version_py = os.path.join(os.path.dirname(spec.origin), "version.py")
    try:
        mtime = os.stat(version_py).st_mtime_ns
    except OSError:
        return None
    h = hashlib.blake2b(digest_size=16)
    for part in (
        FIELDS_FORMAT,
        sys.executable.encode(),
        version_py.encode(),
        str(mtime).encode(),
        _read(version_py),
        _cpu_flags(),
        _gpu_inventory(),
        *(f"{k}={os.environ.get(k)}".encode() for k in TORCH_ENV),
    ):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def _cache_root() -> Path:
    from objcache.config.settings import user_cache_dir

    return user_cache_dir()


def _cache_path(key: str) -> Path:
    return _cache_root() / "fingerprint" / f"{key}.json"


def _cached_torch_fields(key: str) -> dict[str, str] | None:
    try:
        data = json.loads(_cache_path(key).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or set(data) != set(TORCH_FIELDS):
        return None
    if not all(isinstance(v, str) for v in data.values()):
        return None
    return data


def _store_torch_fields(key: str, fields: dict[str, str]) -> None:
    data = json.dumps({k: fields[k] for k in TORCH_FIELDS}).encode()
    # the fingerprint folder is opened without following a link and must be this user's;
    # a read-only home (or a refused folder): every CLI run asks torch, nothing worse
    with contextlib.suppress(OSError):
        publish_file(_cache_root(), ["fingerprint", f"{key}.json"], data, mode=0o600,
                     create_root=True)  # fmt: skip


def _torch_fields_cached() -> dict[str, str]:
    """:func:`_torch_fields`, from the per-machine cache when this process has not imported
    torch and nothing that decides the answer has changed."""
    use_cache = os.environ.get("OBJCACHE_FINGERPRINT_CACHE", "1").lower() not in ("0", "false")
    key = torch_inputs_key() if use_cache else None
    if key is not None and "torch" not in sys.modules:
        cached = _cached_torch_fields(key)
        if cached is not None:
            return cached
    fields = _torch_fields()
    if key is not None and fields["torch"] != "none":
        _store_torch_fields(key, fields)
    return fields


@functools.cache
def fingerprint() -> dict[str, str]:
    """The fingerprint of this process (cached: it cannot change within a process)."""
    fields = {
        **_torch_fields_cached(),
        "triton": _installed_version("triton"),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        # Inductor writes every index expression, size and guard of its code through sympy
        # (simplified, printed, pickled into its entries); torch's keys never name sympy's
        # release, which one process never changes, but a fleet's machines may differ in it
        "sympy": _installed_version("sympy"),
        # AOTAutograd's partitioner picks what a training graph's forward saves for its
        # backward with networkx's minimum cut (torch requires only networkx>=2.5.1)
        "networkx": _installed_version("networkx"),
        "machine": platform.machine(),
    }
    return {k: fields[k] for k in FIELDS}


def vector_isa_asked_since() -> str | None:
    """``ATEN_CPU_CAPABILITY`` as it is now where it asks for another level than the
    fingerprint's ``cpu_isa`` names (ATen's, fixed as torch started), else None: Inductor
    reads the variable at each compile, so a program that sets it after ``import torch``
    gets other C++ kernels than the environment's namespace says."""
    asked = os.environ.get("ATEN_CPU_CAPABILITY")
    if asked is None:
        return None
    level = (fingerprint().get("cpu_isa", "").split() or [""])[0]
    return None if asked.strip().lower() == level else asked


def env_id(fields: dict[str, str] | None = None) -> str:
    """16 hex chars naming an environment in bucket paths."""
    fields = fingerprint() if fields is None else fields
    blob = json.dumps(fields, sort_keys=True).encode()
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


def differences(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """Human-readable ``field: theirs != mine`` lines for every field that differs."""
    keys = [k for k in FIELDS if k in mine or k in theirs]
    keys += sorted((set(mine) | set(theirs)) - set(FIELDS))
    return [
        f"{k}: {theirs.get(k, '?')} (stored) != {mine.get(k, '?')} (here)"
        for k in keys
        if mine.get(k) != theirs.get(k)
    ]
