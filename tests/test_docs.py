"""Docs stay true: runnable code blocks execute, and every page the README links exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

BLOCK = re.compile(r"^```(python|bash) runnable\n(.*?)^```", re.S | re.M)


def runnable_blocks() -> list[tuple[str, str, str]]:
    found = []
    for page in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        for i, m in enumerate(BLOCK.finditer(page.read_text())):
            found.append((f"{page.name}#{i}", m.group(1), m.group(2)))
    return found


@pytest.mark.parametrize(("where", "lang", "code"), runnable_blocks(), ids=lambda v: str(v)[:40])
def test_runnable_block(where: str, lang: str, code: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "OBJCACHE_PREFETCH": "0",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    cmd = (
        [sys.executable, "-c", code]
        if lang == "python"
        else ["bash", "-euo", "pipefail", "-c", code]
    )
    r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{where} failed:\n{r.stdout}\n{r.stderr}"


def test_there_are_runnable_blocks() -> None:
    assert len(runnable_blocks()) >= 2


def test_linked_pages_exist() -> None:
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+\.md)\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_the_quickstart_prints_what_it_counts(tmp_path: Path) -> None:
    """The quickstart's one put prints a count that says what it counts."""
    page = (ROOT / "docs" / "quickstart.md").read_text()
    [code] = [m.group(2) for m in BLOCK.finditer(page) if "client.put(" in m.group(2)]
    env = {**os.environ, "HOME": str(tmp_path), "OBJCACHE_PREFETCH": "0"}
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    printed = r.stdout.strip()
    assert (
        printed == "2 objects written to the store: the entry, and ENV.json (once per environment)"
    )
    assert f"It prints `{printed}`" in page


#: The repository's top-level folders: a backticked token that starts with one names a path
#: here (``torch/_dynamo/pgo.py`` or ``s3/`` name other trees, and stay unchecked).
TOP_FOLDERS = ("objcache", "backends", "tests", "docs", "bench", "scripts", "terraform", ".ci")
#: A backticked token: a path, optionally with a line (``:42``, ``:42-50``) or a pytest
#: selector (``::test_x``) after it.
CODE_SPAN = re.compile(r"`([^`\s]+)`")


def named_paths(text: str) -> list[str]:
    """The paths in this repository that ``text`` names in backticks."""
    paths = []
    for token in CODE_SPAN.findall(text):
        path = re.sub(r"(::\S*|:\d+(-\d+)?)$", "", token.rstrip(".,;:"))
        if any(c in path for c in "<>*{}$?=") or path.split("/")[0] not in TOP_FOLDERS:
            continue
        if "/" in path:
            paths.append(path)
    return paths


def test_named_paths_finds_what_a_page_names() -> None:
    text = (
        "see `objcache/client.py:71`, `tests/core/test_tiered.py::test_x`, `docs/`, "
        "`torch/_dynamo/pgo.py`, `tests/<package>/test_<module>.py`, `objcache.stores`"
    )
    assert named_paths(text) == ["objcache/client.py", "tests/core/test_tiered.py", "docs/"]


def test_every_path_the_docs_name_exists() -> None:
    missing = [
        f"{page.relative_to(ROOT)}: {path}"
        for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
        for path in named_paths(page.read_text())
        if not (ROOT / path).exists()
    ]
    assert not missing, "\n".join(missing)
