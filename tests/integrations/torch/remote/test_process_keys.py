"""Keys only one process can use (:mod:`objcache.integrations.torch.remote.process_keys`): an
AOTAutograd entry whose backward was compiled under settings the program changed after torch
read its key stays on the machine that made it."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support import torch_runs as ts

torch = pytest.importorskip("torch")


def test_an_entry_is_local_once_what_its_key_named_changed() -> None:
    """The state a key was looked up under is compared with the state when its entry is
    saved: another Inductor setting, a program's kernel of torch's ops or another thread count
    between the two, or a key never looked up, keeps the entry local; other kinds are never
    held back."""
    import torch._inductor.config as inductor_config

    from objcache.integrations.torch.remote import process_keys

    process_keys.looked_up("aot-autograd", "a-key")
    assert not process_keys.changed_since_lookup("aot-autograd", "a-key")
    with inductor_config.patch({"cpp.simdlen": 0}):
        assert process_keys.changed_since_lookup("aot-autograd", "a-key")
    assert not process_keys.changed_since_lookup("aot-autograd", "a-key")
    # a program's kernel of one of torch's ops registered between the two
    library = torch.library.Library("aten", "IMPL")
    try:
        library.impl("linear", lambda x, w, b=None: x, "CompositeImplicitAutograd")
        assert process_keys.changed_since_lookup("aot-autograd", "a-key")
    finally:
        library._destroy()
    assert not process_keys.changed_since_lookup("aot-autograd", "a-key")
    threads = torch.get_num_threads()  # the thread count C++ kernels are generated for
    torch.set_num_threads(threads + 1)
    try:
        assert process_keys.changed_since_lookup("aot-autograd", "a-key")
    finally:
        torch.set_num_threads(threads)
    assert not process_keys.changed_since_lookup("aot-autograd", "a-key")
    assert process_keys.changed_since_lookup("aot-autograd", "never-looked-up")
    assert not process_keys.changed_since_lookup("fx-graph", "never-looked-up")


PROGRAM = """\
import json, os
import torch
import objcache

objcache.install()
from objcache.integrations.torch.remote import process_keys

torch.manual_seed(0)
w = torch.randn(16, 257)
x = torch.randn(16, 1, requires_grad=True)


def f(x):
    return (x * w).sin().sum()


loss = torch.compile(f)(x)
if os.environ.get("SCALAR_BACKWARD") == "1":  # set between the forward and its backward
    torch._inductor.config.cpp.simdlen = 0
loss.backward()
counters = torch._dynamo.utils.counters
print("RESULT " + json.dumps({
    "aot_hits": counters["aot_autograd"]["autograd_cache_hit"],
    "kept_local": process_keys.counters["local_only:changed_since_key"],
}))
"""


@pytest.mark.compile
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_a_backward_compiled_under_a_later_setting_is_not_served_to_another_machine(
    tmp_path: Path,
) -> None:
    """torch compiles a graph's backward at its first ``.backward()`` and saves the
    AOTAutograd entry then, under the key it read at the forward: a writer that set an
    Inductor setting in between (scalar kernels) keeps that entry local, and a new machine
    compiles its own backward; a writer that changed nothing serves the next machine."""

    def run(store: str, machine: str, **env: str) -> dict[str, Any]:
        path = tmp_path / store / machine
        path.mkdir(parents=True)
        e = ts.compile_env(path, f"file://{tmp_path / store / 'store'}")
        e.update(OBJCACHE_PREFETCH="0", **env)
        return ts.run_script(path, PROGRAM, e)

    def pair(store: str, **writer_env: str) -> tuple[dict[str, Any], dict[str, Any]]:
        return run(store, "writer", **writer_env), run(store, "reader")

    with ThreadPoolExecutor(max_workers=2) as pool:
        changed = pool.submit(pair, "changed", SCALAR_BACKWARD="1")
        plain = pool.submit(pair, "plain")
        (writer, reader), (plain_writer, plain_reader) = changed.result(), plain.result()
    assert writer["kept_local"] >= 1 and reader["aot_hits"] == 0, (writer, reader)
    assert plain_writer["kept_local"] == 0 and plain_reader["aot_hits"] >= 1, (
        plain_writer,
        plain_reader,
    )
