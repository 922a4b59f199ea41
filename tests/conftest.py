"""Shared fixtures: real servers on 127.0.0.1 (one per session) and fault proxies.

Servers start lazily, the first time a test asks for them. A server that cannot
start makes its tests error with the reason (never a skip).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pytest

from tests.support import hypothesis_profiles
from tests.support.proxy import FaultProxy
from tests.support.servers import (
    FakeGCS,
    MotoS3,
    RedisClusterServer,
    RedisServer,
    S3Server,
    SeaweedS3,
    Server,
)

if TYPE_CHECKING:
    import redis


class BucketServer(Protocol):
    def create_bucket(self, name: str) -> None: ...
    def delete_bucket(self, name: str) -> None: ...


hypothesis_profiles.load()

#: Each test of the torch integration measures one part: precompile entries, on by default
#: on the releases docs/torch.md names, would serve whole functions before the FX,
#: AOTAutograd and kernel parts the other tests exercise. The precompile tests set
#: OBJCACHE_PRECOMPILE=1 themselves; a run with it set in the environment runs every test
#: with the part on (docs/testing.md, "Precompile entries in the suite").
os.environ.setdefault("OBJCACHE_PRECOMPILE", "0")


def _compiler_cache() -> None:
    """``g++`` for the session's processes is ``tests/support/gxx_cache.py``: a build it has
    made once is copied, not made again (docs/testing.md, "The compiler cache").
    Set up once, by the first process (xdist's workers inherit the environment);
    ``TESTS_GXX_CACHE=off`` runs the real compiler every time."""
    if os.environ.get("TESTS_GXX_CACHE"):
        return
    real = shutil.which("g++")
    if real is None:
        return
    import atexit
    import sys
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="objcache-tests-gxx-"))
    atexit.register(shutil.rmtree, folder, True)
    script = Path(__file__).parent / "support" / "gxx_cache.py"
    wrapper = folder / "bin" / "g++"
    wrapper.parent.mkdir()
    wrapper.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -S -E "{script}" "{real}" "{folder / "builds"}" "$@"\n'
    )
    wrapper.chmod(0o755)
    os.environ["TESTS_GXX_CACHE"] = str(folder)
    os.environ["PATH"] = f"{wrapper.parent}{os.pathsep}{os.environ.get('PATH', '')}"


_compiler_cache()


def _bytecode() -> None:
    """The bytecode of objcache and the test helpers written once, as an installed copy has it:
    with ``PYTHONDONTWRITEBYTECODE=1`` (this environment's default) every compile and CLI
    subprocess would otherwise compile objcache's sources again (docs/testing.md, "Time")."""
    import compileall

    root = Path(__file__).resolve().parents[1]
    for folder in (root / "objcache", root / "backends" / "objcache", root / "tests" / "support"):
        compileall.compile_dir(folder, quiet=2, workers=1)


_bytecode()


@pytest.fixture(autouse=True)
def _own_run_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test is its own start: the run group an earlier test's in-process client named
    is not inherited by this test's processes (objcache/observe/process_stats.py)."""
    monkeypatch.setenv("OBJCACHE_RUN_GROUP", "")
    monkeypatch.delenv("OBJCACHE_RUN_GROUP")


S = TypeVar("S", bound=Server)


@pytest.fixture(scope="session")
def test_servers() -> Iterator[Callable[[type[S]], S]]:
    """Factory: ``test_servers(RedisServer)`` starts that server on first use (one per
    class and session) and stops it at the end of the session."""
    started: dict[type[Server], Server | Exception] = {}
    with contextlib.ExitStack() as stack:

        def start(cls: type[S]) -> S:
            if cls not in started:
                try:
                    started[cls] = stack.enter_context(cls())
                except Exception as exc:  # every later test reports it at no cost
                    started[cls] = exc
            server = started[cls]
            if isinstance(server, Exception):
                raise server
            assert isinstance(server, cls)
            return server

        yield start


@pytest.fixture(scope="session")
def redis_server(test_servers: Callable[[type[RedisServer]], RedisServer]) -> RedisServer:
    return test_servers(RedisServer)


@pytest.fixture(params=["seaweed_s3", "moto_s3"])
def s3_server(request: pytest.FixtureRequest) -> S3Server:
    """Each S3 server in turn: SeaweedFS, then moto."""
    server: S3Server = request.getfixturevalue(request.param)
    return server


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A plain redis-py client of the session's server, to look at what a test stored (or
    at the server's own counters) without objcache in between."""
    import redis

    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    yield client
    client.close()


@pytest.fixture(scope="session")
def redis_cluster(
    test_servers: Callable[[type[RedisClusterServer]], RedisClusterServer],
) -> RedisClusterServer:
    """3 primaries and 3 replicas, shared by the session: tests that crash a node start their
    own (tests/faults/test_redis_cluster.py)."""
    return test_servers(RedisClusterServer)


@pytest.fixture(scope="session")
def seaweed_s3(test_servers: Callable[[type[SeaweedS3]], SeaweedS3]) -> SeaweedS3:
    return test_servers(SeaweedS3)


@pytest.fixture(scope="session")
def moto_s3(test_servers: Callable[[type[MotoS3]], MotoS3]) -> MotoS3:
    return test_servers(MotoS3)


@pytest.fixture(scope="session")
def fake_gcs(test_servers: Callable[[type[FakeGCS]], FakeGCS]) -> FakeGCS:
    return test_servers(FakeGCS)


@pytest.fixture
def fault_proxy() -> Iterator[Callable[[str, int], FaultProxy]]:
    """Factory: ``fault_proxy(host, port)`` returns a started proxy, closed at teardown."""
    proxies: list[FaultProxy] = []

    def make_proxy(host: str, port: int) -> FaultProxy:
        proxy = FaultProxy(host, port)
        proxies.append(proxy)
        return proxy

    yield make_proxy
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def make_bucket(request: pytest.FixtureRequest) -> Iterator[Callable[[BucketServer], str]]:
    """Factory: ``make_bucket(server)`` creates a bucket unique to this test on
    ``seaweed_s3``, ``moto_s3`` or ``fake_gcs`` and deletes it (and its objects)
    at teardown."""
    created: list[tuple[BucketServer, str]] = []
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")

    def make(server: BucketServer) -> str:
        name = f"t-{stem}-{uuid.uuid4().hex[:10]}"
        server.create_bucket(name)
        created.append((server, name))
        return name

    yield make
    for server, name in created:
        server.delete_bucket(name)


@pytest.fixture(scope="module")
def module_dir(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """A folder shared by one test module's tests, removed when the module ends unless
    one of its tests failed. Each simulated machine there holds its own torch cache
    (a precompiled header alone is ~160 MB), so keeping them all fills a CI disk."""
    failed_before = request.session.testsfailed
    path = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    yield path
    if request.session.testsfailed == failed_before:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The shared torch.compile runs (one cold compile per session, see
    tests/integrations/torch/test_compile.py)."""
    from tests.integrations.torch.test_compile import World

    return World(tmp_path_factory.mktemp("torch-compile"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with real compiles first, then files on the real servers, then the rest, each
    file's tests in their order: `make test`'s workers take whole files in this order, so
    the long files start first and the short ones fill the end (docs/testing.md, "Time")."""
    rank: dict[Path, int] = {}
    for item in items:
        mine = (
            0
            if item.get_closest_marker("compile")
            else 1
            if item.get_closest_marker("servers")
            else 2
        )
        rank[item.path] = min(rank.get(item.path, 2), mine)
    items.sort(key=lambda item: rank[item.path])
