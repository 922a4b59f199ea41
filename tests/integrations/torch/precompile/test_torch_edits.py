"""The program's edits of torch's own data and of Inductor's tables (docs/torch.md, "Custom
ops in the keys"): a value of torch's that differs from what the release held as imported
keys every graph, by what it is now; what Inductor adds while it compiles keys nothing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from objcache.integrations.torch.precompile import op_overrides, torch_edits
from objcache.integrations.torch.timing import compile_windows
from tests.support import torch_runs

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _remembered() -> Iterator[None]:
    """Copies taken now, as the install takes them when torch and Inductor's lowering
    module finish importing."""
    import torch._inductor.lowering  # noqa: F401

    torch_edits.reset()
    torch_edits.remember()
    yield
    torch_edits.reset()


def test_torch_as_imported_names_nothing() -> None:
    """No edit: every graph keeps torch's key."""
    assert torch_edits.changes() == ()


def test_a_table_of_torch_s_data_edited_in_place_is_named_by_its_value() -> None:
    """``_computation_dtype_map[torch.bfloat16] = torch.bfloat16`` (a "fast low-precision"
    setting: the normalization decompositions compute bfloat16 in bfloat16): named while
    in place, the same way in any process; put back, nothing."""
    import torch._prims_common as common

    from objcache.integrations.torch.remote import custom_ops

    table = common._computation_dtype_map
    before = table[torch.bfloat16]
    token = op_overrides.token()  # what a precompile entry's settings check is redone by
    table[torch.bfloat16] = torch.bfloat16
    try:
        found = dict(torch_edits.changes())
        label = "torch_data:torch._prims_common._computation_dtype_map"
        assert list(found) == [label]
        assert "bfloat16" in found[label] and "0x" not in found[label]
        assert dict(op_overrides._named(()))[label] == found[label]  # in every key
        # process-wide: carried by a precompile entry's settings, which it does not stop
        assert label.startswith(custom_ops.PROCESS_WIDE)
        assert op_overrides.token() != token
    finally:
        table[torch.bfloat16] = before
    assert torch_edits.changes() == ()
    # a key moved to another value: the same values in another order of keys
    items = list(table.items())
    table[torch.float8_e4m3fn] = table.pop(torch.float16)
    try:
        assert [label for label, _ in torch_edits.changes()] == [label]
    finally:
        table.clear()
        table.update(items)
    assert torch_edits.changes() == ()


def test_a_constant_rebound_or_removed_is_named() -> None:
    import torch.nn.functional as F

    modes = F.GRID_SAMPLE_PADDING_MODES
    F.GRID_SAMPLE_PADDING_MODES = {**modes, "planted": 9}
    try:
        assert [label for label, _ in torch_edits.changes()] == [
            "torch_data:torch.nn.functional.GRID_SAMPLE_PADDING_MODES"
        ]
        del F.GRID_SAMPLE_PADDING_MODES
        assert torch_edits.changes() == (
            ("torch_data:torch.nn.functional.GRID_SAMPLE_PADDING_MODES", "removed"),
        )
    finally:
        F.GRID_SAMPLE_PADDING_MODES = modes
    assert torch_edits.changes() == ()


def test_a_lowering_replaced_with_torch_s_own_fallback_is_named() -> None:
    """``make_fallback(aten.exp.default)``: the entry is a closure torch's lowering module
    made, so it reads as torch's; it differs from the release's lowering, and is named by
    the function and the op it closes over (no address)."""
    from torch._inductor import lowering

    op = torch.ops.aten.exp.default
    released = lowering.lowerings[op]
    lowering.make_fallback(op, warn=False)
    try:
        (label, named), *rest = torch_edits.changes()
        assert label == "replaced:lowering:aten.exp.default" and not rest
        assert named.startswith("torch:") and "fallback" in named and "0x" not in named
    finally:
        lowering.lowerings[op] = released
    assert torch_edits.changes() == ()


def test_an_entry_removed_is_named_and_a_fallback_added_while_compiling_is_not() -> None:
    """Inductor adds a fallback for an op without a lowering as it compiles (what a table
    gained depends on what the process compiled before); a removed entry is the program's."""
    from torch._inductor import decomposition, lowering

    added = torch.ops.aten._nested_tensor_from_mask.default
    assert added not in lowering.lowerings
    torch_edits.compile_started()
    lowering.make_fallback(added, warn=False)  # what Inductor does as it meets the op
    torch_edits.compile_ended()
    removed = next(iter(decomposition.decompositions))
    entry = decomposition.decompositions.pop(removed)
    try:
        assert torch_edits.changes() == ((f"replaced:decomposition:{removed}", "removed"),)
    finally:
        decomposition.decompositions[removed] = entry
        lowering.lowerings.pop(added, None)
    assert torch_edits.changes() == ()


def test_a_lowering_the_program_adds_between_compiles_is_named() -> None:
    """``register_lowering`` for an op Inductor would fall back on, between compiles: the
    graph's code changes where no key names the program's code (the lowering table is the one
    torch grows as it compiles, so only what is added outside every compile counts); named by
    the function's code, whatever compiles come after, and nothing once it is gone."""
    from torch._inductor import lowering

    op = torch.ops.aten._nested_tensor_from_mask.default
    assert op not in lowering.lowerings

    def program_s_lowering(*args: object) -> object:
        raise NotImplementedError

    lowering.lowerings[op] = program_s_lowering
    try:
        (label, named), *rest = torch_edits.changes()
        assert label == f"added:lowering:{op}" and not rest
        assert named == torch_edits._identity(program_s_lowering)  # by its code, not torch's
        torch_edits.compile_started()  # a compile after it: still the program's
        torch_edits.compile_ended()
        assert [label for label, _ in torch_edits.changes()] == [f"added:lowering:{op}"]
        # one of torch's own lowerings put there (no code of the program's to find): by it
        lowering.lowerings[op] = lowering.lowerings[torch.ops.aten.exp.default]
        ((label, named),) = torch_edits.changes()
        assert label == f"added:lowering:{op}" and named.startswith("torch:")
    finally:
        del lowering.lowerings[op]
    assert torch_edits.changes() == ()
    # gone, then torch's own fallback for the op made while compiling: torch's, not the program's
    torch_edits.compile_started()
    lowering.make_fallback(op, warn=False)
    torch_edits.compile_ended()
    try:
        assert torch_edits.changes() == ()
    finally:
        lowering.lowerings.pop(op, None)


def test_an_entry_added_to_a_decomposition_table_is_named() -> None:
    """Torch's own ``baddbmm`` decomposition put back into Inductor's table (Inductor leaves
    it out: it rounds the product to bf16 first): the function is torch's, so only the
    difference from the table as imported names it (the twelfth review: off by 0.086)."""
    from torch._decomp import get_decompositions
    from torch._inductor import decomposition

    op = torch.ops.aten.baddbmm.default
    assert op not in decomposition.decompositions
    added = get_decompositions([torch.ops.aten.baddbmm])
    decomposition.decompositions.update(added)
    try:
        found = dict(torch_edits.changes())
        assert found[f"added:decomposition:{op}"].startswith("torch:")
    finally:
        for each in added:
            del decomposition.decompositions[each]
    assert torch_edits.changes() == ()


def test_data_of_inductor_s_modules_edited_in_place_is_named() -> None:
    """``VECTORIZABLE_DTYPES.remove(torch.float64)`` (a workaround for a C++ vectorization
    problem: float64 kernels become scalar loops, which sum in another order; the twelfth
    review: off by 240): a container Inductor holds as imported, which no compile changes."""
    from torch._inductor.codegen import cpp

    dtypes = cpp.VECTORIZABLE_DTYPES
    before = list(dtypes)
    dtypes.remove(torch.float64)
    try:
        label = "torch_data:torch._inductor.codegen.cpp.VECTORIZABLE_DTYPES"
        assert [found for found, _ in torch_edits.changes()] == [label]
    finally:
        dtypes[:] = before
    assert torch_edits.changes() == ()


def test_a_scalar_of_inductor_s_the_program_rebinds_is_named_and_torch_s_own_are_not() -> None:
    """A setting in a module of Inductor's that no config names (``utils.ALIGN_BYTES``, a
    pass's ``cpu_max_other_dimension_decomposition``: the pass reads the lower-case copy) is
    named once the program rebinds it, outside any compile; what torch changes inside a compile
    window (its counters, flags it sets lazily) is never named, whatever it holds later."""
    from torch._inductor import utils
    from torch._inductor.fx_passes import decompose_mem_bound_mm as mm

    torch_edits.remember_module(mm)  # as the import watcher copies a module at its import
    align, limit = utils.ALIGN_BYTES, mm.cpu_max_other_dimension_decomposition
    utils.ALIGN_BYTES = align * 2
    mm.cpu_max_other_dimension_decomposition = limit * 2
    try:
        found = dict(torch_edits.changes())
        prefix = "torch_data:torch._inductor."
        assert sorted(found) == [
            prefix + "fx_passes.decompose_mem_bound_mm.cpu_max_other_dimension_decomposition",
            prefix + "utils.ALIGN_BYTES",
        ]
        assert found[prefix + "utils.ALIGN_BYTES"] == str(align * 2)
    finally:
        utils.ALIGN_BYTES, mm.cpu_max_other_dimension_decomposition = align, limit
    assert torch_edits.changes() == ()  # put back: nothing
    # changed while a compile is under way (nested windows, as a frame's graph compiles): torch's
    torch_edits.compile_started()
    torch_edits.compile_started()
    utils.ALIGN_BYTES = align * 4
    torch_edits.compile_ended()
    assert compile_windows._depth[0] == 1  # the frame's window is still open
    torch_edits.compile_ended()
    try:
        assert torch_edits.changes() == ()
        # put back between compiles (as ``torch._dynamo.reset()`` zeroes Inductor's counters),
        # then changed by the next compile again: still torch's
        utils.ALIGN_BYTES = align
        assert torch_edits.changes() == ()
        torch_edits.compile_started()
        utils.ALIGN_BYTES = align * 4
        torch_edits.compile_ended()
        assert torch_edits.changes() == ()
    finally:
        utils.ALIGN_BYTES = align


def test_compile_windows_are_dynamo_s_and_inductor_s_own() -> None:
    """The install makes a window of Dynamo's context around each frame compile and lazy
    backward compile, of each Inductor graph compile (one a program starts itself) and of
    each call of Inductor as a backend (``aot_compile`` and vLLM call it outside Dynamo's)."""
    import torch._dynamo.callback as callback
    from torch._inductor import compile_fx

    from objcache.integrations.install import hooks
    from objcache.integrations.patching import is_marked

    hooks._apply_torch_edits(callback)
    hooks._apply_inductor_code(compile_fx)
    assert is_marked(callback.CompilationCallbackHandler.install_callbacks)
    assert is_marked(compile_fx._compile_fx_inner) and is_marked(compile_fx.compile_fx)
    seen: list[int] = []
    handler = callback.CompilationCallbackHandler()
    with handler.install_callbacks(callback.CallbackTrigger.DYNAMO, "0/0"):
        seen.append(compile_windows._depth[0])
    assert seen == [1] and compile_windows._depth[0] == 0


def test_data_holding_classes_of_torch_s_dependencies_reads_alike_in_every_process() -> None:
    """Inductor's data holding sympy's classes (2.15.0's ``sizevars._RANGE_BOUND_OPS``) is
    rendered the same in every fresh process: a process that copied Inductor's data as found
    compares it with the release's rendering, made in another interpreter. Read as the
    program's code, a sympy class was named through sympy's process-local caches: no late
    ``install()`` ever matched the release, so such processes shared no entry."""
    program = (
        "import sympy\n"
        "from objcache.integrations.torch.precompile import torch_edits\n"
        "data = (sympy.core.relational.StrictLessThan, sympy.LessThan)\n"
        "print(torch_edits._identity(data))\n"
        "print(torch_edits._identity({torch_edits.inductor_namespace.__name__: [sympy.Add]}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJCACHE_")}
    env["PYTHONPATH"] = str(torch_runs.ROOT)
    first, second = (
        torch_runs.python_c(program, {**env, "PYTHONHASHSEED": seed}) for seed in ("1", "2")
    )
    assert first == second
    assert (
        "class:sympy.core.relational.StrictLessThan" in first
        and "class:sympy.core.add.Add" in first
    )


def test_the_zero_code_path_copies_as_import_torch_returns(tmp_path: Path) -> None:
    """Copied as ``import torch`` returns, so an edit on the program's next line is a
    change (an explicit ``install()`` copies when it runs)."""
    edit = "common._computation_dtype_map[torch.bfloat16] = torch.bfloat16"
    program = [
        "import torch",
        "import torch._prims_common as common",
        edit,
        "from objcache.integrations.torch.precompile.torch_edits import changes",
        "print(*(label for label, _ in changes()))",
    ]
    out = torch_runs.zero_code_python(tmp_path, "\n".join(program)).split()
    assert out == ["torch_data:torch._prims_common._computation_dtype_map"]


def _late_install(tmp_path: Path, cache: Path, *, edit: bool, child: bool = True) -> list[str]:
    """A program that compiles (which imports Inductor), may edit Inductor's tables with
    torch's own functions, and only then calls ``objcache.install()``: the labels of
    ``changes()``."""
    program = [
        "import torch",
        "from objcache.config.settings import Config",
        "from objcache.integrations.torch.precompile import torch_edits",
        "f = torch.compile(lambda x: x + 1)",
        "from torch._inductor import decomposition, lowering",
        "from torch._inductor.codegen import cpp",
        "aten = torch.ops.aten",
    ]
    if edit:
        program += [
            "decomposition.decompositions.pop(aten.gelu.default)",
            "lowering.make_fallback(aten.gelu.default, warn=False)",
            "cpp.VECTORIZABLE_DTYPES.remove(torch.float64)",
            # torch's own lowering put at an op torch falls back on: no code of the program's
            "lowering.lowerings[aten._nested_tensor_from_mask.default] = "
            "lowering.lowerings[aten.exp.default]",
        ]
    if not child:
        program.append("torch_edits._ask_child = lambda: None")
    program += [
        "import objcache",
        f"objcache.install(Config.from_env({{'OBJCACHE_TIERS': 'file://{tmp_path / 'store'}', "
        f"'OBJCACHE_LOCAL_DIR': '{tmp_path / 'local'}'}}))",
        "print(*(label for label, _ in torch_edits.changes()), sep='\\n')",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJCACHE_")}
    env.update(PYTHONPATH=str(torch_runs.ROOT), XDG_CACHE_HOME=str(cache))
    return [line for line in torch_runs.python_c("\n".join(program), env).splitlines() if line]


def test_an_install_after_the_program_imported_inductor_checks_the_release_s_tables(
    tmp_path: Path,
) -> None:
    """``install()`` after ``torch.compile`` (Inductor imported, its tables completed) and
    after the program removed a decomposition, made a fallback with torch's own function,
    put torch's own lowering at an op torch falls back on and edited a container of
    Inductor's: the copies taken then hold the edits, so the release's tables and data are
    read in a fresh interpreter and each edit is named as a process that installed first
    names it, except a lowering that is the fallback Inductor itself makes for its op (after
    compiles the copy holds those: not told from the program's, the same code); without an
    edit nothing is (such a process shares entries with the others); where the release
    cannot be read, the copies as found are named by what they hold (a miss elsewhere)."""
    cache = tmp_path / "cache"
    assert _late_install(tmp_path, cache, edit=True) == [
        "added:lowering:aten._nested_tensor_from_mask.default",
        "replaced:decomposition:aten.gelu.default",
        "torch_data:torch._inductor.codegen.cpp.VECTORIZABLE_DTYPES",
    ]
    assert list((cache / "objcache" / "release-tables").iterdir())  # kept for the next process
    assert _late_install(tmp_path, cache, edit=False) == []
    unread = _late_install(tmp_path, tmp_path / "other-cache", edit=True, child=False)
    assert unread and all(label.startswith("as_found:") for label in unread)
    assert "as_found:decomposition:torch._inductor.decomposition.decompositions" in unread
    assert "as_found:torch_data:torch._inductor.codegen.cpp.VECTORIZABLE_DTYPES" in unread
