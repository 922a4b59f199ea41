"""What the program registered with torch outside any graph (docs/torch.md, "Custom ops in
the keys"): its entries in Inductor's pattern-matcher passes, and the native extensions that
can register C++ kernels, each named so that another registration is another key."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from objcache.integrations.torch.precompile import program_registrations

torch = pytest.importorskip("torch")


def test_the_program_s_pattern_in_inductor_s_passes_is_named() -> None:
    """``register_replacement(search, replace, ..., joint_graph.patterns)``: Inductor rewrites
    every graph the pattern matches, which no key of torch's names; the program's entry is
    named by its functions (another replacement: another identity), torch's own are not."""
    from torch._inductor.fx_passes import joint_graph
    from torch._inductor.pattern_matcher import fwd_only, register_replacement

    def search(x: Any) -> Any:
        return x * torch.sigmoid(x)

    def hardswish(x: Any) -> Any:
        return torch.nn.functional.hardswish(x)

    def relu(x: Any) -> Any:
        return torch.relu(x)

    before = {key: list(entries) for key, entries in joint_graph.patterns.patterns.items()}
    seen_before = {k: list(v) for k, v in joint_graph.patterns.seen_patterns.items()}
    own = program_registrations.pattern_overrides()
    token = program_registrations.tables_token()
    found = []
    try:
        for replace in (hardswish, relu):
            joint_graph.patterns.patterns.clear()
            joint_graph.patterns.patterns.update({k: list(v) for k, v in before.items()})
            joint_graph.patterns.seen_patterns.clear()
            register_replacement(search, replace, [torch.empty(8)], fwd_only, joint_graph.patterns)
            assert program_registrations.tables_token() != token
            found.append(dict(program_registrations.pattern_overrides()))
    finally:
        joint_graph.patterns.patterns.clear()
        joint_graph.patterns.patterns.update(before)
        joint_graph.patterns.seen_patterns.clear()
        joint_graph.patterns.seen_patterns.update(seen_before)
    labels = [label for label in found[0] if label not in dict(own)]
    assert labels and all("joint_graph.patterns" in label for label in labels), found[0]
    assert all(found[0][label] != found[1][label] for label in labels)
    assert program_registrations.pattern_overrides() == own


def test_a_c_plus_plus_kernel_outside_torch_s_build_is_named_by_the_loaded_binaries(
    tmp_path: Path,
) -> None:
    """The dispatcher names a C++ kernel by its build's source path, the same in every
    version of a library: such a registration outside torch's own build adds the loaded
    binaries' identity; torch's own C++ registrations do not."""
    from objcache.integrations.torch.precompile import op_overrides

    ours = str(torch._C._dispatch_dump("aten::relu"))
    assert not op_overrides._native_registrations(ours)
    theirs = "CPU: registered at /__w/vision/vision/torchvision/csrc/ops/nms.cpp:12 :: ()"
    assert op_overrides._native_registrations(theirs)
    one, two = tmp_path / "one.so", tmp_path / "two.so"
    one.write_bytes(b"\x7fELF" + b"\x01" * 4096)
    two.write_bytes(b"\x7fELF" + b"\x02" * 4096)
    assert program_registrations._binary_digest(str(one)) != program_registrations._binary_digest(
        str(two)
    )
    assert program_registrations.native_libraries() == program_registrations.native_libraries()


def test_only_binaries_linking_torch_can_name_a_kernel_library() -> None:
    """Which binaries name a C++ kernel library: those that link against torch (only they
    can register kernels); numpy's, imported by a compile at some moment, never (a machine
    served from a store imports it at another moment: the key would split)."""
    import numpy.random

    with open(torch._C.__file__, "rb") as f:
        needed = program_registrations.elf_needed(f, os.path.getsize(torch._C.__file__))
    assert needed is not None and any(n.startswith("libtorch") for n in needed), needed
    assert program_registrations._links_torch(torch._C.__file__)
    numpys = numpy.random._generator.__file__
    assert numpys is not None and not program_registrations._links_torch(numpys)
    assert numpys not in program_registrations._extension_binaries()


def test_a_tensor_method_the_program_replaced_is_named() -> None:
    """``torch.Tensor.softmax = fn``: Dynamo's graph records the method's name only and
    AOTAutograd runs the program's function while it traces: named while it is there."""
    original = torch.Tensor.softmax
    token = program_registrations.tables_token()
    assert program_registrations.tensor_method_overrides() == ()

    def halved(self: Any, dim: int, *args: Any, **kwargs: Any) -> Any:
        return original(self * 0.5, dim, *args, **kwargs)

    try:
        torch.Tensor.softmax = halved
        assert program_registrations.tables_token() != token
        named = dict(program_registrations.tensor_method_overrides())
        assert list(named) == ["tensor_method:softmax"], named
        assert "tensor_method:softmax" in dict(program_registrations.table_overrides())
    finally:
        torch.Tensor.softmax = original
    assert program_registrations.tensor_method_overrides() == ()


def test_what_a_table_entry_reads_is_named_at_every_call() -> None:
    """Which entries are the program's is remembered until the tables change; what each
    computes is named again at every call: a setting it reads changed after the first
    compile is another identity, not the one remembered."""
    from torch._inductor.decomposition import decompositions, fast_random_decomps

    from objcache.integrations.torch.precompile import op_overrides, torch_edits

    torch_edits.changes()  # torch's tables copied as released, before this test edits one
    scope: dict[str, Any] = {"torch": torch, "SCALE": 2.0}
    exec("def gelu(x, approximate='none'):\n    return x * SCALE\n", scope)
    op = torch.ops.aten.gelu.default
    before = decompositions.get(op)
    label = f"decomposition:{op}"
    try:
        decompositions[op] = scope["gelu"]
        first = dict(op_overrides.torch_overrides())[label]
        scope["SCALE"] = 3.0
        assert dict(op_overrides.torch_overrides())[label] != first
        scope["SCALE"] = 2.0
        assert dict(op_overrides.torch_overrides())[label] == first
    finally:
        if before is None:
            decompositions.pop(op, None)
        else:
            decompositions[op] = before
        fast_random_decomps.cache_clear()


CHOICES = """\
import os
from torch._inductor.choices import InductorChoices

NOFUSE = True


class NoFuse(InductorChoices):
    @staticmethod
    def can_fuse(scheduler, node1, node2, shared_data_score):
        if NOFUSE:
            return False
        return InductorChoices.can_fuse(scheduler, node1, node2, shared_data_score)

    def uuid(self):
        return "nofuse-v1"
"""


def test_the_program_s_inductor_heuristics_are_named(tmp_path: Path) -> None:
    """An ``InductorChoices`` of the program's, set for the thread (``V.set_choices_handler``,
    which no key of torch's reads) or as ``config.inductor_choices_class`` (keyed by torch by
    its ``uuid()`` alone): Inductor's scheduler asks it what to fuse, so it is named by its
    code and what it reads, in every key; another setting, another key."""
    import importlib.util

    from torch._inductor import config
    from torch._inductor.virtualized import V

    path = tmp_path / "objcache_test_choices.py"
    path.write_text(CHOICES)
    spec = importlib.util.spec_from_file_location("objcache_test_choices", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert program_registrations.choices_identity() == []
    with V.set_choices_handler(module.NoFuse()):
        named = dict(program_registrations.config_callables())
        assert "config:inductor_choices:thread" in named
        module.NOFUSE = False
        assert dict(program_registrations.choices_identity()) != {
            k: v for k, v in named.items() if k.startswith("config:inductor_choices")
        }
        module.NOFUSE = True
    with config.patch(inductor_choices_class=module.NoFuse):
        assert [k for k, _ in program_registrations.choices_identity()] == [
            "config:inductor_choices:config"
        ]
    assert program_registrations.choices_identity() == []


def test_the_program_s_functions_in_any_setting_are_named() -> None:
    """``config.external_matmul.append(fn)`` (a list setting appended to in place, whose name
    says nothing of a pass): the program's matmul joins Inductor's autotuning choices, which
    no key of torch's names; named while it is there, whatever the setting's name."""
    from torch._inductor import config

    scale = {"value": 1.0}

    def matmul(a: Any, b: Any, out: Any) -> None:
        out.copy_((a @ b) * scale["value"])

    label = "config:torch._inductor.config.external_matmul"
    assert label not in dict(program_registrations.config_callables())
    config.external_matmul.append(matmul)
    try:
        named = dict(program_registrations.config_callables())
        assert label in named
        scale["value"] = 2.0
        assert dict(program_registrations.config_callables())[label] != named[label]
    finally:
        config.external_matmul.remove(matmul)
    assert label not in dict(program_registrations.config_callables())


def test_an_entry_moved_to_another_key_is_named_under_its_new_key() -> None:
    """The program's function taken off one op or method and put on another (a delete, then
    an add at the end): every value of the table is where it was, in order, and the program
    now rewrites another op. Which entries are the program's is remembered only while the
    tables hold the same keys too, so the new one is named, not the old."""
    from torch._inductor.decomposition import decompositions, fast_random_decomps

    scope: dict[str, Any] = {"torch": torch}
    exec("def halve(x, *args, **kwargs):\n    return x * 0.5\n", scope)
    fn = scope["halve"]
    first, second = torch.ops.aten.cosh.default, torch.ops.aten.sinh.default
    saved = {op: decompositions.pop(op) for op in (first, second) if op in decompositions}
    try:
        decompositions[first] = fn
        assert f"decomposition:{first}" in dict(program_registrations.table_overrides())
        del decompositions[first]
        decompositions[second] = fn
        named = dict(program_registrations.table_overrides())
        assert f"decomposition:{second}" in named and f"decomposition:{first}" not in named
        del decompositions[second]
        torch.Tensor.objcache_first = fn
        assert "tensor_method:objcache_first" in dict(program_registrations.table_overrides())
        del torch.Tensor.objcache_first
        torch.Tensor.objcache_second = fn
        named = dict(program_registrations.table_overrides())
        assert "tensor_method:objcache_second" in named, named
        assert "tensor_method:objcache_first" not in named
    finally:
        for name in ("objcache_first", "objcache_second"):
            if name in vars(torch.Tensor):
                delattr(torch.Tensor, name)
        for op in (first, second):
            decompositions.pop(op, None)
        decompositions.update(saved)
        fast_random_decomps.cache_clear()


def test_a_dispatch_rule_moved_to_another_op_is_named_under_its_new_op() -> None:
    """The program's ``__torch_dispatch__`` rule for torch's op taken off one op and put on
    another (torch's registry keeps an entry for each op it was asked about, in place): the
    rules' identities are unchanged, in order, and only the op they are under says it moved."""
    from torch._library.simple_registry import singleton

    scope: dict[str, Any] = {"torch": torch}
    exec("def rule(mode, func, types, args, kwargs):\n    return args[0] * 0.5\n", scope)
    exec("class Mode(torch.utils._python_dispatch.TorchDispatchMode):\n    pass\n", scope)
    first, second = singleton.find("aten::cosh"), singleton.find("aten::sinh")
    handle = first.torch_dispatch_rules.register(scope["Mode"], scope["rule"])
    try:
        assert any(
            k.startswith("dispatch_rule:aten::cosh:")
            for k in dict(program_registrations.table_overrides())
        )
        handle.destroy()
        handle = second.torch_dispatch_rules.register(scope["Mode"], scope["rule"])
        named = [k for k in dict(program_registrations.table_overrides()) if "dispatch_rule" in k]
        assert named and all(k.startswith("dispatch_rule:aten::sinh:") for k in named), named
    finally:
        handle.destroy()


def test_a_pattern_moved_to_another_target_is_named_under_its_new_target() -> None:
    """The program's pattern entry taken off one target of a pass and put on another (the
    pass's key deleted, the same list added under another): only the key says it moved. A
    target is named with its overload (``aten.add.Tensor`` is not ``aten.add.Scalar``)."""
    import types

    from torch._inductor.fx_passes import joint_graph

    scope: dict[str, Any] = {}
    exec("def check(match):\n    return True\n", scope)
    entries = [types.SimpleNamespace(extra_check=scope["check"])]
    first = ("call_function", torch.ops.aten.cosh.default)
    second = ("call_function", torch.ops.aten.sinh.default)
    patterns = joint_graph.patterns.patterns
    saved = {key: patterns.pop(key) for key in (first, second) if key in patterns}
    try:
        patterns[first] = entries
        named = list(dict(program_registrations.pattern_overrides()))
        assert any(k.endswith(":aten.cosh.default") for k in named), named
        del patterns[first]
        patterns[second] = entries
        named = list(dict(program_registrations.pattern_overrides()))
        assert any(k.endswith(":aten.sinh.default") for k in named), named
        assert not any("cosh" in k for k in named), named
    finally:
        for key in (first, second):
            patterns.pop(key, None)
        patterns.update(saved)


def test_a_pass_the_program_put_in_place_of_torch_s_is_named() -> None:
    """The program's pattern pass put in place of one of Inductor's (``pass_patterns[i] =
    its_pass``, nothing imported since): Inductor runs it on every graph; which passes there
    are is found again when the modules' passes change, not only when a module is imported."""
    import types

    from torch._inductor.fx_passes import post_grad
    from torch._inductor.pattern_matcher import PatternMatcherPass

    scope: dict[str, Any] = {}
    exec("def check(match):\n    return True\n", scope)
    program_registrations.pattern_overrides()  # the passes found, as a compile finds them
    theirs = PatternMatcherPass()
    theirs.patterns[("call_function", torch.ops.aten.cosh.default)] = [
        types.SimpleNamespace(extra_check=scope["check"])
    ]
    released = post_grad.pass_patterns[0]
    try:
        post_grad.pass_patterns[0] = theirs
        named = list(dict(program_registrations.pattern_overrides()))
        assert any("post_grad.pass_patterns[0]" in k and "aten.cosh" in k for k in named), named
    finally:
        post_grad.pass_patterns[0] = released
    assert not any("aten.cosh" in k for k in dict(program_registrations.pattern_overrides()))
