"""The CPU kernels a set of Mega-Cache graphs needs, derived from the graphs themselves.

A Mega-Cache bundle is only a warm start if it carries the compiled C++ kernels its FX graphs
load (:mod:`objcache.integrations.torch.kernels.kernels` explains why torch's own bytes do not). The
kernel hooks record every ``CppBuilder`` a process creates, but only when they were installed
before the compile: a process that follows torch's recipe (compile, then save) without
``objcache.install()`` has recorded nothing.

So the kernels are derived from the artifacts. Each FX graph artifact holds the generated
Python module of the graph; importing that module is exactly what torch does on a cache hit:
its ``async_compile.cpp_pybinding(...)`` calls construct one ``CppBuilder`` per kernel, whose
target path torch computes from the kernel's source and flags (``CppCodeCache.load_async``).
Replaying that import with torch's in-process kernel caches set aside gives the builders, and
so the content keys and the ``.so`` files, of every kernel the graphs load; the vector-ISA
probe torch compiles before choosing kernel flags (``VecISA.check_build``) is replayed too.
Builds are refused during the replay: a kernel whose binary is gone from the inductor cache
dir is reported as missing, never compiled at save time, and a precompiled header is never
built (a loading machine with objcache's kernel hooks needs none when every kernel is a hit).
Only the preprocessor runs that torch uses to hash a header (``g++ -E``) are let through.

The artifacts unpickled here are the ones ``torch.compiler.save_cache_artifacts()`` just
returned from this process's own memory, never bytes read from a store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from objcache.integrations.torch.kernels import kernels

log = logging.getLogger("objcache.torch")


@dataclass
class KernelScan:
    """What a replay of the graphs found: ``(content key, entry)`` pairs (binaries as stored,
    and the records of the headers they were built with) and what is missing."""

    items: list[tuple[str, bytes]] = field(default_factory=list)
    #: Targets torch would load but that no longer exist (their builds will run on load).
    missing: list[str] = field(default_factory=list)
    #: Graphs that could not be replayed, with the reason (one short phrase each).
    failed: list[str] = field(default_factory=list)
    graphs: int = 0


class _BuildRefused(RuntimeError):
    """Raised instead of running g++ during a replay."""


def _refused(exc: BaseException | None) -> bool:
    """Whether ``exc`` (possibly re-raised by torch's compile workers) is a refused build."""
    for _ in range(8):
        if exc is None:
            return False
        if isinstance(exc, _BuildRefused) or "_BuildRefused" in repr(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _subclasses(cls: Any) -> list[Any]:
    found = [cls]
    sub: Any
    for sub in cls.__subclasses__():
        found.extend(_subclasses(sub))
    return found


@contextlib.contextmanager
def _replaying(cpp_builder: Any, codecache: Any) -> Iterator[list[Any]]:
    """Collect every ``CppBuilder`` created inside; refuse builds; torch's caches set aside.

    ``CppCodeCache.load_async`` skips constructing builders for a kernel this process has
    already loaded (its class-level ``cache`` dict), so each code-cache class gets an empty
    ``cache`` for the duration and its own back afterwards.
    """
    cls = cpp_builder.CppBuilder
    builders: list[Any] = []
    original_init, original_build = cls.__init__, cls.build

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        builders.append(self)

    def build(self: Any) -> None:
        if getattr(self, "_preprocessing", False):
            original_build(self)  # ``g++ -E``: torch hashes the header's expansion
        elif not getattr(self, "_precompiling", False):  # a header is not built at save time
            raise _BuildRefused(str(self.get_target_file_path()))

    caches = {c: c.__dict__["cache"] for c in _subclasses(codecache.CppCodeCache)}
    cls.__init__, cls.build = __init__, build
    for c in caches:
        c.cache = {}
    try:
        yield builders
    finally:
        cls.__init__, cls.build = original_init, original_build
        for c, cache in caches.items():
            c.cache = cache


def _required(codecache: Any, cpp_builder: Any) -> str | None:
    """The first torch internal the replay needs that this torch lacks, or None."""
    needs = [
        (codecache, "PyCodeCache"),
        (codecache, "CppCodeCache"),
        (codecache, "_reload_python_module"),
        (cpp_builder, "CppBuilder"),
    ]
    for module, name in needs:
        if not hasattr(module, name):
            return f"torch._inductor.{module.__name__.rsplit('.', 1)[-1]}.{name}"
    if not hasattr(codecache.PyCodeCache, "write"):
        return "PyCodeCache.write"
    if "cache" not in codecache.CppCodeCache.__dict__:
        return "CppCodeCache.cache"
    return None


def _graph_source(artifact: Any) -> str:
    graph = pickle.loads(artifact.content)  # this process's own artifact (module docstring)
    source = getattr(graph, "source_code", None)
    if not isinstance(source, str) or not source:
        raise ValueError("no generated source in the graph")
    return source


def _replay_graph(codecache: Any, source: str) -> None:
    key, path = codecache.PyCodeCache.write(source)
    codecache._reload_python_module(key, path, set_sys_modules=False)


def _replay_isa_probe() -> None:
    """Construct the ISA probe's builder as ``pick_vec_isa()`` does on a fresh machine."""
    from torch._inductor import cpu_vec_isa

    isa = cpu_vec_isa.pick_vec_isa()
    code = getattr(cpu_vec_isa.VecISA, "_avx_code", None)
    if isa and code is not None and hasattr(isa, "check_build"):
        isa.check_build(code)


def derive(artifacts: Mapping[str, Sequence[Any]]) -> KernelScan:
    """Kernels of the ``inductor`` artifacts of a deserialized Mega-Cache (see module doc)."""
    scan = KernelScan()
    graphs = list(artifacts.get("inductor", ()))
    scan.graphs = len(graphs)
    if not graphs:
        return scan
    try:
        from torch._inductor import codecache, cpp_builder
    except Exception as exc:
        scan.failed.append(f"torch's C++ code cache is not importable ({exc.__class__.__name__})")
        return scan
    absent = _required(codecache, cpp_builder)
    if absent is not None:
        scan.failed.append(f"this torch has no {absent}")
        return scan
    with _replaying(cpp_builder, codecache) as builders:
        with contextlib.suppress(Exception):
            _replay_isa_probe()
        # the probe's builders come first: where this process picked another ISA variant than
        # the replay (a CPU with several, AMX among them), the replayed probe was never built
        # here, and a load only probes again (a small build, never a kernel the graphs load)
        probes = len(builders)
        for artifact in graphs:
            try:
                _replay_graph(codecache, _graph_source(artifact))
            except Exception as exc:
                if _refused(exc):
                    continue  # its missing binary is reported below
                scan.failed.append(f"graph {str(artifact.key)[:12]}: {exc.__class__.__name__}")
                log.debug("objcache: replaying graph %s failed", artifact.key, exc_info=True)
    seen: set[str] = set()
    for index, builder in enumerate(builders):
        try:
            plan = kernels.plan(builder)
            if plan is None or plan.precompiled_header or plan.target in seen:
                continue
            seen.add(plan.target)
            if not os.path.isfile(plan.target):
                if index >= probes:
                    scan.missing.append(plan.target)
                continue
            with open(plan.target, "rb") as f:
                stored = kernels.stored_form(plan, f.read())
            if stored is None:
                scan.failed.append("kernel: its headers could not be read")
                continue
            data, (record_key, record) = stored
            if record_key not in seen:
                seen.add(record_key)
                scan.items.append((record_key, record))
            scan.items.append((plan.key, data))
        except Exception as exc:
            scan.failed.append(f"kernel: {exc.__class__.__name__}")
    return scan
