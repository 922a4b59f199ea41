"""CLI commands forked from one process that imported everything once.

A command that times itself from after its imports (torch, inductor, the SDKs: 4-6 s on a
2-core machine) pays those imports in every process; forking each command from a process
that did them once leaves what is timed unchanged (the command's run and its process exit)
and the imports paid once per test module. Each command gets the environment, arguments
and stdout/stderr files it would get as a process of its own (its stdin is /dev/null).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

#: The zygote: imports, says ``ready``, then forks one child a request line. A child times
#: itself from just before ``main()`` (``started <monotonic>`` on its stderr); the zygote
#: answers with its exit code once it has exited.
ZYGOTE = r"""
import json, os, sys, time
import aioboto3, google.cloud.storage, torch
import objcache.cli.main
from objcache.integrations.install import features
features.load()  # the torch modules doctor reports on
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, req["out"]), (2, req["err"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = ["objcache", *req["args"]]
        print("started", time.monotonic(), file=sys.stderr, flush=True)
        code = 0
        try:
            objcache.cli.main.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.exit(code)  # the normal exit: atexit handlers, finalisation
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"code": os.waitstatus_to_exitcode(status), "ended": time.monotonic()}),
          flush=True)
"""


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str
    #: seconds from just before the command's ``main()`` to its process's exit
    elapsed: float


class ForkedCli:
    """``with ForkedCli() as cli: cli.run(*args, env=...)``; one command at a time."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="forked-cli-"))
        self._proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self._line(120)
        assert ready.strip() == "ready", ready
        self._n = 0

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)

    def _line(self, timeout: float) -> str:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no answer from the forked command within {timeout} s") from None

    def run(self, *args: str, env: dict[str, str], timeout: float = 60) -> Done:
        assert self._proc.stdin is not None
        self._n += 1
        out, err = self._dir / f"{self._n}.out", self._dir / f"{self._n}.err"
        request = {"args": list(args), "env": env, "out": str(out), "err": str(err)}
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        child = json.loads(self._line(10))["pid"]
        try:
            answer = json.loads(self._line(timeout))
        except TimeoutError:
            os.kill(child, signal.SIGKILL)
            self._line(10)  # the killed child's answer
            raise
        stderr = err.read_text()
        started = re.search(r"^started (\S+)$", stderr, re.MULTILINE)
        assert started, stderr
        stderr = stderr[started.end() + 1 :]
        elapsed = float(answer["ended"]) - float(started.group(1))
        return Done(answer["code"], out.read_text(), stderr, elapsed)

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=60)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> ForkedCli:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
