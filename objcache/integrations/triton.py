"""Triton's kernel cache through objcache (user guide: docs/triton.md).

Triton (3.x) lets a remote store stand behind its on-disk kernel cache::

    TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager
    TRITON_REMOTE_CACHE_BACKEND=objcache.integrations.triton:ObjcacheTritonBackend

:func:`install` sets both (unless the user set them) and gives remote mode its own
``TRITON_CACHE_DIR``. :class:`ObjcacheTritonBackend` stores every artifact of a compiled
kernel (``.ttir`` ... ``.cubin``, ``.json`` and the ``__grp__*.json`` group file) under the
objcache key ``<triton key>/<filename>`` of kind ``triton``.

Facts about ``triton/runtime/cache.py`` (3.7.1) this module is built on:

* ``RemoteCacheManager.get_file`` asks the backend on *every* call, even when the file is
  already in ``TRITON_CACHE_DIR``, and writes what it gets back into that directory.
  objcache answers from its machine-local tier when it can, so a warm machine makes no
  remote round trip.
* ``RemoteCacheManager.put_group`` writes group files as ``{"child_paths": [names]}``;
  ``FileCacheManager.get_group`` expects ``{"child_paths": {name: path}}`` and raises
  ``AttributeError: 'list' object has no attribute 'items'`` on the list form, uncaught by
  ``triton.compile``. The two managers must therefore never share a ``TRITON_CACHE_DIR``:
  remote mode marks its directory with :data:`MARKER`, and objcache refuses remote mode on
  a directory the default manager uses.
* ``CompiledKernel.__init__`` takes whatever subset of a group's children the backend
  returned and raises ``KeyError`` when the binary is missing. A group file is therefore
  only returned together with *all* of its children (else it is a miss and Triton
  recompiles), which also makes the order in which remote writes land irrelevant.

Since RemoteCacheManager never reads ``TRITON_CACHE_DIR`` itself, what objcache cannot
serve is looked up in the files materialized there before, but only those this process
compiled or received verified from objcache (their digests are remembered): anything else
in the directory may have been planted by whoever else can write it (a shared directory)
and is never handed to Triton nor published (docs/security.md, threat model). A store that
is down or was emptied costs no recompile of what this process already had, and what it
compiled is stored back into objcache.

Nothing here raises into Triton: every failure is a miss (or a dropped write), counted in
:func:`stats` and logged once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from objcache.config.files import publish_file
from objcache.integrations import cache_client
from objcache.observe.metrics import log_once

if TYPE_CHECKING:
    from objcache.client import Client

log = logging.getLogger("objcache")

#: The objcache kind under which Triton artifacts are stored.
KIND = "triton"
#: Triton's prefix of group files (cache.py: ``f"__grp__{filename}"``).
GROUP_PREFIX = "__grp__"

MANAGER = "triton.runtime.cache:RemoteCacheManager"
BACKEND = f"{__name__}:ObjcacheTritonBackend"
ENV_MANAGER = "TRITON_CACHE_MANAGER"
ENV_BACKEND = "TRITON_REMOTE_CACHE_BACKEND"
ENV_CACHE_DIR = "TRITON_CACHE_DIR"
#: The switch ``objcache.install()`` reads (see :func:`install_from_env`).
ENV_SWITCH = "OBJCACHE_TRITON"

#: Written into a ``TRITON_CACHE_DIR`` used in remote mode.
MARKER = ".objcache-remote-mode"
_MARKER_TEXT = (
    "This Triton cache directory is used by triton.runtime.cache.RemoteCacheManager "
    "(objcache). Its __grp__*.json files list child names, a form Triton's default "
    "FileCacheManager cannot read: do not point a process without "
    "TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager at it.\n"
)
#: How many kernel directories :func:`cache_dir_mode` looks into for a group file.
_SCAN_DIRS = 64
#: Name of the remote-mode directory :func:`install` uses when ``TRITON_CACHE_DIR`` is unset
#: (under ``$TRITON_HOME/.triton``, next to Triton's default ``cache``).
DEFAULT_DIR_NAME = "objcache"

DirMode = Literal["remote", "file", "empty"]


# --- counters ------------------------------------------------------------------------------


class _Counters:
    """Process-wide counters of the backend (compile threads share them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c: Counter[str] = Counter()

    def add(self, **deltas: int) -> None:
        with self._lock:
            self._c.update(deltas)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._c)

    def clear(self) -> None:
        with self._lock:
            self._c.clear()


_counters = _Counters()


def stats() -> dict[str, int]:
    """Counters of this process.

    ``get_calls``, ``files_requested``, ``files_hit``; ``cache_dir_hits`` (served from files
    already in ``TRITON_CACHE_DIR`` that this process compiled or verified), ``republished``
    (those stored back into objcache) and ``cache_dir_refused`` (files found there that this
    process did not compile or verify: never served, never published);
    ``puts``, ``put_bytes``; ``incomplete_groups``, ``errors``, ``timeouts``, ``mixed_dir``.
    Per-tier hits and misses: ``objcache.stats()``.
    """
    return _counters.snapshot()


def reset_stats() -> None:
    _counters.clear()
    _known.clear()


class _Known:
    """Digests of the Triton files this process compiled (``put``) or received from
    objcache (verified there): the only files of ``TRITON_CACHE_DIR`` that may be handed to
    Triton or published."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._digests: dict[str, bytes] = {}

    @staticmethod
    def _digest(data: bytes) -> bytes:
        return hashlib.blake2b(data, digest_size=32).digest()

    def add(self, name: str, data: bytes) -> None:
        digest = self._digest(data)
        with self._lock:
            self._digests[name] = digest

    def matches(self, name: str, data: bytes) -> bool:
        with self._lock:
            digest = self._digests.get(name)
        return digest is not None and digest == self._digest(data)

    def clear(self) -> None:
        with self._lock:
            self._digests.clear()


_known = _Known()


def _failed(op: str, exc: BaseException) -> None:
    from objcache.bridge import BridgeTimeout

    if isinstance(exc, BridgeTimeout):
        _counters.add(timeouts=1)
        reason = "timeout"
    else:
        _counters.add(errors=1)
        reason = f"{op}:{type(exc).__name__}"
    log_once.warn(
        "triton", reason, f"objcache: Triton cache {op} failed ({exc!r}); treated as a miss"
    )


# --- the backend ---------------------------------------------------------------------------


def _group_children(data: bytes) -> list[str] | None:
    """Child file names of a group file, in either form; None when it is not one."""
    try:
        children = json.loads(data).get("child_paths")
    except (ValueError, AttributeError):
        return None
    if isinstance(children, dict):
        children = list(children)
    if not isinstance(children, list) or not all(isinstance(c, str) for c in children):
        return None
    return list(children)


def _fetch(client: Client, key: str, names: list[str]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """``(found, children)``: the payloads of ``names`` that exist, fetched concurrently
    with the children of every group file among them, in one call. A group whose children
    are not all present is dropped from ``found`` (Triton would crash on a partial group)."""
    prefix = f"{key}/"

    def children_of(okey: str, payload: bytes) -> list[str]:
        name = okey[len(prefix) :]
        if not name.startswith(GROUP_PREFIX):
            return []
        return [prefix + c for c in _group_children(payload) or ()]

    groups = any(n.startswith(GROUP_PREFIX) for n in names)
    keys = [prefix + n for n in names]
    fetched = client.get_many(KIND, keys, follow=children_of if groups else None)
    got_all = {k[len(prefix) :]: p for k, p in fetched.items()}
    found = {n: got_all[n] for n in names if n in got_all}
    children: dict[str, bytes] = {}
    for group in [n for n in found if n.startswith(GROUP_PREFIX)]:
        listed = _group_children(found[group])
        need = [c for c in listed or () if c not in found and c not in children]
        got = [got_all.get(c) for c in need]
        if listed is None or any(p is None for p in got):
            del found[group]
            _counters.add(incomplete_groups=1)
            log_once.warn(
                "triton",
                "incomplete_group",
                f"objcache: Triton group {key}/{group} is corrupt or misses children; "
                "treated as a miss",
            )
            continue
        children.update({c: p for c, p in zip(need, got, strict=True) if p is not None})
    return found, children


class _BackendImpl:
    """The implementation of :class:`ObjcacheTritonBackend`, free of Triton imports.

    Triton builds one backend per ``RemoteCacheManager``, i.e. per kernel lookup, so
    construction only stores the key; the process-wide client is fetched on first use.
    """

    def __init__(self, key: str, client: Client | None = None) -> None:
        self._key = key
        self._client = client
        #: Children fetched with their group file, handed to the next ``get`` without a
        #: round trip (RemoteCacheManager.get_group asks for them right after the group).
        self._ready: dict[str, bytes] = {}
        #: Where RemoteCacheManager materializes this kernel's files (its FileCacheManager
        #: reads the same knob right after building the backend, in
        #: ``RemoteCacheManager.__init__``).
        cache_dir = _check_current_dir()
        self._dir = os.path.join(cache_dir, key) if cache_dir else None

    @property
    def key(self) -> str:
        return self._key

    def _get_client(self) -> Client:
        if self._client is None:
            self._client = cache_client.get_client()
        return self._client

    def get(self, filenames: Iterable[str]) -> dict[str, bytes]:
        """The stored bytes of those ``filenames`` that objcache has (one bridge call).

        What objcache cannot serve (a miss everywhere, or objcache failing) is looked up in
        the files RemoteCacheManager already materialized in ``TRITON_CACHE_DIR``, so that a
        broken or emptied store costs no recompile of what this machine already has.
        """
        try:
            names = [str(n) for n in dict.fromkeys(filenames)]
        except Exception as exc:
            _failed("get", exc)
            return {}
        found = {n: self._ready.pop(n) for n in names if n in self._ready}
        todo = [n for n in names if n not in found]
        if todo:
            try:
                fetched, ready = _fetch(self._get_client(), self._key, todo)
                found.update(fetched)
                self._ready.update(ready)
                for name, data in {**fetched, **ready}.items():
                    _known.add(f"{self._key}/{name}", data)
            except Exception as exc:
                _failed("get", exc)
            try:
                local = self._from_cache_dir([n for n in todo if n not in found])
            except Exception as exc:
                _failed("get", exc)
                local = {}
            if local:
                self._publish(local)
                found.update({n: d for n, d in local.items() if n in todo})
        _counters.add(get_calls=1, files_requested=len(names), files_hit=len(found))
        return found

    def _read_local(self, filename: str) -> bytes | None:
        """``filename`` from this kernel's folder, only when this process compiled or
        verified those very bytes; anything else there is refused, counted, logged once."""
        if self._dir is None or os.sep in filename or filename in ("", ".", ".."):
            return None
        try:
            fd = os.open(os.path.join(self._dir, filename), os.O_RDONLY | os.O_NOFOLLOW)
            with open(fd, "rb") as f:
                data = f.read()
        except OSError:
            return None
        if _known.matches(f"{self._key}/{filename}", data):
            return data
        _counters.add(cache_dir_refused=1)
        log_once.warn(
            "triton",
            "cache_dir_refused",
            f"objcache: refused {self._key}/{filename} found in TRITON_CACHE_DIR: this process "
            "neither compiled nor verified it; never served or published",
        )
        return None

    def _from_cache_dir(self, names: list[str]) -> dict[str, bytes]:
        """Every file read from this kernel's ``TRITON_CACHE_DIR`` folder for ``names``.

        A group file only counts when every child is available too; the children read for
        it are returned as well and handed to the next ``get`` through ``_ready``.
        """
        read: dict[str, bytes] = {}
        for name in names:
            data = self._read_local(name)
            if data is None:
                continue
            if name.startswith(GROUP_PREFIX):
                listed = _group_children(data)
                if listed is None:
                    continue
                children = {c: self._ready.get(c) or self._read_local(c) for c in listed}
                fresh = {c: v for c, v in children.items() if v is not None}
                if len(fresh) != len(children):
                    continue
                for child, value in fresh.items():
                    if child not in self._ready:
                        self._ready[child] = read[child] = value
            read[name] = data
        if read:
            _counters.add(cache_dir_hits=len(read))
        return read

    def _publish(self, files: dict[str, bytes]) -> None:
        """Store files objcache lacked but this process compiled or verified (only those get
        past :meth:`_read_local`), in one bridge call, so that the fleet gets them: the local
        tier now, the remote tiers in the background."""

        try:
            self._get_client().put_many(KIND, {f"{self._key}/{n}": d for n, d in files.items()})
            _counters.add(republished=len(files))
        except Exception as exc:
            _failed("put", exc)

    def put(self, filename: str, data: bytes | bytearray | memoryview | str) -> None:
        """Store one artifact: local tier now, remote tiers in the background."""
        try:
            payload = data.encode() if isinstance(data, str) else bytes(data)
            _known.add(f"{self._key}/{filename}", payload)  # compiled by this process
            self._get_client().put(KIND, f"{self._key}/{filename}", payload)
            _counters.add(puts=1, put_bytes=len(payload))
        except Exception as exc:
            _failed("put", exc)


_backend_cls: type[Any] | None = None
_backend_lock = threading.Lock()


def backend_class() -> type[Any]:
    """``ObjcacheTritonBackend``: :class:`_BackendImpl` as a Triton ``RemoteCacheBackend``.

    Built on first use so that importing this module does not import Triton (objcache's
    ``install()`` imports it in every process).
    """
    global _backend_cls
    with _backend_lock:
        if _backend_cls is None:
            from triton.runtime.cache import RemoteCacheBackend

            _backend_cls = type(
                "ObjcacheTritonBackend",
                (_BackendImpl, RemoteCacheBackend),
                {"__module__": __name__, "__doc__": _BackendImpl.__doc__},
            )
        return _backend_cls


def __getattr__(name: str) -> Any:
    # Triton resolves TRITON_REMOTE_CACHE_BACKEND with getattr(module, "ObjcacheTritonBackend").
    if name == "ObjcacheTritonBackend":
        return backend_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- one TRITON_CACHE_DIR, one manager -----------------------------------------------------


def _group_form(path: str) -> DirMode | None:
    try:
        with open(path, "rb") as f:
            children = json.load(f).get("child_paths")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(children, dict):
        return "file"
    if isinstance(children, list):
        return "remote"
    return None


def cache_dir_mode(path: str | os.PathLike[str]) -> DirMode:
    """Which manager a Triton cache directory belongs to.

    ``remote``: it carries :data:`MARKER`, or its group files are in list form;
    ``file``: its group files are in Triton's default (path-mapping) form;
    ``empty``: no group file found (absent, empty, or only unfinished compiles).
    Looks into at most ``_SCAN_DIRS`` kernel directories.
    """
    root = Path(path)
    if (root / MARKER).exists():
        return "remote"
    try:
        entries = list(os.scandir(root))
    except OSError:
        return "empty"
    scanned = 0
    for entry in entries:
        if entry.name.startswith("tmp.") or not entry.is_dir(follow_symlinks=False):
            continue
        scanned += 1
        if scanned > _SCAN_DIRS:
            break
        try:
            names = [e.name for e in os.scandir(entry.path)]
        except OSError:
            continue
        for name in names:
            if name.startswith(GROUP_PREFIX):
                mode = _group_form(os.path.join(entry.path, name))
                if mode is not None:
                    return mode
    return "empty"


_verdicts: dict[str, bool] = {}
_verdicts_lock = threading.Lock()


def claim_cache_dir(path: str | os.PathLike[str]) -> bool:
    """Whether remote mode may use ``path``; marks it as a remote-mode directory if so.

    False (with a one-line warning, once per directory and process) when Triton's default
    FileCacheManager already uses it. The verdict is remembered for the process, so that
    this is cheap on every backend construction.
    """
    key = os.path.abspath(os.fspath(path))
    with _verdicts_lock:
        verdict = _verdicts.get(key)
        if verdict is not None:
            return verdict
        verdict = cache_dir_mode(key) != "file"
        if verdict:
            _write_marker(Path(key))
        else:
            log.warning(
                "objcache: TRITON_CACHE_DIR=%s is used by Triton's default FileCacheManager, "
                "which cannot read the list-form group files of RemoteCacheManager; not "
                "using remote mode there (give remote mode its own TRITON_CACHE_DIR)",
                key,
            )
        _verdicts[key] = verdict
        return verdict


def _write_marker(root: Path) -> None:
    marker = root / MARKER
    if marker.exists():
        return
    try:  # a random temporary name, never a planted link (objcache/config/files.py)
        publish_file(root, [MARKER], _MARKER_TEXT.encode(), mode=0o644, create_root=True)
    except OSError as exc:
        log.debug("cannot write %s: %s", marker, exc)


def _check_current_dir() -> str | None:
    """Triton's current cache dir; warns (once) when it belongs to the default manager.

    A default-manager dir is reached when the knobs were set by hand or
    ``TRITON_CACHE_DIR`` changed after :func:`install`. The backend keeps serving:
    RemoteCacheManager writes into the directory whatever the backend does, and serving at
    least saves the recompiles.
    """
    try:
        from triton import knobs

        path = str(knobs.cache.dir)
        if path and not claim_cache_dir(path):
            _counters.add(mixed_dir=1)
        return path or None
    except Exception as exc:
        log.debug("cannot check the Triton cache dir: %r", exc)
        return None


# --- install / uninstall -------------------------------------------------------------------

#: Environment variables :func:`install` set in this process, with the values it set.
_installed: dict[str, str] = {}


def default_cache_dir() -> str:
    """The remote-mode ``TRITON_CACHE_DIR`` used when the user set none."""
    from triton import knobs

    return str(knobs.cache.get_triton_dir(DEFAULT_DIR_NAME))


def install() -> bool:
    """Route Triton's kernel cache through objcache. True when objcache serves it.

    Sets ``TRITON_CACHE_MANAGER`` and ``TRITON_REMOTE_CACHE_BACKEND`` in ``os.environ``
    (Triton reads them at every compile, and compile subprocesses inherit them) unless the
    user set either of them, in the environment or in ``triton.knobs``. When
    ``TRITON_CACHE_DIR`` is unset, points it at ``$TRITON_HOME/.triton/objcache`` so that
    remote mode never shares a directory with the default manager. Falls back to Triton's
    default cache, with a one-line warning, when the directory belongs to the default manager.
    """
    try:
        from triton import knobs
    except ImportError:
        log_once.warn("triton", "import", "objcache: Triton integration asked for, Triton absent")
        return False
    manager, backend = os.environ.get(ENV_MANAGER), os.environ.get(ENV_BACKEND)
    ours = manager == MANAGER and backend == BACKEND
    by_hand = {"manager_class", "remote_manager_class"} & set(vars(knobs.cache))
    if not ours and (manager is not None or backend is not None or by_hand):
        log.info(
            "objcache: %s/%s are set by the user; leaving Triton's cache alone",
            ENV_MANAGER,
            ENV_BACKEND,
        )
        return False
    set_dir = ENV_CACHE_DIR not in os.environ and "dir" not in vars(knobs.cache)
    if set_dir:
        os.environ[ENV_CACHE_DIR] = _installed[ENV_CACHE_DIR] = default_cache_dir()
    if not claim_cache_dir(knobs.cache.dir):
        uninstall()
        return False
    if not ours:
        os.environ[ENV_MANAGER] = _installed[ENV_MANAGER] = MANAGER
        os.environ[ENV_BACKEND] = _installed[ENV_BACKEND] = BACKEND
    return True


def uninstall() -> None:
    """Undo :func:`install` in this process (variables the user changed since are kept)."""
    for var, value in list(_installed.items()):
        if os.environ.get(var) == value:
            del os.environ[var]
        del _installed[var]


def enabled_by_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``OBJCACHE_TRITON`` asks for the Triton integration."""
    value = (os.environ if environ is None else environ).get(ENV_SWITCH, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def install_from_env() -> bool:
    """:func:`install` when ``OBJCACHE_TRITON=1``; what ``objcache.install()`` calls.

    Importing this module and calling this with the switch off imports nothing from Triton.
    Never raises: start-up must not fail because of the cache.
    """
    if not enabled_by_env():
        return False
    try:
        return install()
    except Exception as exc:
        log.warning("objcache: Triton integration not installed: %r", exc)
        return False


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork time stays locked forever in the child.
    global _verdicts_lock, _backend_lock
    _verdicts_lock = threading.Lock()
    _backend_lock = threading.Lock()
    _counters._lock = threading.Lock()
    _known._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
