"""Run objcache from this checkout as an installed copy would run: from bytecode.

``pip install`` compiles a package's modules to ``__pycache__`` as it installs them (torch's
own are there), so no process of a user's compiles objcache's source. A bench that puts this
checkout on ``PYTHONPATH`` under ``PYTHONDONTWRITEBYTECODE=1`` (set on some CI and build
machines) would instead compile every objcache module from source in every process it times:
about 75 ms of CPU per process for the modules a compile imports, on the side torch alone
never pays. Each bench that times processes calls :func:`compile_bytecode` first.
"""

from __future__ import annotations

import compileall
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compile_bytecode() -> None:
    """Write the bytecode of objcache's packages for this interpreter (as pip does)."""
    for package in (ROOT / "objcache", ROOT / "backends" / "objcache"):
        if not compileall.compile_dir(package, quiet=2, workers=1):
            sys.exit(f"could not compile {package} to bytecode")
