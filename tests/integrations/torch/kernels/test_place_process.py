"""Kernel placement in a child process of its own
(objcache/integrations/torch/kernels/place_process.py), with a real child."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.torch_cache import kernel_built, new_machine
from tests.support.waiting import wait_until

torch = pytest.importorskip("torch")


def _local_entries(client: Any, p: Any) -> list[str]:
    """The object keys the prefetch would bring for ``p``: binary, headers, place record,
    each read through once into the new machine's local tier."""
    from objcache.integrations.torch.kernels import kernel_headers, kernel_places, kernels

    record = f"{kernel_places.machine()}-{p.key}"
    stored = client.get(kernels.KIND, p.key)
    assert stored is not None
    headers = kernel_headers.record_key_of(stored)
    assert headers is not None and client.get(kernels.KIND, headers) is not None
    assert client.get(kernel_places.KIND, record) is not None
    wanted = [(kernels.KIND, p.key), (kernels.KIND, headers), (kernel_places.KIND, record)]
    for kind, key in wanted:
        wait_until(lambda k=kind, n=key: client.get_local(k, n) is not None, what=key)
    return [client.object_key(kind, key) for kind, key in wanted]


def _started(child: Any, client: Any) -> Any:
    """``child``'s process, started by a first key to place (one no store holds)."""
    from objcache.integrations.torch.kernels import kernels

    child.arrived(client.object_key(kernels.KIND, "cnothere.so"), None)
    wait_until(lambda: child.proc is not None, what="the child started")
    return child.proc


def test_a_child_places_the_kernels_and_the_compiling_process_knows_what_it_placed(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child (another process, never importing torch) places the binary where torch's
    loader looks; the parent notes it as placed by objcache (the vector-ISA probe's verdict
    needs that), learns the headers' record verdict (its load path never checks it again)
    and counts what the child counted. Closing the pipe ends the child."""
    from objcache.client import get_client
    from objcache.integrations.torch.kernels import kernel_headers, kernels
    from objcache.integrations.torch.kernels.place_process import PlaceProcess

    p = kernel_built(installed_file_store / "inductor" / "gh" / "cghxyz.cpp", 4242)
    inductor = new_machine(installed_file_store, monkeypatch, "b")
    client = get_client()
    okeys = _local_entries(client, p)
    headers = kernel_headers.record_key_of(client.get_local(kernels.KIND, p.key) or b"")
    assert headers is not None
    kernel_headers.forget()  # nothing checked in this process yet
    before = kernels.counters()

    child = PlaceProcess(client, str(inductor))
    assert child.proc is None  # nothing to place yet: no child
    for okey in reversed(okeys):  # the record first: the binary's arrival places it
        child.arrived(okey, None)
    wait_until(
        lambda: kernels.counters().get("placed", 0) == before.get("placed", 0) + 1,
        what="the child's placement counted here",
    )
    placed = inductor / "gh" / "cghxyz.so"
    assert placed.read_bytes() == Path(p.target).read_bytes() and os.access(placed, os.X_OK)
    assert kernels._outputs.get(str(placed)) == (p.key, True)  # noted before counted
    assert kernel_headers.checked(headers) is True
    # the child never imported torch
    assert child.proc is not None and child.proc.pid != os.getpid()
    maps = Path(f"/proc/{child.proc.pid}/maps")
    if maps.exists():
        assert "libtorch" not in maps.read_text()
    child.stop()
    wait_until(lambda: child.proc.poll() is not None, what="the child's exit")
    wait_until(
        lambda: (
            kernels.counters().get("place_process_ended", 0)
            == before.get("place_process_ended", 0) + 1
        ),
        what="its end counted",
    )


def test_a_child_that_says_something_unreadable_is_ended_and_nothing_it_said_is_noted(
    installed_file_store: Path,
) -> None:
    """Only the three message forms are taken, each checked: a placed path torch would not
    give a kernel is not noted, a counter with a name out of form or an absurd count is
    dropped; anything else ends the child, and the load path works as without placement."""
    from objcache.client import get_client
    from objcache.integrations.torch.kernels import kernel_headers, kernels
    from objcache.integrations.torch.kernels.place_process import PlaceProcess

    client = get_client()
    root = installed_file_store / "inductor"
    child = PlaceProcess(client, str(root))
    before = kernels.counters()
    for rel in ("../ab/cabxyz.so", "/ab/cabxyz.so", "ab/cdexyz.so"):
        child._apply({"placed": ["cabxyz.so", rel]})
    assert ("cabxyz.so", True) not in kernels._outputs.values()
    child._apply({"placed": ["cabxyz.so", "ab/cabxyz.so"]})  # a path torch gives a kernel
    assert kernels._outputs[str(root / "ab" / "cabxyz.so")] == ("cabxyz.so", True)
    child._apply({"counts": {"placed": 1, "Bad Name\x1b[2J": 1, "errors": 10**9, "x": "1"}})
    child._apply({"checked": ["headers-x", "yes"]})
    assert kernel_headers.checked("headers-x") is None
    after = kernels.counters()
    assert after.get("placed", 0) == before.get("placed", 0) + 1
    assert after.get("errors", 0) == before.get("errors", 0)
    with pytest.raises(ValueError):
        child._apply({"run": "rm -rf /"})
    # a child gone: its end is counted, later arrivals cost nothing and raise nothing
    _started(child, client).kill()
    wait_until(
        lambda: (
            kernels.counters().get("place_process_ended", 0) > before.get("place_process_ended", 0)
        ),
        what="the end counted",
    )
    queued = child.queued
    child.arrived(client.object_key(kernels.KIND, "cabxyz.so"), None)
    assert child.queued == queued  # nothing kept for a child that is gone
    child.stop()


def test_a_forked_copy_stopping_its_placement_leaves_the_parents_child_running(
    installed_file_store: Path,
) -> None:
    """A forked process (a data loader's worker) builds its own client and stops the
    placement it inherited: only its copy of the pipe is closed; the child keeps placing
    for the process that started it."""
    from objcache.client import get_client
    from objcache.integrations.torch.kernels.place_process import PlaceProcess

    client = get_client()
    child = PlaceProcess(client, str(installed_file_store / "inductor"))
    proc = _started(child, client)
    pid = os.fork()
    if pid == 0:  # the forked copy
        code = 0
        try:
            child.stop()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    child.stop()
    wait_until(lambda: proc.poll() is not None, what="the child's exit")
    # it ended as the parent closed its pipe (0), not by a signal from the forked copy
    assert proc.returncode == 0


def test_a_child_runs_objcache_from_where_the_parent_imported_it_not_the_working_folder(
    tmp_path: Path,
) -> None:
    """``python -m`` puts the working folder first on the path: a module planted there (a
    shared folder; an ``objcache`` wherever objcache is a plain install) would run in the
    child. objcache's children start with the folder their parent's objcache came from in
    that place instead."""
    from objcache.prefetch_process import child_command

    marker = tmp_path / "ran"
    (tmp_path / "planted_probe.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    env = dict(os.environ, OBJCACHE_ENABLE="0")
    env.pop("PYTHONPATH", None)
    run = {"cwd": tmp_path, "env": env, "capture_output": True, "timeout": 60, "check": False}
    done = subprocess.run(child_command("planted_probe"), **run)  # type: ignore[call-overload]
    assert done.returncode != 0 and b"No module named" in done.stderr
    assert not marker.exists()
    ours = subprocess.run(child_command("objcache.prefetch_process"), input=b"", **run)  # type: ignore[call-overload]
    assert ours.returncode == 2, ours.stderr  # objcache's own child: no start message
    # what ``-m`` runs
    subprocess.run([sys.executable, "-m", "planted_probe"], **run)  # type: ignore[call-overload]
    assert marker.exists()


def test_a_start_whose_prefetch_brings_no_kernel_starts_no_child(
    installed_file_store: Path,
) -> None:
    """The child starts with the first key it has to place: other keys, or a stop before
    any, leave the process without one."""
    from objcache.client import get_client
    from objcache.integrations.torch.kernels.place_process import PlaceProcess

    client = get_client()
    child = PlaceProcess(client, str(installed_file_store / "inductor"))
    child.arrived(client.object_key("fx-graph", "fabc"), None)
    child.stop()
    child.writer.join(10)
    assert not child.writer.is_alive() and child.proc is None
