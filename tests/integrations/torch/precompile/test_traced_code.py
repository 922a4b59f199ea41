"""What names the program's Python a compile runs while it traces (docs/torch.md, "Custom
ops in the keys"): each fact a kernel's result depends on changes its identity, or names it
by this process alone; what never decides a result (a logger's state) leaves it alone."""

from __future__ import annotations

import functools
import logging
import os
import types
from typing import Any

import pytest

from objcache.integrations.torch.precompile import traced_code

torch = pytest.importorskip("torch")


def kernel_reading(source: str, **scope: Any) -> Any:
    """A kernel defined in a module of its own (``source`` is its body's one line)."""
    namespace: dict[str, Any] = {"torch": torch, "os": os, **scope}
    exec(f"def kernel(x):\n    return {source}\n", namespace)
    return namespace["kernel"]


def identity(fn: Any) -> list[str]:
    return traced_code.function_identity(fn)


def test_a_partial_a_kernel_reads_is_named_by_its_arguments() -> None:
    """``functools.partial`` is functools' class, not torch's: a kernel reading one is
    named by what it calls and with which arguments."""

    def scale(x: Any, factor: float) -> Any:
        return x * factor

    two = traced_code.value_identity(functools.partial(scale, factor=2.0), 0)
    three = traced_code.value_identity(functools.partial(scale, factor=3.0), 0)
    assert two != three


def test_the_environment_a_kernel_reads_while_it_traces_is_in_its_identity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``os.environ[...]`` / ``os.getenv(...)`` read at trace time (not at import): the
    variables the code names, by their value here."""
    for source in (
        'x * float(os.environ["TRACED_TEST_SCALE"])',
        'x * float(os.getenv("TRACED_TEST_SCALE", "1"))',
    ):
        kernel = kernel_reading(source)
        seen = []
        for value in ("2", "3"):
            monkeypatch.setenv("TRACED_TEST_SCALE", value)
            seen.append(identity(kernel))
        assert seen[0] != seen[1], source
        monkeypatch.setenv("TRACED_TEST_SCALE", "2")
        assert identity(kernel) == seen[0]


class Settings:
    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.nested = {"table": [scale, 1.0]}


class Slotted:
    __slots__ = ("scale",)

    def __init__(self, scale: float) -> None:
        self.scale = scale


@pytest.mark.parametrize(
    "make",
    [
        Settings,
        Slotted,
        lambda scale: types.SimpleNamespace(scale=scale),
    ],
    ids=["object", "slots", "namespace"],
)
def test_a_setting_read_through_an_object_s_attribute_is_in_its_identity(make: Any) -> None:
    """A settings object (the program's class, one with slots, a ``SimpleNamespace``): named
    by its class and what it holds."""
    settings = make(2.0)
    kernel = kernel_reading("x * SETTINGS.scale", SETTINGS=settings)
    first = identity(kernel)
    settings.scale = 3.0
    assert identity(kernel) != first
    settings.scale = 2.0
    assert identity(kernel) == first


def test_every_item_of_a_large_container_is_in_its_identity() -> None:
    """A table of more than :data:`MAX_ITEMS` items is still named by each item (not its
    length); one past :data:`MAX_DIGESTED_ITEMS` is named by this process alone."""
    table = list(range(traced_code.MAX_ITEMS * 4))
    kernel = kernel_reading("x * TABLE[-1]", TABLE=table)
    first = identity(kernel)
    table[-1] = -1
    assert identity(kernel) != first
    nested = {"deep": {"deeper": {"deepest": [1.0, {"scale": 2.0}]}}}
    kernel = kernel_reading('x * NESTED["deep"]["deeper"]["deepest"][1]["scale"]', NESTED=nested)
    first = identity(kernel)
    nested["deep"]["deeper"]["deepest"][1]["scale"] = 3.0  # type: ignore[index]
    assert identity(kernel) != first
    huge = traced_code.value_identity([object()] * (traced_code.MAX_DIGESTED_ITEMS + 1), 0)
    assert huge == traced_code.UNIDENTIFIED


def test_a_tensor_a_kernel_reads_is_named_by_its_content_or_by_this_process() -> None:
    """A constant tensor of any size up to :data:`MAX_ARRAY_BYTES` by its bytes (one
    element changed is another identity); a larger one by this process alone."""
    weights = torch.zeros(100, 100)
    kernel = kernel_reading("x * WEIGHTS", WEIGHTS=weights)
    first = identity(kernel)
    weights[99, 99] = 1.0
    assert identity(kernel) != first
    big = torch.empty(0).expand(0)  # shape only: no storage to read
    assert traced_code.value_identity(big, 0).startswith("tensor:")
    too_large = torch.zeros(1).expand(traced_code.MAX_ARRAY_BYTES // 4 + 1)
    assert traced_code.value_identity(too_large, 0) == traced_code.UNIDENTIFIED


def test_python_s_own_objects_are_named_by_their_kind() -> None:
    """A logger's state (what it has cached, which handlers a machine configured) decides
    nothing a kernel computes: reading one keeps the identity stable."""
    logger = logging.getLogger("objcache.test.traced_code")
    kernel = kernel_reading("x * 2 if LOG.isEnabledFor(10) or True else x", LOG=logger)
    first = identity(kernel)
    logger.isEnabledFor(20)  # fills the logger's cache
    logger.addHandler(logging.NullHandler())
    try:
        assert identity(kernel) == first
    finally:
        logger.handlers.clear()


@pytest.mark.parametrize(
    "make",
    [
        lambda v: __import__("array").array("d", [v]),
        lambda v: __import__("collections").UserDict(scale=v),
        lambda v: __import__("collections").UserList([v]),
        lambda v: __import__("ctypes").c_double(v),
        lambda v: __import__("itertools").repeat(v),
        lambda v: __import__("multiprocessing").Value("d", v, lock=False),
    ],
    ids=["array", "UserDict", "UserList", "ctypes", "repeat", "multiprocessing.Value"],
)
def test_python_s_own_holders_of_a_setting_are_named_by_what_they_hold(make: Any) -> None:
    """A holder of Python's own (its bytes, what it prints, its attributes): another
    setting is another identity, the same setting the same one."""
    assert traced_code.value_identity(make(2.0), 0) == traced_code.value_identity(make(2.0), 0)
    assert traced_code.value_identity(make(2.0), 0) != traced_code.value_identity(make(3.0), 0)


def test_an_unknown_holder_of_python_s_is_of_this_process_alone_a_known_one_by_kind() -> None:
    """An event set or not is two identities; an object of Python's that shows nothing of
    what it holds is named by this process alone (a miss elsewhere, never a shared key);
    a lock or a thread hold no setting and keep one identity."""
    import threading

    on, off = threading.Event(), threading.Event()
    on.set()
    assert traced_code.value_identity(on, 0) != traced_code.value_identity(off, 0)
    opaque = __import__("select").epoll()
    try:
        assert traced_code.value_identity(opaque, 0) == traced_code.UNIDENTIFIED
    finally:
        opaque.close()
    lock = threading.Lock()
    assert traced_code.value_identity(lock, 0) == traced_code.value_identity(threading.Lock(), 0)


def test_the_command_line_a_kernel_reads_is_in_its_identity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``"--fast" in sys.argv``: the interpreter's arguments, by value."""
    import sys

    kernel = kernel_reading("x * (3.0 if '--fast' in sys.argv else 2.0)", sys=sys)
    monkeypatch.setattr(sys, "argv", ["prog"])
    plain = identity(kernel)
    monkeypatch.setattr(sys, "argv", ["prog", "--fast"])
    assert identity(kernel) != plain


def test_a_default_bound_at_definition_is_in_its_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """``def kernel(x, s=float(os.environ["S"]))``: the setting is the function's default."""
    seen = []
    for value in (2.0, 3.0):
        scope: dict[str, Any] = {}
        exec(f"def kernel(x, s={value}):\n    return x * s\n", scope)
        seen.append(identity(scope["kernel"]))
        exec(f"def kernel(x, *, s={value}):\n    return x * s\n", scope)
        seen.append(identity(scope["kernel"]))
    assert seen[0] != seen[2] and seen[1] != seen[3], seen


def test_a_cached_getter_a_kernel_calls_is_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``functools.cache`` of a getter reading the environment: the getter's code and what
    it reads (its cached value is computed from them)."""
    scope: dict[str, Any] = {"os": os, "functools": functools}
    exec(
        "@functools.cache\ndef get_scale():\n"
        '    return float(os.environ.get("TRACED_TEST_SCALE", "2"))\n',
        scope,
    )
    kernel = kernel_reading("x * get_scale()", get_scale=scope["get_scale"])
    seen = []
    for value in ("2", "3"):
        monkeypatch.setenv("TRACED_TEST_SCALE", value)
        seen.append(identity(kernel))
    assert seen[0] != seen[1], seen


def test_a_configured_torch_module_a_kernel_calls_is_named_by_its_settings() -> None:
    """``ACT = nn.LeakyReLU(negative_slope=...)``: torch's class, but the object holds the
    setting (and parameters, buffers, hooks): named by them."""
    kernel = kernel_reading("ACT(x)", ACT=torch.nn.LeakyReLU(0.01))
    other = kernel_reading("ACT(x)", ACT=torch.nn.LeakyReLU(0.2))
    assert identity(kernel) != identity(other)
    linear = torch.nn.Linear(2, 2)
    kernel = kernel_reading("LIN(x)", LIN=linear)
    first = identity(kernel)
    with torch.no_grad():
        linear.weight.add_(1.0)
    assert identity(kernel) != first
    handle = linear.register_forward_hook(lambda module, args, out: out * 2)
    try:
        hooked = identity(kernel)
        assert hooked != first
    finally:
        handle.remove()


def test_torch_s_functions_and_methods_a_kernel_holds_are_named_by_name() -> None:
    """``ACT = getattr(torch, name)``, ``ACT = torch.Tensor.relu``: torch's own functions,
    named by which one (not by their type, the same for all)."""
    names = [
        tuple(identity(kernel_reading("ACT(x)", ACT=act)))
        for act in (torch.relu, torch.sigmoid, torch.Tensor.relu, torch.Tensor.sigmoid)
    ]
    assert len(set(names)) == 4, names


def test_numpy_scalars_and_config_parsers_are_named_by_what_they_hold() -> None:
    """A setting held as a numpy scalar (``np.float32``, ``np.prod`` of a shape) or in a
    ``configparser`` object: by value."""
    import configparser

    import numpy as np

    assert identity(kernel_reading("x * S", S=np.float32(2))) != identity(
        kernel_reading("x * S", S=np.float32(3))
    )
    seen = []
    for value in ("2", "3", "2"):
        parser = configparser.ConfigParser()
        parser.read_string(f"[kernel]\nscale = {value}\n")
        seen.append(identity(kernel_reading('x * float(CFG["kernel"]["scale"])', CFG=parser)))
    assert seen[0] != seen[1] and seen[0] == seen[2], seen


class Scaler:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def apply(self, x: Any) -> Any:
        return x * self.factor


def test_what_a_code_review_found_is_named_and_stable() -> None:
    """A bound method's object, a class's non-plain settings, torch's own values (a memory
    format), a function as a dict key (no address), hooks registered with kwargs (no
    process-wide counter), an alias of an op namespace (its ops join by name)."""
    one, two = Scaler(2.0).apply, Scaler(3.0).apply
    assert identity(one) != identity(two)
    assert traced_code.class_identity(type("A", (), {"DT": torch.float16})) != (
        traced_code.class_identity(type("A", (), {"DT": torch.bfloat16}))
    )
    assert traced_code.value_identity(torch.channels_last, 0) != traced_code.value_identity(
        torch.contiguous_format, 0
    )

    def f(x: Any) -> Any:
        return x

    keyed = traced_code.value_identity({f: 1}, 0)
    assert "0x" not in keyed
    module = torch.nn.Linear(1, 1)
    before = traced_code.value_identity(module, 0)

    def hook(*args: Any, **kwargs: Any) -> None:
        return None

    handles = [module.register_forward_hook(hook, with_kwargs=True)]
    first = traced_code.value_identity(module, 0)
    handles.append(torch.nn.Linear(1, 1).register_forward_hook(hook))  # another counter
    handles[0].remove()
    handles.append(module.register_forward_hook(hook, with_kwargs=True))
    assert traced_code.value_identity(module, 0) == first != before
    with traced_code.names_read_by() as names:
        traced_code.function_identity(kernel_reading("L.inner(x)", L=torch.ops.objcache_alias))
    assert {"objcache_alias", "inner"} <= names


def test_cycles_huge_values_and_raising_objects_are_bounded_and_never_raise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cyclic list, a registry past the work budget, an object whose attribute raises:
    named (by this process alone where need be), never an exception, never unbounded."""
    cyclic: list[Any] = [1.0]
    cyclic.append(cyclic)
    assert traced_code.value_identity(cyclic, 0)
    shared = list(range(90_000))
    table = [shared] * 200  # 18 million items through one shared list
    named = traced_code.value_identity(table, 0)  # past the work budget: this process's
    monkeypatch.setattr(traced_code, "UNIDENTIFIED", "unidentified:another-process")
    assert traced_code.value_identity(table, 0) != named
    monkeypatch.undo()

    class Raising:
        @property
        def __dict__(self) -> Any:  # type: ignore[override]
            raise RuntimeError("no")

    assert traced_code.value_identity(Raising(), 0) in (
        traced_code.UNIDENTIFIED,
        traced_code.value_identity(Raising(), 0),
    )


def test_a_dict_s_order_is_named_and_a_set_s_is_not() -> None:
    """A kernel iterating a dict sees its insertion order (the program's, the same in every
    process): another order is another identity. A set's order is the process's hash seed's:
    the same set is the same identity whatever its order."""
    assert traced_code.value_identity({"a": 1.0, "b": 2.0}, 0) != traced_code.value_identity(
        {"b": 2.0, "a": 1.0}, 0
    )
    big = {f"k{i}": float(i) for i in range(traced_code.MAX_ITEMS * 2)}
    backwards = dict(reversed(list(big.items())))
    assert traced_code.value_identity(big, 0) != traced_code.value_identity(backwards, 0)
    assert traced_code.value_identity({"x", "y", "z"}, 0) == traced_code.value_identity(
        {"z", "y", "x"}, 0
    )


def _defined(source: str, **scope: Any) -> Any:
    """The one function ``source`` defines, in a module scope of its own."""
    namespace: dict[str, Any] = {"os": os, **scope}
    exec(source, namespace)
    return next(
        v for k, v in namespace.items() if isinstance(v, types.FunctionType) and k not in scope
    )


def chain(leaf_source: str, **leaf_scope: Any) -> Any:
    """A kernel calling a helper in another module, which calls another, which calls
    another, which calls ``leaf``: four modules away."""
    leaf = _defined(leaf_source, **leaf_scope)
    third = _defined("def third(x):\n    return leaf(x) + 1\n", leaf=leaf)
    second = _defined("def second(x):\n    return third(x) + 1\n", third=third)
    first = _defined("def first(x):\n    return second(x) + 1\n", second=second)
    return kernel_reading("first(x)", first=first)


def test_the_program_s_functions_a_kernel_calls_are_named_at_any_depth() -> None:
    """A kernel library at another version changes a helper four calls down: its code, the
    plain data it reads, a module's function it calls, each is another identity; the same
    chain rebuilt is the same identity."""
    base = identity(chain("def leaf(x):\n    return x * SCALE\n", SCALE=2.0))
    assert identity(chain("def leaf(x):\n    return x * SCALE\n", SCALE=2.0)) == base
    assert identity(chain("def leaf(x):\n    return x * SCALE\n", SCALE=3.0)) != base
    assert identity(chain("def leaf(x):\n    return x * SCALE + 0\n", SCALE=2.0)) != base
    helpers = types.ModuleType("traced_test_helpers")
    helpers.scale = _defined("def scale(x):\n    return x * 2\n")  # type: ignore[attr-defined]
    leaf = "def leaf(x):\n    return helpers.scale(x)\n"
    through = identity(chain(leaf, helpers=helpers))
    helpers.scale = _defined("def scale(x):\n    return x * 3\n")  # type: ignore[attr-defined]
    assert identity(chain(leaf, helpers=helpers)) != through


def test_a_cycle_of_the_program_s_functions_is_named_once_each_and_stably() -> None:
    """Mutually recursive helpers past the depth objects are followed: each named once, the
    same identity every time, a changed one another."""

    def cyclic(scale: float) -> Any:
        ping = _defined("def ping(x, n):\n    return x if n == 0 else pong(x, n - 1)\n")
        pong = _defined("def pong(x, n):\n    return ping(x * SCALE, n)\n", ping=ping, SCALE=scale)
        ping.__globals__["pong"] = pong
        return chain("def leaf(x):\n    return ping(x, 3)\n", ping=ping)

    assert identity(cyclic(2.0)) == identity(cyclic(2.0)) != identity(cyclic(3.0))


def test_an_environment_variable_a_kernel_names_in_parts_or_through_a_helper_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The variable a kernel reads while it traces, where no constant spells its whole
    name: composed from a prefix (``os.environ["CFG_" + part]``), read by a helper of the
    program's the kernel passes the name to, or computed by a settings module's
    ``__getattr__`` (PEP 562)."""
    env_float = _defined("def env_float(name):\n    return float(os.environ[name])\n")
    settings = types.ModuleType("traced_test_settings")
    exec(
        "import os\ndef __getattr__(name):\n    return float(os.environ['TRACED_MOD_' + name])\n",
        vars(settings),
    )
    kernels = {
        "composed": kernel_reading('x * float(os.environ["TRACED_CMP_" + PART])', PART="SCALE"),
        "helper": kernel_reading('x * env_float("TRACED_HELPER_SCALE")', env_float=env_float),
        "module_getattr": kernel_reading("x * settings.SCALE", settings=settings),
    }
    variables = ("TRACED_CMP_SCALE", "TRACED_HELPER_SCALE", "TRACED_MOD_SCALE")
    for (label, kernel), variable in zip(kernels.items(), variables, strict=True):
        seen = []
        for value in ("2", "3"):
            monkeypatch.setenv(variable, value)
            seen.append(identity(kernel))
        assert seen[0] != seen[1], label
        monkeypatch.setenv(variable, "2")
        assert identity(kernel) == seen[0], label
        monkeypatch.setenv("TRACED_UNRELATED", "1")  # another variable: the same identity
        assert identity(kernel) == seen[0], label
    for variable in variables:  # a credential read this way never shows in a key's details
        monkeypatch.setenv(variable, "s3cr3t-credential")
    assert not any("s3cr3t-credential" in "".join(identity(k)) for k in kernels.values())


class Node:
    def __init__(self, **held: Any) -> None:
        self.__dict__.update(held)


def test_a_setting_nested_in_the_program_s_objects_is_named_at_any_depth() -> None:
    """``CFG.model.act.slope`` read by a helper the kernel calls: past the levels objects
    are followed with everything they hold, the program's objects are still named by the
    plain data they hold, to any depth; a cycle of objects is named once each."""

    def settings(slope: float) -> Any:
        cfg = Node(model=Node(act=Node(slope=slope, name="leaky")))
        cfg.model.parent = cfg  # a cycle
        helper = _defined("def helper(x):\n    return x * CFG.model.act.slope\n", CFG=cfg)
        return kernel_reading("helper(x)", helper=helper)

    assert identity(settings(0.1)) == identity(settings(0.1)) != identity(settings(0.2))


def test_settings_held_by_python_s_state_holders_are_named_by_what_they_hold() -> None:
    """A ``ContextVar``, a ``threading.local``, an ``operator.methodcaller`` a kernel
    reads: what they hold now is the identity (was: their kind alone, the same for every
    setting)."""
    import contextvars
    import operator
    import threading

    var: contextvars.ContextVar[float] = contextvars.ContextVar("traced_test_scale")
    local = threading.local()
    kernels = {
        "context_var": kernel_reading("x * VAR.get()", VAR=var),
        "thread_local": kernel_reading("x * LOCAL.scale", LOCAL=local),
    }
    unset = identity(kernels["context_var"])
    seen = {}
    for scale in (2.0, 3.0):
        var.set(scale)
        local.scale = scale
        seen[scale] = {label: identity(k) for label, k in kernels.items()}
    assert unset != seen[2.0]["context_var"]
    for label in kernels:
        assert seen[2.0][label] != seen[3.0][label], label
    two, three = (
        identity(kernel_reading("STEP(x)", STEP=operator.methodcaller("mul", s)))
        for s in (2.0, 3.0)
    )
    assert two != three


def test_a_class_level_setting_its_metaclass_computes_is_named() -> None:
    """``Settings.SCALE`` where the metaclass's property reads the environment."""

    def settings(variable: str) -> Any:
        source = (
            "import os\n"
            "class Meta(type):\n"
            "    @property\n"
            f"    def SCALE(cls):\n        return float(os.environ.get('{variable}', '2'))\n"
            "class Settings(metaclass=Meta):\n    pass\n"
        )
        namespace: dict[str, Any] = {"__name__": "traced_test_meta"}  # a module of its own
        exec(source, namespace)
        return kernel_reading("x * Settings.SCALE", Settings=namespace["Settings"])

    assert identity(settings("TRACED_META_A")) != identity(settings("TRACED_META_B"))


def test_a_module_a_kernel_imports_in_its_body_is_named_as_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``from settings import SCALE`` inside the kernel (an import cycle broken): the values
    the module holds now; one of the program's not imported yet, by this process alone."""
    import sys

    kernel = _defined(
        "def kernel(x):\n    from traced_test_lazy import SCALE\n    return x * SCALE\n"
    )
    absent = identity(kernel)
    assert traced_code.UNIDENTIFIED in "".join(absent)
    named = []
    for scale in (2.0, 3.0):
        module = types.ModuleType("traced_test_lazy")
        module.SCALE = scale  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "traced_test_lazy", module)
        named.append(identity(kernel))
    assert named[0] != named[1]
    assert traced_code.UNIDENTIFIED not in "".join(named[0])
    stdlib = _defined("def kernel(x):\n    import json\n    return x\n")
    assert traced_code.UNIDENTIFIED not in "".join(identity(stdlib))


def test_a_singledispatch_registry_and_an_enum_s_computed_setting_are_named() -> None:
    """``functools.singledispatch``: the implementations registered on the function object;
    an enum member of the program's read for what its class computes (``MODE.scale``)."""

    def dispatching(scale: float) -> Any:
        source = (
            "import functools, torch\n"
            "@functools.singledispatch\n"
            "def scale_for(dtype):\n    return 1.0\n"
            "@scale_for.register\n"
            "def _(dtype: torch.dtype):\n    return SCALE\n"
        )
        namespace: dict[str, Any] = {"__name__": "traced_test_sd", "SCALE": scale}
        exec(source, namespace)
        return kernel_reading("x * scale_for(x.dtype)", scale_for=namespace["scale_for"])

    assert identity(dispatching(2.0)) != identity(dispatching(3.0))

    def member(scale: float) -> Any:
        source = (
            "import enum\n"
            "class Mode(enum.Enum):\n"
            "    FAST = 1\n"
            "    @property\n"
            f"    def scale(self):\n        return {scale}\n"
        )
        namespace: dict[str, Any] = {"__name__": "traced_test_enum"}
        exec(source, namespace)
        return kernel_reading("x * MODE.scale", MODE=namespace["Mode"].FAST)

    assert identity(member(2.0)) != identity(member(3.0))
    # the class holds its members, which name the class again: named once, never past the
    # work budget (this process's alone, a miss on every other machine)
    assert_the_same_in_another_process(member(2.0))


def assert_the_same_in_another_process(kernel: Any) -> None:
    """Nothing of the identity is this process's alone: with another process's value for
    what cannot be named, the identity is the same."""
    here = identity(kernel)
    saved = traced_code.UNIDENTIFIED
    try:
        traced_code.UNIDENTIFIED = "unidentified:another-process"
        assert identity(kernel) == here
    finally:
        traced_code.UNIDENTIFIED = saved


def test_a_setting_reached_by_a_computed_route_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same setting reached otherwise than by a name the code reads: by a string
    (``getattr(cfg, "SCALE")``, ``globals()["SCALE"]``, ``sys.modules["cfg"].SCALE``),
    through a package's submodule (``pkg.cfg.SCALE``), behind a weak reference, in a
    ``partialmethod``, on a ``NamedTuple`` or ``float`` subclass's code, or on a class held
    deep in a table."""
    import sys
    import typing
    import weakref

    def routes(scale: float) -> dict[str, Any]:
        cfg = types.ModuleType("traced_test_route_cfg")
        cfg.SCALE = scale  # type: ignore[attr-defined]
        pkg = types.ModuleType("traced_test_route_pkg")
        pkg.cfg = cfg  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "traced_test_route_cfg", cfg)
        holder = Node(scale=scale)
        held = Node(ref=weakref.ref(holder))

        class Scaled(typing.NamedTuple):
            base: float

            @property
            def scale(self) -> float:
                return self.base * scale

        Scaled.__module__ = "traced_test_route"

        class Deep:
            SCALE = scale

        Deep.__module__ = "traced_test_route"

        class Partial:
            def mul(self, x: Any, by: float) -> Any:
                return x * by

            scaled = functools.partialmethod(mul, by=scale)

        Partial.__module__ = "traced_test_route"
        return {
            "getattr": (kernel_reading('x * getattr(cfg, "SCALE")', cfg=cfg), holder),
            "globals": (kernel_reading('x * globals()["SCALE_G"]', SCALE_G=scale), holder),
            "sys.modules": (
                kernel_reading('x * sys.modules["traced_test_route_cfg"].SCALE', sys=sys),
                holder,
            ),
            "submodule": (kernel_reading("x * pkg.cfg.SCALE", pkg=pkg), holder),
            "weakref": (kernel_reading("x * HELD.ref().scale", HELD=held), holder),
            "namedtuple": (kernel_reading("x * S.scale", S=Scaled(1.0)), holder),
            "deep class": (
                kernel_reading('x * T["a"]["b"]["c"].SCALE', T={"a": {"b": {"c": Deep}}}),
                holder,
            ),
            "partialmethod": (kernel_reading("P.scaled(x)", P=Partial()), holder),
        }

    two = {label: identity(kernel) for label, (kernel, _) in routes(2.0).items()}
    three = {label: identity(kernel) for label, (kernel, _) in routes(3.0).items()}
    for label in two:
        assert two[label] != three[label], label
    for kernel, _ in routes(2.0).values():
        assert_the_same_in_another_process(kernel)


def test_a_function_is_torch_s_by_its_file_not_by_the_module_it_claims() -> None:
    """``functools.wraps`` copies ``__module__ = "torch"`` onto a program's replacement of
    ``torch.layer_norm``: it is the program's (named by its code), while torch's own
    functions, methods and op objects stay torch's (named by their names)."""

    @functools.wraps(torch.layer_norm)
    def fused(*args: Any, **kwargs: Any) -> Any:
        return None

    assert fused.__module__ == "torch"
    assert not traced_code.is_torchs(fused)
    assert not traced_code.is_torchs(staticmethod(fused))
    assert traced_code.is_torchs(torch.nn.functional.layer_norm)
    assert traced_code.is_torchs(torch.nn.Linear(2, 2).forward)
    assert traced_code.is_torchs(torch.ops.aten.add.default)
    assert traced_code.is_torchs(torch.ops.aten)
