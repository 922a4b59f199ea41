"""The implementations of the custom ops a graph calls are in its FX and AOTAutograd keys
(docs/torch.md, "Custom ops in the keys"), and so is the program's own Python in torch's
function namespaces: a machine with another version of a kernel library, or another
replacement of a torch function, misses, and never runs the writer's decomposition."""

from __future__ import annotations

import functools
import operator
import os
import shutil
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support import torch_runs as ts

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module", autouse=True)
def _torch_as_imported() -> None:
    """Copies of torch's tables and data taken before these tests edit them, as the install
    takes them (docs/torch.md, "Custom ops in the keys"): an edit counts against them."""
    import torch._inductor.lowering  # noqa: F401

    from objcache.integrations.torch.precompile import torch_edits

    torch_edits.remember()


KERNELS = """\
import torch

lib = torch.library.Library("objcache_test_ops", "DEF")
lib.define("scale(Tensor x) -> Tensor")


def scale(x):
    return x * {factor}


lib.impl("scale", scale, "CompositeImplicitAutograd")
"""

#: A program's own kernel for one of torch's ops (a library that patches ``aten::linear``):
#: AOTAutograd traces it for a graph that only names ``torch.nn.functional.linear``.
OVERRIDE = """
import torch

aten = torch.library.Library("aten", "IMPL")


def linear(x, w, b=None):
    return torch.matmul(x, w.t()) * 0 + 7


aten.impl("linear", linear, "CompositeImplicitAutograd")
"""

#: A program's own Python in one of torch's function namespaces: ``F.layer_norm`` stays in
#: the graph as torch's, and AOTAutograd's trace of its body calls ``torch.layer_norm``,
#: which is now the program's (what a fused-kernel library does).
TORCH_FUNCTION = """
import torch

_torchs = torch.layer_norm


def layer_norm(x, shape, weight=None, bias=None, eps=1e-5, cudnn_enable=False):
    return _torchs(x, shape, weight, bias, eps, cudnn_enable) * 2.0


torch.layer_norm = layer_norm
"""

#: Inductor told to run ``sin`` with ATen's kernel (``make_fallback``, what users do to work
#: around a lowering): the entry is a closure of torch's own, replacing the release's lowering.
FALLBACK = """
import torch
from torch._inductor.lowering import make_fallback

make_fallback(torch.ops.aten.sin.default, warn=False)
"""

PROGRAM = """\
import json
import torch
import objcache

objcache.install()
import kernels
import patches


W = torch.linspace(0.0, 1.0, 16).reshape(2, 8)


def f(x):
    y = torch.nn.functional.layer_norm(x, (8,))
    return torch.nn.functional.linear(torch.ops.objcache_test_ops.scale(y.sin()) + 1.0, W)


x = torch.linspace(-1.0, 1.0, 8)
out = torch.compile(f)(x)
from objcache.integrations.install import hooks

print("RESULT " + json.dumps({
    "same": bool(torch.allclose(out, f(x))),
    "custom_ops": hooks.stats()["custom_ops"],
    "fx_hits": torch._dynamo.utils.counters["inductor"]["fxgraph_cache_hit"],
    "aot_hits": torch._dynamo.utils.counters["aot_autograd"]["autograd_cache_hit"],
}))
"""


def run(base: Path, machine: str, factor: str, override: str = "") -> dict[str, Any]:
    path = base / machine
    path.mkdir(parents=True)
    (path / "kernels.py").write_text(KERNELS.format(factor=factor))
    (path / "patches.py").write_text(override)
    env = ts.compile_env(path, f"file://{base / 'store'}")
    env.update(OBJCACHE_PREFETCH="0", PYTHONDONTWRITEBYTECODE="1")
    return ts.run_script(path, PROGRAM, env)


@pytest.mark.compile
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_another_implementation_of_what_a_graph_calls_is_a_miss_not_the_writers_result(
    tmp_path: Path,
) -> None:
    """A machine whose kernel library is at another version, whose program registers its own
    kernel of one of torch's ops, whose program replaces a function of torch's namespaces
    that torch's own code calls, or whose program replaces one of Inductor's lowerings with
    torch's own fallback: each misses and computes eager's result; the same library and
    program are served."""
    writer = run(tmp_path, "writer", "2.0")
    assert writer["same"] and writer["custom_ops"].get("keyed_graphs", 0) >= 1, writer
    readers = {
        "same": "",  # the same library: served as before
        "other": "",  # the library at another version
        "patched": OVERRIDE,  # its own kernel of torch's linear
        # its own Python for a function of torch's namespace that torch's own code calls
        "replaced": TORCH_FUNCTION,
        # one of Inductor's lowerings replaced with torch's own fallback after the install
        "fallback": FALLBACK,
    }
    # The readers share nothing but the store the writer filled (each misses under a key of
    # its own or hits the writer's), so they run side by side.
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {
            machine: pool.submit(
                run, tmp_path, machine, "3.0" if machine == "other" else "2.0", override
            )
            for machine, override in readers.items()
        }
        results = {machine: future.result() for machine, future in futures.items()}
    assert results["same"]["same"] and results["same"]["aot_hits"] >= 1, results["same"]
    for machine in ("other", "patched", "replaced", "fallback"):
        result = results[machine]
        assert result["same"], (machine, result)
        assert result["aot_hits"] == 0 and result["fx_hits"] == 0, (machine, result)


@pytest.mark.parametrize("written", ["plainly", "with functools.wraps"])
def test_a_program_s_own_kernel_of_a_torch_op_keys_every_graph(written: str) -> None:
    """An override of one of torch's ops registered in Python is in every graph's key
    while it is registered, also where ``functools.wraps`` copied torch's ``__module__``
    onto it (the tenth review: served the writer's code, off by 2.27, on 2.15.0); torch's
    own Python registrations are not."""
    from objcache.integrations.torch.remote import custom_ops

    def kernel(x: Any, w: Any, b: Any = None) -> Any:
        return x

    if written != "plainly":
        kernel = functools.wraps(torch.nn.functional.linear)(kernel)
        assert kernel.__module__.startswith("torch")
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.sin(x) + 1)
    assert custom_ops.graph_identity(gm) == ()
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("linear", kernel, "CompositeImplicitAutograd")
        assert [name for name, _ in custom_ops.graph_identity(gm)] == ["override:aten::linear"]
    finally:
        lib._destroy()
    assert custom_ops.graph_identity(gm) == ()


def test_every_function_of_a_custom_op_s_definition_is_in_its_identity(tmp_path: Path) -> None:
    """A ``torch.library.custom_op`` library at another version with another backward (or
    setup-context, fake kernel, autocast dtype) has another identity: AOTAutograd traces
    the backward into the compiled graph, so its key must tell them apart. A helper beside
    the backward in its source file counts too."""
    import importlib.util

    from objcache.integrations.torch.precompile.op_overrides import op_identity

    source = tmp_path / "oplib.py"
    source.write_text(
        "import torch\ndef helper(g): return g * 2\ndef backward(ctx, g): return helper(g)\n"
    )
    spec = importlib.util.spec_from_file_location("objcache_test_oplib", source)
    assert spec is not None and spec.loader is not None
    oplib = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(oplib)

    @torch.library.custom_op("objcache_test_identity::double", mutates_args=())
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    name = "objcache_test_identity::double"
    seen = [op_identity(name)]
    double.register_autograd(oplib.backward)
    seen.append(op_identity(name))
    assert op_identity(name) == seen[-1]  # the same definition: the same identity
    source.write_text(source.read_text().replace("g * 2", "g * 3"))  # the helper, not backward
    seen.append(op_identity(name))
    double.register_autograd(lambda ctx, g: g * 2, setup_context=lambda ctx, inputs, out: None)
    seen.append(op_identity(name))
    double.register_fake(lambda x: torch.empty_like(x))
    seen.append(op_identity(name))
    assert len(set(seen)) == len(seen), seen


def test_a_setting_a_kernel_reads_from_its_module_is_in_its_identity(tmp_path: Path) -> None:
    """The same kernel code configured otherwise (a global read from the environment at
    import) computes something else: another identity."""
    from objcache.integrations.torch.precompile.op_overrides import torch_overrides
    from objcache.integrations.torch.remote import custom_ops

    custom_ops.apply([])  # the kernels registered from here on are recorded, as once installed
    scope: dict[str, Any] = {"torch": torch, "SCALE": 2.0}
    exec("def linear(x, w, b=None):\n    return torch.matmul(x, w.t()) * SCALE\n", scope)
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("linear", scope["linear"], "CompositeImplicitAutograd")
        first = dict(torch_overrides())["override:aten::linear"]
        scope["SCALE"] = 3.0
        lib._destroy()
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("linear", scope["linear"], "CompositeImplicitAutograd")
        second = dict(torch_overrides())["override:aten::linear"]
        assert second != first
        # read through a config module (``cfg.SCALE``)
        cfg = types.ModuleType("objcache_test_cfg")
        cfg.SCALE = 2.0  # type: ignore[attr-defined]
        scope["cfg"] = cfg
        exec("def linear(x, w, b=None):\n    return torch.matmul(x, w.t()) * cfg.SCALE\n", scope)
        seen = []
        for value in (2.0, 3.0):
            cfg.SCALE = value  # type: ignore[attr-defined]
            lib._destroy()
            lib = torch.library.Library("aten", "IMPL")
            lib.impl("linear", scope["linear"], "CompositeImplicitAutograd")
            seen.append(dict(torch_overrides())["override:aten::linear"])
        assert seen[0] != seen[1], seen
    finally:
        lib._destroy()
        custom_ops.uninstall()


def test_a_tensor_subclass_a_graph_takes_is_in_its_identity() -> None:
    """AOTAutograd runs a subclass's ``__torch_dispatch__`` while it traces: the subclass's
    code is part of what a graph taking one is keyed by; another version is another key."""
    from objcache.integrations.torch.remote import custom_ops

    def subclass(factor: float) -> type:
        class Scaled(torch.Tensor):
            @classmethod
            def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                return func(*args, **(kwargs or {})) * factor

        return Scaled

    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.sin(x) + 1)
    plain = torch.ones(2)
    assert custom_ops.graph_identity(gm, [plain]) == ()
    one, two = subclass(1.0), subclass(2.0)
    keyed = custom_ops.graph_identity(gm, [plain.as_subclass(one)])
    assert [name for name, _ in keyed] == [f"subclass:{one.__module__}.{one.__qualname__}"]
    assert keyed != custom_ops.graph_identity(gm, [plain.as_subclass(two)])
    assert keyed == custom_ops.graph_identity(gm, [plain.as_subclass(one)])


def test_a_program_function_a_subgraph_calls_is_in_its_identity() -> None:
    """A function of the program's that a subgraph calls (``allow_in_graph``'d inside a
    checkpoint's or a ``nested_compile_region``'s body): AOTAutograd traces through it,
    and torch's AOTAutograd key names it by its import path only (it refuses such a
    function at the top level, not in a subgraph). What it reads is in the identity: a
    setting read from the environment at import, another on another machine, another key."""
    from objcache.integrations.torch.remote import custom_ops

    cfg = types.ModuleType("objcache_test_subgraph_cfg")
    cfg.SCALE = 2.0  # type: ignore[attr-defined]
    scope: dict[str, Any] = {"cfg": cfg, "__name__": "objcache_test_subgraph_program"}
    exec("def opaque(x):\n    return x * cfg.SCALE\n", scope)
    body = torch.fx.Graph()
    body.output(body.call_function(scope["opaque"], (body.placeholder("x"),)))
    root = torch.nn.Module()
    root.body = torch.fx.GraphModule(torch.nn.Module(), body)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.ops.aten.sin.default, (x,)))
    graph.get_attr("body")
    gm = torch.fx.GraphModule(root, graph)
    keyed = custom_ops.graph_identity(gm)
    assert [name for name, _ in keyed] == ["callable:objcache_test_subgraph_program.opaque"]
    cfg.SCALE = 3.0  # type: ignore[attr-defined]
    assert custom_ops.graph_identity(gm) != keyed
    cfg.SCALE = 2.0  # type: ignore[attr-defined]
    assert custom_ops.graph_identity(gm) == keyed
    # torch's own functions and Python's in a subgraph name nothing
    plain = torch.fx.Graph()
    y = plain.placeholder("x")
    plain.output(plain.call_function(operator.mul, (plain.call_function(torch.sin, (y,)), 2)))
    root.body = torch.fx.GraphModule(torch.nn.Module(), plain)
    assert custom_ops.graph_identity(torch.fx.GraphModule(root, graph)) == ()


def test_a_tensor_subclass_a_subgraph_makes_is_in_its_identity() -> None:
    """A subclass constructed inside a checkpoint's body (a node of the subgraph calls the
    class): AOTAutograd runs its ``__torch_dispatch__`` there too; another version of it is
    another key, as for a subclass the graph takes."""
    from objcache.integrations.torch.remote import custom_ops

    def keyed(factor: float) -> tuple[tuple[str, str], ...]:
        class Scaled(torch.Tensor):
            @classmethod
            def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                return func(*args, **(kwargs or {})) * factor

        body = torch.fx.Graph()
        body.output(body.call_function(Scaled, (body.placeholder("x"),)))
        root = torch.nn.Module()
        root.body = torch.fx.GraphModule(torch.nn.Module(), body)
        graph = torch.fx.Graph()
        graph.output(graph.call_function(torch.ops.aten.sin.default, (graph.placeholder("x"),)))
        graph.get_attr("body")
        return custom_ops.graph_identity(torch.fx.GraphModule(root, graph))

    one = keyed(1.0)
    assert [name.split(".")[-1] for name, _ in one] == ["Scaled"]
    assert one[0][0].startswith("subclass:")
    assert one != keyed(2.0)
    assert one == keyed(1.0)


def test_the_program_s_external_matmuls_are_registered_before_a_key_is_read() -> None:
    """Code Inductor compiled with the program's ``config.external_matmul`` kernel calls it as
    ``extern_kernels.<name>``, registered only while Inductor lowers a matmul: a process
    served that code never lowered and crashed on the call (the twenty-sixth review; torch
    with one shared cache folder too). A key read registers them as lowering would."""
    from torch._inductor import config
    from torch._inductor.select_algorithm import extern_kernels

    from objcache.integrations.torch.remote import custom_ops

    def objcache_test_fast_mm(a: Any, b: Any, out: Any) -> None:
        torch.mm(a, b, out=out)

    assert not hasattr(extern_kernels, "objcache_test_fast_mm")
    custom_ops.register_external_matmuls()  # nothing set: nothing registered
    assert not hasattr(extern_kernels, "objcache_test_fast_mm")
    with config.patch(external_matmul=[objcache_test_fast_mm]):
        custom_ops.register_external_matmuls()
    assert extern_kernels.objcache_test_fast_mm is objcache_test_fast_mm


def test_the_program_s_entry_in_inductor_s_decompositions_keys_every_graph() -> None:
    """A decomposition the program put in Inductor's table runs for every graph using the
    op, which no key of torch's names: it keys every graph while it is there."""
    from torch._inductor.decomposition import decompositions, fast_random_decomps

    from objcache.integrations.torch.precompile import torch_edits
    from objcache.integrations.torch.remote import custom_ops

    torch_edits.changes()  # torch's tables copied as released, before this test edits one
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.sin(x) + 1)
    op = torch.ops.aten.gelu.default
    before = decompositions.get(op)
    try:
        decompositions[op] = lambda x, approximate="none": x * 0.5 * (1 + torch.tanh(x))
        names = [name for name, _ in custom_ops.graph_identity(gm)]
        assert names == [f"decomposition:{op}"], names
    finally:
        if before is None:
            decompositions.pop(op, None)
        else:
            decompositions[op] = before
        fast_random_decomps.cache_clear()  # torch's copy of the table, made again when asked
    assert custom_ops.graph_identity(gm) == ()


def test_an_autocast_rule_the_program_put_on_a_torch_op_keys_every_graph() -> None:
    """``torch.library.register_autocast("aten::exp", "cpu", torch.bfloat16)``: torch's helper
    makes the kernel (its code is torch's), the program chose it; AOTAutograd traces it under
    autocast, so a graph's output dtype changes where no graph names it (the twelfth review:
    served float32 where eager returns bfloat16). Keyed while registered."""
    from objcache.integrations.patching import is_marked
    from objcache.integrations.torch.remote import custom_ops

    applied = is_marked(torch.library.Library.impl)
    custom_ops.apply([])  # ``Library.impl`` recorded, as the install does
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.sin(x) + 1)
    assert custom_ops.graph_identity(gm) == ()
    kept = torch.library._keep_alive
    before = len(kept)
    try:
        # the library object torch makes for it: the dispatcher names torch's own file
        torch.library.register_autocast("aten::exp", "cpu", torch.bfloat16)
        names = [name for name, _ in custom_ops.graph_identity(gm)]
        assert names == ["override:aten::exp"], names
    finally:
        for lib in kept[before:]:
            lib._destroy()
        del kept[before:]
        torch.ops.aten.exp.default.py_kernels.pop(torch._C.DispatchKey.AutocastCPU, None)
        if not applied:
            custom_ops.uninstall()
    assert custom_ops.graph_identity(gm) == ()


def test_torch_s_own_registrations_at_a_first_call_are_not_the_program_s(tmp_path: Path) -> None:
    """``torch.func.vmap``'s first call registers torch's decompositions on aten ops from
    torch's own code, under the program's call (the code review of the autocast fix: 8 ops
    named, a key one process alone had); ``register_autocast`` the program calls is its."""
    program = [
        "import torch",
        "from objcache.integrations.torch.precompile.op_overrides import torch_overrides",
        "torch.func.vmap(torch.sin)(torch.ones(2, 3))",
        "print(*(name for name, _ in torch_overrides()), sep=',')",
        'torch.library.register_autocast("aten::exp", "cpu", torch.bfloat16)',
        "print(*(name for name, _ in torch_overrides()), sep=',')",
    ]
    out = ts.zero_code_python(tmp_path, "\n".join(program)).splitlines()
    assert out == ["", "override:aten::exp"]


def test_a_kernel_registered_before_objcache_installed_is_keyed_to_this_process() -> None:
    """A Python kernel whose registration objcache did not see (a library imported before
    the install, registering through a helper of its own) is named by nothing but where it
    was registered: its graphs get a key of this process alone, a miss elsewhere."""
    from objcache.integrations.torch.precompile import op_overrides

    lib = torch.library.Library("objcache_test_early", "DEF")
    try:
        lib.define("triple(Tensor x) -> Tensor")
        lib.impl("triple", lambda x: x * 3, "CompositeImplicitAutograd")  # not recorded
        op_overrides.op_identity("objcache_test_early::triple")
        assert "objcache_test_early::triple" in op_overrides.unidentified
    finally:
        lib._destroy()


def test_a_graph_without_custom_ops_keeps_torchs_key() -> None:
    """Only graphs that call an op outside torch's namespaces get the field."""
    from objcache.integrations.torch.remote import custom_ops

    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.sin(x) + 1)
    assert custom_ops.graph_identity(gm) == ()


def test_attention_backends_turned_off_are_in_every_graph_s_key() -> None:
    """Which kernel a graph's attention lowers to follows the backends enabled when
    AOTAutograd decomposes it: a process that turned one off keys its graphs by that (and a
    process with torch's defaults keeps torch's keys)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from objcache.integrations.torch.remote import custom_ops

    class Details:
        def __init__(self, gm: Any) -> None:
            self.gm = gm

    init = custom_ops._wrap_details_init(Details.__init__)
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.sin(x) + 1)
    plain = Details.__new__(Details)
    init(plain, gm)
    assert custom_ops.FIELD not in plain.__dict__
    with sdpa_kernel([SDPBackend.MATH]):
        math_only = Details.__new__(Details)
        init(math_only, gm)
    assert math_only.__dict__[custom_ops.FIELD] == (
        ("sdp_backends_off", "flash,mem_efficient,cudnn"),
        ("aten_switches", "overrideable_sdp_enabled=False"),  # a device extension's backend
    )


def test_torchs_global_switches_an_aten_decomposition_reads_are_in_every_graph_s_key() -> None:
    """The attention math path's reduced-precision switch (read by the C++ decomposition of
    ``scaled_dot_product_attention`` while AOTAutograd traces) and the oneDNN path (read by
    Inductor while it lowers) are in no key of torch's: a process that set one away from
    torch's default keys every graph by it; back at the default, torch's key again."""
    from objcache.integrations.torch.remote import custom_ops

    class Details:
        def __init__(self, gm: Any) -> None:
            self.gm = gm

    init = custom_ops._wrap_details_init(Details.__init__)
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.sin(x) + 1)

    def field() -> Any:
        made = Details.__new__(Details)
        init(made, gm)
        return made.__dict__.get(custom_ops.FIELD)

    assert field() is None
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
    try:
        assert field() == (("aten_switches", "math_sdp_allow_fp16_bf16_reduction=True"),)
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(False)
    with torch.backends.mkldnn.flags(enabled=False):
        assert field() == (("aten_switches", "mkldnn_enabled=False"),)
    assert field() is None


def test_a_thread_that_flushes_denormals_or_rounds_otherwise_keys_every_graph_by_it() -> None:
    """Inductor folds constants with real kernels in the compiling thread: under
    ``torch.set_flush_denormal(True)`` a denormal folds to zero (0.0 baked in where a normal
    compile bakes in 0.1), and another rounding mode folds to other bits. torch has no getter
    for either and no key names them: a thread with one on keys every graph by it; back in
    the default modes, torch's key."""
    import ctypes
    import ctypes.util
    import platform

    from objcache.integrations.torch.remote import custom_ops

    class Details:
        def __init__(self, gm: Any) -> None:
            self.gm = gm

    init = custom_ops._wrap_details_init(Details.__init__)
    gm = torch.fx.symbolic_trace(lambda x: x + torch.full((2,), 1e-39) * 1e38)

    def field() -> Any:
        made = Details.__new__(Details)
        init(made, gm)
        return made.__dict__.get(custom_ops.FIELD)

    assert field() is None
    if platform.machine() == "x86_64" and platform.system() == "Linux":
        libm = ctypes.CDLL(ctypes.util.find_library("m"))
        for mode, name in ((0x800, "up"), (0x400, "down"), (0xC00, "zero")):
            assert libm.fesetround(mode) == 0
            try:
                assert field() == (("aten_switches", f"rounding={name}"),)
            finally:
                libm.fesetround(0)  # to nearest, the default
        assert field() is None
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode torch can set")
    try:
        folded = float((torch.full((1,), 1e-39) * 1e38)[0])
        assert folded == 0.0  # what a compile in this thread would fold
        assert field() == (("aten_switches", "flush_denormal=True"),)
    finally:
        torch.set_flush_denormal(False)
    assert field() is None


def test_a_registration_from_a_package_beside_torch_is_the_program_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch's own registrations come from its package's folder; one from a package whose
    folder merely starts with the same letters (``torchvision``) is not torch's."""
    import os

    from objcache.integrations.torch.precompile import op_overrides

    home = os.path.dirname(torch.__file__)
    dumps = {
        "aten::own": f"CompositeImplicitAutograd: registered at {home}/_decomp/x.py:3 :: ()",
        "aten::beside": f"CompositeImplicitAutograd: registered at {home}vision/ops.py:3 :: ()",
    }
    monkeypatch.setattr(torch._C, "_dispatch_dump", lambda name: dumps[name])
    assert op_overrides.registered_by_torch("aten::own", "CompositeImplicitAutograd")
    assert not op_overrides.registered_by_torch("aten::beside", "CompositeImplicitAutograd")


def outer_identities(body: str, held: bool, factors: tuple[float, ...]) -> list[str]:
    """The identity of ``objcache_test_outer::outer`` (kernel ``body``, in a module of its
    own) over helper ops ``objcache_test_inner::inner`` computing ``x * factor``, each in a
    process's state of its own; ``held``: the outer module holds the op as ``OP``."""
    from objcache.integrations.torch.precompile import op_overrides
    from objcache.integrations.torch.remote import custom_ops

    custom_ops.apply([])
    seen = []
    try:
        for factor in factors:
            inner = torch.library.Library("objcache_test_inner", "DEF")
            outer = torch.library.Library("objcache_test_outer", "DEF")
            try:
                inner.define("inner(Tensor x) -> Tensor")
                helper: dict[str, Any] = {}  # the helper op's module
                exec(f"def inner(x):\n    return x * {factor}\n", helper)
                inner.impl("inner", helper["inner"], "CompositeImplicitAutograd")
                outer.define("outer(Tensor x) -> Tensor")
                public: dict[str, Any] = {"torch": torch}  # the public op's, apart
                if held:
                    public["OP"] = torch.ops.objcache_test_inner.inner.default
                exec(body, public)
                outer.impl("outer", public["outer"], "CompositeImplicitAutograd")
                seen.append(op_overrides.op_identity("objcache_test_outer::outer"))
            finally:
                inner._destroy()
                outer._destroy()
                for name in ("objcache_test_inner::inner", "objcache_test_outer::outer"):
                    op_overrides._python_kernels.pop(name, None)  # as in a new process
    finally:
        custom_ops.uninstall()
    return seen


def test_the_ops_a_kernel_calls_by_name_are_in_its_identity() -> None:
    """A library's public op built on its helper op (``torch.ops.lib.inner(x)`` inside
    ``lib::outer``'s kernel): a graph names only ``outer``, whose identity holds ``inner``'s."""
    body = "def outer(x):\n    return torch.ops.objcache_test_inner.inner(x) + 1\n"
    seen = outer_identities(body, held=False, factors=(2.0, 3.0, 2.0))
    assert seen[0] != seen[1] and seen[0] == seen[2], seen


def test_an_op_object_a_kernel_holds_joins_its_identity() -> None:
    """``OP = torch.ops.lib.inner.default`` in the kernel's module, called as ``OP(x)``: the
    held op's own identity is part of the kernel's op."""
    seen = outer_identities("def outer(x):\n    return OP(x) + 1\n", held=True, factors=(2.0, 3.0))
    assert seen[0] != seen[1], seen


def test_what_a_program_registers_around_torch_s_ops_keys_every_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Python AOTAutograd runs for torch's own ops that no graph names: an entry in
    AOTAutograd's own decomposition table, a ``py_impl`` kernel on an op object, a
    ``__torch_dispatch__`` rule (``register_torch_dispatch``). Each keys every graph while
    it is there, another function another key; gone, the graph's key is torch's again."""
    from torch._functorch import aot_autograd
    from torch._library import simple_registry

    from objcache.integrations.torch.precompile import program_registrations
    from objcache.integrations.torch.remote import custom_ops

    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.sin(x) + 1)
    monkeypatch.setattr(program_registrations, "_py_impls", [])
    custom_ops.apply([])
    op = torch.ops.aten.cos.default

    def fast(x: Any) -> Any:
        return x - x * x / 2

    def faster(x: Any) -> Any:
        return 1 - x * x / 2

    class Rules(torch.Tensor):
        pass

    libraries: list[Any] = []

    def fallback(fn: Any) -> None:
        # a key no CPU graph reaches: the registration is what is named, not its use
        libraries.append(torch.library.Library("_", "IMPL"))
        libraries[-1].fallback(lambda *a, **k: fn(*a), "PrivateUse3")

    def no_fallback() -> None:
        while libraries:
            libraries.pop()._destroy()
        program_registrations._py_impls.clear()

    try:
        for label, register, undo in (
            (
                f"decomposition:{op}",
                lambda fn: aot_autograd.aot_autograd_decompositions.__setitem__(op, fn),
                lambda: aot_autograd.aot_autograd_decompositions.pop(op, None),
            ),
            (
                "py_impl:",
                lambda fn: op.py_impl(torch._C.DispatchKey.AutogradCPU)(fn),
                lambda: (
                    op.py_kernels.pop(torch._C.DispatchKey.AutogradCPU, None),
                    program_registrations._py_impls.clear(),
                ),
            ),
            ("py_impl:fallback:_:PrivateUse3", fallback, no_fallback),
            (
                "dispatch_rule:aten::cos",
                lambda fn: simple_registry.singleton.find(
                    "aten::cos"
                ).torch_dispatch_rules._data.__setitem__(
                    Rules, lambda cls, func, types, args, kwargs: fn(*args)
                ),
                lambda: simple_registry.singleton.find("aten::cos").torch_dispatch_rules._data.pop(
                    Rules, None
                ),
            ),
        ):
            seen = []
            for fn in (fast, faster):
                undo()
                register(fn)
                keyed = dict(custom_ops.graph_identity(gm))
                assert any(name.startswith(label) for name in keyed), (label, keyed)
                seen.append(keyed)
            assert seen[0] != seen[1], label
            undo()
            assert custom_ops.graph_identity(gm) == (), label
    finally:
        no_fallback()
        aot_autograd.aot_autograd_decompositions.pop(op, None)
        op.py_kernels.pop(torch._C.DispatchKey.AutogradCPU, None)
        simple_registry.singleton.find("aten::cos").torch_dispatch_rules._data.pop(Rules, None)
        custom_ops.uninstall()


def test_a_backward_registered_for_a_library_s_op_and_a_backend_s_compiler_are_named(
    tmp_path: Path,
) -> None:
    """``torch.library.register_autograd`` of an op a ``Library`` defined (torch registers a
    kernel of its own that calls the program's backward), and the inner compile a backend
    hands ``compile_fx`` (AOTAutograd's compilers): another function, another identity."""
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
    from torch._inductor import compile_fx
    from torch._inductor.output_code import OutputCode

    from objcache.integrations.torch.precompile.op_overrides import op_identity
    from objcache.integrations.torch.remote import custom_ops

    custom_ops.apply([])
    try:
        seen = []
        for i, factor in enumerate((2.0, 3.0)):
            lib = torch.library.Library(f"objcache_bw{i}", "DEF")
            lib.define("op(Tensor x) -> Tensor")
            lib.impl("op", lambda x: x.sin(), "CPU")
            scope: dict[str, Any] = {"FACTOR": factor}
            exec("def backward(ctx, grad):\n    return grad * FACTOR\n", scope)
            torch.library.register_autograd(
                f"objcache_bw{i}::op", scope["backward"], setup_context=None, lib=lib
            )
            seen.append(op_identity(f"objcache_bw{i}::op").split(":")[-1])
            lib._destroy()
        # the ops differ by name too: compare what each names beyond its name
        assert seen[0] != seen[1]

        def compilers(inner: Any) -> Any:
            wrapped = functools.partial(compile_fx.compile_fx_inner, inner_compile=inner)
            return types.SimpleNamespace(
                fw_compiler=SerializableAOTDispatchCompiler(OutputCode, wrapped),
                decompositions={},
            )

        def one_pass(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
            return compile_fx.compile_fx_inner(gm, example_inputs, **kwargs)

        def another_pass(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
            return compile_fx.compile_fx_inner(gm, list(example_inputs), **kwargs)

        first = custom_ops.compilers_identity(compilers(one_pass))
        assert [name for name, _ in first] == ["compiler:fw_compiler"]
        assert first != custom_ops.compilers_identity(compilers(another_pass))
        # torch 2.14 and later hand the compilers to aot_module_simplified beside the config:
        # read from that frame of torch's
        scope: dict[str, Any] = {"__name__": "torch._functorch.objcache_test", "ops": custom_ops}
        exec(
            "def aot_module_simplified(fw_compiler):\n"
            "    return ops.compilers_identity(object())\n",
            scope,
        )
        beside = scope["aot_module_simplified"](compilers(one_pass).fw_compiler)
        assert beside == first
        inductor_s = types.SimpleNamespace(
            fw_compiler=SerializableAOTDispatchCompiler(OutputCode, compile_fx.compile_fx_inner)
        )
        assert custom_ops.compilers_identity(inductor_s) == ()
    finally:
        custom_ops.uninstall()


def test_a_custom_pass_set_in_torch_s_compiler_settings_is_named_by_what_it_runs() -> None:
    """``config.post_grad_custom_post_pass = MyPass()``: torch keys the pass by the uuid it
    returns; a pass whose uuid stays while what it does changes (a setting it reads) is
    another key here; without it, the graph's key is torch's again."""
    from torch._inductor import config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    from objcache.integrations.torch.remote import custom_ops

    def make(scale: float) -> Any:
        class Rewrite(CustomGraphPass):
            def __call__(self, graph: Any) -> None:
                self.scale = scale

            def uuid(self) -> Any:
                return "always-the-same"

        Rewrite.__module__ = "objcache_test_passes"  # a module of the program's
        return Rewrite()

    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.sin(x) + 1)
    seen = []
    for scale in (2.0, 3.0):
        with config.patch(post_grad_custom_post_pass=make(scale)):
            keyed = dict(custom_ops.graph_identity(gm))
        assert list(keyed) == ["config:torch._inductor.config.post_grad_custom_post_pass"]
        seen.append(keyed)
    assert seen[0] != seen[1]
    assert custom_ops.graph_identity(gm) == ()


def test_ops_by_computed_name_kernels_the_library_object_holds_and_torch_s_switches() -> None:
    """An op a kernel calls by a string (``getattr(torch.ops.lib, "inner")``) joins its
    identity; a kernel put in through the C++ library object (``lib.m.impl``), which no
    ``Library.impl`` saw, keys to this process alone; a graph calling the program's ops is
    keyed by torch's process-wide switches (``torch.backends.mkldnn.enabled``)."""
    from objcache.integrations.torch.precompile import op_overrides, traced_code
    from objcache.integrations.torch.precompile.op_overrides import op_identity
    from objcache.integrations.torch.remote import custom_ops

    custom_ops.apply([])
    libraries = [torch.library.Library(f"objcache_sw{i}", "DEF") for i in range(2)]
    try:
        inner, outer = libraries
        inner.define("inner(Tensor x) -> Tensor")
        outer.define("outer(Tensor x) -> Tensor")
        scope: dict[str, Any] = {"torch": torch, "FACTOR": 2.0}
        exec("def inner(x):\n    return x * FACTOR\n", scope)
        exec('def outer(x):\n    return getattr(torch.ops.objcache_sw0, "inner")(x)\n', scope)
        inner.impl("inner", scope["inner"], "CompositeImplicitAutograd")
        outer.impl("outer", scope["outer"], "CompositeImplicitAutograd")
        first = op_identity("objcache_sw1::outer")
        scope["FACTOR"] = 3.0
        assert op_identity("objcache_sw1::outer") != first

        inner.m.impl("inner", "CPU", lambda x: x * 4, False)
        assert traced_code.UNIDENTIFIED in "".join(
            op_overrides._own_identity("objcache_sw0::inner")
        )

        class Details:
            def __init__(self, gm: Any, *args: Any) -> None:
                pass

        custom_ops.apply([Details])
        gm = torch.fx.symbolic_trace(lambda x: torch.ops.objcache_sw1.outer(x) + 1)
        flags = torch.backends.mkldnn.enabled
        keyed = dict(Details(gm, []).__dict__[custom_ops.FIELD])
        try:
            torch.backends.mkldnn.enabled = not flags
            switched = dict(Details(gm, []).__dict__[custom_ops.FIELD])
        finally:
            torch.backends.mkldnn.enabled = flags
        assert keyed["flags:torch"] != switched["flags:torch"]
        plain = torch.fx.symbolic_trace(lambda x: torch.ops.aten.sin(x) + 1)
        assert custom_ops.FIELD not in Details(plain, []).__dict__  # torch's key, untouched
    finally:
        for library in libraries:
            library._destroy()
        custom_ops.uninstall()


def test_where_a_cpu_gemm_template_can_be_chosen_the_cache_sizes_and_threads_are_in_the_key() -> (
    None
):
    """Inductor's C++ GEMM templates (max-autotune with the CPP backend) write the per-core
    cache sizes' and the thread count's blocking into the kernel source the entry carries:
    keyed there; elsewhere torch's key."""
    from torch._inductor import config as inductor_config

    from objcache.integrations.torch.remote import custom_ops

    class Details:
        def __init__(self, gm: Any) -> None:
            self.gm = gm

    init = custom_ops._wrap_details_init(Details.__init__)
    gm = torch.fx.symbolic_trace(lambda a, b: torch.bmm(a, b) * 1.5)

    def field() -> Any:
        made = Details.__new__(Details)
        init(made, gm)
        return made.__dict__.get(custom_ops.FIELD)

    caps = torch.cpu.get_capabilities()
    geometry = (
        f"l1d={caps.get('l1d_cache_size')},l2={caps.get('l2_cache_size')},"
        f"threads={torch.get_num_threads()}"
    )
    assert field() is None
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN,CPP"):
        assert field() == (("cpu_gemm", geometry),)
    with inductor_config.patch(max_autotune_gemm=True, max_autotune_gemm_backends="CPP"):
        assert field() == (("cpu_gemm", geometry),)
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN,TRITON"):
        assert field() is None


def _dynamo_graph(fn: Any, *inputs: torch.Tensor) -> torch.fx.GraphModule:
    """The graph Dynamo makes of ``fn`` (its nodes hold their example values)."""
    graphs: list[torch.fx.GraphModule] = []

    def capture(gm: torch.fx.GraphModule, example: object) -> object:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=capture)(*inputs)
    (gm,) = graphs
    return gm


def _doubling_op(name: str) -> Any:
    """A ``torch.library.custom_op`` computing ``x * 2``, with its fake kernel."""

    @torch.library.custom_op(name, mutates_args=())
    def doubled(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @doubled.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    return doubled


def test_what_a_kernel_aotautograd_runs_traces_to_is_in_its_identity() -> None:
    """An op whose ``CompositeImplicitAutograd`` kernel AOTAutograd runs while it traces:
    what that kernel traces to here is in the graph's identity, whatever it read (a C++
    kernel's environment variable, a global its setter changed, a library it links at
    another version: state no key names); an op AOTAutograd calls as it is, whatever its
    kernel, is not traced."""
    from objcache.integrations.torch.remote import custom_ops

    setting = {"scale": 2.0}  # stands for state only the kernel's own code reads
    lib = torch.library.Library("objcache_traced_test", "DEF")
    try:
        lib.define("scaled(Tensor x) -> Tensor")
        lib.impl("scaled", lambda x: torch.sin(x) * setting["scale"], "CompositeImplicitAutograd")
        lib.define("opaque(Tensor x) -> Tensor")
        lib.impl("opaque", lambda x: x * setting["scale"], "CPU")
        lib.impl("opaque", lambda x: torch.empty_like(x), "Meta")

        def fn(x: torch.Tensor) -> torch.Tensor:
            scaled = torch.ops.objcache_traced_test.scaled(x)
            return torch.ops.objcache_traced_test.opaque(scaled) + 1

        gm = _dynamo_graph(fn, torch.ones(3))
        traced = custom_ops._traced_ops(gm)
        assert [name for name, _ in traced] == ["traced:objcache_traced_test::scaled"]
        setting["scale"] = 3.0
        assert custom_ops._traced_ops(gm) != traced
        setting["scale"] = 2.0
        assert custom_ops._traced_ops(gm) == traced
    finally:
        torch._dynamo.reset()
        lib._destroy()


def test_a_custom_op_without_a_backward_is_traced_by_its_forward() -> None:
    """``torch.library.custom_op`` registers an ``Autograd`` kernel that fails only when a
    gradient is asked: a call whose input requires grad is keyed by its forward's trace, the
    same in every process, never an unreadable key."""
    from objcache.integrations.torch.remote import custom_ops

    no_backward = _doubling_op("objcache_traced_test::no_backward")
    try:
        x = torch.ones(3, requires_grad=True)
        gm = _dynamo_graph(lambda x: no_backward(x).sum(), x)
        traced = custom_ops._traced_ops(gm)
        assert [name for name, _ in traced] == ["traced:objcache_traced_test::no_backward"]
        assert custom_ops._traced_ops(gm) == traced
    finally:
        torch._dynamo.reset()


def test_calls_alike_are_traced_once_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph calling a traced op in every layer traces it once for each kind of call
    (sizes, strides, dtype, grad), not once a layer: the key costs what its calls differ by."""
    from objcache.integrations.torch.remote import custom_ops

    lib = torch.library.Library("objcache_traced_test_n", "DEF")
    try:
        lib.define("scaled(Tensor x) -> Tensor")
        lib.impl("scaled", lambda x: torch.sin(x) * 2.0, "CompositeImplicitAutograd")

        def layers(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            for _ in range(4):
                x = torch.ops.objcache_traced_test_n.scaled(x)
            return x.sum() + torch.ops.objcache_traced_test_n.scaled(y).sum()

        gm = _dynamo_graph(layers, torch.ones(3), torch.ones(2, 5))
        traces: list[object] = []
        real = custom_ops._trace_digest

        def counted(node: object) -> str:
            traces.append(node)
            return real(node)

        monkeypatch.setattr(custom_ops, "_trace_digest", counted)
        (item,) = custom_ops._traced_ops(gm)
        assert len(traces) == 2  # (3,) four times, (2, 5) once
        assert len(item[1].split("|")) == 2  # one code, the sizes it makes at each
    finally:
        torch._dynamo.reset()
        lib._destroy()


def test_a_traced_kernel_s_size_tests_never_reach_the_compile_s_guards() -> None:
    """The op is traced in a shape environment of its own: a backward's fast path on a size
    (``if g.shape[0] == 8``), run by the key's trace where the graph never differentiates
    the call, guards nothing of the compile (a dim the program marked dynamic stays so)."""
    from objcache.integrations.torch.remote import custom_ops

    fast_path = _doubling_op("objcache_traced_test::fast_path")

    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
        return g * 2 if g.shape[0] == 8 else g + g

    fast_path.register_autograd(backward)
    keyed: list[tuple[tuple[str, str], ...]] = []

    def keying(gm: torch.fx.GraphModule, inputs: object) -> object:
        keyed.append(custom_ops._traced_ops(gm))  # as the AOTAutograd key is read: mid-compile
        return gm.forward

    def fn(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return fast_path(x) + 1

    torch._dynamo.reset()
    try:
        x = torch.ones(8, requires_grad=True)
        torch._dynamo.mark_dynamic(x, 0)
        assert torch.equal(torch.compile(fn, backend=keying)(x), fn(x))
        assert [name for name, _ in keyed[0]] == ["traced:objcache_traced_test::fast_path"]
    finally:
        torch._dynamo.reset()


def test_a_kernel_that_draws_while_it_traces_draws_nothing_more_for_the_key() -> None:
    """A kernel drawing from Python's random numbers as it traces: the key's trace leaves the
    program's next draws as they would be without it."""
    import random

    from objcache.integrations.torch.remote import custom_ops

    lib = torch.library.Library("objcache_traced_test_r", "DEF")
    try:
        lib.define("jitter(Tensor x) -> Tensor")
        lib.impl("jitter", lambda x: x * (1.0 + 0.0 * random.random()), "CompositeImplicitAutograd")
        gm = _dynamo_graph(lambda x: torch.ops.objcache_traced_test_r.jitter(x), torch.ones(3))
        random.seed(7)
        expected = random.random()
        random.seed(7)
        assert [name for name, _ in custom_ops._traced_ops(gm)] == [
            "traced:objcache_traced_test_r::jitter"
        ]
        assert random.random() == expected
    finally:
        torch._dynamo.reset()
        lib._destroy()


def _usable_cores() -> int:
    """The CPUs this process may run on: a cpuset gives two containers the same
    ``os.cpu_count()`` and another affinity."""
    return len(os.sched_getaffinity(0))


def _chunked_linear(x: torch.Tensor, w: torch.Tensor, b: Any = None) -> torch.Tensor:
    """``aten::linear`` summed over as many chunks of the inner size as there are usable
    CPUs, each rounded to a quarter (a kernel library's blocking chosen by the machine)."""
    step = -(-w.shape[1] // _usable_cores())
    parts = [
        torch.round((x[..., i : i + step] @ w[:, i : i + step].t()) * 4) / 4
        for i in range(0, w.shape[1], step)
    ]
    out = functools.reduce(torch.add, parts)
    return out if b is None else out + b


def test_what_the_program_s_replacement_of_a_torch_kernel_computes_here_keys_the_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel of torch's own op the program replaced (``aten::linear``) that asks the
    machine how many CPUs it may use: its source and the values it reads are the same on
    every machine, what it computes is not (the forty-fifth review: served another
    machine's code, off by 0.25). Where the program replaced anything of torch's, the
    graph's trace here (Inductor's decompositions, the program's code run) keys it."""
    from objcache.integrations.torch.remote import custom_ops

    gm = _dynamo_graph(
        lambda x, w: torch.nn.functional.linear(x, w), torch.ones(2, 8), torch.ones(3, 8)
    )
    assert custom_ops.graph_trace(gm) == ()  # nothing replaced
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("linear", _chunked_linear, "CompositeImplicitAutograd")
        keys = []
        for cores in ({0, 1}, {0}, {0, 1}):
            monkeypatch.setattr(os, "sched_getaffinity", lambda pid, c=cores: c)
            keys.append(dict(custom_ops.graph_identity(gm) + custom_ops.graph_trace(gm)))
        assert keys[0]["traced:graph"] != keys[1]["traced:graph"]
        assert keys[0] == keys[2]  # the same machine: the same key
        assert {k: v for k, v in keys[0].items() if k != "traced:graph"} == {
            k: v for k, v in keys[1].items() if k != "traced:graph"
        }  # what named it before: alike on both machines
    finally:
        lib._destroy()
        torch._dynamo.reset()


def test_what_a_fake_kernel_makes_of_the_sizes_keys_the_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A custom op whose kernels pad to a multiple of the usable CPUs: the traced code is the
    same text on every machine, the sizes it makes are not (the forty-fifth review: the served
    code failed its size check on another machine). The sizes of the trace's values key it."""
    from objcache.integrations.torch.remote import custom_ops

    @torch.library.custom_op("objcache_traced_test::padded", mutates_args=())
    def padded(x: torch.Tensor) -> torch.Tensor:
        m = 4 * _usable_cores()
        return torch.nn.functional.pad(x, (0, -(-x.shape[0] // m) * m - x.shape[0]))

    @padded.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        m = 4 * _usable_cores()
        return x.new_empty(-(-x.shape[0] // m) * m)

    try:
        gm = _dynamo_graph(lambda x: padded(x).cumsum(0), torch.arange(10.0))
        traced = []
        for cores in ({0, 1}, {0}):
            monkeypatch.setattr(os, "sched_getaffinity", lambda pid, c=cores: c)
            traced.append(custom_ops._traced_ops(gm))
        assert [n for n, _ in traced[0]] == ["traced:objcache_traced_test::padded"]
        assert traced[0] != traced[1]
    finally:
        torch._dynamo.reset()
