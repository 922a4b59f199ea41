"""A ``g++`` for the test session that serves a build it has already made (docs/testing.md,
"The compiler cache").

Most of a compile test's CPU is g++, and most of that is the same work in every simulated
machine: torch's vector-ISA probes (six small programs, ~8 s on this machine) and the
precompiled header (~6 s) are built again in every fresh ``TMPDIR``, and the same kernels again in
every fresh cache dir. ``conftest.py`` puts this program first on ``PATH`` for the session
(subprocesses inherit it): a build whose inputs it has seen is copied from its cache, any
other call runs the real compiler. Test shims (``torch_runs.make_gxx_shim``) still log every
call, since they run before this one.

A build is keyed by the real compiler's path, every argument (a file argument by its
content, the output by its suffix, the working directory when an argument is relative) and
the environment variables g++ reads for paths; only a build that succeeded with one output
is kept. What a source ``#include``s is not keyed: the headers a test build reads are torch's
installed ones, fixed for a session (no test builds against headers it writes). Only this
script's stdlib is used: it runs as ``python -S -E``.

Run as ``gxx_cache.py REAL_GXX CACHE_DIR ARGS...``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

#: Arguments whose presence means the call is not a plain build of one output.
_PASS_THROUGH = frozenset({"-E", "-M", "-MM", "-MD", "-MMD", "-v", "--version", "-save-temps"})
#: Variables g++ reads to find headers, libraries or its own parts.
_ENV = ("CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH", "LIBRARY_PATH", "GCC_EXEC_PREFIX")


def _file_digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_key(real: str, args: list[str], cwd: str, environ: dict[str, str]) -> str | None:
    """The cache key of a build, or None where the call is not one cacheable build."""
    if any(a in _PASS_THROUGH or a.startswith("--help") or a == "-Q" for a in args):
        return None
    if args.count("-o") != 1 or args[-1] == "-o":
        return None
    parts = [real]
    relative = False
    for i, arg in enumerate(args):
        if i > 0 and args[i - 1] == "-o":
            parts.append("<out>" + os.path.splitext(arg)[1])
            continue
        value = arg[2:] if arg[:2] in ("-I", "-L") and len(arg) > 2 else arg
        if value and not os.path.isabs(value) and os.path.exists(value):
            relative = True  # a path read from the working directory
        if not arg.startswith("-") and os.path.isfile(arg):
            # (a header's precompiled form beside it only makes its build faster)
            parts.append("<file " + _file_digest(arg) + os.path.splitext(arg)[1] + ">")
        else:
            parts.append(arg)
    if relative:
        parts.append("<cwd " + cwd + ">")
    parts.extend(f"{name}={environ.get(name, '')}" for name in _ENV)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _place(source: str, target: str) -> None:
    """``source`` copied to ``target`` atomically, its mode kept."""
    folder = os.path.dirname(os.path.abspath(target))
    fd, temp = tempfile.mkstemp(dir=folder, prefix=".gxx-cache-")
    os.close(fd)
    try:
        shutil.copy2(source, temp)
        os.replace(temp, target)
    except BaseException:
        os.unlink(temp)
        raise


def main(argv: list[str]) -> int:
    real, cache, args = argv[0], argv[1], argv[2:]
    key = build_key(real, args, os.getcwd(), dict(os.environ))
    if key is None:
        os.execv(real, [real, *args])
    output = args[args.index("-o") + 1]
    stored = os.path.join(cache, key)
    if os.path.isfile(stored) and os.path.isfile(stored + ".stderr"):
        _place(stored, output)
        with open(stored + ".stderr", "rb") as f:  # the warnings of the build it was
            sys.stderr.buffer.write(f.read())
        return 0
    done = subprocess.run([real, *args], stderr=subprocess.PIPE)
    sys.stderr.buffer.write(done.stderr)
    if done.returncode == 0 and os.path.isfile(output):
        os.makedirs(cache, exist_ok=True)
        _place(output, stored)
        fd, temp = tempfile.mkstemp(dir=cache, prefix=".gxx-cache-")
        with os.fdopen(fd, "wb") as f:
            f.write(done.stderr)
        os.replace(temp, stored + ".stderr")  # last: a build is served once both are there
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
