"""The environment fingerprint: what must match for a compiled artifact to be reusable.

Torch's own keys omit the CPU vector ISA (an AVX-512 entry is served to an AVX2 process and
computes wrong results) and say nothing about the GPU or CUDA build. objcache namespaces
every entry by a short hash of this fingerprint (DESIGN section 4).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
from typing import Any

#: Fields in the order they are shown to users.
FIELDS = ("torch", "triton", "cuda", "hip", "gpu", "cpu_isa", "python", "machine")


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


def _cpu_isa(torch: Any) -> str:
    """The vector ISA ATen and Inductor use here: honours ``ATEN_CPU_CAPABILITY``."""
    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
    except Exception:
        capability = os.environ.get("ATEN_CPU_CAPABILITY", "default")
    return capability.lower()


def _triton_version() -> str:
    try:
        from importlib.metadata import version

        return version("triton")
    except Exception:
        return "none"


@functools.cache
def fingerprint() -> dict[str, str]:
    """The fingerprint of this process (cached: it cannot change within a process)."""
    fields = {
        **_torch_fields(),
        "triton": _triton_version(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "machine": platform.machine(),
    }
    return {k: fields[k] for k in FIELDS}


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
