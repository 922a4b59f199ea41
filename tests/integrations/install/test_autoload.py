"""The zero-code path (:mod:`objcache.integrations.install.autoload` and its ``.pth``): importing it
activates nothing, the ``.pth`` imports nothing while the switch is off and hooks torch when
it is on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import torch_runs

torch = pytest.importorskip("torch")


def test_importing_the_torch_layer_has_no_side_effects_and_no_import_circle() -> None:
    """Importing autoload activates nothing; hooks never imports autoload (uninstall
    included). ``-S``: no site-packages, so no installed ``.pth`` runs first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJCACHE_")}
    env.update(PYTHONPATH=str(torch_runs.ROOT), OBJCACHE_ENABLE="1")
    code = (
        "import sys\n"
        "from objcache.integrations.install import hooks\n"
        "hooks.uninstall()\n"
        "assert 'objcache.integrations.install.autoload' not in sys.modules\n"
        "from objcache.integrations.install import autoload\n"
        "finders = lambda: [type(f).__name__ for f in sys.meta_path]\n"
        "assert '_PostImportFinder' not in finders()\n"
        "assert autoload.activate()\n"
        "assert '_PostImportFinder' in finders()\n"
        "hooks.uninstall()\n"
        "assert '_PostImportFinder' not in finders()\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"


def test_pth_imports_nothing_when_unset_and_hooks_torch_when_set(tmp_path: Path) -> None:
    site_dir = torch_runs.make_site_dir(tmp_path / "site")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJCACHE_")}
    env["PYTHONPATH"] = str(torch_runs.ROOT)
    probe = (
        f"import site, sys; site.addsitedir({str(site_dir)!r}); "
        "print(sorted(m for m in sys.modules if m.startswith('objcache')))"
    )
    assert torch_runs.python_c(probe, env).strip() == "[]"
    env["OBJCACHE_ENABLE"] = "1"
    env["OBJCACHE_LOCAL_DIR"] = str(tmp_path / "local")
    code = (
        f"import site, sys; site.addsitedir({str(site_dir)!r}); "
        "import torch; assert 'torch._inductor.remote_cache' not in sys.modules; "
        "import torch._inductor.config as c, torch._inductor.remote_cache as rc; "
        "from objcache.integrations.patching import is_marked; "
        "print(c.fx_graph_remote_cache, rc.RemoteFxGraphCache.objcache_kind, "
        "is_marked(torch.library.Library.impl))"
    )
    # ``Library.impl`` as torch.library is imported, inside ``import torch``: the kernels a
    # library registers as it is imported are seen (docs/torch.md, "Custom ops in the keys")
    assert torch_runs.python_c(code, env).split() == ["True", "fx-graph", "True"]


def test_a_compile_process_imports_only_what_its_settings_use() -> None:
    """What the hooks, the client and the prefetch import in every compile process: never
    the CLI's printing (rich), the retry machinery before a retry (tenacity), the signing
    library where no key is set (cryptography), a cloud SDK for a file:// store, nor the
    precompile feature's own modules while it is off (the key side's traced-code modules
    beside them are the plain path's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJCACHE_")}
    env.update(PYTHONPATH=str(torch_runs.ROOT))
    code = (
        "import sys\n"
        "from objcache.integrations.install import hooks\n"
        "import objcache.client, objcache.prefetch_process\n"
        "from objcache.integrations.torch.remote import custom_ops\n"
        "heavy = ('rich', 'tenacity', 'cryptography', 'aiobotocore', 'google')\n"
        "precompile = 'objcache.integrations.torch.precompile.precompile'\n"
        "found = [m for m in sys.modules if m.split('.')[0] in heavy or m.startswith(precompile)]\n"
        "print(sorted(found))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"
