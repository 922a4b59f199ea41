"""The contract every objcache backend keeps, as tests a backend's own suite inherits.

objcache runs it against each of its backends (``tests/contract/`` in its repository); a
third-party backend runs the same tests by subclassing :class:`BackendContract` (the way
``fsspec.tests.abstract`` is used), naming the class ``Test...`` so pytest collects it::

    from objcache.backends.base import Backend
    from objcache.testing.backend_contract import BackendContract
    from objcache.config.urls import parse_tier_url

    class TestMyStore(BackendContract):
        exact_delete = False  # only if delete() cannot tell whether the key existed

        async def make_backend(self, request: pytest.FixtureRequest, unique: str) -> Backend:
            server = request.getfixturevalue("my_server")  # your own fixture
            return MyBackend(parse_tier_url(f"my://{server.address}/{unique}"))

``make_backend`` returns a fresh backend whose keys no other test sees (``unique`` is a
name made for the test: use it as key prefix, folder or bucket path); the suite closes it.
Needs pytest and pytest-asyncio (``pip install 'objcache[testing]'``); the tests carry the
``asyncio`` mark, so pytest-asyncio's strict mode runs them too.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import ClassVar

import pytest
import pytest_asyncio

from objcache.backends.base import Backend, ObjectInfo, PutMode
from objcache.backends.records_contract import RecordBackend
from objcache.core.records import Change, Outcome, read_modify_write
from objcache.entry.layout import Namespace
from objcache.errors import EntryTooLarge, InvalidKey, TransientBackendError


async def listed(backend: Backend, prefix: str = "") -> dict[str, int]:
    return {info.key: info.size async for info in backend.list(prefix)}


INVALID_KEYS = ["", "../x", "a/../../x", "/abs", "a//b", "a/", "./a", "a/\x00b", "a\\b", "k" * 901]


#: Byte lengths of the logical keys every backend must store (docs/architecture.md, "Long
#: keys"): around the 255-byte path component of filesystems, S3's and GCS's 1,024-byte
#: object names, and beyond.
KEY_LENGTHS = (1, 255, 256, 1024, 4096)
#: The tightest name limits among the built-in backends: a filesystem's path component,
#: and S3's and GCS's object names (the tier's own prefix comes on top of an object key).
MAX_COMPONENT_BYTES = 255
MAX_OBJECT_KEY_BYTES = 512


def logical_key(nbytes: int, script: str) -> str:
    """A key of exactly ``nbytes`` UTF-8 bytes: ASCII, or CJK (3 bytes a character)."""
    if script == "ascii":
        return "k" * nbytes
    return "\u9375" * (nbytes // 3) + "k" * (nbytes % 3)


def _value(i: int) -> bytes:
    return bytes([i]) * (64 * 1024 + i)


def _records(backend: Backend) -> RecordBackend:
    """The backend's record operations; a backend without them skips the record tests (its
    tier then holds no records: docs/architecture.md, "Records")."""
    if not isinstance(backend, RecordBackend):
        pytest.skip(f"{type(backend).__name__} has no record support (get_versioned)")
    return backend


def _add_element(element: str) -> Change:
    def change(current: bytes | None) -> bytes | None:
        members = set(json.loads(current)) if current else set()
        if element in members:
            return None
        return json.dumps(sorted(members | {element})).encode()

    return change


async def _join_riding_out_server_errors(
    store: RecordBackend, key: str, element: str, tries: int = 3
) -> tuple[Outcome, bool]:
    """Add ``element`` to the record ``key``: ``(outcome, retried)``. A transient error (a
    test server's HTTP 500 under concurrent writers: moto's has answered so) is the
    server's, not the backend's; the writer tries again, as a caller would. A try after
    an error may find its own element applied (``UNCHANGED``)."""
    for attempt in range(tries):
        try:
            outcome, _ = await read_modify_write(store, key, _add_element(element), timeout_s=30)
        except TransientBackendError:
            if attempt == tries - 1:
                raise
            continue
        return outcome, attempt > 0
    raise AssertionError("unreachable")


class KeepingSink:
    """A :class:`~objcache.backends.base.Sink` that keeps what it is handed."""

    def __init__(self, in_pieces: bool) -> None:
        self.in_pieces = in_pieces
        self.sizes: list[int | None] = []
        self.pieces: list[bytes] = []

    async def begin(self, size: int | None) -> bool:
        self.sizes.append(size)
        return self.in_pieces

    async def piece(self, data: bytes) -> None:
        self.pieces.append(bytes(data))


class BackendContract:
    """Inherit, implement :meth:`make_backend`, and every contract test runs on your backend."""

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.asyncio]

    #: delete() reports exactly whether the key existed (an object store may not know).
    exact_delete: ClassVar[bool] = True

    async def make_backend(self, request: pytest.FixtureRequest, unique: str) -> Backend:
        """A fresh backend whose keys live under ``unique`` (a name made for one test)."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_backend")

    @pytest_asyncio.fixture
    async def backend(self, request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
        made = await self.make_backend(request, f"t{uuid.uuid4().hex[:12]}")
        try:
            yield made
        finally:
            await made.close()

    async def test_get_missing_is_none(self, backend: Backend) -> None:
        assert await backend.get("no/such/key") is None
        assert await backend.exists("no/such/key") is False

    @pytest.mark.parametrize(
        "data",
        [b"", b"\x00", os.urandom(1 << 20), bytes(range(256)) * 64],
        ids=["empty", "one-byte", "1MiB-random", "all-byte-values"],
    )
    async def test_round_trip(self, backend: Backend, data: bytes) -> None:
        assert await backend.put("rt/value", data) is True
        got = await backend.get("rt/value")
        assert type(got) is bytes
        assert got == data
        assert await backend.exists("rt/value") is True

    @pytest.mark.parametrize("in_pieces", [True, False], ids=["in-pieces", "whole"])
    async def test_get_into_hands_the_object_to_its_sink(
        self, backend: Backend, in_pieces: bool
    ) -> None:
        """``get_into``: the object's bytes in order (in pieces where the sink asks, one
        otherwise), the size told first where known; an absent key is False; an object
        over the cap is refused (EntryTooLarge), one of exactly the cap is not."""
        data = os.urandom(3 << 20)
        assert await backend.put("into/value", data) is True
        sink = KeepingSink(in_pieces)
        assert await backend.get_into("into/value", len(data), sink) is True
        assert b"".join(sink.pieces) == data
        assert sink.sizes in ([len(data)], [None]) and (in_pieces or len(sink.pieces) == 1)
        assert await backend.get_into("into/absent", len(data), KeepingSink(in_pieces)) is False
        with pytest.raises(EntryTooLarge):
            await backend.get_into("into/value", len(data) - 1, KeepingSink(in_pieces))

    async def test_create_keeps_first_value(self, backend: Backend) -> None:
        assert await backend.put("k", b"first", PutMode.CREATE) is True
        assert await backend.put("k", b"second", PutMode.CREATE) is False
        assert await backend.get("k") == b"first"

    async def test_overwrite_replaces(self, backend: Backend) -> None:
        assert await backend.put("k", b"new key", PutMode.OVERWRITE) is True
        assert await backend.put("k", b"longer replacement value", PutMode.OVERWRITE) is True
        assert await backend.get("k") == b"longer replacement value"
        assert await backend.put("k", b"short", PutMode.OVERWRITE) is True
        assert await backend.get("k") == b"short"

    async def test_exists_and_delete(self, backend: Backend) -> None:
        await backend.put("d/k", b"v")
        assert await backend.exists("d/k") is True
        deleted = await backend.delete("d/k")
        if self.exact_delete:
            assert deleted is True
        assert await backend.exists("d/k") is False
        assert await backend.get("d/k") is None
        assert await backend.put("d/k", b"again", PutMode.CREATE) is True  # the key is free again
        assert await backend.get("d/k") == b"again"

    async def test_delete_missing_is_harmless(self, backend: Backend) -> None:
        deleted = await backend.delete("never/written")
        if self.exact_delete:
            assert deleted is False
        assert await backend.exists("never/written") is False

    async def test_list_prefix(self, backend: Backend) -> None:
        entries = {"p/x/1": 1, "p/x/2": 22, "p/xy": 3, "p/y/deep/er/4": 4, "px": 5, "q/1": 6}
        for key, size in entries.items():
            await backend.put(key, b"z" * size)
        t0 = time.time()
        assert await listed(backend) == entries
        assert await listed(backend, "p/") == {
            k: v for k, v in entries.items() if k.startswith("p/")
        }
        # A prefix is a string prefix, not a folder: "p/x" also matches "p/xy".
        assert await listed(backend, "p/x") == {"p/x/1": 1, "p/x/2": 22, "p/xy": 3}
        assert await listed(backend, "p/x/") == {"p/x/1": 1, "p/x/2": 22}
        assert await listed(backend, "p/y/deep/er/4") == {"p/y/deep/er/4": 4}
        assert await listed(backend, "nothing/") == {}
        infos = [info async for info in backend.list("q/")]
        assert infos == [ObjectInfo(key="q/1", size=6, mtime=infos[0].mtime)]
        assert abs(infos[0].mtime - t0) < 24 * 3600

    async def test_list_empty(self, backend: Backend) -> None:
        assert await listed(backend) == {}

    @pytest.mark.parametrize(
        "key",
        [
            "pt2:fx-graph-v1::fabc123:c1",
            "k=v+w@host",
            "a:b/c=d/e+f/g@h",
            "v1/e0f3/fx/ab/" + "/".join(f"level{i}" for i in range(20)) + "/leaf",
            ".hidden/file.bin",
        ],
    )
    async def test_unusual_keys(self, backend: Backend, key: str) -> None:
        assert await backend.put(key, key.encode()) is True
        assert await backend.get(key) == key.encode()
        assert await backend.exists(key) is True
        assert await listed(backend) == {key: len(key.encode())}

    @pytest.mark.parametrize("key", INVALID_KEYS, ids=lambda k: repr(k)[:20])
    async def test_invalid_keys_rejected(self, backend: Backend, key: str) -> None:
        with pytest.raises(InvalidKey):
            await backend.put(key, b"v")
        with pytest.raises(InvalidKey):
            await backend.put(key, b"v", PutMode.OVERWRITE)
        with pytest.raises(InvalidKey):
            await backend.get(key)
        with pytest.raises(InvalidKey):
            await backend.exists(key)
        with pytest.raises(InvalidKey):
            await backend.delete(key)
        assert await listed(backend) == {}

    @pytest.mark.parametrize("script", ["ascii", "cjk"])
    @pytest.mark.parametrize("nbytes", KEY_LENGTHS)
    async def test_keys_of_every_length_are_stored(
        self, backend: Backend, nbytes: int, script: str
    ) -> None:
        """Every key the API accepts has a name this backend holds: its object key (and its
        candidates folder) stays within every backend's name limits, and two keys that
        share their first kilobytes still get names of their own."""
        namespace = Namespace("e0f3")
        key = logical_key(nbytes, script)
        assert len(key.encode()) == nbytes
        twin = key[:-1] + ("x" if key[-1] != "x" else "y")
        names = {
            namespace.object_key("fx-graph", key): b"one",
            namespace.candidate_key("fx-graph", key, "ab" * 32): b"candidate",
            namespace.object_key("fx-graph", twin): b"twin",
        }
        for name, data in names.items():
            assert len(name.encode()) <= MAX_OBJECT_KEY_BYTES
            assert all(len(part.encode()) <= MAX_COMPONENT_BYTES for part in name.split("/"))
            assert await backend.put(name, data) is True
        assert len(names) == 3
        for name, data in names.items():
            assert await backend.get(name) == data
            assert await backend.exists(name) is True
        assert await listed(backend) == {name: len(data) for name, data in names.items()}
        prefix = namespace.object_prefix("fx-graph", key)
        assert await listed(backend, prefix) == {
            namespace.candidate_key("fx-graph", key, "ab" * 32): 9
        }
        for name in names:
            assert await backend.delete(name) is True or not self.exact_delete
        assert await listed(backend) == {}

    async def test_concurrent_creates_have_one_winner(self, backend: Backend) -> None:
        values = {_value(i) for i in range(32)}
        seen: list[bytes | None] = []
        done = asyncio.Event()

        async def reader() -> None:
            while not done.is_set():
                seen.append(await backend.get("race"))
                await asyncio.sleep(0)  # let writers run even if get() never suspends

        async def writers() -> list[bool]:
            try:
                return list(
                    await asyncio.gather(*(backend.put("race", _value(i)) for i in range(32)))
                )
            finally:
                done.set()

        results, *_ = await asyncio.gather(writers(), reader(), reader())
        assert results.count(True) == 1
        assert results.count(False) == 31
        final = await backend.get("race")
        assert final == _value(results.index(True))
        assert all(v is None or v in values for v in seen), "a reader saw a partial value"
        assert await listed(backend) == {"race": len(final)}

    async def test_concurrent_puts_of_different_keys(self, backend: Backend) -> None:
        keys = [f"many/{i % 4}/k{i}" for i in range(64)]
        results = await asyncio.gather(*(backend.put(k, k.encode() * 10) for k in keys))
        assert all(results)
        got = await asyncio.gather(*(backend.get(k) for k in keys))
        assert got == [k.encode() * 10 for k in keys]
        assert await listed(backend, "many/") == {k: len(k) * 10 for k in keys}

    async def test_close_is_idempotent(self, backend: Backend) -> None:
        await backend.put("c", b"v")
        await backend.close()
        await backend.close()

    # --- records: conditional writes (docs/architecture.md, "Records") ----------------------

    async def test_record_versions_are_compare_and_set(self, backend: Backend) -> None:
        store = _records(backend)
        assert await store.get_versioned("r/k") is None
        assert await store.put_if_version("r/k", b"one", None)
        assert not await store.put_if_version("r/k", b"other first", None)
        first = await store.get_versioned("r/k")
        assert first is not None and first.data == b"one"
        assert await store.put_if_version("r/k", b"two", first.version)
        assert not await store.put_if_version("r/k", b"stale", first.version)
        second = await store.get_versioned("r/k")
        assert second is not None and second.data == b"two" and second.version != first.version
        assert await backend.get("r/k") == b"two"
        assert not await store.put_if_version("r/absent", b"x", first.version)
        assert await backend.get("r/absent") is None

    async def test_record_concurrent_writers_all_survive_in_the_join(
        self, backend: Backend
    ) -> None:
        store = _records(backend)
        outcomes = await asyncio.gather(
            *(_join_riding_out_server_errors(store, "r/join", f"w{i}") for i in range(8))
        )
        assert all(
            o is Outcome.STORED or (o is Outcome.UNCHANGED and retried) for o, retried in outcomes
        )
        assert await backend.get("r/join") == json.dumps([f"w{i}" for i in range(8)]).encode()

    async def test_record_conflict_storm_ends_within_the_deadline(self, backend: Backend) -> None:
        """100 writers on one record: each contribution is in the join or its write was
        dropped (and says so); the storm ends within the deadline, never a hang."""
        store = _records(backend)
        deadline_s = 5.0
        started = time.monotonic()
        results = await asyncio.gather(
            *(
                read_modify_write(store, "r/storm", _add_element(f"w{i:03d}"), timeout_s=deadline_s)
                for i in range(100)
            ),
            return_exceptions=True,
        )
        assert time.monotonic() - started < deadline_s + 2.0
        stored = await backend.get("r/storm")
        joined = set(json.loads(stored)) if stored else set()
        outcomes: list[Outcome] = []
        for i, result in enumerate(results):
            # a transient error (a test server's HTTP 500 under the storm) says so, as a drop does
            if isinstance(result, TransientBackendError):
                outcome = Outcome.DROPPED
            else:
                assert not isinstance(result, BaseException), result
                outcome = result[0]
            outcomes.append(outcome)
            assert outcome in (Outcome.STORED, Outcome.DROPPED)
            if outcome is Outcome.STORED:  # a confirmed write is never lost
                assert f"w{i:03d}" in joined
            # else: dropped, or cut off by the deadline after the store applied it
            assert f"w{i:03d}" in joined or outcome is Outcome.DROPPED
        assert sum(o is Outcome.STORED for o in outcomes) >= 1
