"""The test session's compiler cache (tests/support/gxx_cache.py): a build is served again only
where every input is the same, and the call it answers looks like the real compiler's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import gxx_cache

SCRIPT = Path(gxx_cache.__file__)


def _fake_compiler(folder: Path) -> tuple[Path, Path]:
    """A "compiler" that copies its input to its output, warns, and counts its runs."""
    runs = folder / "runs"
    real = folder / "real-g++"
    real.write_text(
        "#!/bin/sh\n"
        f'echo run >> "{runs}"\n'
        'while [ "$1" != "-o" ]; do src="$1"; shift; done\n'
        'cat "$src" > "$2"; chmod 755 "$2"\n'
        'echo "warning: from the build" >&2\n'
    )
    real.chmod(0o755)
    return real, runs


def _build(real: Path, cache: Path, source: Path, output: Path, *flags: str) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-S",
            "-E",
            str(SCRIPT),
            str(real),
            str(cache),
            *flags,
            str(source),
            "-o",
            str(output),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stderr


def test_a_build_of_the_same_inputs_elsewhere_is_served_from_the_cache(tmp_path: Path) -> None:
    real, runs = _fake_compiler(tmp_path)
    cache = tmp_path / "cache"
    for machine in ("a", "b"):
        (tmp_path / machine).mkdir()
        (tmp_path / machine / "k.cpp").write_text("kernel")
    err_a = _build(real, cache, tmp_path / "a" / "k.cpp", tmp_path / "a" / "k.so", "-O3")
    err_b = _build(real, cache, tmp_path / "b" / "k.cpp", tmp_path / "b" / "k.so", "-O3")
    assert runs.read_text().count("run") == 1
    assert (tmp_path / "b" / "k.so").read_text() == "kernel"
    assert os.access(tmp_path / "b" / "k.so", os.X_OK)
    assert err_a == err_b == "warning: from the build\n"


def test_another_input_or_flag_is_built_again(tmp_path: Path) -> None:
    real, runs = _fake_compiler(tmp_path)
    cache = tmp_path / "cache"
    source = tmp_path / "k.cpp"
    source.write_text("one")
    _build(real, cache, source, tmp_path / "k.so", "-O3")
    _build(real, cache, source, tmp_path / "k.so", "-O2")
    source.write_text("two")
    _build(real, cache, source, tmp_path / "k.so", "-O3")
    assert runs.read_text().count("run") == 3
    assert (tmp_path / "k.so").read_text() == "two"


def test_calls_that_are_not_one_build_are_never_keyed(tmp_path: Path) -> None:
    source = tmp_path / "k.cpp"
    source.write_text("x")
    env: dict[str, str] = {}
    assert gxx_cache.build_key("g++", ["--version"], str(tmp_path), env) is None
    assert gxx_cache.build_key("g++", [str(source), "-E", "-o", "k.i"], str(tmp_path), env) is None
    assert gxx_cache.build_key("g++", [str(source)], str(tmp_path), env) is None
    one = gxx_cache.build_key("g++", [str(source), "-o", "/a/k.so"], "/x", env)
    assert one == gxx_cache.build_key("g++", [str(source), "-o", "/b/k.so"], "/y", env)
    assert one != gxx_cache.build_key("g++", [str(source), "-o", "/a/k.so"], "/x", {"CPATH": "/i"})
