"""The ledger of what one integration part patched in another package, to put it back."""

from __future__ import annotations

from typing import Any

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
