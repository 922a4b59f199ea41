"""What one integration part patches in another package: the wrappers, marked as objcache's,
and the ledger that puts the originals back."""

from __future__ import annotations

from collections.abc import Callable
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


def marked(wrapper: F, original: Callable[..., Any]) -> F:
    """``wrapper`` marked as objcache's (``__objcache__``: an apply finds it already there) and
    pointing at what it wraps (``__wrapped__``)."""
    wrapper.__objcache__ = True  # type: ignore[attr-defined]
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapper
