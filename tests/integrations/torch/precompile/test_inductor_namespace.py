"""What the program put into Inductor's own namespace (docs/torch.md, "Custom ops in the
keys"): a method of its code generator replaced, an entry in one of its registries, a
config object holding the program's function in the closure of one of torch's lowerings.
Each is named, so another implementation is another key; torch's own are not."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest

from objcache.integrations.torch.precompile import inductor_namespace, program_registrations
from objcache.integrations.torch.remote import custom_ops
from tests.support import torch_runs

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module", autouse=True)
def _inductor_loaded() -> None:
    """Inductor's modules as a compile leaves them (its code generators are imported)."""
    import torch._inductor.codegen.cpp
    import torch._inductor.decomposition
    import torch._inductor.lowering  # noqa: F401


def _fresh() -> tuple[tuple[str, str], ...]:
    inductor_namespace._read_memo.clear()  # another frame compile
    return inductor_namespace.overrides()


def test_torch_s_own_namespace_names_nothing() -> None:
    """With no program change, nothing: every graph keeps torch's key."""
    assert _fresh() == ()


def test_a_replaced_method_of_the_code_generator_is_named_by_its_code() -> None:
    """``CppOverrides.exp = fast_exp`` (a "fast math" library): the generated C++ differs, no
    graph's ops or torch's keys show it. Named while in place, by what it computes."""
    from torch._inductor.codegen.cpp import CppOverrides

    original = CppOverrides.__dict__["exp"]
    scale = {"value": "0.5"}

    def fast_exp(x: Any) -> str:
        return f"(1 + {x} + {x}*{x}*{scale['value']})"

    try:
        CppOverrides.exp = staticmethod(fast_exp)  # type: ignore[method-assign,assignment]
        named = dict(_fresh())
        label = "inductor:torch._inductor.codegen.cpp.CppOverrides.exp"
        assert list(named) == [label]
        scale["value"] = "0.25"  # what the function reads changed: another identity
        assert dict(_fresh())[label] != named[label]
        # in every graph's key, a graph of torch's ops alone included
        gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.exp(x) + 1)
        assert label in dict(custom_ops.graph_identity(gm))
    finally:
        CppOverrides.exp = original  # type: ignore[method-assign]
    assert _fresh() == ()


def test_an_entry_in_one_of_inductor_s_registries_is_named() -> None:
    """``register_noop_decomp`` and the like keep the program's function in a module-level
    dict of Inductor's: named by where it sits and what it computes."""
    from torch._inductor.fx_passes import post_grad

    registry = post_grad.noop_registry
    op = torch.ops.aten.mul.Tensor

    def never_a_noop(x: Any, y: Any) -> bool:
        return os.environ.get("NOOP_BENCH") == "1"

    had = op in registry
    before = registry.get(op)
    try:
        registry[op] = never_a_noop
        named = dict(_fresh())
        assert len(named) == 1
        (label,) = named
        assert label.startswith("inductor:torch._inductor.fx_passes.post_grad.noop_registry[")
    finally:
        if had:
            registry[op] = before
        else:
            registry.pop(op, None)
    assert _fresh() == ()


def test_torch_s_object_holding_the_program_s_function_is_named_with_its_settings() -> None:
    """A registry item that is one of torch's objects (a backend's ``DeviceCodegen``, an
    autotuning config) holding the program's function: followed to it."""
    from torch._inductor.fx_passes import post_grad

    class Holder:  # stands for one of torch's config objects
        __module__ = "torch._inductor.kernel.custom_op"

        def __init__(self, fn: Any, factor: float) -> None:
            self.decomposition = fn
            self.factor = factor

    def decomposition(x: Any) -> Any:
        return x * 2

    registry = post_grad.noop_registry
    key = "objcache-test-holder"
    try:
        registry[key] = Holder(decomposition, 2.0)  # type: ignore[index]
        named = dict(_fresh())
        assert list(named) == [
            "inductor:torch._inductor.fx_passes.post_grad.noop_registry"
            "[objcache-test-holder].decomposition"
        ]
    finally:
        registry.pop(key, None)  # type: ignore[call-overload]
    assert _fresh() == ()


def test_a_lowering_closing_over_config_objects_names_their_functions_and_settings() -> None:
    """``register_custom_op_autotuning`` puts torch's own wrapper in the lowering table, its
    closure holding a list of config objects with the program's decomposition and
    parameters: the table entry is named by them (another factor: another identity)."""

    class Config:  # stands for torch's CustomOpConfig
        __module__ = "torch._inductor.kernel.custom_op"

        def __init__(self, fn: Any, **params: Any) -> None:
            self.decomposition = fn
            self.params = params

    def decomposition(x: Any, factor: float) -> Any:
        return x * factor

    def wrapper_of(configs: list[Any]) -> Any:
        def lowering(*args: Any) -> Any:
            return configs

        lowering.__code__ = lowering.__code__.replace(
            co_filename=os.path.join(program_registrations.torch_home(), "_inductor", "x.py")
        )
        return lowering

    two = program_registrations.program_functions(wrapper_of([Config(decomposition, factor=2)]))
    three = program_registrations.program_functions(wrapper_of([Config(decomposition, factor=3)]))
    assert len(two) == len(three) == 1
    assert program_registrations.identity(two[0]) != program_registrations.identity(three[0])
    assert program_registrations.program_functions(wrapper_of([1, 2])) == []


def test_a_cached_method_and_a_generated_one_of_torch_s_are_torch_s() -> None:
    """torch's ``functools.cache`` methods and the methods it generates with ``exec`` (its
    ops handlers') are not mistaken for the program's; a method generated under another
    name than its slot's is."""
    fn = functools.lru_cache(torch.nn.functional.relu)
    assert not inductor_namespace._programs_code(fn, "relu")
    namespace: dict[str, Any] = {}
    exec("def add(self, a, b):\n    return a + b\n", namespace)
    assert not inductor_namespace._programs_code(namespace["add"], "add")
    assert inductor_namespace._programs_code(namespace["add"], "exp")


@pytest.mark.parametrize("written", ["plainly", "with functools.wraps"])
def test_a_torch_function_replaced_with_the_program_s_is_named(written: str) -> None:
    """``torch.layer_norm = fused`` (a kernel library): ``F.layer_norm`` and ``nn.LayerNorm``
    stay in the graph and AOTAutograd runs the program's function while it traces them, so
    no graph or key of torch's shows it (found by the eighth review: served the writer's
    result, off by 2.27, both ways). Named in every graph's key while in place, also where
    ``functools.wraps`` copied torch's ``__module__`` onto it (the ninth review)."""
    original = torch.layer_norm
    eps = {"value": 1e-1}

    def fused_layer_norm(x: Any, shape: Any, w: Any = None, b: Any = None, e: float = 0) -> Any:
        return original(x, shape, w, b, eps["value"])

    replacement = fused_layer_norm
    if written != "plainly":
        replacement = functools.wraps(original)(fused_layer_norm)
        assert replacement.__module__ == "torch"
    try:
        torch.layer_norm = replacement
        named = dict(_fresh())
        label = "torch_function:torch.layer_norm"
        assert list(named) == [label]
        eps["value"] = 1e-3  # what it reads changed: another identity
        assert dict(_fresh())[label] != named[label]
        gm = torch.fx.symbolic_trace(lambda x: torch.nn.functional.layer_norm(x, (4,)))
        assert label in dict(custom_ops.graph_identity(gm))
    finally:
        torch.layer_norm = original
    assert _fresh() == ()


def test_a_function_of_a_torch_module_a_namespace_holds_is_named() -> None:
    """``F.mse_loss`` calls ``_Reduction.get_enum``: a function the program puts into
    ``torch.nn._reduction`` (a module ``torch.nn.functional`` holds) runs while AOTAutograd
    traces the graph's ``F.mse_loss`` (the eleventh review: served the writer's code, off by
    602, both ways). Named in every graph's key while in place."""
    import torch.nn._reduction as reduction

    original = reduction.get_enum

    def get_enum(name: str) -> int:
        return 2 if name == "mean" else original(name)

    try:
        reduction.get_enum = get_enum
        label = "torch_function:torch.nn._reduction.get_enum"
        assert list(dict(_fresh())) == [label]
        gm = torch.fx.symbolic_trace(lambda x: torch.nn.functional.mse_loss(x, x))
        assert label in dict(custom_ops.graph_identity(gm))
    finally:
        reduction.get_enum = original
    assert _fresh() == ()


def test_a_helper_of_aotautograd_s_partitioner_the_program_replaced_is_named() -> None:
    """AOTAutograd's partitioner looks its helpers up as module globals at every call: a
    program's ``get_default_op_list`` (nothing recomputed in the backward) decides which
    activations are saved, so the compiled forward and backward (the twenty-fifth review,
    bfloat16: served the writer's code, torch with one cache folder too). Named in every
    graph's key while in place; torch's own package and the code generator torch ships
    beside it (``torchgen``) are not the program's."""
    import torch._functorch.partitioners as partitioners

    original = partitioners.get_default_op_list

    def never_recompute() -> Any:
        ops = original()
        ops.recomputable_ops = set()
        return ops

    assert _fresh() == ()
    try:
        partitioners.get_default_op_list = never_recompute
        label = "torch_function:torch._functorch.partitioners.get_default_op_list"
        assert list(dict(_fresh())) == [label]
        gm = torch.fx.symbolic_trace(lambda x: torch.sin(x))
        assert label in dict(custom_ops.graph_identity(gm))
    finally:
        partitioners.get_default_op_list = original
    assert _fresh() == ()


def test_a_method_pointed_at_another_of_torch_s_is_named_and_a_wrapper_of_torch_s_is_not() -> None:
    """``CppOverrides.sigmoid = CppOverrides.tanh``: torch's own code, so no reading of the
    program's finds it; it differs from the copy of the class taken as its module was
    imported (the eighth review: a new machine without it was served ``tanh``'s code, off
    by 1.09). Deleted, it is named too; Dynamo's wrapper of ``torch.jit.trace``, which every
    first compile puts in place of torch's own, is not."""
    from torch._inductor.codegen.cpp import CppOverrides

    inductor_namespace.remember_release()
    released = vars(CppOverrides)["sigmoid"]
    label = "inductor:torch._inductor.codegen.cpp.CppOverrides.sigmoid"
    try:
        CppOverrides.sigmoid = CppOverrides.tanh
        found = dict(_fresh())
        assert list(found) == [label] and "tanh" in found[label] and "0x" not in found[label]
        del CppOverrides.sigmoid
        assert dict(_fresh()) == {label: "removed"}
    finally:
        CppOverrides.sigmoid = released
    assert _fresh() == ()
    trace, disable = torch.jit.trace, torch._dynamo.disable
    copied = inductor_namespace._release.pop("torch.jit", None)
    try:
        torch.jit.trace = disable(trace)  # Dynamo's, in place before the copy
        inductor_namespace.remember_release()
        torch.jit.trace = disable(torch.jit.trace)  # and made again after it
        assert _fresh() == ()
    finally:
        torch.jit.trace = trace
        if copied is not None:
            inductor_namespace._release["torch.jit"] = copied


def test_a_copy_taken_while_the_program_s_function_is_in_place_names_nothing_once_undone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An explicit install copies the namespaces imported already, maybe while a test's
    ``monkeypatch`` holds its own function in one (the project's CI: a spy in place of
    ``RedisRemoteCacheBackend.__init__`` as ``install()`` ran, then every later graph of
    that worker was keyed on torch's own put back). The program's function is no copy of
    the release's: named while in place, nothing once undone."""
    from torch._inductor import remote_cache

    where = "torch._inductor.remote_cache.RedisRemoteCacheBackend"
    copied = inductor_namespace._release.pop(where, None)
    try:
        with monkeypatch.context() as patched:

            def spy(self: object, cache_id: str) -> None:
                raise RuntimeError(cache_id)

            patched.setattr(remote_cache.RedisRemoteCacheBackend, "__init__", spy)
            inductor_namespace.remember_release()
            assert [label for label, _ in _fresh()] == [f"inductor:{where}.__init__"]
        assert _fresh() == ()
    finally:
        if copied is not None:
            inductor_namespace._release[where] = copied


def test_the_zero_code_path_copies_each_inductor_module_as_it_is_imported(
    tmp_path: Path,
) -> None:
    """A program that imports a code generator and re-points one of its methods before any
    compile is named: the copy was taken as the module's import ended."""
    code = (
        "from torch._inductor.codegen.cpp import CppOverrides\n"
        "CppOverrides.sigmoid = CppOverrides.tanh\n"
        "from objcache.integrations.torch.precompile import inductor_namespace\n"
        "print(*(label for label, _ in inductor_namespace.overrides()))\n"
    )
    out = torch_runs.zero_code_python(tmp_path, code).split()
    assert out == ["inductor:torch._inductor.codegen.cpp.CppOverrides.sigmoid"]


def _explicit_install_python(tmp_path: Path, code: str) -> list[str]:
    """``code``'s output lines in a fresh process, objcache off until the code's own
    ``install()`` (no zero-code path)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJCACHE_")}
    env.update(PYTHONPATH=str(torch_runs.ROOT), OBJCACHE_LOCAL_DIR=str(tmp_path / "local"))
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    return torch_runs.python_c(code, env).splitlines()


def test_a_method_replaced_before_an_explicit_install_is_named_at_the_first_reading(
    tmp_path: Path,
) -> None:
    """The install's copy of each namespace is scanned once, and that scan is the first
    reading's while the namespace holds what it held then: a code generator's method the
    program replaced before ``install()`` is named by it, and nothing once torch's is back."""
    code = (
        "from torch._inductor.codegen.cpp import CppOverrides\n"
        "released = CppOverrides.__dict__['exp']\n"
        "CppOverrides.exp = staticmethod(lambda x: f'(1 + {x})')\n"
        "import objcache\n"
        "objcache.install()\n"
        "from objcache.integrations.torch.precompile import inductor_namespace\n"
        "print(*(label for label, _ in inductor_namespace.overrides()), sep=',')\n"
        "CppOverrides.exp = released\n"
        "print(*(label for label, _ in inductor_namespace.overrides()), sep=',')\n"
    )
    out = _explicit_install_python(tmp_path, code)
    assert out == ["inductor:torch._inductor.codegen.cpp.CppOverrides.exp", ""]


def test_a_method_deleted_and_its_function_kept_under_another_name_is_named(
    tmp_path: Path,
) -> None:
    """The copy's scan is reused only while the namespace holds the same names for the same
    identities: the last method of a code generator deleted and its function put back under
    another name leaves the values as they were, in order, but the method is gone (a graph
    compiles to other code): named as removed."""
    code = (
        "from torch._inductor.codegen.cpp import CppOverrides\n"
        "import objcache\n"
        "objcache.install()\n"
        "from objcache.integrations.torch.precompile import inductor_namespace\n"
        "print(*(label for label, _ in inductor_namespace.overrides()), sep=',')\n"
        "last, value = list(vars(CppOverrides).items())[-1]\n"
        "delattr(CppOverrides, last)\n"
        "setattr(CppOverrides, 'objcache_moved', value)\n"
        "print(last, *(label for label, _ in inductor_namespace.overrides()), sep=',')\n"
    )
    before, after = _explicit_install_python(tmp_path, code)
    assert before == ""
    last, *named = after.split(",")
    assert named == [f"inductor:torch._inductor.codegen.cpp.CppOverrides.{last}"]


def test_a_registry_the_program_put_in_place_of_inductor_s_is_named() -> None:
    """``post_grad.noop_registry = {**post_grad.noop_registry, op: fn}``: the module global
    re-bound to the program's own dict (nothing imported, the module's globals as many as
    before); Inductor reads the global at every compile: the new dict is read, not the one
    found when the module was first read."""
    from torch._inductor.fx_passes import post_grad

    def never_a_noop(x: Any, y: Any) -> bool:
        return os.environ.get("NOOP_BENCH") == "1"

    assert _fresh() == ()  # the module's layout found, as a first compile finds it
    released = post_grad.noop_registry
    try:
        post_grad.noop_registry = {**released, torch.ops.aten.mul.Tensor: never_a_noop}
        named = list(dict(_fresh()))
        assert len(named) == 1 and named[0].startswith(
            "inductor:torch._inductor.fx_passes.post_grad.noop_registry["
        ), named
    finally:
        post_grad.noop_registry = released
    assert _fresh() == ()


def test_a_module_the_program_put_in_place_of_torch_s_is_named_by_its_code() -> None:
    """``F._Reduction = its_module``: ``F.mse_loss`` calls ``_Reduction.get_enum`` at call
    time, so the program's module decides the traced graph; named in place of torch's, by the
    program's code in it as it is at each reading (a function of it replaced later is
    another identity)."""
    import types

    import torch.nn.functional as F

    inductor_namespace.remember_release()
    released = F._Reduction
    theirs = types.ModuleType("objcache_test_reduction")
    scope: dict[str, Any] = {"__name__": theirs.__name__}
    exec("def get_enum(name):\n    return 2\n", scope)
    exec("def get_enum(name):\n    return 1\n", (other := {"__name__": theirs.__name__}))
    theirs.get_enum = scope["get_enum"]  # type: ignore[attr-defined]
    theirs.legacy_get_string = released.legacy_get_string  # type: ignore[attr-defined]
    try:
        F._Reduction = theirs  # type: ignore[assignment]
        named = dict(_fresh())
        label = "torch_function:torch.nn.functional._Reduction"
        assert list(named) == [label], named
        theirs.get_enum = other["get_enum"]  # type: ignore[attr-defined]
        assert dict(_fresh())[label] != named[label]
    finally:
        F._Reduction = released  # type: ignore[assignment]
    assert _fresh() == ()


def test_a_printer_pointed_at_another_of_torch_s_is_named() -> None:
    """``wrapper.pexpr = triton.texpr``: both are ``PythonPrinter.doprint``, one function bound
    to two printers, and the wrapper's code generator would print Triton's expressions; and
    ``cpp_utils.cexpr = triton.texpr``, another function. A bound method is the release's
    only while it is the same function bound to the same object."""
    import torch._inductor.codegen.triton as triton
    from torch._inductor.codegen import cpp_utils, wrapper

    inductor_namespace.remember_release()
    assert wrapper.pexpr.__func__ is triton.texpr.__func__
    for module, attr in ((wrapper, "pexpr"), (cpp_utils, "cexpr")):
        released = getattr(module, attr)
        label = f"inductor:{module.__name__}.{attr}"
        try:
            setattr(module, attr, triton.texpr)
            assert list(dict(_fresh())) == [label]
            setattr(module, attr, released.__func__.__get__(released.__self__))  # the same
            assert _fresh() == ()
        finally:
            setattr(module, attr, released)
    assert _fresh() == ()
