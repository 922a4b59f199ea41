"""Compile windows: torch at work compiling (each frame compile, each lazy backward compile,
each call of Inductor as a backend, ``aot_compile``'s and vLLM's too, each graph compile, a
served entry's load), nested, counted process-wide.

The program's code does not run inside one, so what it registered and edited (the readings
of precompile's ``inductor_namespace``, ``torch_edits``, ``op_overrides``) is read once per
outermost window and thread, then shared by every key computed in it. A lazy backward is a
window of its own (torch compiles it under its forward's compile id, after the program ran
on), so a program's change between a forward and its backward is read again.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
#: windows open now (a graph compile nests in its frame compile)
_depth = [0]
#: outermost windows opened so far
_serial = [0]


def opened() -> bool:
    """A window opens; returns whether it is the outermost one."""
    with _lock:
        outermost = not _depth[0]
        if outermost:
            _serial[0] += 1
        _depth[0] += 1
        return outermost


def closed() -> bool:
    """A window closes; returns whether none is open any more."""
    with _lock:
        _depth[0] = max(0, _depth[0] - 1)
        return not _depth[0]


def open_now() -> bool:
    """Whether a window is open."""
    return bool(_depth[0])


def reading_id() -> tuple[int, int] | None:
    """What one reading may be shared under: (the outermost window, the thread) while one is
    open; None outside every window (read afresh)."""
    with _lock:
        if not _depth[0]:
            return None
        return _serial[0], threading.get_ident()


def reset() -> None:
    """No window open (tests)."""
    with _lock:
        _depth[0] = 0
