"""Guarded candidates: every guard variant of an FX graph or AOTAutograd entry, everywhere.

torch's FX graph and AOTAutograd caches are *guarded*: one key can have several compiled
entries, each valid under its own guard expression on symbolic shapes. Locally torch keeps
them all (``{cache_dir}/fxgraph/<xx>/<key>/<entry>``) and
``GuardedCache.iterate_over_candidates`` tries each local entry,
then exactly **one** remote value; ``find_guarded_entry`` takes the first whose guards pass.
With one remote value per key, machines that need another variant take a guard miss and
recompile.

With objcache installed (and ``OBJCACHE_GUARDED_CANDIDATES`` not ``0``):

* a put stores the raw pickle as its own content-addressed object
  ``.../<shard>/<key>!/<digest>`` (:func:`objcache.core.candidates.put_candidate`,
  CREATE mode, so equal bytes from many processes make one object);
* ``iterate_over_candidates`` is replaced on ``FxGraphCache`` and ``AOTAutogradCache``: it
  yields torch's local entries first, exactly as torch does, then every candidate objcache
  holds for the key (one LIST per tier, concurrent GETs, each verified by the codec; at most
  16, newest first), skipping bytes already yielded locally. torch's own
  ``find_guarded_entry`` still evaluates the guards and records its counters
  (``fxgraph_cache_hit``, ``autograd_cache_guard_miss`` ...);
* ``find_guarded_entry`` is wrapped only to learn which candidate passed: that one is
  written through into torch's local cache (and objcache's local tier); candidates that
  failed their guards are not.

A ``backend_override_cls`` (torch's test mocks) or the flag off gives torch's behaviour back.
:func:`uninstall` restores both classes.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import threading
from collections import Counter
from collections.abc import Callable, Generator
from typing import Any

from objcache.integrations import cache_client
from objcache.integrations.patching import is_marked, marked
from objcache.integrations.torch.remote import process_keys, serde, writethrough
from objcache.observe.metrics import FailureLog

log = logging.getLogger("objcache.torch")

#: objcache kinds whose torch caches are guarded.
GUARDED_KINDS = frozenset({"fx-graph", "aot-autograd"})

#: ``lookups:<kind>``, ``candidates:<kind>``, ``remote_hits:<kind>``, ``guard_misses:<kind>``,
#: ``skipped_local_duplicates:<kind>``, ``errors:<where>``.
counters: Counter[str] = Counter()
_state = threading.local()
#: (class, attribute) -> the attribute in the class's own __dict__ before install, or _ABSENT.
_saved: dict[tuple[type, str], Any] = {}
_ABSENT = object()
_lock = threading.RLock()

_failed = FailureLog(
    log, "torch.candidates", counters, "errors:",
    "objcache: %s failed; torch goes on without candidates: %r",
)  # fmt: skip


def enabled() -> bool:
    """Whether the process-wide client stores and serves guarded candidates."""
    try:
        return bool(cache_client.get_client().config.guarded_candidates)
    except Exception as exc:
        _failed("config", exc)
        return False


def _serves(kind: str, remote_cache: Any) -> bool:
    """Whether ``remote_cache`` is objcache's cache of ``kind`` with candidates on."""
    if remote_cache is None:
        return False
    cls = type(remote_cache)
    if getattr(cls, "objcache_kind", None) != kind or cls.backend_override_cls is not None:
        return False
    return enabled()


def _sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def _make_iterate(kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def iterate_over_candidates(
        cls: Any, local: bool, remote_cache: Any, key: str
    ) -> Generator[tuple[Any, bytes, bool], None, None]:
        process_keys.looked_up(kind, key)  # the state an entry saved later must match
        if not _serves(kind, remote_cache):
            yield from original(cls, local, remote_cache, key)
            return
        seen: set[str] = set()
        if local:  # torch's own local entries, in torch's order
            for value, content, in_local in original(cls, local, None, key):
                seen.add(_sha256(content))
                yield value, content, in_local
        counters[f"lookups:{kind}"] += 1
        # First the candidates the start-up prefetch brought (the local tier only: no far
        # LIST), then, if none of them fits, every tier's (objcache/core/candidates.py).
        for prefetched_only in (True, False):
            try:
                found = cache_client.get_client().get_candidates(
                    kind, remote_cache._get_key(key), prefetched_only=prefetched_only
                )
            except Exception as exc:
                _failed(f"list candidates ({kind})", exc)
                return
            for candidate in found:
                try:
                    _, raw = serde.unpack(kind, candidate.payload)
                    if raw is None or _sha256(raw) in seen:
                        counters[f"skipped_local_duplicates:{kind}"] += raw is not None
                        continue
                    value = pickle.loads(raw)
                except Exception as exc:
                    _failed(f"load candidate ({kind})", exc)
                    continue
                counters[f"candidates:{kind}"] += 1
                seen.add(_sha256(raw))
                _state.pending = (kind, key, candidate, raw)
                yield value, raw, False
                # Resumed: torch's guards refused this candidate.
                _state.pending = None
                counters[f"guard_misses:{kind}"] += 1

    marked(iterate_over_candidates, original)
    return iterate_over_candidates


def _make_find(kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def find_guarded_entry(cls: Any, key: str, *args: Any, **kwargs: Any) -> Any:
        _state.pending = None
        try:
            result = original(cls, key, *args, **kwargs)
        finally:
            pending = getattr(_state, "pending", None)
            _state.pending = None
        try:
            _, content, _info = result
            if pending is not None and content is pending[3]:
                _, _, candidate, raw = pending
                counters[f"remote_hits:{kind}"] += 1
                writethrough.write_through(kind, key, raw)
                cache_client.get_client().adopt_candidate(candidate)
        except Exception as exc:
            _failed(f"write-through ({kind})", exc)
        return result

    marked(find_guarded_entry, original)
    return find_guarded_entry


def _patch(cls: type, kind: str) -> None:
    with _lock:
        current = cls.__dict__.get("iterate_over_candidates")
        if is_marked(getattr(current, "__func__", None)):
            return
        for attr, make in (
            ("iterate_over_candidates", _make_iterate),
            ("find_guarded_entry", _make_find),
        ):
            _saved[(cls, attr)] = cls.__dict__.get(attr, _ABSENT)
            original = getattr(cls, attr).__func__  # the classmethod's function, inherited
            setattr(cls, attr, classmethod(make(kind, original)))


def apply_fx(module: Any) -> None:
    """Part for ``torch._inductor.codecache``."""
    _patch(module.FxGraphCache, "fx-graph")


def apply_aot(module: Any) -> None:
    """Part for ``torch._functorch._aot_autograd.autograd_cache``."""
    _patch(module.AOTAutogradCache, "aot-autograd")


def uninstall() -> None:
    """Give both classes their own methods back."""
    with _lock:
        for (cls, attr), value in reversed(list(_saved.items())):
            if value is _ABSENT:
                if attr in cls.__dict__:
                    delattr(cls, attr)
            else:
                setattr(cls, attr, value)
        _saved.clear()


def patched(cls: type) -> bool:
    current = cls.__dict__.get("iterate_over_candidates")
    return is_marked(getattr(current, "__func__", None))
