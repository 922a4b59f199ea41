"""Triton's host-side modules through objcache: the driver's utilities and kernel launchers.

Before its first kernel runs, Triton builds small C extension modules with the system C
compiler (``triton.runtime.build.compile_module_from_src``): the NVIDIA driver's
``cuda_utils`` and, for a kernel Triton launches itself, a ``__triton_launcher`` per
signature. It keeps each in its own cache directory under ``sha256(source + platform)``. A
machine with a warm ``TRITON_CACHE_DIR`` loads them; a new machine runs the compiler again.
On an H100 host that was 0.4 s at the first kernel load, inside torch's AOTAutograd cache
load: the one phase a new machine spent longer in than torch's own warm start
(docs/benchmarks.md, "GPU"). Torch's FX entries carry the kernels, never these modules.

``compile_module_from_src`` looks up ``get_cache_manager`` in its module at every call, so
the hook wraps that one name in ``triton.runtime.build``: whatever bound the build function
earlier (the driver does, at import) goes through it too, and no other Triton cache does.
The manager it returns is Triton's own, answering as before, except that

* ``get_file(name)`` on a miss asks objcache (kind ``triton-host``), keyed by Triton's key,
  the file name (it carries Python's extension suffix) and the C compiler's identity, under
  the environment namespace (Triton, Python, CUDA, GPU). A hit was verified by objcache's
  codec (checksum; signature where keys are set) and is at most :data:`MAX_BYTES`; Triton's
  own manager writes it into Triton's directory and Triton loads it from there. Where that
  load fails, Triton builds the module again, as without objcache.
* ``put(data, name)``, Triton keeping what it just built, also stores it in objcache
  (write-behind: the compile never waits for the store).

Only Triton's default file manager is wrapped, and only while Triton builds with the C
compiler (no ``knobs.build.impl``): with objcache's Triton remote mode
(:mod:`objcache.integrations.triton`, which carries these modules itself) or any other
manager nothing changes. Nothing here raises into Triton: every failure is a counted miss,
logged once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from objcache.integrations import cache_client
from objcache.integrations.patching import Patches, is_marked, marked
from objcache.observe.metrics import FailureLog

log = logging.getLogger("objcache.triton")

#: The Triton module this part patches.
BUILD = "triton.runtime.build"
#: objcache kind of a host-side module.
KIND = "triton-host"
#: Largest module served (the driver's utilities are about 100 KB).
MAX_BYTES = 8 * 1024 * 1024
_FORMAT = "objcache-triton-host-v1"

counters: Counter[str] = Counter()
_failed = FailureLog(
    log,
    "triton-host",
    counters,
    "errors:",
    "objcache: Triton host module %s failed; Triton goes on as without objcache there: %r",
)
_lock = threading.Lock()
_patched = Patches()
_compiler_ids: dict[str, str] = {}


def compiler_identity() -> str:
    """The C compiler Triton's build would run (``CC``, else gcc, else clang) and the first
    line of its ``--version``; ``"none"`` where there is none (Triton then fails to build
    as it would without objcache)."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang") or ""
    if not cc:
        return "none"
    cached = _compiler_ids.get(cc)
    if cached is None:
        try:
            out = subprocess.run(
                [cc, "--version"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
            cached = f"{os.path.basename(cc)}:{out.splitlines()[0] if out else '?'}"
        except (OSError, subprocess.SubprocessError):
            cached = f"{os.path.basename(cc)}:?"
        _compiler_ids[cc] = cached
    return cached


def module_key(triton_key: str, filename: str) -> str:
    """objcache key of one built module: Triton's key (its source and platform), the file
    name (with Python's extension suffix) and the compiler."""
    h = hashlib.sha256(_FORMAT.encode() + b"\0")
    for part in (triton_key, filename, compiler_identity()):
        h.update(f"{part}\0".encode())
    return h.hexdigest()


class _HostModules:
    """Triton's file cache manager for one host module's key, with objcache behind it."""

    def __init__(self, inner: Any, triton_key: str) -> None:
        self._inner = inner
        self._triton_key = triton_key
        self._served: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get_file(self, filename: str) -> str | None:
        path = self._inner.get_file(filename)
        if path is not None:
            counters["local"] += 1
            return str(path)
        data = self._fetch(filename)
        if data is None:
            return None
        try:
            placed = self._inner.put(data, filename, binary=True)
        except Exception as exc:
            _failed("write into Triton's cache", exc)
            return None
        self._served.add(filename)
        counters["hits"] += 1
        return str(placed)

    def _fetch(self, filename: str) -> bytes | None:
        try:
            data = cache_client.get_client().get(KIND, module_key(self._triton_key, filename))
        except Exception as exc:
            _failed("lookup", exc)
            return None
        if data is None:
            counters["misses"] += 1
            return None
        if len(data) > MAX_BYTES:
            counters["rejected:oversized"] += 1
            return None
        return bytes(data)

    def put(self, data: Any, filename: str, binary: bool = True) -> Any:
        path = self._inner.put(data, filename, binary=binary)
        if filename not in self._served:
            try:
                payload = data if isinstance(data, bytes) else bytes(data, "utf-8")
                if len(payload) <= MAX_BYTES:
                    cache_client.get_client().put(
                        KIND, module_key(self._triton_key, filename), payload
                    )
                    counters["stored"] += 1
            except Exception as exc:
                _failed("store", exc)
        return path


def _on() -> bool:
    return bool(getattr(cache_client.get_client().config, "triton_host", True))


def _builds_with_cc(build: Any) -> bool:
    knobs = getattr(build, "knobs", None)
    return getattr(getattr(knobs, "build", None), "impl", None) is None


def _wrap(original: Callable[[Any], Any], build: Any, file_manager: type) -> Any:
    def get_cache_manager(key: Any) -> Any:
        manager = original(key)
        try:
            if type(manager) is not file_manager or not _builds_with_cc(build) or not _on():
                return manager
            return _HostModules(manager, str(key))
        except Exception as exc:
            _failed("wrap", exc)
            return manager

    return marked(get_cache_manager, original)


def apply(build: Any) -> bool:
    """Carry Triton's host-side modules through objcache; False (nothing patched) where this
    Triton builds them another way (feature-detected, logged once)."""
    with _lock:
        original = getattr(build, "get_cache_manager", None)
        builder = getattr(build, "compile_module_from_src", None)
        file_manager = getattr(sys.modules.get("triton.runtime.cache"), "FileCacheManager", None)
        if not callable(original) or not callable(builder) or not isinstance(file_manager, type):
            counters["off:no_hooks"] += 1
            log.info("objcache: this Triton builds host modules another way; part off")
            return False
        if is_marked(original):
            return True
        _patched.set(build, "get_cache_manager", _wrap(original, build, file_manager))
        return True


def uninstall() -> None:
    """Put back what :func:`apply` patched."""
    with _lock:
        _patched.undo()


def installed() -> bool:
    return bool(_patched)
