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
from collections.abc import Callable, Iterator
from typing import Any

from objcache.integrations.patching import marked
from objcache.integrations.torch.precompile.portable_guards import import_source
from objcache.integrations.torch.precompile.precompile_entry import unsaveable

#: Why a frame is not saved where a failed lookup has no source to check.
UNSAVED = "absent_attribute"
#: Where the names are collected: an attribute of the frame's ``OutputGraph``.
_ATTR = "_objcache_absent"

_inside_hasattr = threading.local()


@contextlib.contextmanager
def _set(local: threading.local, name: str, value: Any) -> Iterator[None]:
    """``local.<name>`` is ``value`` inside, what it was (or None) after."""
    outer = getattr(local, name, None)
    setattr(local, name, value)
    try:
        yield
    finally:
        setattr(local, name, outer)


def _collect(tx: Any, source: str, name: Any, attr: str = _ATTR) -> None:
    """``name`` looked up at ``source``, kept under ``attr`` of the frame's output graph."""
    output = getattr(tx, "output", None)
    if getattr(output, "package", None) is None:
        return  # not a frame of a precompile package
    found: dict[str, set[Any]] = output.__dict__.setdefault(attr, {})
    found.setdefault(source, set()).add(name)


def collected(output_graph: Any, attr: str = _ATTR) -> dict[str, set[Any]]:
    """The names the frame's trace did not find, by the source of what it looked in."""
    found = getattr(output_graph, "__dict__", {}).get(attr, {})
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
        with _set(_inside_hasattr, "depth", (getattr(_inside_hasattr, "depth", None) or 0) + 1):
            result = original(self, tx, name)
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
        with _set(_inside_hasattr, "depth", (getattr(_inside_hasattr, "depth", None) or 0) + 1):
            return original(self, tx, name)

    marked(call_getattr_fallback, original)
    return call_getattr_fallback


def wrap_observed_attribute_error(original: Callable[..., None]) -> Any:
    """``ObservedAttributeError.__init__``: an attribute the trace did not find outside a
    ``hasattr`` (which :func:`wrap_hasattr` answers for): the frame is not saved."""
    return _unsaveable_when_raised(original, UNSAVED, outside_hasattr=True)


#: Why a frame is not saved whose trace raised ``KeyError`` (and went on: caught).
KEY_UNSAVED = "absent_key"
#: Where the keys a dict lacked are collected: an attribute of the frame's ``OutputGraph``.
_KEYS_ATTR = "_objcache_absent_keys"
#: The keys a record can name: JSON carries each as itself.
_PLAIN_KEYS = (str, int, bool, type(None))

_dict_lookup = threading.local()


def collected_keys(output_graph: Any) -> dict[str, set[Any]]:
    """The keys the frame's trace did not find, by the source of the dict it looked in."""
    return collected(output_graph, _KEYS_ATTR)


def wrap_dict_getitem(original: Callable[..., Any]) -> Any:
    """``ConstDictVariable.getitem_const_raise_exception_if_absent`` (``D[k]``): while it
    runs, the ``KeyError`` it raises for an absent key is known to be that dict's, so
    :func:`wrap_observed_key_error` can keep the absence as a record instead of leaving the
    frame unsaved."""

    def getitem_const_raise_exception_if_absent(self: Any, tx: Any, arg: Any) -> Any:
        with _set(_dict_lookup, "current", (self, tx, arg)):
            return original(self, tx, arg)

    marked(getitem_const_raise_exception_if_absent, original)
    return getitem_const_raise_exception_if_absent


def _collect_absent_key() -> bool:
    """Whether the ``KeyError`` being made is a dict lookup's whose absence a record can
    carry: a constant key of a plain type, in a dict a guard's source names (collected at
    that source), or in a dict the frame made (its keys come from what the trace read and
    torch guarded: nothing to carry)."""
    current = getattr(_dict_lookup, "current", None)
    if current is None:
        return False
    variable, tx, arg = current
    key, text = _key_and_source(variable, arg)
    if type(key) not in _PLAIN_KEYS or (text is None and getattr(variable, "source", None)):
        return False
    if text is not None:
        _collect(tx, text, key, _KEYS_ATTR)
    return True


def _key_and_source(variable: Any, arg: Any) -> tuple[Any, str | None]:
    """The constant ``arg`` stands for (else ``arg`` itself, no plain key) and the text of
    the dict ``variable``'s source (None where it has none)."""
    key = arg.as_python_constant() if arg.is_python_constant() else arg
    source = getattr(variable, "source", None)
    text = None if source is None else source.name() if callable(source.name) else source.name
    return key, text if isinstance(text, str) else None


#: Where the keys an object's ``__dict__`` held when the trace asked are collected.
_PRESENT_ATTR = "_objcache_present_keys"
#: Why a frame is not saved that read the whole key set of an object's ``__dict__``.
INSTANCE_DICT_UNSAVED = "instance_dict_keys"


def collected_present_keys(output_graph: Any) -> dict[str, set[Any]]:
    """The keys an object's ``__dict__`` held when the trace asked, by its source."""
    return collected(output_graph, _PRESENT_ATTR)


def wrap_instance_dict_contains(original: Callable[..., Any]) -> Any:
    """``DunderDictVariable.install_dict_contains_guard`` (``"k" in obj.__dict__``,
    ``vars(obj).get("k", d)``): torch's installs nothing (it tracks the dict's mutations, not
    its state when the frame starts), so the answer is collected at the dict's source, an
    ``ABSENT_KEYS`` or a ``PRESENT_KEYS`` record; a key a record cannot carry makes the frame
    unsaveable."""

    def install_dict_contains_guard(self: Any, tx: Any, args: Any) -> Any:
        try:
            _collect_instance_key(self, tx, args[0])
        except Exception:
            unsaveable(tx, KEY_UNSAVED)
        return original(self, tx, args)

    marked(install_dict_contains_guard, original)
    return install_dict_contains_guard


def _collect_instance_key(variable: Any, tx: Any, arg: Any) -> None:
    if getattr(variable, "source", None) is None:
        return  # an object the frame made: what it holds the trace put there
    key, text = _key_and_source(variable, arg)
    if type(key) not in _PLAIN_KEYS or text is None:
        unsaveable(tx, KEY_UNSAVED)
    else:
        _collect(tx, text, key, _KEYS_ATTR if arg not in variable else _PRESENT_ATTR)


def wrap_instance_dict_keys(original: Callable[..., Any]) -> Any:
    """``DunderDictVariable.install_dict_keys_match_guard`` (``len(obj.__dict__)``, its keys,
    items, a copy): torch's installs nothing, and no record carries a whole key set: the
    frame is not saved where the dict has a source."""

    def install_dict_keys_match_guard(self: Any) -> Any:
        if getattr(self, "source", None) is not None:
            _mark_tracing(INSTANCE_DICT_UNSAVED)
        return original(self)

    marked(install_dict_keys_match_guard, original)
    return install_dict_keys_match_guard


def _mark_tracing(why: str) -> None:
    """The frame being traced is not saved (``unsaved:<why>``), found by torch's tracing
    context where no translator is at hand."""
    with contextlib.suppress(Exception):
        from torch._guards import TracingContext

        context = TracingContext.try_get()
        if context is not None:
            context.__dict__.setdefault("_objcache_unsaveable", why)


def wrap_observed_key_error(original: Callable[..., None]) -> Any:
    """``ObservedKeyError.__init__``: a key the trace did not find. In a dict a record can
    name (:func:`wrap_dict_getitem`; transformers' attention registry is asked for
    ``"eager"`` that way) the absence is collected for an ``ABSENT_KEYS`` record; elsewhere
    (``os.getenv``, which reads ``os.environ``, a mapping of the program's own, a key with
    no constant value) torch keeps only the container's type, no guard that the key is
    absent (the forty-sixth review: a reader that had the key, or another value of the
    environment variable, was served the writer's default): the frame is not saved."""
    return _unsaveable_when_raised(original, KEY_UNSAVED, outside_hasattr=False)


def _unsaveable_when_raised(original: Callable[..., None], why: str, outside_hasattr: bool) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if outside_hasattr and getattr(_inside_hasattr, "depth", None):
            return
        with contextlib.suppress(Exception):
            if not outside_hasattr and _collect_absent_key():
                return
        _mark_tracing(why)

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
