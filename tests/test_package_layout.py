"""The package layout docs/architecture.md describes: backends/ is the source root of
objcache.backends, for every tool, and not a package of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import objcache.backends
from tests.support.paths import ROOT

SOURCE = ROOT / "backends" / "objcache" / "backends"


def test_objcache_backends_is_the_top_level_source_folder() -> None:
    assert Path(objcache.backends.__file__).resolve().parent == SOURCE.resolve()
    assert not (ROOT / "objcache" / "backends").exists(), "no second copy or link in objcache/"


def test_setuptools_and_mypy_map_the_same_folder() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setuptools = config["tool"]["setuptools"]
    assert "objcache.backends" in setuptools["packages"]
    assert ROOT / setuptools["package-dir"]["objcache.backends"] == SOURCE
    assert ROOT / config["tool"]["mypy"]["mypy_path"] / "objcache" / "backends" == SOURCE


def test_every_package_of_the_tree_is_in_the_wheel() -> None:
    """A new package (a backend's folder) is listed in ``[tool.setuptools] packages``, or the
    wheel would lack it."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    tree = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "objcache").rglob("__init__.py")
    } | {
        ".".join(("objcache", *p.parent.relative_to(SOURCE.parent).parts))
        for p in SOURCE.rglob("__init__.py")
    }
    assert tree == listed


def test_a_bare_backends_package_is_not_importable_from_the_root() -> None:
    env = {**os.environ, "PYTHONPATH": ""}
    out = subprocess.run(
        [sys.executable, "-c", "import backends"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode != 0
    assert "import objcache.backends" in out.stderr


def test_the_torch_extra_never_caps_torch() -> None:
    """An upper bound would make `pip install 'objcache[torch]'` downgrade a user's torch;
    the integration checks torch's hooks by feature instead (docs/torch.md)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    reqs = [Requirement(r) for deps in extras.values() for r in deps]
    torch_reqs = [r for r in reqs if r.name == "torch"]
    assert torch_reqs, "the torch extra declares torch"
    for req in torch_reqs:
        for spec in req.specifier:
            assert spec.operator in (">=", ">", "!="), f"{req} caps torch ({spec})"
