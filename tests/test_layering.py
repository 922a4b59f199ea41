"""The package layout holds (docs/architecture.md, "Layers"): every import in objcache/ and
backends/objcache/backends goes down the declared layer order or stays in its layer, no two
modules import each other (directly or round a longer loop), and no module imports another
module's private (``_name``) name.

The walk reads the source with :mod:`ast`; nothing is imported. For the layer order an import
inside a function counts like one at the top (a lazy import is a dependency all the same);
a cycle is one of imports run at import time (module level: a function-level import is how
the zero-code path stays light, ``autoload`` importing ``hooks`` only when a part applies).
Imports under ``if TYPE_CHECKING:`` (annotations, never run) count for neither.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"objcache": ROOT / "objcache", "objcache.backends": ROOT / "backends/objcache/backends"}

#: Bottom to top. A module belongs to the layer of the longest prefix naming it (``*`` stands
#: for one name); it may import its own layer and those below. A backend's ``spec`` (what the
#: registry reads: scheme, options, location check) is config, in the backend's folder. The
#: package root ``objcache`` (the public API) is imported by no module of the tree: the
#: integrations reach the client through ``objcache.integrations.cache_client``, and the root
#: imports them for ``install()``. The integrations are five layers: the ledger and the client
#: accessor every part uses; the parts that stand alone (precompile, kernels, timing, Triton,
#: vLLM); torch's remote caches (their keys check precompile's state); the Mega-Cache bundles
#: (kernels and the remote caches' ids); the installer, which applies them all.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("errors", ("objcache.errors",)),
    ("entry", ("objcache.entry",)),
    ("config", ("objcache.config", "objcache.backends.*.spec")),
    ("backends", ("objcache.backends",)),
    ("observe", ("objcache.observe",)),
    ("core", ("objcache.core",)),
    (
        "client",
        (
            "objcache.client",
            "objcache.bridge",
            "objcache.prefetch_process",
            "objcache.run_observer",
            "objcache.stores",
        ),
    ),
    (
        "integration helpers",
        ("objcache.integrations.patching", "objcache.integrations.cache_client"),
    ),
    (
        "integration parts",
        (
            "objcache.integrations.torch.precompile",
            "objcache.integrations.torch.kernels",
            "objcache.integrations.torch.timing",
            "objcache.integrations.triton",
            "objcache.integrations.triton_host",
            "objcache.integrations.vllm",
            "objcache.integrations.vllm_aot",
        ),
    ),
    ("torch remote caches", ("objcache.integrations.torch.remote",)),
    ("Mega-Cache bundles", ("objcache.integrations.torch.mega",)),
    ("installer", ("objcache.integrations", "objcache.integrations.install")),
    ("demo", ("objcache.demo",)),
    ("cli, testing", ("objcache.cli", "objcache.testing")),
    ("public API", ("objcache", "objcache.mega", "objcache.backend_contract")),
)


def _names(module: str, prefix: str) -> bool:
    parts, pattern = module.split("."), prefix.split(".")
    return len(parts) >= len(pattern) and all(
        p in ("*", n) for p, n in zip(pattern, parts, strict=False)
    )


def layer_of(module: str) -> int:
    best, rank = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if _names(module, p) and len(p) > best:
                best, rank = len(p), i
    assert rank >= 0, f"{module} is in no layer of tests/test_layering.py"
    return rank


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported objcache module
    line: int
    names: tuple[str, ...]  # names taken from the target (from-imports)
    type_only: bool
    at_import: bool  # at module level, not inside a function


def modules(sources: dict[str, Path] = SOURCES) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, root in sources.items():
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            if package == "objcache" and name.startswith("objcache.backends"):
                continue  # an installed tree's copy; the source is in backends/
            found[name] = path
    return found


def _function_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(name: str, path: Path, known: dict[str, Path]) -> list[Import]:
    tree = ast.parse(path.read_text(), str(path))
    type_only = _type_checking_lines(tree)
    lazy = _function_lines(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def flags(line: int) -> tuple[bool, bool]:
        return line in type_only, line not in lazy

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "objcache":
                    found.append(Import(name, alias.name, node.lineno, (), *flags(node.lineno)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "objcache":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:  # ``from objcache.core import tier``: the module tier
                    found.append(Import(name, sub, node.lineno, (), *flags(node.lineno)))
                else:
                    found.append(
                        Import(name, target, node.lineno, (alias.name,), *flags(node.lineno))
                    )
    return found


def private_uses(name: str, path: Path, known: dict[str, Path]) -> list[str]:
    """``from x import _name`` and ``module._name`` through an imported objcache module."""
    tree = ast.parse(path.read_text(), str(path))
    bad: list[str] = []
    module_names: set[str] = set()
    for imp in imports_of(name, path, known):
        for n in imp.names:
            if n.startswith("_") and not n.startswith("__") and imp.target != name:
                bad.append(f"{path.relative_to(ROOT)}:{imp.line}: from {imp.target} import {n}")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("objcache"):
            for alias in node.names:
                if f"{node.module}.{alias.name}" in known:
                    module_names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("objcache.") and alias.asname:
                    module_names.add(alias.asname)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in module_names
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    return bad


def upward_imports(known: dict[str, Path]) -> list[str]:
    bad = []
    for name, path in known.items():
        for imp in imports_of(name, path, known):
            if imp.type_only or imp.target == "objcache":
                continue
            if layer_of(imp.target) > layer_of(name):
                bad.append(
                    f"{path.relative_to(ROOT)}:{imp.line}: {name} ({LAYERS[layer_of(name)][0]}) "
                    f"imports {imp.target} ({LAYERS[layer_of(imp.target)][0]})"
                )
    return bad


def import_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    """Per module, the modules it imports at import time (not under ``TYPE_CHECKING``)."""
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for imp in imports_of(name, path, known):
            # importing a submodule runs its packages' __init__ first; the root is exempt
            target = imp.target
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if imp.at_import and not imp.type_only and target not in (name, "objcache"):
                graph[name].add(target)
    return graph


def cycles(known: dict[str, Path]) -> list[list[str]]:
    graph = import_graph(known)
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


#: What the layers between the backends and the client (observe, core) may use of the backends
#: layer: the storage contract and the helpers the stores share, never a store nor its async
#: face; the node leases use the filesystem store's folder walk, not the store
#: (docs/architecture.md, "Adding a backend").
BACKEND_HELPERS = frozenset(
    {
        "objcache.backends.base",
        "objcache.backends.records_contract",
        "objcache.backends.shared",
        "objcache.backends.fs_folders",
    }
)
#: What the registry (objcache/config/registry.py) imports at run time to find the specs: the
#: backends package and each folder's package.
WALKED = "objcache.backends"


def _layer(name: str) -> int:
    return next(i for i, (n, _) in enumerate(LAYERS) if n == name)


def stores_reached_from_below(known: dict[str, Path]) -> list[str]:
    """Imports of the backends layer from observe or core beyond :data:`BACKEND_HELPERS`."""
    low, high = _layer("backends"), _layer("client")
    return [
        f"{path.relative_to(ROOT)}:{imp.line}: {name} imports {imp.target}"
        for name, path in known.items()
        if low < layer_of(name) < high
        for imp in imports_of(name, path, known)
        if not imp.type_only and layer_of(imp.target) == low and imp.target not in BACKEND_HELPERS
    ]


def calls_up_through_the_root(known: dict[str, Path]) -> list[str]:
    """Imports of the root package ``objcache`` (``objcache.get_client()``, ...) from any
    module of the tree: the root imports the integrations for ``install()``, so one of them
    importing it would be a loop, and below the client a call up into it."""
    return [
        f"{path.relative_to(ROOT)}:{imp.line}: {name} imports objcache"
        for name, path in known.items()
        if name != "objcache"
        for imp in imports_of(name, path, known)
        if imp.target == "objcache" and not imp.type_only
    ]


def loaded_by_the_walk(known: dict[str, Path]) -> dict[str, set[str]]:
    """Per package the registry's walk imports (``objcache.backends`` and each folder's), the
    objcache modules importing it loads (imports run at import time, followed through)."""
    graph = import_graph(known)
    walked = [
        n
        for n, p in known.items()
        if p.name == "__init__.py" and (n == WALKED or n.rpartition(".")[0] == WALKED)
    ]
    loaded: dict[str, set[str]] = {}
    for package in walked:
        seen: set[str] = set()
        todo = list(graph[package])
        while todo:
            nxt = todo.pop()
            if nxt not in seen:
                seen.add(nxt)
                todo.extend(graph.get(nxt, ()))
        loaded[package] = seen
    return loaded


def walk_leaks(known: dict[str, Path]) -> list[str]:
    """What a walked package loads that leads back to the registry (the two would import
    each other) or runs code of the backends layer or above (describing a backend would)."""
    return [
        f"{package} loads {module}"
        for package, loaded in sorted(loaded_by_the_walk(known).items())
        for module in sorted(loaded)
        if module == "objcache.config.registry" or layer_of(module) >= _layer("backends")
    ]


def test_every_module_is_in_a_layer() -> None:
    for name in modules():
        layer_of(name)


def test_imports_only_go_down_the_layers() -> None:
    assert upward_imports(modules()) == []


def test_no_import_cycles() -> None:
    assert cycles(modules()) == []


def test_no_module_imports_another_modules_private_names() -> None:
    known = modules()
    bad = [use for name, path in known.items() for use in private_uses(name, path, known)]
    assert bad == []


def test_observe_and_core_reach_no_store_only_the_contract_and_helpers() -> None:
    assert stores_reached_from_below(modules()) == []


def test_no_module_imports_the_root_package() -> None:
    assert calls_up_through_the_root(modules()) == []


def test_the_registry_and_the_packages_it_walks_do_not_import_each_other() -> None:
    """docs/architecture.md, "Adding a backend": the registry imports ``objcache.backends`` and
    each folder's package to read the specs; those load nothing that imports the registry,
    and no backend code."""
    loaded = loaded_by_the_walk(modules())
    assert "objcache.backends" in loaded and "objcache.backends.disk" in loaded
    assert walk_leaks(modules()) == []


#: The most modules (``.py`` files besides ``__init__.py``) one folder of objcache/ holds: past
#: it, a folder is split by feature (docs/architecture.md, "Modules, top to bottom").
MOST_MODULES_A_FOLDER = 15


def crowded_folders(root: Path = SOURCES["objcache"]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in root.rglob("*.py"):
        if path.name != "__init__.py" and "__pycache__" not in path.parts:
            folder = str(path.parent.relative_to(ROOT))
            counts[folder] = counts.get(folder, 0) + 1
    return {f: n for f, n in sorted(counts.items()) if n > MOST_MODULES_A_FOLDER}


def test_no_folder_holds_more_than_fifteen_modules() -> None:
    assert crowded_folders() == {}


@pytest.fixture
def tree_with(tmp_path: Path) -> Path:
    """A copy of the two source trees to plant a violation in."""
    import shutil

    shutil.copytree(SOURCES["objcache"], tmp_path / "objcache")
    shutil.copytree(SOURCES["objcache.backends"], tmp_path / "backends")
    return tmp_path


def _sources(root: Path) -> dict[str, Path]:
    return {"objcache": root / "objcache", "objcache.backends": root / "backends"}


def test_the_checks_catch_a_planted_violation(tree_with: Path) -> None:
    """Each check fails on the violation it is for: the tests above can fail."""
    planted = {
        "objcache/core/tier.py": "from objcache.cli.ops import bounded",
        "objcache/entry/codec.py": "from objcache.entry.caps import _planted",
        "objcache/entry/caps.py": "from objcache.entry import codec",
        "objcache/core/fetch_once/nodelease.py": "from objcache.backends.fs_store import FsStore",
        "objcache/observe/keycards.py": "import objcache",
        "backends/__init__.py": "from objcache.config import registry",
    }
    for where, line in planted.items():
        path = tree_with / where
        path.write_text(f"{path.read_text()}\n{line}\n")
    known = modules(_sources(tree_with))
    global ROOT
    saved, ROOT = ROOT, tree_with
    try:
        assert any(
            "objcache.core.tier (core) imports objcache.cli.ops" in b for b in upward_imports(known)
        )
        assert any(
            "imports objcache.backends.fs_store" in b for b in stores_reached_from_below(known)
        )
        assert any(
            "objcache.observe.keycards imports objcache" in b
            for b in calls_up_through_the_root(known)
        )
        assert "objcache.backends loads objcache.config.registry" in walk_leaks(known)
        assert ["objcache.entry.caps", "objcache.entry.codec", "objcache.entry.caps"] in cycles(
            known
        )
        assert any(
            "import _planted" in b for n, p in known.items() for b in private_uses(n, p, known)
        )
    finally:
        ROOT = saved


def _docstring_only(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


def _section(markdown: str, title: str) -> str:
    return markdown.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_module_table_in_docs_lists_every_module_and_only_those() -> None:
    """docs/architecture.md, "Modules, top to bottom": a row per module of the tree (a
    package's ``__init__`` too, unless it holds only its docstring), no row for a file that
    is not there."""
    section = _section((ROOT / "docs/architecture.md").read_text(), "Modules, top to bottom")
    listed = [
        cell.strip("`")
        for line in section.splitlines()
        if line.startswith("| `")
        for cell in [line.split("|")[1].strip()]
    ]
    tree = {
        str(path.relative_to(ROOT))
        for path in modules().values()
        if not (path.name == "__init__.py" and _docstring_only(path))
    }
    assert sorted(set(listed) - tree) == [], (
        "rows for files that do not exist (or only a docstring)"
    )
    # a backend's folder says what is in it (the test below): adding one touches no table
    required = {path for path in tree if not _in_a_backend_folder(ROOT / path)}
    assert sorted(required - set(listed)) == [], "modules missing from the table"
    assert len(listed) == len(set(listed)), "a module listed twice"


def _in_a_backend_folder(path: Path) -> bool:
    return path.parent.parent == SOURCES["objcache.backends"]


def test_each_backend_folder_names_its_modules_in_its_docstring() -> None:
    """docs/architecture.md, "Adding a backend": a backend's folder describes itself; its
    ``__init__`` docstring names every module of the folder."""
    folders = {p.parent for p in modules().values() if _in_a_backend_folder(p)}
    assert folders, "no backend folder found"
    for folder in sorted(folders):
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        for path in sorted(folder.glob("*.py")):
            if path.name != "__init__.py":
                assert f"``{path.stem}``" in doc, f"{folder.name}/__init__.py: {path.stem}"


def test_the_layer_table_in_docs_is_the_order_this_test_checks() -> None:
    section = _section((ROOT / "docs/architecture.md").read_text(), "Layers")
    rows = [
        line.split("|") for line in section.splitlines() if line.startswith("| ") and "`" in line
    ]
    assert [r[2].strip() for r in rows] == [name for name, _ in LAYERS]
    for row in rows:
        for path in row[3].split("`")[1::2]:
            if "/" in path:
                assert list(ROOT.glob(path)), path
