"""Which backends the contract suite runs against, and how to make a fresh one per test.

To add a backend, append a :class:`BackendParam` to :data:`BACKENDS`; the tests do not
change. Its factory gets the pytest ``request`` (ask for server fixtures with
``request.getfixturevalue("redis_server")``, which also skips the test when the fixture
does) and a name unique to the test, to use as key prefix, folder or bucket path so that no
two tests see each other's keys. It returns the backend, or an awaitable of it. For example::

    def _redis(request: pytest.FixtureRequest, unique: str) -> Backend:
        url = request.getfixturevalue("redis_server")  # e.g. "redis://127.0.0.1:port/0"
        # however the backend takes a key prefix; an S3 factory would use s3://bucket/{unique}
        return create_backend(parse_tier_url(f"{url}?prefix={unique}"))

    BACKENDS.append(BackendParam("redis", _redis, marks=(pytest.mark.servers,)))
"""

from __future__ import annotations

import contextlib
import inspect
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from objcache.backends.base import Backend
from objcache.registry import create_backend
from objcache.urls import parse_tier_url

Factory = Callable[[pytest.FixtureRequest, str], "Backend | Awaitable[Backend]"]


@dataclass(frozen=True)
class BackendParam:
    """One backend configuration the contract suite runs against."""

    id: str
    factory: Factory
    #: delete() reports exactly whether the key existed (object stores may not know).
    exact_delete: bool = True
    marks: tuple[pytest.MarkDecorator, ...] = ()


def _fs(scheme: str, query: str = "", hardlinks: bool = True) -> Factory:
    def make(request: pytest.FixtureRequest, unique: str) -> Backend:
        root = request.getfixturevalue("tmp_path") / unique
        backend = create_backend(parse_tier_url(f"{scheme}://{root}{query}"))
        if not hardlinks:  # exercise the O_EXCL placeholder path of CREATE
            backend.store.hardlinks = False  # type: ignore[attr-defined]
        return backend

    return make


def _redis(request: pytest.FixtureRequest, unique: str) -> Backend:
    server = request.getfixturevalue("redis_server")
    return create_backend(parse_tier_url(f"{server.url}?prefix={unique}/"))


def _s3(fixture: str) -> Factory:
    def make(request: pytest.FixtureRequest, unique: str) -> Backend:
        from tests.cloud_support import s3_url

        return create_backend(parse_tier_url(s3_url(request.getfixturevalue(fixture), unique)))

    return make


def _gcs(request: pytest.FixtureRequest, unique: str) -> Backend:
    from tests.cloud_support import gcs_url

    return create_backend(parse_tier_url(gcs_url(request.getfixturevalue("fake_gcs"), unique)))


BACKENDS: list[BackendParam] = [
    # A size limit the tests never reach still runs the LRU bookkeeping on every call.
    BackendParam("disk", _fs("disk", "?max_bytes=1G")),
    BackendParam("file", _fs("file")),
    BackendParam("file-nolinks", _fs("file", hardlinks=False)),
    BackendParam("redis", _redis, marks=(pytest.mark.servers,)),
    BackendParam("s3-seaweed", _s3("seaweed_s3"), marks=(pytest.mark.servers,)),
    BackendParam("s3-moto", _s3("moto_s3"), marks=(pytest.mark.servers,)),
    BackendParam("gcs", _gcs, marks=(pytest.mark.servers,)),
]


def backend_params() -> list[object]:
    return [pytest.param(p, id=p.id, marks=p.marks) for p in BACKENDS]


@contextlib.asynccontextmanager
async def open_backend(
    param: BackendParam, request: pytest.FixtureRequest
) -> AsyncIterator[Backend]:
    """A fresh backend with its own namespace, closed afterwards."""
    made = param.factory(request, f"t{uuid.uuid4().hex[:12]}")
    backend = await made if inspect.isawaitable(made) else made
    try:
        yield backend
    finally:
        await backend.close()
