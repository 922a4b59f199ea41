"""The headers a kernel binary was built with: what the compiler's search found, where, and
with what content (docs/architecture.md, "The headers a kernel was built with").

torch never ships a C++ binary between machines: each one builds a kernel from its source
with its own compiler, environment and header files. objcache does ship them, keyed by the
source, the command line, ``g++ -v`` and the CPU (:mod:`.kernels`); but the compiler also
reads what its search finds: ``CPATH`` and the other variables of its environment, the
folders it searches by default and every header there. A header that differs (another
image's libc), or a file of the same name earlier in the search (an ``omp.h`` on ``CPATH``,
a ``math.h`` in ``/usr/local/include``), makes another binary from the same source and
flags (the thirty-fifth adversarial review: a kernel built under the writer's ``CPATH``
summed half of what the reader's own build sums). So:

* the key names the compiler's search context (:func:`search_id`): the environment
  variables the compiler reads and the folders it searches by default (``<compiler> -E -v``),
  read once per compiler and environment in a process;
* a stored binary names a record of the headers its build read (:func:`pack`: the writer
  runs its command with ``-M -v``, once per kind of translation unit): the search list, and
  per header its path (this machine's folders as placeholders), the search folder it was
  found under, which earlier folders also hold a file of that name, and a digest of its
  content. The record is an entry of its own, named by its digest: a process's kernels share
  one;
* a machine takes a binary only where the same record, read where it stands, comes out the
  same (:func:`unpack`): otherwise a counted miss, and the build runs as without objcache.

Not covered: a file added beside a header that includes it by a quoted name (found there
before the search), where the machine that built the kernel found that name further along
the search. Only regular files are read, each and all together bounded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

#: The environment variables the compiler reads that change where it searches or what runs
#: (gcc's and clang's manuals, "Environment Variables").
COMPILER_ENV = (
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "OBJC_INCLUDE_PATH",
    "GCC_EXEC_PREFIX",
    "COMPILER_PATH",
    "LIBRARY_PATH",
    "CCC_OVERRIDE_OPTIONS",
)
#: A stored binary: ``PREFIX + record key + b"\n" + binary``.
PREFIX = b"objcache-kernel-2 "
#: A record's first line.
RECORD_HEAD = b"objcache-kernel-headers-1\n"
RECORD_KEY_PREFIX = "headers-"
#: Bounds on what a record makes a machine read.
MAX_RECORD_BYTES = 4 << 20
MAX_HEADERS = 20_000
MAX_HEADER_BYTES = 64 << 20
MAX_TOTAL_BYTES = 512 << 20
#: The preprocessor lines that decide which headers a source reads.
_DIRECTIVE = re.compile(
    rb"^[ \t]*#[ \t]*"
    rb"(include|include_next|import|define|undef|if|ifdef|ifndef|elif|else|endif)\b.*$",
    re.MULTILINE,
)
#: An include by a quoted relative name: searched first in the including file's folder.
_QUOTED_BESIDE = re.compile(rb'#[ \t]*include(?:_next)?[ \t]*"[^/"]')
_SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".hxx")

_lock = threading.Lock()
_search_ids: dict[tuple[str, tuple[str, ...]], str | None] = {}
#: Records made in this process: memo key -> (record key, record) or None (unreadable).
_made: dict[str, tuple[str, bytes] | None] = {}
#: Records checked in this process: record key -> whether it held here.
_checked: dict[str, bool] = {}
_file_digests: dict[str, str | None] = {}


def digest(*parts: bytes | str) -> str:
    """A BLAKE2b digest of ``parts``, each ended by a zero byte."""
    h = hashlib.blake2b(digest_size=20)
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _compiler_env() -> dict[str, str]:
    return {**os.environ, "LC_ALL": "C"}


def _env_values() -> tuple[str, ...]:
    return tuple(f"{name}={os.environ.get(name)}" for name in COMPILER_ENV)


def _search_lists(stderr: str) -> list[str] | None:
    """The folders of ``-v``'s search list, quoted then angled, in order; None if absent."""
    lines = stderr.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if "search starts here" in ln)
        end = next(i for i, ln in enumerate(lines) if ln.startswith("End of search list"))
    except StopIteration:
        return None
    folders = []
    for line in lines[start:end]:
        if line.startswith(" "):
            folder = line.strip().split(" (", 1)[0]  # "(framework directory)" on macOS
            folders.append(os.path.normpath(folder))
    return folders


def search_id(compiler: str, normalize: Callable[[str], str]) -> str | None:
    """A digest of the compiler's search context here (module docstring); None when the
    compiler cannot say it (the build is then not cached)."""
    memo = (compiler, _env_values())
    with _lock:
        if memo in _search_ids:
            return _search_ids[memo]
    found: str | None = None
    try:
        out = subprocess.run(
            [compiler, "-E", "-v", "-x", "c++", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
            env=_compiler_env(),
            stdin=subprocess.DEVNULL,
        )
        folders = _search_lists(out.stderr) if out.returncode == 0 else None
        if folders is not None:
            found = digest(*memo[1], *(normalize(f) for f in folders))
    except (OSError, subprocess.SubprocessError):
        found = None
    with _lock:
        _search_ids[memo] = found
    return found


def _file_digest(path: str) -> str | None:
    """The digest of a regular file's content (bounded), None where it is not one."""
    with _lock:
        if path in _file_digests:
            return _file_digests[path]
    digest: str | None = None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        fd = -1
    if fd >= 0:
        try:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and info.st_size <= MAX_HEADER_BYTES:
                h = hashlib.blake2b(digest_size=16)
                with os.fdopen(fd, "rb", closefd=False) as f:
                    data = f.read(MAX_HEADER_BYTES + 1)
                if len(data) <= MAX_HEADER_BYTES:
                    h.update(data)
                    digest = f"{len(data)}:{h.hexdigest()}"
        except OSError:
            digest = None
        finally:
            os.close(fd)
    with _lock:
        _file_digests[path] = digest
    return digest


Placed = tuple[int, str] | None
#: (a header's path, the search folders) -> :func:`_placement`'s answer, read once a process
#: as each header's digest is (:data:`_file_digests`)
_placements: dict[tuple[str, tuple[str, ...]], Placed] = {}


def _placement(path: str, folders: Sequence[str]) -> Placed:
    """Which search folder ``path`` lies under (the first in the search order) and which
    earlier folders hold a file of the same name there; None when under none."""
    key = (path, tuple(folders))
    with _lock:
        if key in _placements:
            return _placements[key]
    placed = _find_placement(path, folders)
    with _lock:
        _placements[key] = placed
    return placed


def _find_placement(path: str, folders: Sequence[str]) -> Placed:
    for index, folder in enumerate(folders):
        prefix = folder.rstrip(os.sep) + os.sep
        if path.startswith(prefix):
            name = path[len(prefix) :]
            earlier = [
                str(j) for j in range(index) if os.path.lexists(os.path.join(folders[j], name))
            ]
            return index, ",".join(earlier) or "-"
    return None


def _header_line(path: str, folders: Sequence[str], shown: str) -> bytes | None:
    digest = _file_digest(path)
    if digest is None:
        return None
    placed = _placement(path, folders)
    where = f"{placed[0]} {placed[1]}" if placed is not None else "- -"
    return f"header {where} {digest} {shown}\n".encode()


def _memo_key(tokens: Sequence[str], target: str, files: Sequence[str]) -> str:
    """The command with its output left out and each source replaced by its preprocessor
    lines: two kernels of one kind (the same flags, the same includes) share a record."""
    parts: list[bytes | str] = []
    for token in tokens:
        if token == target:
            parts.append("<out>")
        elif token in files and token.endswith(_SOURCE_SUFFIXES):
            with open(token, "rb") as f:
                lines = b"\n".join(m.group(0) for m in _DIRECTIVE.finditer(f.read()))
            parts.append(lines)
            if _QUOTED_BESIDE.search(lines):  # found first beside the source: its folder too
                parts.append(os.path.dirname(token))
        else:
            parts.append(token)
    return digest(*_env_values(), *parts)


def _scan(tokens: Sequence[str], target: str) -> tuple[list[str], list[str]] | None:
    """(search folders, headers read) of the command's translation units, by the compiler;
    a command that compiles nothing (a link of object files) reads no header."""
    if not any(t.endswith(_SOURCE_SUFFIXES) and os.path.isfile(t) for t in tokens[1:]):
        return [], []
    args = list(tokens)
    if target in args:
        i = args.index(target)
        if i > 0 and args[i - 1] == "-o":
            del args[i - 1 : i + 1]
        else:
            del args[i]
    out = subprocess.run(
        [*args, "-M", "-v"],
        capture_output=True,
        timeout=300,
        env=_compiler_env(),
        stdin=subprocess.DEVNULL,
    )
    if out.returncode != 0:
        return None
    folders = _search_lists(out.stderr.decode(errors="replace"))
    if folders is None:
        return None
    text = out.stdout.decode(errors="strict").replace("\\\n", " ")
    if "\\ " in text or "$$" in text:
        return None  # a path with a blank or a dollar: not parsed, not cached
    headers = [t for t in text.split() if not t.endswith(":")]
    return folders, headers


def record(
    tokens: Sequence[str], target: str, files: Sequence[str], normalize: Callable[[str], str]
) -> tuple[str, bytes] | None:
    """``(record key, record)`` of the headers ``tokens``' build reads, made where it was
    built; None when they cannot be read (the binary is then not stored)."""
    try:
        memo = _memo_key(tokens, target, files)
    except OSError:
        return None
    with _lock:
        if memo in _made:
            return _made[memo]
    made: tuple[str, bytes] | None = None
    try:
        scanned = _scan(tokens, target)
        if scanned is not None:
            made = _make_record(*scanned, set(files), normalize)
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
        made = None
    with _lock:
        _made[memo] = made
    return made


def _make_record(
    folders: list[str], headers: list[str], files: set[str], normalize: Callable[[str], str]
) -> tuple[str, bytes] | None:
    lines = [RECORD_HEAD]
    lines += [f"search {normalize(folder)}\n".encode() for folder in folders]
    seen: set[str] = set()
    for header in headers:
        path = os.path.normpath(header)
        if path in files or path in seen or path.endswith((".gch", ".pch")):
            continue  # a file on the command line is in the key by its content already
        if not os.path.isabs(path) or len(seen) >= MAX_HEADERS:
            return None
        seen.add(path)
        line = _header_line(path, folders, normalize(path))
        if line is None:
            return None
        lines.append(line)
    data = b"".join(lines)
    if len(data) > MAX_RECORD_BYTES:
        return None
    return RECORD_KEY_PREFIX + digest(data), data


def checked(key: str) -> bool | None:
    """What :func:`holds` found for the record ``key`` in this process; None: not checked."""
    with _lock:
        return _checked.get(key)


def verdicts() -> dict[str, bool]:
    """Every record checked in this process and what the check found."""
    with _lock:
        return dict(_checked)


def learn(key: str, held: bool) -> None:
    """What a child placing kernels for this process found for the record ``key`` (a
    check made once per machine, never repeated on the load path)."""
    with _lock:
        _checked.setdefault(key, held)


def holds(key: str, data: bytes, denormalize: Callable[[str], str | None]) -> bool:
    """Whether the record ``data`` (named ``key``) comes out the same read here."""
    with _lock:
        if key in _checked:
            return _checked[key]
    held = _holds(key, data, denormalize)
    with _lock:
        _checked[key] = held
    return held


def _holds(key: str, data: bytes, denormalize: Callable[[str], str | None]) -> bool:
    try:
        return _read_holds(key, data, denormalize)
    except (OSError, ValueError):
        return False


#: A header as a record names it: (its path here, how many search folders precede it in the
#: record, its path as shown, the record's line)
Wanted = tuple[str, int, str, str]


def _read_holds(key: str, data: bytes, denormalize: Callable[[str], str | None]) -> bool:
    if len(data) > MAX_RECORD_BYTES or not data.startswith(RECORD_HEAD):
        return False
    if key != RECORD_KEY_PREFIX + digest(data):
        return False
    try:
        lines = data[len(RECORD_HEAD) :].decode().splitlines()
    except UnicodeDecodeError:
        return False
    folders: list[str] = []
    wanted: list[Wanted] = []
    total = 0
    for count, line in enumerate(lines):
        if count > MAX_HEADERS + 1_000:
            return False
        kind, _, rest = line.partition(" ")
        if kind == "search":
            folder = denormalize(rest)
            if folder is None:
                return False
            folders.append(folder)
            continue
        fields = rest.split(" ", 3)
        if kind != "header" or len(fields) != 4:
            return False
        path = denormalize(fields[3])
        if path is None or not os.path.isabs(path) or os.path.normpath(path) != path:
            return False
        try:
            total += int(fields[2].split(":", 1)[0])
        except ValueError:
            return False
        if total > MAX_TOTAL_BYTES:
            return False
        wanted.append((path, len(folders), fields[3], line + "\n"))
    if _unread(wanted, folders) >= ELSEWHERE_FROM:
        held = _hold_elsewhere(wanted, folders)
        if held is not None:
            return held
    return _lines_hold(wanted, folders)


def _unread(wanted: Sequence[Wanted], folders: Sequence[str]) -> int:
    """How many of the headers this process has not read yet (content or placement): what a
    check here would cost in system calls."""
    with _lock:
        return sum(
            path not in _file_digests or (path, tuple(folders[:searched])) not in _placements
            for path, searched, _, _ in wanted
        )


def _lines_hold(wanted: Sequence[Wanted], folders: Sequence[str]) -> bool:
    """Whether each header reads here as its record's line says (the first that does not
    ends the reading: what is read stays bounded by the record's sizes)."""
    for path, searched, shown, line in wanted:
        here = _header_line(path, folders[:searched], shown)
        if here is None or here.decode() != line:
            return False
    return True


#: A record of this many headers or more is read by a child interpreter: the reading is a
#: few thousand system calls (about 75 ms alone), each of which lets go of this process's
#: interpreter lock and waits to take it back from the thread compiling beside it; in this
#: process the check took 1.2 s beside a compile and slowed the compile's tracing
#: (docs/architecture.md, "The headers a kernel was built with").
ELSEWHERE_FROM = 64
ELSEWHERE_TIMEOUT_S = 60.0
#: Most bytes the child may answer with (a verdict, then a digest per header it read).
_MAX_ANSWER = 16 << 20


def _hold_elsewhere(wanted: Sequence[Wanted], folders: Sequence[str]) -> bool | None:
    """:func:`_lines_hold` in a child interpreter running this file alone (the standard
    library only: no import of objcache or torch); the digests it read join this process's.
    None where the child cannot say (not started, failed, timed out, answered out of form):
    the caller reads here."""
    if not sys.executable or not os.path.isfile(__file__):
        return None
    paths = {w[0] for w in wanted}
    with _lock:  # what this process read already is not read again
        known = {path: _file_digests[path] for path in paths if path in _file_digests}
    request = json.dumps(
        {"folders": list(folders), "wanted": [list(w) for w in wanted], "digests": known}
    )
    searched = {w[0]: w[1] for w in wanted}
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", __file__],
            input=request.encode(),
            capture_output=True,
            timeout=ELSEWHERE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0 or len(done.stdout) > _MAX_ANSWER:
        return None
    try:
        answer = json.loads(done.stdout)
        held, digests, placements = answer["holds"], answer["digests"], answer["placements"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(held, bool) or not isinstance(digests, dict):
        return None
    read = {
        path: value
        for path, value in digests.items()
        if path in paths and (value is None or isinstance(value, str))
    }
    placed: dict[tuple[str, tuple[str, ...]], Placed] = {}
    for item in placements if isinstance(placements, list) else ():
        if (
            isinstance(item, list)
            and len(item) == 3
            and searched.get(item[0]) == item[1]
            and (item[2] is None or _is_placed(item[2]))
        ):
            where = (item[2][0], item[2][1]) if item[2] is not None else None
            placed[(item[0], tuple(folders[: item[1]]))] = where
    with _lock:
        for path, value in read.items():
            _file_digests.setdefault(path, value)
        for key, where in placed.items():
            _placements.setdefault(key, where)
    return held


def _is_placed(value: object) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], int)
        and isinstance(value[1], str)
    )


def _child_main() -> None:
    """The child's side of :func:`_hold_elsewhere`: the request on standard input, the
    verdict and the digests it read on standard output."""
    request = json.loads(sys.stdin.buffer.read(MAX_RECORD_BYTES * 4))
    wanted = [(str(p), int(n), str(s), str(line)) for p, n, s, line in request["wanted"]]
    _file_digests.update(request["digests"])
    folders = [str(f) for f in request["folders"]]
    held = _lines_hold(wanted, folders)
    placements = [
        [path, len(searched), _placements[(path, searched)]]
        for path, searched in _placements
        if tuple(folders[: len(searched)]) == searched
    ]
    sys.stdout.write(
        json.dumps({"holds": held, "digests": _file_digests, "placements": placements})
    )


def pack(record_key: str, binary: bytes) -> bytes:
    """A binary as stored: the key of its headers' record, then its bytes."""
    return PREFIX + record_key.encode() + b"\n" + binary


def unpack(
    payload: bytes,
    get: Callable[[str], bytes | None],
    denormalize: Callable[[str], str | None],
) -> tuple[bytes | None, str]:
    """``(binary, "")`` where ``payload``'s headers hold here, else ``(None, why)``;
    ``get(record key)`` reads a record (None: absent)."""
    key = record_key_of(payload)
    if key is None:
        return None, "format"
    with _lock:
        known = _checked.get(key)
    if known is None:
        data = get(key)
        if data is None:
            return None, "headers_absent"
        known = holds(key, data, denormalize)
    if not known:
        return None, "headers_differ"
    return payload[len(PREFIX) + len(key) + 1 :], ""


_RECORD_KEY = re.compile(rb"(" + RECORD_KEY_PREFIX.encode() + rb"[0-9a-f]{40})\n")


def record_key_of(payload: bytes) -> str | None:
    """The key of the headers' record a stored binary names; None: not one of this format."""
    if not payload.startswith(PREFIX):
        return None
    match = _RECORD_KEY.match(payload, len(PREFIX))
    return match.group(1).decode() if match is not None else None


def forget() -> None:
    """Drop what this process learned (tests; a changed environment)."""
    with _lock:
        _search_ids.clear()
        _made.clear()
        _checked.clear()
        _file_digests.clear()
        _placements.clear()


def source_files(tokens: Sequence[str]) -> list[str]:
    """The files on a command line (absolute paths that exist)."""
    return [t for t in tokens if os.path.isabs(t) and os.path.isfile(t)]


if __name__ == "__main__":  # the child interpreter of :func:`_hold_elsewhere`
    _child_main()
