"""The program's Python code a compile runs while it traces, which no graph shows and no key
of torch's names (docs/torch.md, "Custom ops in the keys").

AOTAutograd and Inductor run Python the program supplies while they turn a Dynamo graph into
code: a kernel registered for an op, a ``custom_op``'s backward, a tensor subclass's
``__torch_dispatch__``, an entry the program put in Inductor's decomposition or lowering
table. Their *results* are baked into the compiled code. Here each such function is named
by what decides what it does, as far as a digest can tell: its code, the content of the
source file it sits in (the helpers beside it), and the values it reads from its module's
globals and its closure (a setting read from the environment at import), the environment
variables it names where it reads the environment, following the functions it reads one level
further. A class is named by those of its methods and its plain attributes; an object by its
class and its attributes; a C++ kernel by the binaries the process loaded. What is torch's own
(its package's files) is in its release, which every key holds already. What cannot be named
within the bounds below (a container or tensor too large to digest) is named by a value of
this process alone: a miss on every other machine, never another machine's result.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import os
import sys
import sysconfig
import threading
import types
from collections.abc import Iterable, Iterator
from typing import Any

from objcache.integrations.torch.precompile import portable_guards

#: Largest source file digested (a larger one is named by size and mtime).
MAX_SOURCE_BYTES = 8 << 20
#: How far the functions a function reads are followed.
MAX_DEPTH = 2
#: Longest rendering of one value read (a longer one is named by its digest).
MAX_VALUE_CHARS = 4096
#: Most items of a container read by a function that are named one by one (followed).
MAX_ITEMS = 256
#: Most items of a container named at all (by a cheap rendering of each, unfollowed); a
#: larger one is named by this process alone.
MAX_DIGESTED_ITEMS = 100_000
#: Largest array or tensor read by a function that is named by its content (larger: by
#: this process alone).
MAX_ARRAY_BYTES = 64 << 20
#: Read of a native library's binary, each end (its ELF build id sits in the first pages).
NATIVE_READ_BYTES = 1 << 20

#: The value that names what cannot be named: of this process alone (a miss elsewhere).
PROCESS_NONCE = os.urandom(8).hex()
UNIDENTIFIED = f"unidentified:{PROCESS_NONCE}"

_lock = threading.Lock()
_sources: dict[tuple[str, int, int], str] = {}


def source_digest(path: str) -> str:
    """The content of a source file, by digest (not its path: another venv, another machine);
    remembered by size and mtime."""

    def digest(f: Any, size: int) -> str:
        if size > MAX_SOURCE_BYTES:
            return f"size:{size}:mtime:{os.fstat(f.fileno()).st_mtime_ns}"
        return hashlib.sha256(f.read(MAX_SOURCE_BYTES)).hexdigest()[:32]

    return _file_digest(path, _sources, digest, "unreadable")


def _file_digest(
    path: str, memo: dict[tuple[str, int, int], str], digest: Any, unreadable: str
) -> str:
    """``digest(file, size)`` of ``path``, remembered in ``memo`` by size and mtime."""
    try:
        st = os.stat(path)
    except OSError:
        return "absent"
    key = (path, st.st_size, st.st_mtime_ns)
    with _lock:
        known = memo.get(key)
    if known is not None:
        return known
    try:
        with open(path, "rb") as f:
            value = str(digest(f, st.st_size))
    except OSError:
        value = unreadable
    with _lock:
        if len(memo) > 4096:
            memo.clear()
        memo[key] = value
    return value


def is_torchs(value: Any) -> bool:
    """Whether a function, class or module comes from torch's own package (or Python
    itself)."""
    module = (
        value.__name__
        if isinstance(value, types.ModuleType)
        else getattr(value, "__module__", None)
    )
    if not isinstance(module, str):
        return False
    return module in ("builtins", "functools") or module == "torch" or module.startswith("torch.")


def is_stdlib(value: Any) -> bool:
    """Whether a module, or an object's class, is Python's own (named by its kind: the
    interpreter's release is in every key)."""
    name = (
        value.__name__
        if isinstance(value, types.ModuleType)
        else getattr(type(value), "__module__", None)
    )
    if not isinstance(name, str) or name.split(".", 1)[0] not in sys.stdlib_module_names:
        return False
    module = value if isinstance(value, types.ModuleType) else sys.modules.get(name)
    path = getattr(module, "__file__", None)  # not a program's module of the same name
    return path is None or os.path.realpath(path).startswith(_STDLIB_DIRS)


_STDLIB_DIRS = tuple(
    os.path.realpath(sysconfig.get_paths()[kind]) + os.sep for kind in ("stdlib", "platstdlib")
)
#: Python's own classes whose objects are settings (what they hold names them).
_SETTINGS_CLASSES = frozenset({"types.SimpleNamespace", "argparse.Namespace"})


def _names_read(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names_read(const)


_ENV_READS = frozenset({"environ", "getenv", "environb", "getenvb"})


def _strings(code: types.CodeType) -> Iterator[str]:
    for const in code.co_consts:
        if isinstance(const, str):
            yield const
        elif isinstance(const, types.CodeType):
            yield from _strings(const)


def function_identity(fn: Any, depth: int = 0) -> list[str]:
    """What decides what ``fn`` computes: its code, its source file, what it reads."""
    if isinstance(fn, functools.partial):
        return [
            "partial",
            *function_identity(fn.func, depth),
            *(value_identity(a, depth) for a in fn.args),
            *(f"{k}={value_identity(v, depth)}" for k, v in sorted(fn.keywords.items())),
        ]
    fn = getattr(fn, "__func__", fn)  # a bound method, a classmethod, a staticmethod
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return [f"callable:{type(fn).__module__}.{type(fn).__qualname__}"]
    parts = [portable_guards.code_digest(code), source_digest(code.co_filename)]
    if depth >= MAX_DEPTH:
        return parts
    scope = getattr(fn, "__globals__", None)
    names = sorted(set(_names_read(code)))
    if isinstance(scope, dict):
        for name in names:
            if name not in scope:
                continue
            value = scope[name]
            parts.append(f"{name}={value_identity(value, depth + 1)}")
            if isinstance(value, types.ModuleType) and not (is_torchs(value) or is_stdlib(value)):
                # what the code reads through a module of the program's (``cfg.SCALE``,
                # ``helpers.scale(x)``): the values under the names the code reads
                for attr in names:
                    held = getattr(value, attr, None)
                    if held is not None and not isinstance(held, types.ModuleType):
                        parts.append(f"{name}.{attr}={value_identity(held, depth + 1)}")
    if _ENV_READS.intersection(names):
        # ``os.environ["SCALE"]``, ``os.getenv("SCALE")`` while it traces: the variables
        # named by the code's string constants, by their value here
        for const in sorted(set(_strings(code))):
            if const.isidentifier():
                parts.append(f"env:{const}={os.environ.get(const)!r}")
    for i, cell in enumerate(getattr(fn, "__closure__", None) or ()):
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        parts.append(f"cell{i}={value_identity(contents, depth + 1)}")
    return parts


def value_identity(value: Any, depth: int) -> str:
    """One value a traced function reads: by value where it is plain data, by identity where
    it is code, by name where it is a module or torch's own."""
    plain = _plain_data(value, [MAX_DIGESTED_ITEMS])
    if plain is not None:
        rendered = plain
    elif isinstance(value, (tuple, list, frozenset, set, dict)) and (
        len(value) > MAX_ITEMS or depth > MAX_DEPTH
    ):
        rendered = _container_digest(value)  # a registry: each item named, unfollowed
    elif isinstance(value, (tuple, list, frozenset, set)):
        items = [value_identity(v, depth + 1) for v in value]
        rendered = repr(sorted(items) if isinstance(value, (set, frozenset)) else items)
    elif isinstance(value, dict):
        rendered = repr(sorted((repr(k), value_identity(v, depth + 1)) for k, v in value.items()))
    elif isinstance(value, types.ModuleType):
        rendered = f"module:{value.__name__}"
    elif isinstance(value, type):
        rendered = f"class:{value.__module__}.{value.__qualname__}"
        if not is_torchs(value) and depth <= MAX_DEPTH:
            rendered += ":" + class_identity(value, depth + 1)
    elif isinstance(value, functools.partial) or (callable(value) and not is_torchs(value)):
        # a partial's class is functools': it is named by what it calls and its arguments
        rendered = ",".join(function_identity(value, depth))
    else:
        rendered = _object_identity(value, depth)
    if len(rendered) > MAX_VALUE_CHARS:
        return "sha256:" + hashlib.sha256(rendered.encode()).hexdigest()[:32]
    return rendered


def _plain_data(value: Any, budget: list[int]) -> str | None:
    """Numbers, strings and containers of them however nested, by value; None for anything
    else, or past ``budget`` items."""
    budget[0] -= 1
    if budget[0] < 0:
        return None
    if value is None or isinstance(value, (str, bytes, int, float, complex, bool)):
        return repr(value)
    if isinstance(value, (tuple, list, frozenset, set)):
        items = []
        for item in value:
            rendered = _plain_data(item, budget)
            if rendered is None:
                return None
            items.append(rendered)
        if isinstance(value, (set, frozenset)):
            items.sort()
        return f"{type(value).__name__}[{','.join(items)}]"
    if isinstance(value, dict):
        pairs = []
        for key, item in value.items():
            k, v = _plain_data(key, budget), _plain_data(item, budget)
            if k is None or v is None:
                return None
            pairs.append(f"{k}:{v}")
        return "dict{" + ",".join(sorted(pairs)) + "}"
    return None


def _container_digest(value: Any) -> str:
    """A container too large (or too deep) to follow: each item by what it is without
    following it further (plain data by value, code by its code and source); past
    :data:`MAX_DIGESTED_ITEMS` items, this process alone."""
    if len(value) > MAX_DIGESTED_ITEMS:
        return UNIDENTIFIED
    pairs = value.items() if isinstance(value, dict) else ((None, v) for v in value)
    digests = [
        hashlib.sha256(f"{_shallow(k)}\0{_shallow(v)}".encode()).hexdigest() for k, v in pairs
    ]
    if isinstance(value, (set, frozenset, dict)):
        digests.sort()
    joined = "".join(digests).encode()
    return f"{type(value).__name__}:{len(value)}:" + hashlib.sha256(joined).hexdigest()[:32]


def _shallow(value: Any) -> str:
    plain = _plain_data(value, [MAX_ITEMS])
    if plain is not None:
        return plain
    if isinstance(value, (tuple, list, frozenset, set, dict)):
        return UNIDENTIFIED  # a container in a container past the depth followed
    return value_identity(value, MAX_DEPTH + 1)


def _object_identity(value: Any, depth: int = MAX_DEPTH + 1) -> str:
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return _tensor_identity(value, kind)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        if value.nbytes > MAX_ARRAY_BYTES or value.dtype.hasobject:
            return UNIDENTIFIED
        data = numpy.ascontiguousarray(value).tobytes()
        return f"ndarray:{value.dtype}:{value.shape}:" + hashlib.sha256(data).hexdigest()[:32]
    if type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "device"):
        return str(value)
    if isinstance(value, enum.Enum):
        return f"{kind}.{value.name}={_plain_data(value.value, [MAX_ITEMS]) or ''}"
    if is_torchs(type(value)) or depth > MAX_DEPTH:
        return kind
    if is_stdlib(value) and kind not in _SETTINGS_CLASSES:
        return kind  # a logger, a lock, a file: Python's own
    # an object of the program's (a settings object, a dataclass): its class and what it
    # holds, followed one level more
    held = getattr(value, "__dict__", None)
    parts = [kind]
    if not is_stdlib(value):
        parts.append(class_identity(type(value), MAX_DEPTH))
    if isinstance(held, dict):
        for name, item in sorted(held.items(), key=lambda kv: str(kv[0]))[:MAX_ITEMS]:
            parts.append(f"{name}={value_identity(item, depth + 1)}")
    for name in _slots(type(value)):
        if hasattr(value, name):
            parts.append(f"{name}={value_identity(getattr(value, name), depth + 1)}")
    return ";".join(parts)


def _slots(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else list(slots))
    return [n for n in names if n not in ("__dict__", "__weakref__")][:MAX_ITEMS]


def _tensor_identity(value: Any, kind: str) -> str:
    try:
        described = f"tensor:{value.dtype}:{tuple(value.shape)}"
        nbytes = value.numel() * value.element_size()
        if nbytes > MAX_ARRAY_BYTES or type(value).__name__ not in ("Tensor", "Parameter"):
            return UNIDENTIFIED  # too large to digest, or a subclass holding what it holds
        data = (
            value.detach()
            .to("cpu")
            .contiguous()
            .reshape(-1)
            .view(sys.modules["torch"].uint8)
            .numpy()
            .tobytes()
        )
        return described + ":" + hashlib.sha256(data).hexdigest()[:32]
    except Exception:
        return UNIDENTIFIED


def class_identity(cls: type, depth: int = 0) -> str:
    """A class outside torch by its methods and plain attributes, and those of each of its
    bases outside torch."""
    parts: list[str] = []
    for klass in cls.__mro__:
        if is_torchs(klass) or klass is object:
            continue
        parts.append(f"{klass.__module__}.{klass.__qualname__}")
        for name, attr in sorted(vars(klass).items()):
            if name in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__"):
                continue
            if isinstance(attr, property):
                attr = attr.fget
            if isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            if getattr(attr, "__code__", None) is not None:
                parts.append(name + ":" + ",".join(function_identity(attr, depth)))
            elif (
                isinstance(attr, (tuple, list, frozenset, set, dict))
                or attr is None
                or (isinstance(attr, (str, bytes, int, float, complex, bool, enum.Enum)))
            ):
                parts.append(f"{name}={value_identity(attr, MAX_DEPTH)}")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def tensor_subclasses(values: Iterable[Any]) -> set[type]:
    """The tensor subclasses outside torch among ``values`` (nested lists, tuples, dicts)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return set()
    found: set[type] = set()
    stack = list(values)
    seen = 0
    while stack and seen < 100_000:
        seen += 1
        value = stack.pop()
        if isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, torch.Tensor) and not is_torchs(type(value)):
            found.add(type(value))
        elif isinstance(value, type) and issubclass(value, torch.Tensor) and not is_torchs(value):
            found.add(value)
    return found


def _tables() -> list[tuple[str, dict[Any, Any]]]:
    tables: list[tuple[str, dict[Any, Any]]] = []
    for label, module, attr in (
        ("decomposition", "torch._inductor.decomposition", "decompositions"),
        ("decomposition", "torch._inductor.decomposition", "fast_random_decomps"),
        ("lowering", "torch._inductor.lowering", "lowerings"),
    ):
        table = getattr(sys.modules.get(module), attr, None)
        if callable(table) and not isinstance(table, dict):
            # torch's cached copy of the table (what Inductor uses by default), read only once
            # made: making it here would freeze the table before the program's own entries
            try:
                table = table() if table.cache_info().currsize else None
            except Exception:
                table = None
        if isinstance(table, dict):
            tables.append((label, table))
    return tables


def tables_token() -> int:
    """What changes when an entry of Inductor's decomposition or lowering tables is put,
    replaced or removed (a sum of the entries' identities: ~0.15 ms)."""
    total = 0
    for _, table in _tables():
        total += len(table) + sum(map(id, list(table.values())))
    return total


def table_overrides() -> tuple[tuple[str, str], ...]:
    """``((f"{table}:{op}", identity), ...)`` for each entry of Inductor's decomposition or
    lowering tables whose function is the program's (not from torch's package): Inductor
    runs it on every graph that uses the op, and torch's keys do not name it."""
    found: dict[str, str] = {}
    for label, table in _tables():
        for op, fn in list(table.items()):
            inner = fn.func if isinstance(fn, functools.partial) else fn
            code_of = inner if hasattr(inner, "__code__") else type(inner)  # else a callable object
            if is_torchs(code_of):
                continue
            identity = ",".join(function_identity(fn))
            found[f"{label}:{op}"] = hashlib.sha256(identity.encode()).hexdigest()[:32]
    return tuple(sorted(found.items()))


_binaries: dict[tuple[str, int, int], str] = {}
_native_memo: dict[frozenset[str], str] = {}


def native_libraries() -> str:
    """The native extensions outside torch and Python the process imported or loaded (a
    kernel library registering C++ kernels: its meta, autograd and composite kernels run
    while AOTAutograd traces), each by a digest of its size and both ends of its file (the
    ELF build id sits in the first pages): another build of a kernel library is another
    value. Only what registers ops: Python extension modules and ``torch.ops.load_library``'s
    libraries, never the shared objects they pull in or the compiled kernels a compile loads
    from its cache (which a machine served from a store loads at other moments)."""
    paths = _extension_binaries()
    with _lock:
        known = _native_memo.get(paths)
    if known is not None:
        return known
    named = sorted(f"{os.path.basename(p)}:{_binary_digest(p)}" for p in paths)
    digest = hashlib.sha256("\0".join(named).encode()).hexdigest()[:32]
    with _lock:
        if len(_native_memo) > 64:
            _native_memo.clear()
        _native_memo[paths] = digest
    return digest


def _extension_binaries() -> frozenset[str]:
    """The extension modules and loaded libraries that link against torch (only those can
    register kernels with its dispatcher; numpy's or a template engine's, imported by a
    compile at some moment, never)."""
    found: set[str] = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not path.endswith((".so", ".pyd", ".dylib")):
            continue
        if not (is_torchs(module) or is_stdlib(module)):
            found.add(os.path.realpath(path))
    torch = sys.modules.get("torch")
    loaded = getattr(getattr(torch, "ops", None), "loaded_libraries", None)
    if isinstance(loaded, (set, list, tuple)):
        found.update(os.path.realpath(p) for p in loaded if isinstance(p, str))
    skipped = tuple(d for d in _kernel_cache_dirs() if d != os.sep)
    return frozenset(p for p in found if not p.startswith(skipped) and _links_torch(p))


_links: dict[tuple[str, int, int], str] = {}


def _links_torch(path: str) -> bool:
    """Whether the shared object at ``path`` names one of torch's libraries among those it
    needs (its ELF dynamic section; a file that is no ELF object: yes, to be safe)."""
    return _file_digest(path, _links, _needs_torch, "1") == "1"


def _needs_torch(f: Any, size: int) -> str:
    needed = elf_needed(f, size)
    if needed is None:
        return "1"
    return "1" if any(n.startswith(("libtorch", "libc10")) for n in needed) else "0"


def elf_needed(f: Any, size: int) -> list[str] | None:
    """The ``DT_NEEDED`` names of a 64-bit little-endian ELF shared object, or None when
    ``f`` holds something else (read: the headers and the dynamic section, not the file)."""
    import struct

    head = f.read(64)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    phoff, phentsize, phnum = (
        struct.unpack_from("<Q", head, 32)[0],
        *struct.unpack_from("<HH", head, 54),
    )
    if phentsize < 56 or phnum > 256 or phoff + phentsize * phnum > size:
        return None
    f.seek(phoff)
    table = f.read(phentsize * phnum)
    loads: list[tuple[int, int, int]] = []
    dynamic: tuple[int, int] | None = None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(
            "<IIQQQQ", table, i * phentsize
        )
        if p_type == 1:  # PT_LOAD
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (p_offset, min(p_filesz, 1 << 20))
    if dynamic is None:
        return []
    f.seek(dynamic[0])
    entries = f.read(dynamic[1])
    strtab, strsz, wanted = None, 0, []
    for tag, value in struct.iter_unpack("<qQ", entries[: len(entries) // 16 * 16]):
        if tag == 0:
            break
        if tag == 1:
            wanted.append(value)
        elif tag == 5:
            strtab = value
        elif tag == 10:
            strsz = value
    if strtab is None:
        return None
    offset = next((o + strtab - v for v, o, n in loads if v <= strtab < v + n), None)
    if offset is None or strsz <= 0 or strsz > 64 << 20:
        return None
    f.seek(offset)
    strings = f.read(strsz)
    return [strings[w : strings.find(b"\0", w)].decode("utf-8", "replace") for w in wanted]


def _kernel_cache_dirs() -> list[str]:
    """Where compiled kernels are loaded from (Inductor's and Triton's caches)."""
    dirs = [os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ.get("TRITON_CACHE_DIR")]
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    with contextlib.suppress(Exception):
        dirs.append(utils.cache_dir() if utils is not None else None)
    dirs.append(os.path.join(os.path.expanduser("~"), ".triton"))
    return [os.path.realpath(d) + os.sep for d in dirs if d]


def _binary_digest(path: str) -> str:
    def digest(f: Any, size: int) -> str:
        h = hashlib.sha256(str(size).encode())
        h.update(f.read(NATIVE_READ_BYTES))
        if size > NATIVE_READ_BYTES:
            f.seek(max(NATIVE_READ_BYTES, size - NATIVE_READ_BYTES))
            h.update(f.read(NATIVE_READ_BYTES))
        return h.hexdigest()[:32]

    return _file_digest(path, _binaries, digest, UNIDENTIFIED)
