"""Kernels where torch looks before torch looks: placing prefetched binaries in its cache dir.

On an FX/AOTAutograd cache hit torch imports the graph's module, whose
``async_compile.cpp_pybinding(...)`` calls reach ``CppCodeCache.load_async`` (the same code in
2.13, 2.14 and 2.15): it writes the kernel's ``.main.cpp`` (skipped where it exists), takes
``locks/<key>.lock`` and, for every builder whose target is absent (``_worker_compile_cpp``:
the ``.o`` files of a split kernel, then the ``.so``), builds it; then it dlopens the ``.so``.
A warm machine finds every target on disk and builds nothing; a new machine builds each one,
which objcache's hook (:mod:`objcache.integrations.torch.kernels.kernels`) turns into a content key,
a local read and a write, on the load path, kernel after kernel.

So a process records where each kernel it built or fetched lives in torch's cache dir, and the
next machine puts the binaries there while its prefetch runs, before the compile gets to them:

* **The record** (kind ``kernel-place``) is named ``<machine>-<content key>`` and holds the
  target's path relative to ``TORCHINDUCTOR_CACHE_DIR``. ``<machine>`` is a digest of what
  decides both torch's file name (a hash of the kernel's source and of its command line, whose
  paths are this machine's: torch's and Python's folders) and objcache's content key (the
  compiler's identity, the CPU): the torch release, those folders, ``g++ -v``, the compiler's
  search context (:mod:`.kernel_headers`), the CPU's flags and ATen's CPU capability (which
  decides the vector ISA in the kernels' flags).
  The cache dir and the temp dir are not in it: torch's names do not depend on them.
* **Placement** happens only for a record of this machine's own digest, a path of the form
  torch gives a kernel (``<k[1:3]>/<k><.suffixes>.so|.o``, one folder below the cache dir,
  nothing else), and the binary of exactly the content key the record names, read from the
  local tier. The file is created, never replaced (:func:`objcache.config.files.publish_file`
  with ``replace=False``: no link followed, no folder of another user's, no overwrite), so a
  binary torch or objcache already put there is left as it is. Anything else is counted and
  left to the load path, which works as without placement.

The placing runs in a child process (:mod:`.place_process`: on a thread of the compiling
process its system calls kept Dynamo's thread waiting for the interpreter lock); this module
is what both sides share. A placed binary is noted like one objcache's hook placed
(``kernels.note_output``), so the vector-ISA probe's verdict still skips the dlopen child for
it (docs/architecture.md, "Kernels placed before the compile").
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import re
import threading
import time
from typing import TYPE_CHECKING, Any

from objcache.config.files import publish_file
from objcache.integrations import cache_client
from objcache.integrations.torch.kernels import kernel_headers, kernels

if TYPE_CHECKING:
    from objcache.integrations.torch.kernels.place_process import PlaceProcess

log = logging.getLogger("objcache.torch")

KIND = "kernel-place"
PLACE_VERSION = "p1"
#: Longest record accepted (a relative path).
MAX_RECORD = 512
#: Records remembered as written by this process, and placements queued at once.
MAX_PENDING = 100_000
#: Tries of a key whose entries are not local yet, and the wait between two.
RETRIES = 20
RETRY_S = 0.05
#: torch's name for a kernel binary: ``get_path(key, ext)`` puts ``<key>.<ext>`` in
#: ``<cache>/<key[1:3]>/``; the key is ``c`` + base32 of a hash.
_PATH = re.compile(r"^([a-z0-9]{2})/([a-z0-9]([a-z0-9]{2})[a-z0-9]*(?:\.[a-z_]+)*\.(?:so|o))$")

_machine: str | None = None
_written: set[str] = set()
_lock = threading.Lock()
_placer: PlaceProcess | None = None
#: What :meth:`Placer.stop` queues.
_STOP = ("", "", None, -1)


def machine() -> str:
    """This machine's digest for records (module docstring); computed once per process."""
    global _machine
    if _machine is None:
        import torch
        from torch._inductor.cpp_builder import get_cpp_compiler

        roots = [f"{tag}={path}" for path, tag in kernels.machine_roots() if tag not in _MOVABLE]
        compiler = get_cpp_compiler()
        # what the compiler searches decides the binary as the content key says (a machine
        # whose compiler cannot say it matches no record: nothing is placed)
        search = kernel_headers.search_id(compiler, kernels.normalize)
        _machine = kernels.digest(
            PLACE_VERSION,
            str(torch.__version__),
            *sorted(roots),
            kernels.compiler_id(compiler),
            f"search:{search or os.urandom(16).hex()}",
            kernels.cpuinfo(),
            # the vector ISA torch picks for kernel flags follows ATen's capability
            f"isa:{os.environ.get('ATEN_CPU_CAPABILITY', '')}:{_capability()}",
        )[:20]
    return _machine


def _capability() -> str:
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:
        return ""


#: Roots that do not enter torch's file names.
_MOVABLE = ("<cache>", "<tmp>")


def relative(target: str) -> str | None:
    """``target``'s path below torch's cache dir where it has the form of a kernel's, or None."""
    root = kernels.inductor_cache_dir()
    if root is None:
        return None
    rel = os.path.relpath(os.path.abspath(target), root).replace(os.sep, "/")
    return rel if valid(rel) else None


def valid(rel: str) -> bool:
    """Whether ``rel`` is a path torch gives a kernel binary (module docstring)."""
    match = _PATH.match(rel)
    return match is not None and match.group(1) == match.group(3)


def note(p: kernels.Plan) -> None:
    """Record where ``p``'s output is, once per process (in the background)."""
    try:
        rel = relative(p.target)
        if rel is None or p.precompiled_header:
            return
        name = f"{machine()}-{p.key}"

        client = cache_client.get_client()
        if client.object_key(KIND, name) in client.cache.prefetched:
            return  # the store has it already
        with _lock:
            if name in _written or len(_written) >= MAX_PENDING:
                return
            _written.add(name)
    except Exception as exc:
        kernels.warn_once("place record", exc)
        return

    def put() -> None:
        try:
            client.put(KIND, name, rel.encode())
            kernels.count("place_records_stored")
        except Exception as exc:
            kernels.warn_once("place record store", exc)

    kernels.submit(put)


class Placer:
    """Places the binaries of this machine's records (``prefix``: ``<machine>-``) as the
    prefetch brings them: the placing child (:mod:`.place_process`) queues each key it is
    sent, one thread does the rest. A record and its binary may arrive in either order: each
    arrival queues the content key, and the key is placed once both are local (a second try
    costs two local reads).
    """

    def __init__(self, client: Any, root: str, prefix: str) -> None:
        self.client = client
        self.root = root
        self.prefix = prefix
        #: ``(kind, name, payload, tries)``: a record or a binary as it arrived (kind
        #: :data:`KIND` or ``kernels.KIND``), or ``("", content key, (record, binary),
        #: tries)`` for a key tried again
        self.queue: queue.SimpleQueue[tuple[str, str, Any, int]] = queue.SimpleQueue()
        self.done: set[str] = set()
        self.thread = threading.Thread(target=self._run, name="objcache-kernel-place", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """No more placements: the thread ends."""
        self.queue.put(_STOP)

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is _STOP:
                return
            try:
                self._one(*item)
            except Exception as exc:
                kernels.warn_once("place", exc)
            self.worked()

    def _one(self, kind: str, name: str, payload: Any, tries: int) -> None:
        if kind == KIND:  # a record: this machine's only
            if not name.startswith(self.prefix):
                return
            key, record, binary = name[len(self.prefix) :], payload, None
        elif kind:
            key, record, binary = name, None, payload
        else:
            key, (record, binary) = name, payload
        if key.startswith(kernel_headers.RECORD_KEY_PREFIX):
            # the record of the headers kernels were built with: checked here, beside the
            # compile, not on the load path of the first kernel that names it
            payload = binary if binary is not None else self._local(kernels.KIND, key)
            if payload is not None:
                kernel_headers.holds(key, payload, kernels.denormalize)
            return
        if self.place(key, record, binary) is None and tries < RETRIES:
            # a prefetched entry still on its way to the local tier: once more later
            time.sleep(RETRY_S)
            self.queue.put(("", key, (record, binary), tries + 1))

    def _local(self, kind: str, key: str) -> bytes | None:
        return self.client.get_local(kind, key)  # type: ignore[no-any-return]

    def place(
        self, key: str, record: bytes | None = None, binary: bytes | None = None
    ) -> bool | None:
        """Place the binary of content key ``key`` where its record says: True if placed,
        False if not (counted), None while its record or binary is not local."""
        if key in self.done:
            return False
        if record is None:
            record = self._local(KIND, self.prefix + key)
            if record is None:
                return None  # no record of this machine's (yet)
        self.done.add(key)
        try:
            rel = record.decode() if len(record) <= MAX_RECORD else ""
        except UnicodeDecodeError:
            rel = ""
        if not valid(rel) or os.path.splitext(rel)[1] != os.path.splitext(key)[1]:
            kernels.count("place_refused")
            return False
        target = os.path.join(self.root, *rel.split("/"))
        if os.path.lexists(target):
            kernels.count("place_present")
            return False
        if binary is None:
            binary = self._local(kernels.KIND, key)
            if binary is None:
                self.done.discard(key)  # its binary has not arrived yet
                return None
        record_key = kernel_headers.record_key_of(binary)
        headers = None
        if record_key is not None and kernel_headers.checked(record_key) is None:
            # read only until checked: every kernel of a build names the same record
            headers = self._local(kernels.KIND, record_key)
            if headers is None:
                self.done.discard(key)  # the record of its headers has not arrived yet
                return None
        binary = kernels.binary_of(binary, lambda k: headers if k == record_key else None)
        if binary is None:
            return False  # counted: built with other headers than this machine's
        try:
            # created, never replaced; the folder is not fsynced: a name lost to a power cut
            # is a kernel the load path fetches again (its data is fsynced before it is named)
            publish_file(self.root, rel.split("/"), binary, mode=0o755, create_root=True,
                         replace=False, sync_folder=False)  # fmt: skip
        except FileExistsError:
            kernels.count("place_present")
            return False
        except OSError as exc:  # an unsafe folder (counted), a full disk
            kernels.count("place_refused")
            log.debug("objcache: placing %s refused: %r", rel, exc)
            return False
        self.placed(key, rel, target)
        return True

    def placed(self, key: str, rel: str, target: str) -> None:
        """Note a binary placed (for the vector-ISA probe's verdict) and count it."""
        kernels.note_output(kernels.Plan(key, target, False), placed=True)
        kernels.count("placed")

    def worked(self) -> None:
        """One queued item done with (a placing child reports what changed)."""


def enable() -> None:
    """Start placement beside the prefetch of every process-wide client: the one built
    already, and each one built later, on any path (``install()`` builds it up front, the
    zero-code path at its first lookup: :data:`objcache.client.client_listeners`)."""
    from objcache import client as clients

    if _started not in clients.client_listeners:
        clients.client_listeners.append(_started)
    current = clients.current_client()
    if current is not None:
        _started(current)


def disable() -> None:
    """Undo :func:`enable`: no placement for clients built later, the running one stopped."""
    global _placer
    from objcache import client as clients

    with contextlib.suppress(ValueError):
        clients.client_listeners.remove(_started)
    with _lock:
        placer, _placer = _placer, None
    if placer is not None:
        placer.stop()


def _started(client: Any) -> None:
    try:
        start(client)
    except Exception as exc:
        kernels.warn_once("kernel placement", exc)


def start(client: Any) -> PlaceProcess | None:
    """Place this process's prefetched kernels in the background (once per client)."""
    global _placer
    if client.prefetch_result is None:
        return None
    with _lock:
        if _placer is not None and _placer.client is client:
            return _placer
        root = kernels.inductor_cache_dir()
        if root is None:
            return None
        if _placer is not None:
            _placer.stop()  # a client replaced (install(config)) or a forked child's
        from objcache.integrations.torch.kernels.place_process import PlaceProcess

        # in a child process, off the compiling process's interpreter lock (its docstring)
        placer = _placer = PlaceProcess(client, root)
        kernels.count("place_started")
    cache = client.cache
    cache.prefetch_listeners.append(placer.arrived)
    # keys the prefetch found or fetched before the listener was there
    for okey in list(cache.prefetched):
        placer.arrived(okey, None)
    return placer
