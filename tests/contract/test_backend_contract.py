"""The contract every backend keeps (``objcache.backends.base``), run against each entry of
:data:`tests.contract.backends.BACKENDS`."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import pytest

from objcache.backends.base import Backend, ObjectInfo, PutMode
from objcache.errors import InvalidKey

from .backends import BackendParam, backend_params, open_backend


@pytest.fixture(params=backend_params())
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    async with open_backend(request.param, request) as b:
        yield b


@pytest.fixture
def param(request: pytest.FixtureRequest) -> BackendParam:
    """The configuration behind ``backend`` (for capability flags)."""
    p: BackendParam = request.node.callspec.params["backend"]
    return p


async def listed(backend: Backend, prefix: str = "") -> dict[str, int]:
    return {info.key: info.size async for info in backend.list(prefix)}


async def test_get_missing_is_none(backend: Backend) -> None:
    assert await backend.get("no/such/key") is None
    assert await backend.exists("no/such/key") is False


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00", os.urandom(1 << 20), bytes(range(256)) * 64],
    ids=["empty", "one-byte", "1MiB-random", "all-byte-values"],
)
async def test_round_trip(backend: Backend, data: bytes) -> None:
    assert await backend.put("rt/value", data) is True
    got = await backend.get("rt/value")
    assert type(got) is bytes
    assert got == data
    assert await backend.exists("rt/value") is True


async def test_create_keeps_first_value(backend: Backend) -> None:
    assert await backend.put("k", b"first", PutMode.CREATE) is True
    assert await backend.put("k", b"second", PutMode.CREATE) is False
    assert await backend.get("k") == b"first"


async def test_overwrite_replaces(backend: Backend) -> None:
    assert await backend.put("k", b"new key", PutMode.OVERWRITE) is True
    assert await backend.put("k", b"longer replacement value", PutMode.OVERWRITE) is True
    assert await backend.get("k") == b"longer replacement value"
    assert await backend.put("k", b"short", PutMode.OVERWRITE) is True
    assert await backend.get("k") == b"short"


async def test_exists_and_delete(backend: Backend, param: BackendParam) -> None:
    await backend.put("d/k", b"v")
    assert await backend.exists("d/k") is True
    deleted = await backend.delete("d/k")
    if param.exact_delete:
        assert deleted is True
    assert await backend.exists("d/k") is False
    assert await backend.get("d/k") is None
    assert await backend.put("d/k", b"again", PutMode.CREATE) is True  # the key is free again
    assert await backend.get("d/k") == b"again"


async def test_delete_missing_is_harmless(backend: Backend, param: BackendParam) -> None:
    deleted = await backend.delete("never/written")
    if param.exact_delete:
        assert deleted is False
    assert await backend.exists("never/written") is False


async def test_list_prefix(backend: Backend) -> None:
    entries = {"p/x/1": 1, "p/x/2": 22, "p/xy": 3, "p/y/deep/er/4": 4, "px": 5, "q/1": 6}
    for key, size in entries.items():
        await backend.put(key, b"z" * size)
    t0 = time.time()
    assert await listed(backend) == entries
    assert await listed(backend, "p/") == {k: v for k, v in entries.items() if k.startswith("p/")}
    # A prefix is a string prefix, not a folder: "p/x" also matches "p/xy".
    assert await listed(backend, "p/x") == {"p/x/1": 1, "p/x/2": 22, "p/xy": 3}
    assert await listed(backend, "p/x/") == {"p/x/1": 1, "p/x/2": 22}
    assert await listed(backend, "p/y/deep/er/4") == {"p/y/deep/er/4": 4}
    assert await listed(backend, "nothing/") == {}
    infos = [info async for info in backend.list("q/")]
    assert infos == [ObjectInfo(key="q/1", size=6, mtime=infos[0].mtime)]
    assert abs(infos[0].mtime - t0) < 24 * 3600


async def test_list_empty(backend: Backend) -> None:
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
async def test_unusual_keys(backend: Backend, key: str) -> None:
    assert await backend.put(key, key.encode()) is True
    assert await backend.get(key) == key.encode()
    assert await backend.exists(key) is True
    assert await listed(backend) == {key: len(key.encode())}


INVALID_KEYS = ["", "../x", "a/../../x", "/abs", "a//b", "a/", "./a", "a/\x00b", "a\\b", "k" * 901]


@pytest.mark.parametrize("key", INVALID_KEYS, ids=lambda k: repr(k)[:20])
async def test_invalid_keys_rejected(backend: Backend, key: str) -> None:
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


def _value(i: int) -> bytes:
    return bytes([i]) * (64 * 1024 + i)


async def test_concurrent_creates_have_one_winner(backend: Backend) -> None:
    values = {_value(i) for i in range(32)}
    seen: list[bytes | None] = []
    done = asyncio.Event()

    async def reader() -> None:
        while not done.is_set():
            seen.append(await backend.get("race"))
            await asyncio.sleep(0)  # let writers run even if get() never suspends

    async def writers() -> list[bool]:
        try:
            return list(await asyncio.gather(*(backend.put("race", _value(i)) for i in range(32))))
        finally:
            done.set()

    results, *_ = await asyncio.gather(writers(), reader(), reader())
    assert results.count(True) == 1
    assert results.count(False) == 31
    final = await backend.get("race")
    assert final == _value(results.index(True))
    assert all(v is None or v in values for v in seen), "a reader saw a partial value"
    assert await listed(backend) == {"race": len(final)}


async def test_concurrent_puts_of_different_keys(backend: Backend) -> None:
    keys = [f"many/{i % 4}/k{i}" for i in range(64)]
    results = await asyncio.gather(*(backend.put(k, k.encode() * 10) for k in keys))
    assert all(results)
    got = await asyncio.gather(*(backend.get(k) for k in keys))
    assert got == [k.encode() * 10 for k in keys]
    assert await listed(backend, "many/") == {k: len(k) * 10 for k in keys}


async def test_close_is_idempotent(backend: Backend) -> None:
    await backend.put("c", b"v")
    await backend.close()
    await backend.close()
