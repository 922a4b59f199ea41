"""The import watcher (:mod:`objcache.integrations.install.import_watch`): each watched module's
part is applied as its import ends, on the zero-code path and after an explicit
``install()``, which leaves Inductor's lowering module to the first compile."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import torch_runs

torch = pytest.importorskip("torch")


def test_an_explicit_install_copies_a_code_generator_imported_after_it(tmp_path: Path) -> None:
    """``install()`` imports no code generator (a process that never compiles pays nothing
    for them); one the program imports later is copied as its import ends, so torch's own
    code re-pointed right after (``CppOverrides.sigmoid = CppOverrides.tanh``) is named.
    ``uninstall()`` stops the watching. Before that, nothing is named: the cache classes
    ``install()`` puts in torch's place after copying are objcache's (they were named in
    every key of an explicitly installed process, the zero-code path copying after them)."""
    # OBJCACHE_ENABLE=0: the installed ``.pth`` stays out, the explicit path alone
    env = torch_runs.file_store_env(tmp_path, OBJCACHE_PREFETCH="0", OBJCACHE_ENABLE="0")
    code = (
        "import sys\n"
        "import objcache\n"
        "objcache.install()\n"
        "watching = lambda: [type(f).__name__ for f in sys.meta_path].count('_PostImportFinder')\n"
        "print('lowering', 'torch._inductor.lowering' in sys.modules, 'watching', watching())\n"
        "from objcache.integrations.torch.precompile import inductor_namespace\n"
        "named = lambda: ['named', *(label for label, _ in inductor_namespace.overrides())]\n"
        "print(*named())\n"
        "from torch._inductor.codegen.cpp import CppOverrides\n"
        "CppOverrides.sigmoid = CppOverrides.tanh\n"
        "print(*named())\n"
        "objcache.uninstall()\n"
        "print('watching', watching())\n"
    )
    lines = torch_runs.python_c(code, env).splitlines()
    assert lines == [
        "lowering False watching 1",
        "named",  # objcache's own cache classes in torch's place are not the program's
        "named inductor:torch._inductor.codegen.cpp.CppOverrides.sigmoid",
        "watching 0",
    ]
