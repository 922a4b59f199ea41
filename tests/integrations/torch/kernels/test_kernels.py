"""The kernel layer (:mod:`objcache.integrations.torch.kernels.kernels`) on tiny g++ builds: keys
follow content and flags, fetched kernels replace builds, precompiled headers wait until a
kernel needs them, ISA probes carry their verdict, and a fetched kernel is placed only
through this user's own folders."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.torch_cache import header_record, new_machine
from tests.support.torch_cache import kernel_builder as _builder

torch = pytest.importorskip("torch")


@given(
    st.lists(
        st.text(alphabet=st.sampled_from(list("ab-=/. \t\n\r\x0b\"'\\")), max_size=12),
        max_size=6,
    ).map(" ".join)
)
def test_a_compile_command_splits_as_shlex_splits_it(command: str) -> None:
    """The kernel key's tokens: shlex's, with its tokenizer skipped where nothing is quoted."""
    import shlex

    from objcache.integrations.torch.kernels.kernels import split_command

    try:
        expected = shlex.split(command)
    except ValueError:  # an unclosed quote: shlex refuses, and so does the key
        with pytest.raises(ValueError):
            split_command(command)
        return
    assert split_command(command) == expected


def test_kernel_keys_follow_content_and_flags_not_paths(tmp_path: Path) -> None:
    from objcache.integrations.torch.kernels import kernels

    code = 'extern "C" int answer() { return 42; }\n'
    a, b = tmp_path / "a" / "k1.cpp", tmp_path / "b" / "zz" / "k2.cpp"
    for path in (a, b):
        path.parent.mkdir(parents=True)
        path.write_text(code)
    pa, pb = kernels.plan(_builder(a, a.parent)), kernels.plan(_builder(b, b.parent))
    assert pa is not None and pb is not None
    assert pa.key == pb.key  # same source and flags in other dirs: same entry
    assert pa.target.endswith(".so") and pa.key.endswith(".so")
    assert kernels.plan(_builder(a, a.parent, compile_only=True)).key != pa.key  # type: ignore[union-attr]
    b.write_text(code.replace("42", "43"))
    assert kernels.plan(_builder(b, b.parent)).key != pa.key  # type: ignore[union-attr]
    assert kernels.plan(_builder(a, a.parent, preprocessing=True)) is None


def test_a_fetched_kernel_is_never_written_through_a_link_in_torchs_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below torch's cache directory a kernel is placed only through folders of this user's
    that nobody else can write (docs/security.md, "Files objcache places outside a store")."""
    from objcache.errors import UnsafeFolder
    from objcache.integrations.torch.kernels import kernels

    cache, elsewhere = tmp_path / "inductor", tmp_path / "elsewhere"
    cache.mkdir(mode=0o700)
    elsewhere.mkdir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    (cache / "ab").symlink_to(elsewhere)
    with pytest.raises(UnsafeFolder):
        kernels._atomic_write(str(cache / "ab" / "cab.so"), b"\x7fELF")
    assert list(elsewhere.iterdir()) == []
    (cache / "cd").mkdir(mode=0o777)
    (cache / "cd").chmod(0o777)
    with pytest.raises(UnsafeFolder):
        kernels._atomic_write(str(cache / "cd" / "ccd.so"), b"\x7fELF")
    kernels._atomic_write(str(cache / "ef" / "cef.so"), b"\x7fELF")
    assert (cache / "ef" / "cef.so").read_bytes() == b"\x7fELF"
    assert (cache / "ef" / "cef.so").stat().st_mode & 0o777 == 0o755


def test_kernels_are_fetched_instead_of_built_and_headers_wait_until_needed(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objcache.integrations.torch.kernels import kernels

    header = installed_file_store / "pch" / "prefix.h"
    header.parent.mkdir()
    header.write_text("#include <vector>\n")
    src = installed_file_store / "src" / "k.cpp"
    src.parent.mkdir()
    src.write_text('#include <vector>\nextern "C" int n() { return std::vector<int>(3).size(); }\n')

    def counted() -> dict[str, int]:
        return kernels.counters()

    start = counted()
    pch = _builder(header, None, precompiling=True)
    pch.build()  # deferred: no kernel needs it yet
    gch = Path(pch.get_target_file_path())
    assert not gch.exists()
    kernel = _builder(src, installed_file_store / "out-a", precompiled_header=str(header))
    kernel.build()  # a miss: the header is built first, then the kernel
    assert gch.exists() and Path(kernel.get_target_file_path()).exists()
    kernels.wait_stored(60)
    after_cold = counted()
    assert after_cold.get("pch_built", 0) == start.get("pch_built", 0) + 1
    assert after_cold.get("builds", 0) == start.get("builds", 0) + 2

    new_machine(installed_file_store, monkeypatch, "b")
    gch.unlink()
    pch.build()
    again = _builder(src, installed_file_store / "out-b", precompiled_header=str(header))
    again.build()
    fetched = Path(again.get_target_file_path())
    assert fetched.read_bytes() == Path(kernel.get_target_file_path()).read_bytes()
    assert os.access(fetched, os.X_OK)
    assert not gch.exists()  # never needed: every kernel came from the cache
    after_warm = counted()
    assert after_warm.get("builds", 0) == after_cold.get("builds", 0)
    assert after_warm.get("fetched", 0) == after_cold.get("fetched", 0) + 1


def test_a_kernel_is_served_only_where_the_compiler_s_search_finds_the_same_headers(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same source and command line read other headers on a machine whose header differs,
    whose search finds a file of that name earlier, or whose compiler environment adds a
    folder (``CPATH``): each builds its own kernel and computes its own answer; a machine
    with the same headers is served (docs/architecture.md, "The headers a kernel was built
    with")."""
    import ctypes

    from objcache.integrations.torch.kernels import kernels

    # the session's g++ cache keys a build by its command, not by the headers it reads
    # (tests/support/gxx_cache.py): these builds read headers this test writes
    wrapper = os.environ.get("TESTS_GXX_CACHE")
    if wrapper and wrapper != "off":
        folders = os.environ["PATH"].split(os.pathsep)
        monkeypatch.setenv(
            "PATH", os.pathsep.join(f for f in folders if f != os.path.join(wrapper, "bin"))
        )
    base = installed_file_store
    first, second = base / "include-a", base / "include-b"
    first.mkdir()
    second.mkdir()
    (second / "answer.h").write_text("#define ANSWER 1\n")
    src = base / "src" / "k.cpp"
    src.parent.mkdir()
    src.write_text('#include <answer.h>\nextern "C" int answer() { return ANSWER; }\n')
    flags = (f"-I{first}", f"-I{second}")

    def built(name: str) -> tuple[int, dict[str, int]]:
        """A machine's answer from the kernel it builds or is served, and its counters."""
        if name != "writer":
            new_machine(base, monkeypatch, name)
        before = kernels.counters()
        builder = _builder(src, base / f"out-{name}", extra_flags=flags)
        builder.build()
        kernels.wait_stored(60)
        after = kernels.counters()
        answer = ctypes.CDLL(str(builder.get_target_file_path())).answer()
        return int(answer), {k: after.get(k, 0) - before.get(k, 0) for k in after}

    answer, counted = built("writer")
    assert answer == 1 and counted.get("builds") == 1 and counted.get("stored") == 1, counted
    answer, counted = built("same")  # the same headers: served
    assert answer == 1 and counted.get("fetched") == 1 and not counted.get("builds"), counted
    (second / "answer.h").write_text("#define ANSWER 2\n")  # another image's header
    answer, counted = built("other-header")
    assert answer == 2 and counted.get("misses_headers_differ") == 1, counted
    assert counted.get("builds") == 1 and not counted.get("fetched"), counted
    (second / "answer.h").write_text("#define ANSWER 1\n")
    (first / "answer.h").write_text("#define ANSWER 3\n")  # found earlier in the search
    answer, counted = built("shadowed")
    assert answer == 3 and counted.get("builds") == 1 and not counted.get("fetched"), counted
    (first / "answer.h").unlink()
    shadow = base / "on-cpath"
    shadow.mkdir()
    (shadow / "unused.h").write_text("\n")
    monkeypatch.setenv("CPATH", str(shadow))  # another search: another key altogether
    answer, counted = built("cpath")
    assert answer == 1 and counted.get("misses") == 1 and counted.get("builds") == 1, counted
    monkeypatch.delenv("CPATH")
    answer, counted = built("same-again")
    assert answer == 1 and counted.get("fetched") == 1 and not counted.get("builds"), counted

    # a link of object files compiles nothing and reads no header: stored all the same
    obj = _builder(src, base / "out-object", extra_flags=flags, compile_only=True)
    obj.build()
    kernels.wait_stored(60)
    linked = _builder(Path(obj.get_target_file_path()), base / "out-linked")
    before = kernels.counters()
    linked.build()
    kernels.wait_stored(60)
    after = kernels.counters()
    assert after.get("stored", 0) == before.get("stored", 0) + 1, (before, after)


def test_a_fetched_isa_probe_skips_the_dlopen_child_only_if_its_probe_passed_where_built(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch dlopens every ISA probe library in a child Python unless it has seen that
    library load (2.14+: a ``.load_ok`` marker beside it). A probe objcache brings to a new
    machine carries the verdict torch reached where it was built; no verdict, the child runs."""
    from torch._inductor import cpu_vec_isa

    from objcache.integrations.torch.kernels import kernels

    isa = cpu_vec_isa.pick_vec_isa()
    if not isa or not hasattr(cpu_vec_isa.VecISA, "_probe_load"):
        pytest.skip("no vector ISA probe on this machine or torch")
    children: list[str] = []
    fail_children = False
    real_run = subprocess.run

    def run(cmd: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(cmd, list) and any("LoadLibrary" in str(c) for c in cmd):
            children.append(str(cmd[-1]))
            if fail_children:
                raise subprocess.CalledProcessError(1, cmd)
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(cpu_vec_isa.subprocess, "run", run)
    passes = 'extern "C" int objcache_probe_ok() { return 1; }\n'
    refused = 'extern "C" int objcache_probe_refused() { return 2; }\n'
    assert isa.check_build(passes)  # built here, the child dlopened it
    fail_children = True
    assert not isa.check_build(refused)  # built here, the child failed
    fail_children = False
    assert len(children) == 2
    kernels.wait_stored(60)
    before = kernels.counters()

    inductor = new_machine(installed_file_store, monkeypatch, "b")
    assert isa.check_build(passes)
    assert len(children) == 2  # the library came from objcache with its verdict: no child
    after = kernels.counters()
    assert after.get("fetched", 0) == before.get("fetched", 0) + 1
    assert after.get("probes_skipped", 0) == before.get("probes_skipped", 0) + 1
    if any(p.name.endswith(".so.load_ok") for p in (installed_file_store / "inductor").rglob("*")):
        # this torch keeps a marker: it is where torch itself would have left it
        assert [p.name for p in inductor.rglob("*.so.load_ok")]
    assert isa.check_build(refused)  # fetched, but its probe never passed: the child runs
    assert len(children) == 3
    assert kernels.counters().get("builds", 0) == before.get("builds", 0)


def test_headers_found_beside_a_source_are_its_own(tmp_path: Path) -> None:
    """Two kernels of one kind share a record of their headers, but not where a quoted
    include is found beside each source: each names its own folder's header."""
    records = []
    for name, value in (("a", 1), ("b", 2)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "local.h").write_text(f"#define VALUE {value}\n")
        made = header_record(
            folder / "k.cpp", '#include "local.h"\nint value() { return VALUE; }\n'
        )
        assert made is not None
        records.append(made)
    assert records[0][0] != records[1][0]
    assert b"/a/local.h" in records[0][1] and b"/b/local.h" in records[1][1]
