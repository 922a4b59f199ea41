"""Per-kind size caps on what a remote tier may hand this machine (docs/security.md).

A cap bounds both the stored bytes a remote GET may transfer (checked before the body is
read where the protocol allows) and the payload length a zstd frame may claim (checked
before decompression), so a planted huge object or a zstd bomb costs neither memory nor CPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from objcache.errors import ConfigError

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"(\d+)\s*([kmgt]?)(?:i?b)?")

#: Cap of the kinds in :data:`LARGE_KINDS` and of a client's own kinds
#: (``client.put("blob", ...)``): far above any FX graph, kernel or Mega-Cache bundle seen.
DEFAULT_CAP = 1 << 30
#: Kinds objcache stores that take :attr:`SizeCaps.default` (so ``OBJCACHE_MAX_ENTRY_BYTES=512M``
#: lowers them too): compiled graphs, kernels and bundles, large by nature.
LARGE_KINDS: frozenset[str] = frozenset({"aot-autograd", "fx-graph", "kernel", "mega", "triton"})
#: Every other kind objcache stores has its own cap: the largest entry its reader accepts, so
#: a planted huge object of a small kind is refused at the read, before it is fetched
#: (docs/security.md, "Size caps in detail"). Each kind of ``objcache.entry.layout.KINDS`` is
#: here or in :data:`LARGE_KINDS` (tests/entry/test_caps.py).
DEFAULT_PER_KIND: Mapping[str, int] = MappingProxyType(
    {
        # torch's autotune results: JSON dicts (objcache/integrations/torch/remote/serde.py)
        "autotune": 64 << 20,
        "bundled-autotune": 64 << 20,
        # key cards (objcache/observe/keycards.py: MAX_CARD_BYTES, MAX_MISSES_BYTES)
        "aot-card": 128 << 10,
        "fx-card": 128 << 10,
        "miss-cards": 8 << 20,
        # a kernel's load verdict: a few bytes (objcache/integrations/torch/kernels/kernels.py)
        "isa-probe": 64 << 10,
        # where a kernel lives in torch's cache dir: a short path
        # (objcache/integrations/torch/kernels/kernel_places.py)
        "kernel-place": 64 << 10,
        "manifest": 64 << 20,
        "pgo": 64 << 20,
        # Dynamo's bytecode, guards and the compiled graphs' code, not their kernels
        # (docs/torch.md, "Precompile entries")
        "precompile": 256 << 20,
        # a run summary, read by `objcache report` at most twice its 256 KiB limit
        "run": 512 << 10,
        # Triton's host-side module (objcache/integrations/triton_host.py: MAX_BYTES)
        "triton-host": 8 << 20,
        # vLLM's AOT artifact and model inspection (docs/vllm.md): the integrations' limits
        "vllm-aot": 256 << 20,
        "vllm-modelinfo": 64 << 10,
    }
)


@dataclass(frozen=True)
class SizeCaps:
    """The largest entry (stored bytes, and payload once decompressed) accepted per kind."""

    default: int = DEFAULT_CAP
    per_kind: Mapping[str, int] = field(default_factory=lambda: DEFAULT_PER_KIND)

    def for_kind(self, kind: str) -> int:
        return self.per_kind.get(kind, self.default)

    @classmethod
    def parse(cls, raw: str, where: str) -> SizeCaps:
        """``N[,kind=N...]`` with optional k/m/g (binary) suffixes: ``512M,pgo=1M``."""
        default, per_kind = DEFAULT_CAP, dict(DEFAULT_PER_KIND)
        for part in (p.strip() for p in raw.split(",")):
            if not part:
                continue
            kind, sep, value = part.rpartition("=")
            if sep:
                per_kind[kind.strip()] = _size(value, where)
            else:
                default = _size(value, where)
        return cls(default, MappingProxyType(per_kind))

    def __str__(self) -> str:
        kinds = ",".join(f"{k}={v}" for k, v in sorted(self.per_kind.items()))
        return f"{self.default},{kinds}" if kinds else str(self.default)


def parse_size(text: str, where: str) -> int:
    """A byte count: digits with an optional binary suffix, any case (``10G``, ``512M``,
    ``64k``, ``10 GiB``, ``1048576``). The one size parser of every size option, environment
    variable, keyword and tier URL option alike (docs/configuration.md)."""
    match = _SIZE.fullmatch(text.strip().lower())
    if not match:
        raise ConfigError(f"{where}: must be a byte count like 10G, 512M or 1048576, got {text!r}")
    return int(match[1]) * _UNITS[match[2]]


def _size(text: str, where: str) -> int:
    value = parse_size(text, where)
    if value == 0:
        raise ConfigError(f"{where}: {text.strip()!r} is not a size (e.g. 512M, 64k, 1048576)")
    return value
