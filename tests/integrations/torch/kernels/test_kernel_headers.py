"""The record of the headers a kernel was built with
(:mod:`objcache.integrations.torch.kernels.kernel_headers`): a record of many headers is read
by a child interpreter, which says what this process would say, and where no child can say,
this process reads it itself."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.torch_cache import header_record

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture
def made(tmp_path: Path) -> tuple[str, bytes]:
    """A real record: a source including enough of the standard library to be read by a
    child."""
    from objcache.integrations.torch.kernels import kernel_headers

    code = "#include <iostream>\n#include <vector>\nint n() { return 1; }\n"
    record = header_record(tmp_path / "k.cpp", code)
    assert record is not None
    assert record[1].count(b"\nheader ") >= kernel_headers.ELSEWHERE_FROM
    kernel_headers.forget()
    return record


def _children(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The command lines of the child interpreters started from now on."""
    from objcache.integrations.torch.kernels import kernel_headers

    started: list[list[str]] = []
    real = subprocess.run

    def run(args: list[str], **kwargs: Any) -> Any:
        started.append(list(args))
        return real(args, **kwargs)

    monkeypatch.setattr(kernel_headers.subprocess, "run", run)
    return started


def _tampered(data: bytes) -> tuple[str, bytes]:
    """The record with its last header's digest changed, under its own key."""
    from objcache.integrations.torch.kernels import kernel_headers

    head, _, last = data.rstrip(b"\n").rpartition(b"\n")
    fields = last.split(b" ")
    size, _, hexed = fields[3].partition(b":")
    fields[3] = size + b":" + (b"0" * len(hexed))
    changed = head + b"\n" + b" ".join(fields) + b"\n"
    return kernel_headers.RECORD_KEY_PREFIX + kernel_headers.digest(changed), changed


def test_a_record_of_many_headers_is_read_by_a_child_that_says_what_this_process_says(
    made: tuple[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading hundreds of headers in the process that compiles lets go of its interpreter
    lock at every system call: a child reads them, and its verdict is this process's own,
    both ways; what it read (each header's digest and place in the search) spares this
    process a second reading."""
    from objcache.integrations.torch.kernels import kernel_headers, kernels

    key, data = made
    started = _children(monkeypatch)
    assert kernel_headers.holds(key, data, kernels.denormalize) is True
    assert len(started) == 1 and started[0][1:] == ["-I", "-S", kernel_headers.__file__]
    assert len(kernel_headers._file_digests) >= kernel_headers.ELSEWHERE_FROM
    assert len(kernel_headers._placements) >= kernel_headers.ELSEWHERE_FROM
    # another record of the same headers: nothing left to read, checked here at once
    bad_key, bad = _tampered(data)
    assert kernel_headers.holds(bad_key, bad, kernels.denormalize) is False
    assert len(started) == 1
    kernel_headers.forget()  # read by a child again: the same verdict
    assert kernel_headers.holds(bad_key, bad, kernels.denormalize) is False
    assert len(started) == 2
    # the same verdicts read in this process
    kernel_headers.forget()
    monkeypatch.setattr(kernel_headers, "ELSEWHERE_FROM", 10**9)
    assert kernel_headers.holds(key, data, kernels.denormalize) is True
    assert kernel_headers.holds(bad_key, bad, kernels.denormalize) is False
    assert len(started) == 2


@pytest.mark.parametrize("failure", ["no interpreter", "cannot start", "answers nonsense"])
def test_where_no_child_can_say_this_process_reads_the_record(
    made: tuple[str, bytes], monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    from objcache.integrations.torch.kernels import kernel_headers, kernels

    key, data = made
    if failure == "no interpreter":
        monkeypatch.setattr(kernel_headers.sys, "executable", "")
    else:

        def run(args: list[str], **kwargs: Any) -> Any:
            if failure == "cannot start":
                raise OSError("no fork")
            answer = b'{"holds": "yes", "digests": {}, "placements": []}'
            return subprocess.CompletedProcess(args, 0, answer, b"")

        monkeypatch.setattr(kernel_headers.subprocess, "run", run)
    assert kernel_headers.holds(key, data, kernels.denormalize) is True
    bad_key, bad = _tampered(data)
    assert kernel_headers.holds(bad_key, bad, kernels.denormalize) is False
