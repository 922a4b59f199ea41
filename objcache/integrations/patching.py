"""The one patch ledger of the integrations: what objcache changed in other packages, the
wrappers it put there marked as objcache's (:func:`marked`, read by :func:`is_marked`), and what
puts the originals back.

Two records, one module: a part of Triton's or vLLM's holds a :class:`Patches` of the
attributes it set; the torch install records each change once, the first time, as (module
name, attribute) -> the value before it (:data:`saved`); :func:`undo_all` puts every one back,
last first, and :func:`undo_since` the ones recorded after a point (an install part failing
half-way). A torch config flag is recorded as its raw user override (``config:<flag>``), never
as the default value: restoring "unset" is not the same as setting the default back.

Callers (:mod:`objcache.integrations.install.hooks`, each part) hold their lock around every
call.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_ABSENT: Any = object()


class Patches:
    """Attributes a part set on others' classes and modules: :meth:`set` records the value
    each held in its own ``__dict__`` (or that it held none), :meth:`undo` restores them, last
    first. Callers hold their part's lock around both."""

    def __init__(self) -> None:
        self._done: list[tuple[Any, str, Any]] = []

    def set(self, owner: Any, attr: str, value: Any) -> None:
        self._done.append((owner, attr, vars(owner).get(attr, _ABSENT)))
        setattr(owner, attr, value)

    def undo(self) -> None:
        for owner, attr, previous in reversed(self._done):
            if previous is _ABSENT:
                delattr(owner, attr)
            else:
                setattr(owner, attr, previous)
        self._done.clear()

    def __bool__(self) -> bool:
        return bool(self._done)


def marked(wrapper: F, original: Callable[..., Any] | None = None) -> F:
    """``wrapper`` marked as objcache's (``__objcache__``: an apply finds it already there) and,
    given ``original``, pointing at what it wraps (``__wrapped__``)."""
    wrapper.__objcache__ = True  # type: ignore[attr-defined]
    if original is not None:
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapper


def is_marked(value: Any) -> bool:
    """Whether ``value`` is a wrapper :func:`marked` as objcache's."""
    return bool(getattr(value, "__objcache__", False))


#: What install() changed: (module name, attribute) -> previous value.
saved: dict[tuple[str, str], Any] = {}


def save(mod_name: str, attr: str, value: Any) -> None:
    """Record ``value`` as what ``mod_name``'s ``attr`` held before (the first record wins)."""
    saved.setdefault((mod_name, attr), value)


def set_config(module: Any, attr: str, value: Any) -> None:
    """Set a torch config value, remembering the raw override so uninstall restores it.

    torch config modules keep a user override per entry (``ConfigModule.__setattr__``);
    restoring "unset" is not the same as setting the default value back, so the raw
    override is saved and put back as it was.
    """
    entry = getattr(module, "_config", {}).get(attr)
    override: Any = getattr(entry, "user_override", None)
    # torch >= 2.13 keeps the override in a context-variable-like holder (``get``/``set``);
    # older releases keep the value itself, or a bare sentinel object when unset: those are
    # restored by setting the attribute back
    holder = getattr(override, "get", None), getattr(override, "set", None)
    if callable(holder[0]) and callable(holder[1]):
        save(module.__name__, f"config:{attr}", holder[0]())
    else:
        save(module.__name__, attr, getattr(module, attr))
    setattr(module, attr, value)


def restore(mod: Any, attr: str, value: Any) -> None:
    """Put ``value`` back as ``mod``'s ``attr`` (a ``config:`` flag as its raw override)."""
    if attr.startswith("config:"):
        mod._config[attr[len("config:") :]].user_override.set(value)
        dirty = getattr(mod, "_hash_dirty_var", None)
        if dirty is not None:
            dirty.set(True)
        mark = getattr(mod, "_mark_get_dict_dirty", None)
        if mark is not None:
            mark(attr[len("config:") :])
    elif "." in attr:  # a class's attribute; None: the class inherited it
        owner, _, name = attr.partition(".")
        if value is None:
            delattr(getattr(mod, owner), name)
        else:
            setattr(getattr(mod, owner), name, value)
    else:
        setattr(mod, attr, value)


def undo_flag(mod_name: str, attr: str) -> None:
    """Put back a config flag set through :func:`set_config` (nothing when it was not)."""
    for key in ((mod_name, f"config:{attr}"), (mod_name, attr)):
        if key in saved and (mod := sys.modules.get(mod_name)) is not None:
            restore(mod, key[1], saved.pop(key))


def undo_since(before: Collection[tuple[str, str]]) -> None:
    """Put back, last first, every change recorded since ``before`` (the keys then)."""
    for key in reversed([k for k in saved if k not in before]):
        mod = sys.modules.get(key[0])
        value = saved.pop(key)
        if mod is not None:
            restore(mod, key[1], value)


def undo_all(failed: Callable[[str, BaseException], None]) -> None:
    """Put back every recorded change, last first; one that fails is reported to ``failed``
    and the others still go back."""
    for (mod_name, attr), value in reversed(list(saved.items())):
        mod = sys.modules.get(mod_name)
        if mod is None:
            continue
        try:
            restore(mod, attr, value)
        except Exception as exc:
            failed(f"uninstall ({mod_name}.{attr})", exc)
    saved.clear()
