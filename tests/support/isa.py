"""CPU vector ISAs for tests that need "another machine's" ISA, chosen relative to this one.

Fleets mix CPUs (AVX-512 Intel next to AVX2-only AMD, Graviton next to both), so no test may
assume which ISA the machine running it has. ATen accepts ``ATEN_CPU_CAPABILITY`` set to a level
at or below the machine's own; ``default`` (no vector extensions) is valid everywhere.
"""

from __future__ import annotations

#: x86 levels from lowest to highest, as ``torch.backends.cpu.get_cpu_capability()`` names them
#: (lower-cased). Other architectures (aarch64 ``sve*``, ppc ``vsx``, s390x ``zvector``) have
#: one vector level above ``default``.
X86_LADDER = ("default", "avx2", "avx512")


def lower_isa(current: str) -> str | None:
    """A level below ``current`` (a fingerprint's ``cpu_isa``: ATen's level, then Inductor's
    extensions) that ATen on this machine will accept, or None at the bottom."""
    current = (current.split() or ["default"])[0].lower()
    if current == "default":
        return None
    if current in X86_LADDER:
        return X86_LADDER[X86_LADDER.index(current) - 1]
    return "default"


def other_isa(current: str) -> str:
    """Any ISA name that is not ``current``: a label for "another environment" in metadata."""
    return lower_isa(current) or "avx2"
