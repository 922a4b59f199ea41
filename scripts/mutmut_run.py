"""`mutmut`, with this checkout's backend layout: ``python scripts/mutmut_run.py run|show|...``.

mutmut 3 names a mutant after its file's path (``backends/objcache/backends/disk/store.py`` gives
``backends.objcache.backends.disk.store``), but at run time it matches the mutant against the
module the tests imported: ``objcache.backends.disk.store`` (the backends' source lives in
``backends/objcache/backends/`` and is imported as ``objcache.backends``; see
docs/architecture.md, "Package layout"). Left alone, no backend mutant ever runs and every
one is reported as having no tests. This maps the path-derived name to the imported one and
hands over to mutmut's own command line (docs/testing.md).

It also keeps mutmut's call-stack tracking off ``contextvars``: with the threads these tests
start (``asyncio.to_thread``, lease wakers), the test-map run crashed in
``ContextVar.set`` (a segfault) or read back another call's arguments as the stack depth.
A per-thread stack records the same callers.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import ClassVar

import mutmut.__main__ as mutmut_main
import mutmut.mutation.file_mutation as file_mutation
import mutmut.mutation.trampoline as trampoline
import mutmut.utils.format_utils as format_utils

BACKENDS_PREFIX = "backends.objcache."
_path_derived_name = format_utils.get_mutant_name


def get_mutant_name(relative_source_path: Path, mutant_method_name: str) -> str:
    """The mutant's name under the module name the tests import."""
    name = _path_derived_name(relative_source_path, mutant_method_name)
    return name.removeprefix("backends.") if name.startswith(BACKENDS_PREFIX) else name


for module in (format_utils, mutmut_main, file_mutation):
    module.get_mutant_name = get_mutant_name  # type: ignore[attr-defined]


class ThreadCallStack:
    """``mutmut.core.MutmutCallStack`` on a thread-local instead of a ``ContextVar``."""

    _local: ClassVar[threading.local] = threading.local()

    @classmethod
    def get(cls) -> tuple[str | None, int]:
        value: tuple[str | None, int] = getattr(cls._local, "value", (None, 0))
        return value

    @classmethod
    def set(cls, value: tuple[str, int]) -> tuple[str | None, int]:
        """Push ``value``; the token is the value it replaced."""
        previous = cls.get()
        cls._local.value = value
        return previous

    @classmethod
    def reset(cls, token: tuple[str | None, int]) -> None:
        cls._local.value = token


trampoline.MutmutCallStack = ThreadCallStack  # type: ignore[attr-defined,assignment]

if __name__ == "__main__":
    # A few Hypothesis examples per property and mutant (tests/support/hypothesis_profiles.py).
    os.environ.setdefault("OBJCACHE_HYPOTHESIS_PROFILE", "mutation")
    mutmut_main.cli()
