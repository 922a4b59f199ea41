"""CPU kernel artifacts: compiled C++ kernels (``.so``/``.o``) and precompiled headers.

On CPU neither torch's remote caches nor Mega-Cache carry the binaries g++ produced: a
remote hit in a fresh ``TORCHINDUCTOR_CACHE_DIR`` still runs one g++ per kernel, per ISA
probe (``cpu_vec_isa.py`` ``VecISA.check_build``) and for the precompiled header — tens of
seconds. Every one of those builds goes through ``CppBuilder.build``
(kernels via ``torch._inductor.codecache._worker_compile_cpp``, the header
via ``_precompile_header``, the ISA probes directly), so that is the hook:

* before g++ runs, the output is looked up in objcache (kind ``kernel``) under a
  content-addressed key and, on a hit, written to the path torch expects;
* after g++ ran, the output is stored (in the background: a precompiled header is 150 MB).

The key is what decides the binary, independent of where things live on this machine: the
content of every input file on the command line (sources, the ``-include`` header, link
inputs), the command line with machine-specific directories (torch, Python, the cache and
temp dirs) replaced by placeholders, the compiler's identity (``g++ -v``) and, when the
flags say ``-march=native``, what *native* means here (``g++ -march=native -Q
--help=target``). torch's own file names hash the command line including absolute paths,
so they differ between machines whose virtualenvs differ; objcache's key does not. Entries
also live in the environment namespace (torch, Python, CPU ISA, architecture).

**Deferred precompiled header.** ``_precompile_header`` builds the header before torch knows
whether any kernel needs compiling (``CppCodeCache.load_async``). objcache defers that build: the
header is built (or fetched) only when a kernel that includes it actually has to be
compiled. When every kernel comes from the cache, the header is never built at all.
Preprocessing runs (``g++ -E``, used by torch to hash the header) are not cached.

**The vector-ISA probe's verdict travels with its binary.** Before choosing kernel flags,
torch builds small probe libraries (``VecISA.check_build``) and dlopens each in a child
Python (``VecISA._probe_load``); from 2.14 on it leaves a ``<probe>.so.load_ok`` marker
beside the library when the child succeeded and skips the child whenever the marker is there
(2.13 runs the child every time). A machine whose probe binaries came from objcache has no
marker, so each probe spawns a child — about a second in all on the first compile, the whole
gap between a new machine and torch's own warm cache on 2.14/2.15. So the verdict is
carried as torch leaves it: when torch's own probe of a library succeeds, objcache stores a
small record under the library's content key plus ``.load_ok``; when torch probes a library
objcache placed in this process and that record is in the store, the child is skipped and
torch writes its marker itself. A missing, unreadable or unverifiable record is a miss: the
child runs, exactly as without objcache (docs/torch.md, "CPU kernels and the deferred
precompiled header").
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import hashlib
import logging
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from objcache.config.files import publish_file
from objcache.integrations import cache_client
from objcache.integrations.patching import is_marked, marked
from objcache.integrations.torch.kernels import kernel_headers
from objcache.observe.metrics import log_once

log = logging.getLogger("objcache.torch")

KIND = "kernel"
#: The kind of a probe binary's dlopen verdict: its own, so that ``kernel`` lookups count
#: kernels (a store holding only a Mega-Cache bundle has the binaries but no verdicts).
VERDICT_KIND = "isa-probe"
#: k2: the compiler's search context in the key, a binary stored with its headers' record
#: (:mod:`.kernel_headers`); a k1 entry is never read.
KEY_VERSION = "k2"
#: How many builders are remembered for Mega-Cache bundles.
MAX_RECORDED = 20_000

_counters: Counter[str] = Counter()
_counter_lock = threading.Lock()
_pch_lock = threading.Lock()
#: Deferred precompiled headers: output path -> (builder, original build).
_pending_pch: dict[str, tuple[Any, Callable[[Any], None]]] = {}
#: Builders created in this process (for bundles); only ones with absolute targets.
_recorded: deque[Any] = deque(maxlen=MAX_RECORDED)
_compiler_ids: dict[str, str] = {}
_native_ids: dict[str, str] = {}
_roots_cache: list[tuple[str, str]] | None = None
_fixed_roots: list[tuple[str, str]] | None = None
_originals: dict[str, Any] = {}
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_pid = 0
_inflight: set[concurrent.futures.Future[None]] = set()
#: Suffix of the record saying torch's dlopen probe of a binary succeeded (its marker's name).
LOAD_OK = ".load_ok"
#: Outputs of this process: target path -> (content key, whether objcache placed it).
_outputs: dict[str, tuple[str, bool]] = {}
_outputs_lock = threading.Lock()
#: Told each output this process built or fetched (kernel_places.note: where it lives).
output_listeners: list[Callable[[Plan], None]] = []


def count(name: str, n: int = 1) -> None:
    with _counter_lock:
        _counters[name] += n


def counters() -> dict[str, int]:
    """Kernel-layer counters of this process: builds, fetched, stored, deferred headers..."""
    with _counter_lock:
        return dict(_counters)


def _warn_once(what: str, exc: BaseException) -> None:
    count("errors")
    log_once.failure(
        log, "torch.kernels", what, "objcache: kernel cache %s failed (build goes on): %r",
        what, exc,
    )  # fmt: skip


# --- keys ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    key: str
    target: str
    precompiled_header: bool
    #: The build's command line (what the headers' record is made from where it is built).
    command: tuple[str, ...] = ()


_digest = kernel_headers.digest


def _file_digest(path: str) -> str:
    h = hashlib.blake2b(digest_size=20)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def compiler_id(compiler: str) -> str:
    """A digest of ``<compiler> -v`` (torch's own notion of the compiler's identity)."""
    cached = _compiler_ids.get(compiler)
    if cached is None:
        try:
            from torch._inductor.cpp_builder import get_compiler_version_info

            info = get_compiler_version_info(compiler)
        except Exception:
            info = ""
        cached = _digest(compiler if not info else "", info)
        _compiler_ids[compiler] = cached
    return cached


def native_id(compiler: str) -> str:
    """What ``-march=native`` resolves to here (the -m flags g++ enables)."""
    cached = _native_ids.get(compiler)
    if cached is None:
        text = ""
        try:
            out = subprocess.run(
                [compiler, "-march=native", "-Q", "--help=target"],
                capture_output=True,
                text=True,
                timeout=30,
                env={**os.environ, "LC_ALL": "C"},
            )
            if out.returncode == 0:
                text = out.stdout
        except (OSError, subprocess.SubprocessError):
            pass
        if not text:
            text = _cpuinfo()
        cached = _digest(text)
        _native_ids[compiler] = cached
    return cached


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("flags", "model name", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        import platform

        return platform.processor() or platform.machine()


def _roots() -> list[tuple[str, str]]:
    """Machine-specific directories and their placeholders, longest first."""
    global _roots_cache
    if _fixed_roots is not None:
        return _fixed_roots
    if _roots_cache is None:
        import sysconfig

        import torch

        candidates = [
            (os.path.dirname(os.path.abspath(torch.__file__)), "<torch>"),
            (sysconfig.get_paths().get("include", ""), "<py-include>"),
            (str(sysconfig.get_config_var("LIBDIR") or ""), "<py-libdir>"),
            (sys.prefix, "<prefix>"),
            (sys.base_prefix, "<base-prefix>"),
        ]
        _roots_cache = [(p.rstrip(os.sep), tag) for p, tag in candidates if len(p) > 1]
    dynamic = [(tempfile.gettempdir(), "<tmp>")]
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache:
        dynamic.append((os.path.abspath(cache), "<cache>"))
    roots = _roots_cache + [(p.rstrip(os.sep), t) for p, t in dynamic if len(p) > 1]
    return sorted(roots, key=lambda r: len(r[0]), reverse=True)


def fix_roots(roots: list[tuple[str, str]]) -> None:
    """Use ``roots`` as this process's folder map from now on: a child that places kernels
    for its parent reads paths as the parent does, without importing torch."""
    global _fixed_roots
    _fixed_roots = sorted(roots, key=lambda r: len(r[0]), reverse=True)


def _normalize(token: str, roots: list[tuple[str, str]]) -> str:
    for path, tag in roots:
        if path in token:
            token = token.replace(path, tag)
    return token


def normalize(path: str) -> str:
    """``path`` with this machine's folders as placeholders (``<torch>/include/...``)."""
    return _normalize(path, _roots())


def denormalize(shown: str) -> str | None:
    """The path here of a ``normalize``'d one; None for a placeholder this machine lacks."""
    if not shown.startswith("<"):
        return shown
    for path, tag in _roots():
        if shown == tag or shown.startswith(tag + "/"):
            return path + shown[len(tag) :]
    return None


#: What shlex (POSIX mode, no comments) splits on, and what makes it do more than split.
_BLANKS = re.compile(r"[ \t\r\n]+")
_QUOTING = re.compile(r"[\"'\\]")


def split_command(command: str) -> list[str]:
    """``shlex.split(command)``, without its tokenizer where nothing is quoted or escaped
    (every compile command torch writes: shlex costs about 1.3 ms per kernel, on every
    kernel a new machine loads)."""
    if _QUOTING.search(command):
        return shlex.split(command)
    return [token for token in _BLANKS.split(command) if token]


def plan(builder: Any) -> Plan | None:
    """The cache key of ``builder``'s output, or None for builds objcache does not cache."""
    if getattr(builder, "_preprocessing", False) or getattr(builder, "_use_relative_path", False):
        return None
    target = str(builder.get_target_file_path())
    if not os.path.isabs(target):
        return None
    tokens = split_command(builder.get_command_line())
    if not tokens:
        return None
    compiler = tokens[0]
    roots = _roots()
    parts: list[str] = [KEY_VERSION, f"cc:{compiler_id(compiler)}"]
    native = False
    for tok in tokens[1:]:
        if tok == target:
            parts.append("<out>")
        elif os.path.isabs(tok) and os.path.isfile(tok):
            parts.append(f"<file:{_file_digest(tok)}>")
        else:
            if tok.endswith("=native") and tok.startswith(("-march=", "-mtune=", "-mcpu=")):
                native = True
            parts.append(_normalize(tok, roots))
    if native:
        parts.append(f"native:{native_id(compiler)}")
    search = kernel_headers.search_id(compiler, normalize)
    if search is None:
        count("search_unreadable")
        return None  # what the compiler searches is unknown: not cached
    parts.append(f"search:{search}")
    ext = os.path.splitext(target)[1]
    parts.append(ext)
    return Plan(
        key=f"{KEY_VERSION}-{_digest(*parts)}{ext}",
        target=target,
        precompiled_header=bool(getattr(builder, "_precompiling", False)),
        command=tuple(tokens),
    )


# --- objcache I/O ---------------------------------------------------------------------------


def _inductor_cache_dir() -> str | None:
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return os.path.abspath(cache_dir())
    except Exception:  # an older torch: the target's own folder is the root
        return None


def _atomic_write(path: str, data: bytes, mode: int = 0o755) -> None:
    """Place ``data`` at ``path`` through :func:`objcache.config.files.publish_file`: below
    torch's cache directory (the trusted root) no folder is followed through a link or
    accepted unless it is this user's and writable by nobody else; a target elsewhere has
    its own folder as the root (made where absent, as torch would)."""
    root = _inductor_cache_dir()
    parts = os.path.relpath(path, root).split(os.sep) if root is not None else [os.pardir]
    if root is None or parts[0] in (os.pardir, os.curdir):
        root, parts = os.path.dirname(path), [os.path.basename(path)]
    publish_file(root, parts, data, mode=mode, create_root=True)


def _keep_out_of_prefetch(client: Any, p: Plan) -> None:
    """Precompiled headers are ~150 MB and needed only when a kernel must compile: keep
    them out of the job's prefetch manifest (which lists the keys a run read or wrote), so a
    warm start does not download and decompress one it will never use."""
    if p.precompiled_header:
        client.leave_out_of_manifest(KIND, p.key)


def binary_of(payload: bytes, get: Callable[[str], bytes | None]) -> bytes | None:
    """The binary of a stored kernel entry where the headers it was built with are the
    ones here (:mod:`.kernel_headers`), else None (counted ``misses_<why>``); ``get`` reads
    a record of kind :data:`KIND`."""
    binary, why = kernel_headers.unpack(payload, get, denormalize)
    if binary is None:
        count(f"misses_{why}")
    return binary


def stored_form(p: Plan, binary: bytes) -> tuple[bytes, tuple[str, bytes]] | None:
    """``(entry, (record key, record))`` of a binary built here from ``p``'s command: the
    entry names the record of the headers its build read; None where they cannot be read
    (counted; the binary is then not stored)."""
    made = kernel_headers.record(
        p.command, p.target, kernel_headers.source_files(p.command), normalize
    )
    if made is None:
        count("headers_unreadable")
        return None
    return kernel_headers.pack(made[0], binary), made


def fetch(p: Plan) -> bool:
    """Write the cached output of ``p`` where torch expects it; False on a miss."""
    try:
        client = cache_client.get_client()
        payload = client.get(KIND, p.key)
        _keep_out_of_prefetch(client, p)
        if payload is None:
            count("misses")
            return False
        data = binary_of(payload, lambda key: client.get(KIND, key))
        if data is None:
            return False
        _atomic_write(p.target, data)
    except Exception as exc:
        _warn_once("fetch", exc)
        return False
    count("fetched")
    count("fetched_bytes", len(data))
    return True


def _put_now(p: Plan) -> None:
    try:
        with open(p.target, "rb") as f:
            binary = f.read()
        stored = stored_form(p, binary)
        if stored is None:
            return
        data, (record_key, record) = stored
        client = cache_client.get_client()
        if client.get_local(KIND, record_key) is None:  # a process's kernels share one
            client.put(KIND, record_key, record)
        client.put(KIND, p.key, data)
        _keep_out_of_prefetch(client, p)
        count("stored")
        count("stored_bytes", len(data))
    except Exception as exc:
        _warn_once("store", exc)


def store(p: Plan) -> None:
    """Store the freshly built output of ``p`` without holding up the compile."""
    _submit(lambda: _put_now(p))


def _submit(task: Callable[[], None]) -> None:
    """Run ``task`` (a put that never raises) in the background; inline at shutdown."""
    global _executor, _executor_pid
    try:
        if _executor is None or _executor_pid != os.getpid():
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=2, thread_name_prefix="objcache-kernel-put"
            )
            _executor_pid = os.getpid()
        future = _executor.submit(task)
        _inflight.add(future)
        future.add_done_callback(_inflight.discard)
    except Exception:
        task()  # interpreter shutting down: store inline


def wait_stored(timeout: float | None = None) -> None:
    """Wait for background stores (at exit, before the client flushes)."""
    pending = [f for f in list(_inflight) if not f.done()]
    if pending:
        concurrent.futures.wait(pending, timeout=timeout)


# --- the hook -------------------------------------------------------------------------------


def _note_output(p: Plan, placed: bool) -> None:
    """Remember where ``p``'s output is and whether objcache placed it (for the ISA probe)."""
    with _outputs_lock:
        _outputs.pop(p.target, None)
        _outputs[p.target] = (p.key, placed)
        while len(_outputs) > MAX_RECORDED:
            del _outputs[next(iter(_outputs))]


def _build(builder: Any, original: Callable[[Any], None]) -> None:
    try:
        p = plan(builder)
    except Exception as exc:
        _warn_once("key", exc)
        p = None
    if p is None:
        original(builder)
        return
    if p.precompiled_header:
        if os.path.exists(p.target):
            return
        with _pch_lock:
            _pending_pch[p.target] = (builder, original)
        count("pch_deferred")
        return
    if fetch(p):
        _note_output(p, placed=True)
        _tell(p)
        return
    _ensure_precompiled_header(builder)
    original(builder)
    count("builds")
    _note_output(p, placed=False)
    store(p)
    _tell(p)


def _tell(p: Plan) -> None:
    for listener in output_listeners:
        listener(p)  # never raises (kernel_places.note)


# --- the vector-ISA probe ---------------------------------------------------------------------


def _probe_verdict_stored(key: str) -> bool:
    """Whether the store says torch's dlopen probe of the binary ``key`` succeeded."""
    try:
        return cache_client.get_client().get(VERDICT_KIND, key + LOAD_OK) is not None
    except Exception as exc:
        _warn_once("probe verdict fetch", exc)
        return False


def _store_probe_verdict(key: str) -> None:
    def put() -> None:
        try:
            cache_client.get_client().put(VERDICT_KIND, key + LOAD_OK, b"load_ok\n")
            count("probe_verdicts_stored")
        except Exception as exc:
            _warn_once("probe verdict store", exc)

    _submit(put)


def _probe_load(isa: Any, output_path: Any, original: Callable[[Any, Any], bool]) -> bool:
    """``VecISA._probe_load``: skip the dlopen child for a probe binary objcache placed here
    whose probe succeeded where it was built (module docstring); record a success."""
    try:
        with _outputs_lock:
            known = _outputs.get(str(output_path))
    except Exception:
        known = None
    if known is not None and known[1] and _probe_verdict_stored(known[0]):
        count("probes_skipped")
        return True
    ok = original(isa, output_path)
    if ok and known is not None:
        _store_probe_verdict(known[0])
    return bool(ok)


def _ensure_precompiled_header(builder: Any) -> None:
    """Fetch or build the precompiled header ``builder`` includes, if it was deferred."""
    header = getattr(getattr(builder, "_build_option", None), "precompiled_header", None)
    if not header:
        return
    with _pch_lock:
        for target in (f"{header}.gch", f"{header}.pch"):
            entry = _pending_pch.get(target)
            if entry is None:
                continue
            pch_builder, original = entry
            try:
                _build_header(target, pch_builder, original)
            finally:
                _pending_pch.pop(target, None)


def _build_header(target: str, pch_builder: Any, original: Callable[[Any], None]) -> None:
    from torch.utils._filelock import FileLock

    name = os.path.splitext(os.path.basename(target[: -len(".gch")]))[0]
    lock_path = os.path.join(os.path.dirname(target), "locks", f"{name}.lock")
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    with FileLock(lock_path, timeout=600):
        if os.path.exists(target):
            return
        try:
            p = plan(pch_builder)
        except Exception as exc:
            _warn_once("key", exc)
            p = None
        if p is not None and fetch(p):
            count("pch_fetched")
            return
        original(pch_builder)
        count("builds")
        count("pch_built")
        if p is not None:
            store(p)


def install() -> bool:
    """Hook ``CppBuilder`` (idempotent). False when torch has no C++ builder to hook."""
    try:
        from torch._inductor import cpp_builder
    except Exception:
        return False
    return apply(cpp_builder)


def apply(cpp_builder: Any) -> bool:
    cls = cpp_builder.CppBuilder
    if is_marked(cls.build):
        return True
    original_build = cls.build
    original_init = cls.__init__

    def build(self: Any) -> None:
        _build(self, original_build)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        try:
            if os.path.isabs(self.get_target_file_path()):
                _recorded.append(self)
        except Exception:
            pass

    marked(build, original_build)
    __init__.__wrapped__ = original_init  # type: ignore[attr-defined]
    _originals["build"] = original_build
    _originals["__init__"] = original_init
    cls.build = build
    cls.__init__ = __init__
    _apply_probe(sys.modules.get("torch._inductor.cpu_vec_isa"))
    _register_exit_hook()
    return True


def _apply_probe(cpu_vec_isa: Any) -> None:
    """Hook ``VecISA._probe_load`` where this torch has it (an optional part of the hook)."""
    cls = getattr(cpu_vec_isa, "VecISA", None)
    original = getattr(cls, "_probe_load", None)
    if not callable(original) or is_marked(original):
        return

    def probe_load(self: Any, output_path: Any) -> bool:
        return _probe_load(self, output_path, original)

    marked(probe_load, original)
    _originals["_probe_load"] = original
    cls._probe_load = probe_load  # type: ignore[union-attr]


def _register_exit_hook() -> None:
    """Finish background stores before the client flushes at exit.

    Registered like the client's own early exit hook (``threading._register_atexit``, which
    runs in reverse order before thread pools stop), after importing the client so that this
    one runs first; plain ``atexit`` is the fallback.
    """
    import objcache.client  # noqa: F401  (its hook is registered first, so runs after ours)

    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        with contextlib.suppress(RuntimeError):
            register(wait_stored, 60.0)
            return
    atexit.register(wait_stored, 60.0)


def uninstall() -> None:
    try:
        from torch._inductor import cpp_builder
    except Exception:
        return
    cls: Any = cpp_builder.CppBuilder
    if "build" in _originals:
        cls.build = _originals.pop("build")
    if "__init__" in _originals:
        cls.__init__ = _originals.pop("__init__")
    if "_probe_load" in _originals:
        vec_isa: Any = sys.modules["torch._inductor.cpu_vec_isa"].VecISA
        vec_isa._probe_load = _originals.pop("_probe_load")
    output_listeners.clear()
    with _outputs_lock:
        _outputs.clear()
    with _pch_lock:
        _pending_pch.clear()


# --- bundles (objcache.mega) ------------------------------------------------------------------


def used_artifacts(include_headers: bool = False) -> Iterator[tuple[str, bytes]]:
    """``(key, bytes)`` of every built output this process created a builder for."""
    seen: set[str] = set()
    for builder in list(_recorded):
        try:
            target = str(builder.get_target_file_path())
            if target in seen or not os.path.isfile(target):
                continue
            seen.add(target)
            p = plan(builder)
            if p is None or (p.precompiled_header and not include_headers):
                continue
            with open(target, "rb") as f:
                stored = stored_form(p, f.read())
            if stored is None:
                continue
        except Exception as exc:
            _warn_once("bundle", exc)
            continue
        data, (record_key, record) = stored
        if record_key not in seen:
            seen.add(record_key)
            yield record_key, record
        yield p.key, data


# --- what kernel_places shares ------------------------------------------------------------------

digest = _digest
cpuinfo = _cpuinfo
machine_roots = _roots
inductor_cache_dir = _inductor_cache_dir
warn_once = _warn_once
submit = _submit
note_output = _note_output
