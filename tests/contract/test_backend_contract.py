"""The backend contract (:mod:`objcache.testing.backend_contract`), run against every
objcache backend: the local ones on a temporary folder, the others on each test server of
``tests.support.servers.CONTRACT_SERVERS`` (a new backend's server joins that list, and the
contract runs on it with no change here).
"""

from __future__ import annotations

import pytest

from objcache.backends import create_backend
from objcache.backends.base import Backend
from objcache.config.urls import parse_tier_url
from objcache.testing.backend_contract import BackendContract
from tests.support.servers import CONTRACT_SERVERS, FakeGCS, MotoS3, RedisServer, SeaweedS3


def _fs(request: pytest.FixtureRequest, scheme: str, unique: str, query: str = "") -> Backend:
    root = request.getfixturevalue("tmp_path") / unique
    return create_backend(parse_tier_url(f"{scheme}://{root}{query}"))


class TestDisk(BackendContract):
    async def make_backend(self, request: pytest.FixtureRequest, unique: str) -> Backend:
        # A size limit the tests never reach still runs the LRU bookkeeping on every call.
        return _fs(request, "disk", unique, "?max_bytes=1G")


class TestFile(BackendContract):
    async def make_backend(self, request: pytest.FixtureRequest, unique: str) -> Backend:
        return _fs(request, "file", unique)


class TestFileWithoutHardLinks(BackendContract):
    """Exercises the O_EXCL placeholder path of CREATE."""

    async def make_backend(self, request: pytest.FixtureRequest, unique: str) -> Backend:
        backend = _fs(request, "file", unique)
        backend.store.hardlinks = False  # type: ignore[attr-defined]
        return backend


def _on_server(server_cls: type[RedisServer | SeaweedS3 | MotoS3 | FakeGCS]) -> type:
    class OnServer(BackendContract):
        async def make_backend(self, request: pytest.FixtureRequest, unique: str) -> Backend:
            server = request.getfixturevalue("test_servers")(server_cls)
            return create_backend(parse_tier_url(server.contract_url(unique)))

    OnServer.__name__ = OnServer.__qualname__ = f"Test{server_cls.__name__}"
    return pytest.mark.servers(OnServer)


for _server_cls in CONTRACT_SERVERS:
    globals()[f"Test{_server_cls.__name__}"] = _on_server(_server_cls)


def test_every_builtin_backend_supports_records() -> None:
    """Records (PGO profiles) must work on every built-in tier, so no built-in backend may
    skip the record tests of the contract."""
    from objcache.backends.disk import DiskBackend
    from objcache.backends.file import FileBackend
    from objcache.backends.gcs import GCSBackend
    from objcache.backends.records_contract import RecordBackend
    from objcache.backends.redis import RedisBackend
    from objcache.backends.s3 import S3Backend

    for cls in (DiskBackend, FileBackend, GCSBackend, RedisBackend, S3Backend):
        assert issubclass(cls, RecordBackend), cls
