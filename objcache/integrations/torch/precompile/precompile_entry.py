"""What a precompile entry is (docs/torch.md, "Precompile entries"): its kind, its payload's
format, its key, and the checks that an entry is the package of the function it is meant for.

Both paths of the part use it: serving an entry (:mod:`.precompile_serve`) and saving one
(:mod:`.precompile_save`). The part's counters, failure log and lock live here too, shared
by the two paths and by :mod:`.precompile`, which patches torch.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import sys
import threading
import types
from collections import Counter
from typing import Any

from objcache.integrations.torch.precompile import portable_guards
from objcache.observe.metrics import FailureLog

log = logging.getLogger("objcache.torch")

#: objcache kind of a precompile entry.
KIND = "precompile"
#: The payload's format (and the key's first part): a dict naming the wrapped function's
#: code digest and holding torch's ``PrecompileCacheEntry``, every guards state of which
#: carries its portable guards (:func:`portable_guards.attach`).
FORMAT = "objcache-precompile-v3"

counters: Counter[str] = Counter()
failed = FailureLog(
    log,
    "torch",
    counters,
    "errors:",
    "objcache: precompile %s failed; torch goes on without a precompile entry there: %r",
)

#: The part's one lock: the patches, the entries served and the entries to save.
lock = threading.RLock()
#: objcache key -> digest of the bytes last stored or loaded (no put of the same bytes).
stored: dict[str, str] = {}


def _module_source(name: str) -> bytes:
    module = sys.modules.get(name)
    if module is None:
        return b""
    try:
        return inspect.getsource(module).encode()
    except (OSError, TypeError):
        return b""  # no source file (exec'd code): the code digest alone


def unsaveable(tx: Any, why: str) -> None:
    """Mark the precompile package of the frame ``tx`` traces as not to be saved (counted
    ``unsaved:<why>`` when it is recorded); nothing where the frame has no package."""
    package = getattr(getattr(tx, "output", None), "package", None)
    if package is not None:
        package.__dict__.setdefault("_objcache_unsaveable", why)


def entry_key(fn: Any, job: str, compiler: str) -> tuple[str, str]:
    """``(torch's key, objcache key)`` of the function ``torch.compile`` wraps.

    torch's key is ``sha256(qualname, first line)``; the objcache key adds the job, the
    module name (torch installs the entry's globals into ``sys.modules[that name]``), the
    code object (bytecode, names, constants, nested code), the module's source text, so
    an edit anywhere in the file, or another script, is another key, and the compiler the
    wrapper names (backend, mode, options: :func:`compile_settings.compiler_identity`).
    """
    from torch._dynamo.eval_frame import innermost_fn
    from torch._dynamo.package import CompilePackage

    inner = innermost_fn(fn)
    torch_key = str(CompilePackage.source_id_from_fn(fn))
    h = hashlib.sha256(FORMAT.encode() + b"\0")
    for part in (torch_key, job, inner.__module__, inner.__qualname__, compiler):
        h.update(f"{part}\0".encode())
    portable_guards.code_into(inner.__code__, h)
    h.update(hashlib.sha256(_module_source(inner.__module__)).digest())
    return torch_key, h.hexdigest()


def same_code(serialized: Any, code: types.CodeType) -> bool:
    """Whether torch's ``SerializedCode`` of an entry is ``code`` (paths and line tables
    aside, which differ by machine)."""
    fields = (
        "co_code", "co_name", "co_firstlineno", "co_names", "co_varnames", "co_freevars",
        "co_cellvars", "co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_flags",
    )  # fmt: skip
    if any(getattr(serialized, f, None) != getattr(code, f) for f in fields):
        return False
    consts = getattr(serialized, "co_consts", ())
    if len(consts) != len(code.co_consts):
        return False
    for mine, real in zip(consts, code.co_consts, strict=True):
        if isinstance(real, types.CodeType):
            if not same_code(mine, real):
                return False
        elif type(mine) is not type(real) or (mine != real and mine == mine):  # NaN aside
            return False
    return True


def all_guards_portable(dynamo: Any) -> bool:
    """Whether every guarded code carries its portable guards and exactly one compiler
    settings record."""
    for c in dynamo.codes:
        for guarded in c.guarded_codes:
            detached = portable_guards.detach(guarded.guards_state)
            if detached is None or not portable_guards.has_one_settings_record(detached[1]):
                return False
    return True
