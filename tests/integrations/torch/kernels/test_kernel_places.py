"""Kernels placed where torch's loader looks while the prefetch runs
(docs/architecture.md, "Kernels placed before the compile")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.torch_cache import kernel_builder as _builder
from tests.support.torch_cache import kernel_built, new_machine
from tests.support.waiting import wait_until

torch = pytest.importorskip("torch")


def test_a_new_machine_finds_its_kernels_placed_before_torch_asks(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel built on one machine is put where torch's loader looks on the next, from
    the prefetch's local entries, before any build runs there; only a record of this
    machine's, in the form torch names a kernel, naming the binary's own key, is placed, and
    never over a file already there (docs/architecture.md, "Kernels placed before the
    compile")."""
    from objcache.client import get_client
    from objcache.integrations.torch.kernels import kernel_headers, kernel_places, kernels

    p = kernel_built(installed_file_store / "inductor" / "ab" / "cabxyz.cpp", 42)
    assert Path(p.target).name == "cabxyz.so"
    record = f"{kernel_places.machine()}-{p.key}"
    assert get_client().get(kernel_places.KIND, record) == b"ab/cabxyz.so"

    inductor = new_machine(installed_file_store, monkeypatch, "b")
    client = get_client()
    # the prefetch brings the entries into the local tier (here: read through once): the
    # binary, the record of the headers it was built with, its place
    stored = client.get(kernels.KIND, p.key)
    assert stored is not None
    headers = kernel_headers.record_key_of(stored)
    assert headers is not None and client.get(kernels.KIND, headers) is not None
    assert client.get(kernel_places.KIND, record) is not None
    # the local write-through of a remote hit is behind
    wait_until(lambda: client.get_local(kernels.KIND, p.key) is not None, what="kernel local")
    wait_until(lambda: client.get_local(kernels.KIND, headers) is not None, what="headers")
    wait_until(lambda: client.get_local(kernel_places.KIND, record) is not None, what="record")
    here = f"{kernel_places.machine()}-"
    placer = kernel_places.Placer(client, str(inductor), here)
    before = kernels.counters()
    assert placer.place(p.key)
    placed = inductor / "ab" / "cabxyz.so"
    assert placed.read_bytes() == Path(p.target).read_bytes() and os.access(placed, os.X_OK)
    assert placer.place(p.key) is False  # once
    # the record of its headers is read until it is checked here, then never again (every
    # kernel of a build names the same record)
    second = kernel_places.Placer(client, str(inductor / "second"), here)
    asked: list[str] = []
    read_local = second._local

    def counted(kind: str, key: str) -> bytes | None:
        asked.append(key)
        return read_local(kind, key)

    monkeypatch.setattr(second, "_local", counted)
    assert second.place(p.key)
    assert p.key in asked and headers not in asked
    second.stop()
    # torch's own loader now finds it: the build is skipped, nothing is fetched
    again = _builder(inductor / "ab" / "cabxyz.cpp", inductor / "ab")
    assert again.get_target_file_path() == str(placed)
    assert kernels.counters().get("placed", 0) == before.get("placed", 0) + 2

    # refused: another machine's record, a path not torch's, a path with another suffix, a
    # file already there (left as it is)
    other = kernel_places.Placer(client, str(inductor), "0" * 20 + "-")
    assert other.place(p.key) is None  # not local: tried again later, never placed
    for bad in (b"../ab/cabxyz.so", b"ab/cdexyz.so", b"/ab/cabxyz.so", b"ab/cabxyz.o", b"ab"):
        assert not kernel_places.Placer(client, str(inductor), here).place(p.key, record=bad)
    placed.unlink()
    placed.write_bytes(b"torch's own")
    assert not kernel_places.Placer(client, str(inductor), here).place(p.key)
    assert placed.read_bytes() == b"torch's own"
    placed.unlink()
    placed.symlink_to(installed_file_store / "elsewhere")
    assert not kernel_places.Placer(client, str(inductor), here).place(p.key)
    assert not (installed_file_store / "elsewhere").exists()
    after = kernels.counters()
    assert after.get("place_refused", 0) - before.get("place_refused", 0) == 5
    assert after.get("place_present", 0) - before.get("place_present", 0) >= 2


def test_kernels_are_placed_beside_the_prefetch_of_a_client_built_by_a_first_lookup(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Placement starts with whichever client the process builds, not only with the one
    ``install()`` builds up front: the zero-code path builds it at its first lookup
    (objcache.client.client_listeners)."""
    from objcache.client import get_client, reset_client
    from objcache.integrations.torch.kernels import kernel_places, kernels

    p = kernel_built(installed_file_store / "inductor" / "cd" / "ccdxyz.cpp", 7)
    get_client().flush()
    reset_client()  # the run's manifest lists the kernel and its place record
    inductor = new_machine(installed_file_store, monkeypatch, "b")
    monkeypatch.setenv("OBJCACHE_PREFETCH", "1")
    before = kernels.counters()
    client = get_client()  # as a first lookup would: no start_client()
    assert client.prefetch_result is not None
    client.prefetch_result.result(30)
    placed = inductor / "cd" / "ccdxyz.so"
    # the file is published before the placement is counted: wait for the count
    wait_until(
        lambda: kernels.counters().get("placed", 0) >= before.get("placed", 0) + 1,
        what="the kernel placement counted",
    )
    after = kernels.counters()
    assert placed.exists(), (before, after)
    assert placed.read_bytes() == Path(p.target).read_bytes()
    # (a background store of an earlier test may build a client too: at least ours)
    assert after.get("place_started", 0) >= before.get("place_started", 0) + 1
    assert kernel_places.start(client) is not None  # the same placer: started once
    assert kernels.counters().get("place_started", 0) == after.get("place_started", 0)


def test_a_machine_whose_compiler_searches_elsewhere_takes_no_record_of_this_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The records name the machine by what decides its binaries; the compiler's search
    (``CPATH``: another header found first) is part of it, as it is of the content key, so a
    binary built under another search is never placed where torch would load it."""
    from objcache.integrations.torch.kernels import kernel_places

    monkeypatch.setattr(kernel_places, "_machine", None)
    here = kernel_places.machine()
    monkeypatch.setenv("CPATH", str(tmp_path))
    monkeypatch.setattr(kernel_places, "_machine", None)
    assert kernel_places.machine() != here
    monkeypatch.delenv("CPATH")
    monkeypatch.setattr(kernel_places, "_machine", None)
    assert kernel_places.machine() == here


def test_the_machine_digest_is_computed_off_the_clients_builder_and_matched_by_the_placer(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The digest runs ``g++ -v`` and reads the compiler's search folders (about 20 ms
    alone, a few hundred beside a busy prefetch): the thread that built the client
    (``install()``, or a compile's first lookup on the zero-code path) never waits for it,
    the thread that feeds the placing child computes it; only a record of that digest
    reaches a placement, and a digest that cannot be made matches no record."""
    import threading

    from objcache.client import get_client
    from objcache.integrations.torch.kernels import kernel_places, kernels, place_process

    threads: list[str] = []

    def digest() -> str:
        threads.append(threading.current_thread().name)
        return "m" * 20

    monkeypatch.setattr(kernel_places, "machine", digest)
    client = get_client()
    child = place_process.PlaceProcess(client, str(installed_file_store / "inductor"))
    assert threads == []  # not on this thread
    child.arrived(client.object_key(kernels.KIND, "cnothere.so"), None)
    wait_until(lambda: threads, what="the digest computed")
    assert threads == ["objcache-place-send"]
    child.stop()

    placer = kernel_places.Placer(client, str(installed_file_store / "inductor"), "m" * 20 + "-")
    placed: list[tuple[str, bytes | None]] = []

    def place(key: str, record: bytes | None = None, binary: bytes | None = None) -> bool:
        placed.append((key, record))
        return False

    monkeypatch.setattr(placer, "place", place)
    for machine, name in (("o", "cabxyz.so"), ("m", "cdefgh.so")):
        placer.queue.put((kernel_places.KIND, f"{machine * 20}-{name}", name.encode(), 0))
    placer.stop()
    placer.thread.join(10)
    assert placed == [("cdefgh.so", b"cdefgh.so")]

    def no_digest() -> str:
        raise OSError("no compiler")

    monkeypatch.setattr(kernel_places, "machine", no_digest)
    assert place_process._prefix() == "\0"  # no record's name starts with it
