"""tests/ mirrors the code (docs/testing.md, "Layout: module -> tests").

Read with :mod:`ast` and the file tree; nothing is imported. Each folder of tests/ is a
cross-cutting suite or the mirror of a package (``tests/core`` of ``objcache/core``,
``tests/backends`` of ``objcache.backends``, ``tests/bench`` of ``bench``); helpers live in
tests/support, never beside the tests; and each pytest fixture name is defined once in the
whole tree, so a test never gets a fixture of the same name meaning something else."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.support.paths import ROOT

TESTS = ROOT / "tests"

#: Suites that cut across the packages (each keeps its own helpers), and the helpers.
CROSS_CUTTING = {"contract", "faults", "fuzz", "security", "support"}

#: Test folders whose package does not live under objcache/.
SOURCES = {
    "backends": ROOT / "backends" / "objcache" / "backends",
    "bench": ROOT / "bench",
}


def folders_of_tests() -> list[Path]:
    return sorted(
        p for p in TESTS.rglob("*") if p.is_dir() and p.name != "__pycache__" and p != TESTS
    )


def source_of(folder: Path) -> Path:
    """The package a test folder mirrors: tests/a/b -> objcache/a/b (or SOURCES' root)."""
    top, *rest = folder.relative_to(TESTS).parts
    return SOURCES.get(top, ROOT / "objcache" / top).joinpath(*rest)


def suite_of(folder: Path) -> str:
    return folder.relative_to(TESTS).parts[0]


def test_every_test_folder_mirrors_a_package_or_is_a_cross_cutting_suite() -> None:
    stray = [
        str(f.relative_to(ROOT))
        for f in folders_of_tests()
        if suite_of(f) not in CROSS_CUTTING and not (source_of(f) / "__init__.py").is_file()
    ]
    assert not stray, f"test folders that mirror no package: {stray}"


def test_every_test_folder_is_a_package() -> None:
    """tests/ is a package: its folders are too, so two test modules of the same name in two
    folders stay two modules (tests.core.test_x, tests.cli.test_x)."""
    missing = [
        str(f.relative_to(ROOT)) for f in folders_of_tests() if not (f / "__init__.py").is_file()
    ]
    assert not missing, f"test folders without an __init__.py: {missing}"


def test_helpers_live_in_tests_support() -> None:
    """Beside the tests of a package (and at tests/ top level) only test modules and
    conftest.py: a helper shared by tests goes to tests/support."""
    folders = [TESTS] + [f for f in folders_of_tests() if suite_of(f) not in CROSS_CUTTING]
    helpers = [
        str(p.relative_to(ROOT))
        for folder in folders
        for p in folder.glob("*.py")
        if not (p.name.startswith("test_") or p.name in ("__init__.py", "conftest.py"))
    ]
    assert not helpers, f"helpers outside tests/support: {helpers}"


def _is_fixture(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in function.decorator_list:
        node = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(node, ast.Attribute) and node.attr == "fixture":
            return True  # pytest.fixture, pytest_asyncio.fixture
        if isinstance(node, ast.Name) and node.id == "fixture":
            return True  # from pytest import fixture
    return False


def _fixture_name(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    for decorator in function.decorator_list:
        if isinstance(decorator, ast.Call):
            for keyword in decorator.keywords:
                if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                    return str(keyword.value.value)
    return function.name


def fixtures() -> dict[str, list[str]]:
    """Each fixture name defined under tests/ (conftest.py included), with where."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_fixture(node):
                found[_fixture_name(node)].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_each_fixture_name_is_defined_once() -> None:
    """A fixture defined in two files means two things under one name (or one thing twice:
    then it belongs in a conftest.py above both)."""
    found = fixtures()
    assert len(found) > 50, "the walk found the fixtures"
    twice = {name: where for name, where in found.items() if len(where) > 1}
    assert not twice, f"fixture names defined more than once: {twice}"
