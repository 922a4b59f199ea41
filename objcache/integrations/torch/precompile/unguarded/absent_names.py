"""Names a trace looked up and did not find, as records of a precompile entry
(docs/torch.md, "What a served entry depends on").

Dynamo bakes into a frame's code what a failed lookup decided and torch guards none of it
across processes (one process never adds a name it looked up in vain):

* a **builtin** (``abs``, ``len``) is reached past the module's globals: a reader whose
  module defines that name (``from fastops import abs`` where it is installed) runs its own
  function, the writer's code the builtin;
* an **attribute a check found absent**: ``hasattr(helpmod, "fast")``,
  ``getattr(self, "use_fast", False)``, ``hasattr(torch.ops.lib, "op")``, a class attribute
  defined only where a switch is on.

While a frame of a precompile package is traced, each such name is collected with the
source of the object it was looked up in (the module of the code that loaded a builtin;
the object ``hasattr`` asked): :func:`.portable_guards.absent_records` makes one
``ABSENT_NAMES`` record per source,
which the reader checks (:func:`.portable_guards.check_for`, until the whole guard first
holds, as a compile there would have looked then). A failed lookup whose object has no
source torch could name (an object made inside the frame aside), or one the trace caught
itself (``try: x.attr except AttributeError``, or a ``getattr`` default where Dynamo answers
it without ``hasattr``), makes the frame unsaveable (``unsaved:absent_attribute``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any

from objcache.integrations.patching import marked
from objcache.integrations.torch.precompile.portable_guards import import_source
from objcache.integrations.torch.precompile.precompile_entry import unsaveable

#: Why a frame is not saved where a failed lookup has no source to check.
UNSAVED = "absent_attribute"
#: Where the names are collected: an attribute of the frame's ``OutputGraph``.
_ATTR = "_objcache_absent"

_inside_hasattr = threading.local()


def _collect(tx: Any, source: str, name: str) -> None:
    output = getattr(tx, "output", None)
    if getattr(output, "package", None) is None:
        return  # not a frame of a precompile package
    found: dict[str, set[str]] = output.__dict__.setdefault(_ATTR, {})
    found.setdefault(source, set()).add(name)


def collected(output_graph: Any) -> dict[str, set[str]]:
    """The names the frame's trace did not find, by the source of what it looked in."""
    found = getattr(output_graph, "__dict__", {}).get(_ATTR, {})
    return found if isinstance(found, dict) else {}


def module_source(f_globals: Any) -> str | None:
    """``__import__('top').sub`` naming the loaded module whose globals are ``f_globals``, or
    None where none holds them (an ``exec`` of a string). Found by its ``__name__`` first,
    else among the loaded modules (``_collections_abc`` names itself ``collections.abc``)."""
    if not isinstance(f_globals, dict):
        return None
    known = _sources.get(id(f_globals))
    if known is not None and known[0] is f_globals:
        return known[1]
    name = f_globals.get("__name__")
    module = sys.modules.get(name) if isinstance(name, str) else None
    if module is None or getattr(module, "__dict__", None) is not f_globals:
        name = next(
            (
                key
                for key, loaded in list(sys.modules.items())
                if getattr(loaded, "__dict__", None) is f_globals and isinstance(key, str)
            ),
            None,
        )
    source = None if name is None else import_source(name)
    if len(_sources) > 4096:
        _sources.clear()
    _sources[id(f_globals)] = (f_globals, source)
    return source


#: id of a module's globals -> (those globals, the module's source or None)
_sources: dict[int, tuple[dict[str, Any], str | None]] = {}


def class_source(cls: Any) -> str | None:
    """The source naming class ``cls`` by its module and qualified name, where that path
    reaches it, else None (a class made in a function)."""
    module_name = getattr(cls, "__module__", None)
    qualname = getattr(cls, "__qualname__", None)
    if not isinstance(module_name, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    target: Any = sys.modules.get(module_name)
    if target is None:
        return None
    for part in qualname.split("."):
        target = getattr(target, part, None)
    return import_source(module_name, *qualname.split(".")) if target is cls else None


def wrap_load_builtin(original: Callable[..., Any]) -> Any:
    """``InstructionTranslatorBase.load_builtin_from_argval``: Dynamo reached ``argval``
    past the globals of the code it traces; that the module does not define it is a fact."""

    def load_builtin_from_argval(self: Any, argval: Any) -> Any:
        with contextlib.suppress(Exception):
            source = module_source(getattr(self, "f_globals", None))
            if source is None:
                unsaveable(self, UNSAVED)
            elif isinstance(argval, str):
                _collect(self, source, argval)
        return original(self, argval)

    marked(load_builtin_from_argval, original)
    return load_builtin_from_argval


def wrap_hasattr(original: Callable[..., Any]) -> Any:
    """A ``VariableTracker`` class's ``call_obj_hasattr``: a False answer is collected at
    the object's source, or for an object the frame made (no source) at its class's (an
    attribute the object lacks its class lacks too); where neither is there the frame is
    unsaveable."""

    def call_obj_hasattr(self: Any, tx: Any, name: Any) -> Any:
        depth = getattr(_inside_hasattr, "depth", 0)
        _inside_hasattr.depth = depth + 1
        try:
            result = original(self, tx, name)
        finally:
            _inside_hasattr.depth = depth
        with contextlib.suppress(Exception):
            if result.is_python_constant() and result.as_python_constant() is False:
                source = getattr(self, "source", None)
                text = getattr(source, "name", None) if source is not None else None
                text = text() if callable(text) else text
                if source is None:  # an object the frame made: looked up through its class
                    text = class_source(self.python_type())
                if isinstance(text, str) and isinstance(name, str):
                    _collect(tx, text, name)
                else:
                    unsaveable(tx, UNSAVED)
        return result

    marked(call_obj_hasattr, original)
    return call_obj_hasattr


def wrap_function_getattr_fallback(original: Callable[..., Any]) -> Any:
    """``BaseUserFunctionVariable.call_getattr_fallback``: an attribute a Python function
    does not have (``inspect.signature`` tries ``fn.__signature__`` and
    ``fn._partialmethod`` and catches the ``AttributeError``). Where the function is
    reached by its module and qualified name (the very function) the name is collected
    there, a record the reader checks like a ``hasattr`` found absent, and the error the
    trace then catches does not make the frame unsaveable; elsewhere as before."""

    def call_getattr_fallback(self: Any, tx: Any, name: Any) -> Any:
        text = None
        with contextlib.suppress(Exception):
            text = class_source(self.get_function())
        if not isinstance(text, str) or not isinstance(name, str):
            return original(self, tx, name)
        _collect(tx, text, name)
        depth = getattr(_inside_hasattr, "depth", 0)
        _inside_hasattr.depth = depth + 1
        try:
            return original(self, tx, name)
        finally:
            _inside_hasattr.depth = depth

    marked(call_getattr_fallback, original)
    return call_getattr_fallback


def wrap_observed_attribute_error(original: Callable[..., None]) -> Any:
    """``ObservedAttributeError.__init__``: an attribute the trace did not find outside a
    ``hasattr`` (which :func:`wrap_hasattr` answers for): the frame is not saved."""
    return _unsaveable_when_raised(original, UNSAVED, outside_hasattr=True)


#: Why a frame is not saved whose trace raised ``KeyError`` (and went on: caught).
KEY_UNSAVED = "absent_key"


def wrap_observed_key_error(original: Callable[..., None]) -> Any:
    """``ObservedKeyError.__init__``: a key the trace did not find (``try: D["k"] except
    KeyError``, ``Mapping.get``, ``os.getenv``, which reads ``os.environ`` that way): torch
    keeps only the dict's type, no guard that the key is absent (the forty-sixth review: a
    reader that had the key, or another value of the environment variable, was served the
    writer's default): the frame is not saved."""
    return _unsaveable_when_raised(original, KEY_UNSAVED, outside_hasattr=False)


def _unsaveable_when_raised(original: Callable[..., None], why: str, outside_hasattr: bool) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if outside_hasattr and int(getattr(_inside_hasattr, "depth", 0)):
            return
        with contextlib.suppress(Exception):
            from torch._guards import TracingContext

            context = TracingContext.try_get()
            if context is not None:
                context.__dict__.setdefault("_objcache_unsaveable", why)

    marked(__init__, original)
    return __init__


def hasattr_classes(base: type) -> list[type]:
    """``base`` and each of its subclasses that defines ``call_obj_hasattr`` itself."""
    seen: list[type] = []
    stack = [base]
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.append(cls)
        stack.extend(cls.__subclasses__())
    return [cls for cls in seen if callable(cls.__dict__.get("call_obj_hasattr"))]
