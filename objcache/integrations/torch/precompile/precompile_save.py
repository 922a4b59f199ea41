"""Saving precompile entries (docs/torch.md, "Precompile entries"): the save path.

``DynamoCache.record_package`` (after each frame compile) and
``PrecompileContext.record_artifact`` (a backend, the backward included) mark entries to
save; a background thread saves them once compiles have settled for :data:`SETTLE_S`, and
again at exit, before the client flushes. Each is serialized as torch's
``PrecompileCacheEntry`` in objcache's payload (:data:`.precompile_entry.FORMAT`), without
the variants a later one covers (:mod:`.superseded_codes`). Unchanged entries are not put
again. Nobody needs to call ``torch.compiler.save_cache_artifacts()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from objcache.integrations import cache_client
from objcache.integrations.patching import marked
from objcache.integrations.torch.precompile import (
    compile_settings,
    portable_guards,
    precompile_entry,
    superseded_codes,
    torch_edits,
)
from objcache.integrations.torch.precompile.precompile_entry import counters, failed, lock, stored

#: Seconds without a new frame compile or backend before the entries are saved.
SETTLE_S = 2.0

#: objcache key -> (the wrapped function, its package's latest Dynamo entry): tracked per
#: package, never through torch's weak ``sha256(qualname, first line)`` key.
_entries: dict[str, tuple[Any, Any]] = {}
#: objcache keys whose entry changed since it was last saved.
_dirty: set[str] = set()
#: objcache keys saved before their backend was recorded: saved at exit if nothing marks them.
_waiting: set[str] = set()
_changed = threading.Condition(lock)
_last_change = 0.0
_saver: threading.Thread | None = None
_pid = 0


def _mark(key: str | None = None) -> None:
    global _last_change, _saver
    with lock:
        if key is not None:
            _dirty.add(key)
        else:
            _dirty.update(_entries)
        _last_change = time.monotonic()
        if _saver is None or not _saver.is_alive() or _pid != os.getpid():
            _saver = threading.Thread(target=_settle, name="objcache-precompile", daemon=True)
            _saver.start()
        _changed.notify_all()


def _settle() -> None:
    while True:
        with lock:
            while not _dirty:
                _changed.wait()
            left = _last_change + SETTLE_S - time.monotonic()
            if left > 0:
                _changed.wait(left)
                continue
        save(final=False)


def wrap_record_package(original: Callable[[Any], None]) -> Callable[[Any], None]:
    def record_package(package: Any) -> None:
        if compile_settings.debug_overrides():  # its frames' settings have no digest either
            counters["unsaved:debug_override"] += 1
            return
        why = package.__dict__.get("_objcache_unsaveable")
        if why:
            counters[f"unsaved:{why}"] += 1  # torch's own record would fail the same way
            return
        compiler = package.__dict__.get("_objcache_compiler")
        if compiler is None:
            counters["unsaved:unportable_compiler"] += 1
            return
        try:
            original(package)
            fn = package._innermost_fn
            entry = package.cache_entry()  # this package's, whatever torch's key maps to
            _, key = precompile_entry.entry_key(fn, cache_client.get_client().job, compiler)
            with lock:
                _entries[key] = (fn, entry)
            _mark(key)
        except Exception as exc:
            failed("record", exc)

    marked(record_package)
    return record_package


def wrap_record_artifact(original: Callable[..., None]) -> Any:
    def record_artifact(cls: Any, artifact: Any) -> None:
        original(artifact)
        try:
            if _entries:
                _mark()
        except Exception as exc:
            failed("record", exc)

    marked(record_artifact)
    return classmethod(record_artifact)


def save(final: bool = True) -> int:
    """Store every changed entry now (never raises); returns how many were put.

    Only the background saver passes ``final=False``: an entry whose backend is not recorded
    yet then waits for it (:func:`_complete_entry`).
    """
    try:
        return _save(final)
    except Exception as exc:
        failed("save", exc)
        return 0


_save_lock = threading.Lock()


def _save(final: bool) -> int:
    with torch_edits.torch_at_work():
        return _save_now(final)


def _save_now(final: bool) -> int:
    with _save_lock:
        return _save_locked(final)


def _complete_entry(key: str, final: bool) -> tuple[int, dict[str, Any]] | None:
    """torch's ``PrecompileCacheEntry`` of one function in objcache's payload, with how many
    variants it leaves out (:mod:`superseded_codes`); None while a backend is missing.

    A training step compiles its backward lazily, at the first ``backward()``: its backend is
    recorded (``record_artifact``) seconds after the frame's package. torch's
    ``PrecompileCacheEntry.from_cache_entry`` marks a code whose backend is missing
    ``bypassed`` *in place*, on the very objects the live package and ``PrecompileContext``
    hold, so a save in between would store, then and on every later save, an entry a new
    machine traces and compiles again. Such an entry waits (counted) for its backend, which
    marks it again; at exit (``final``) it is saved as torch would save it (the incomplete
    codes bypassed, on copies), unless no code at all is complete (nothing would be served).
    """
    from torch._dynamo.package import PrecompileCacheEntry
    from torch._dynamo.precompile_context import PrecompileContext

    with lock:
        fn, dynamo = _entries.get(key, (None, None))
    if dynamo is None:
        return None
    backends = PrecompileContext._backend_artifacts_by_key
    waiting = [c for c in dynamo.codes if any(b not in backends for b in c.backend_ids)]
    if waiting and (not final or len(waiting) == len(dynamo.codes)):
        counters["waiting_for_backend" if not final else "unsaved:no_backend"] += 1
        if not final:
            with lock:
                _waiting.add(key)
        return None
    from torch._dynamo.eval_frame import innermost_fn

    code = innermost_fn(fn).__code__
    if not dynamo.codes or not precompile_entry.same_code(dynamo.codes[0].python_code, code):
        counters["unsaved:code_mismatch"] += 1  # never another function's package
        return None
    if not precompile_entry.all_guards_portable(dynamo):  # serialized without the portable split
        counters["unsaved:no_portable_guards"] += 1
        return None
    # torch marks the copies, never the live package's codes; a static variant a later
    # dynamic one covers is left out (superseded_codes)
    codes, left_out = [], 0
    for c in dynamo.codes:
        kept, dropped = superseded_codes.without_superseded(c)
        left_out += dropped
        codes.append(kept)
    main = _in_its_own_module(codes[0], innermost_fn(fn))
    if main is None:
        counters["unsaved:foreign_scope"] += 1
        return None
    copy = dataclasses.replace(dynamo, codes=[main, *codes[1:]])
    return left_out, {
        "format": precompile_entry.FORMAT,
        "code": portable_guards.code_digest(code),
        "entry": PrecompileCacheEntry.from_cache_entry(copy, backends),
    }


def _in_its_own_module(main: Any, fn: Any) -> Any:
    """The root code's entry naming the module whose globals the code runs in, or None.

    torch names it by the compiled function's ``__module__``, which ``functools.wraps``
    copies from the wrapped function (transformers' ``wrapper`` of a model's ``forward``
    runs in ``transformers/utils/generic.py`` and says ``modeling_bert``); a served entry is
    installed, its backends bound and its guards read in ``sys.modules[python_module]``, so
    that name must be the module of ``fn.__globals__``, as it is on the writer, where Dynamo
    binds everything in the frame's own globals (docs/torch.md, "What a served entry depends
    on"). Globals no loaded module owns cannot be found again by name: None (unsaveable)."""
    scope = getattr(fn, "__globals__", None)
    name = scope.get("__name__") if isinstance(scope, dict) else None
    if name == main.python_module:
        return main
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is None or getattr(module, "__dict__", None) is not scope:
        return None
    return dataclasses.replace(main, python_module=name)


def _save_locked(final: bool) -> int:
    with lock:
        if final:
            _dirty.update(_waiting)
        _waiting.difference_update(_dirty)
        dirty = {k for k in _dirty if k in _entries}
        _dirty.clear()
    if not dirty:
        return 0
    from torch._dynamo import convert_frame

    blobs: dict[str, tuple[int, bytes]] = {}
    with getattr(convert_frame, "compile_lock", contextlib.nullcontext()):
        for key in dirty:
            entry = _complete_entry(key, final)
            if entry is not None:
                blobs[key] = entry[0], pickle.dumps(entry[1])
    client = cache_client.get_client()
    cap = client.cache.caps.for_kind(precompile_entry.KIND)
    changed: dict[str, bytes] = {}
    digests: dict[str, str] = {}
    for key, (left_out, blob) in blobs.items():
        digest = hashlib.sha256(blob).hexdigest()
        if stored.get(key) == digest:
            continue
        if len(blob) > cap:
            counters["too_large"] += 1
            continue
        changed[key], digests[key] = blob, digest
        counters["superseded_variants_left_out"] += left_out
    if not changed:
        return 0
    # An entry grows as its function compiles more frames (a save between two of them holds
    # the first only): each save replaces the stored one, never only adds where none is.
    written_all = client.replace(precompile_entry.KIND, changed)
    for key, written in zip(changed, written_all, strict=True):
        stored[key] = digests[key]
        counters["puts"] += 1
        if written.stored < written.asked:
            counters["put_failed"] += 1
    return len(changed)


def _save_at_exit() -> None:
    if _pid == os.getpid():
        save()


def start() -> None:
    """Save from this process on: at exit, and from the saver (restarted in a forked child)."""
    global _pid
    _pid = os.getpid()
    _register_exit_save()


def _register_exit_save() -> None:
    """Save at exit before the client closes: ``objcache.client`` registered its close
    first, and ``threading._register_atexit`` hooks run in reverse order."""
    import atexit

    import objcache.client  # noqa: F401 - its exit hook first, so it runs after this one

    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        with contextlib.suppress(RuntimeError):
            register(_save_at_exit)
            return
    atexit.register(_save_at_exit)


def forget() -> None:
    """Drop the entries marked to save (the part's uninstall)."""
    _dirty.clear()
    _waiting.clear()
