"""The backend contract (:mod:`objcache.testing.backend_contract`), run against every scheme
objcache serves: the registry (:func:`objcache.config.registry.builtin_schemes`) is
enumerated, and each scheme runs on every test server ``tests.support.servers.CONTRACT_SERVERS``
lists for it. A new backend's folder registers its schemes, its server joins that table, and
the contract runs on it with no change here; a scheme without a server fails this suite.
"""

from __future__ import annotations

import pytest

from objcache.backends import backend_class, create_backend
from objcache.backends.base import Backend
from objcache.backends.records_contract import RecordBackend
from objcache.config import registry
from objcache.config.urls import parse_tier_url
from objcache.testing.backend_contract import BackendContract
from tests.support.servers import CONTRACT_SERVERS, LocalFolder, Server

SCHEMES = registry.builtin_schemes()


def _on_server(scheme: str, server_cls: type[Server]) -> type:
    class OnServer(BackendContract):
        async def make_backend(self, request: pytest.FixtureRequest, unique: str) -> Backend:
            server = request.getfixturevalue("test_servers")(server_cls)
            return create_backend(parse_tier_url(server.contract_url(unique, scheme)))

    OnServer.__name__ = OnServer.__qualname__ = f"Test_{scheme}_{server_cls.__name__}"
    return OnServer if server_cls is LocalFolder else pytest.mark.servers(OnServer)


def _without_server(scheme: str) -> type:
    class NoServer(BackendContract):
        async def make_backend(self, request: pytest.FixtureRequest, unique: str) -> Backend:
            pytest.fail(
                f"{scheme}:// is registered but has no test server: add one to "
                "CONTRACT_SERVERS in tests/support/servers.py (docs/architecture.md, "
                '"Adding a backend")'
            )

    NoServer.__name__ = NoServer.__qualname__ = f"Test_{scheme}_without_a_server"
    return NoServer


for _scheme in SCHEMES:
    _servers = CONTRACT_SERVERS.get(_scheme, ())
    if isinstance(_servers, str):
        continue  # covered by the run of the scheme it names (checked below)
    for _cls in _servers or (None,):
        _test = _without_server(_scheme) if _cls is None else _on_server(_scheme, _cls)
        globals()[_test.__name__] = _test


class TestFileWithoutHardLinks(BackendContract):
    """``file://`` through the O_EXCL placeholder path of CREATE."""

    async def make_backend(self, request: pytest.FixtureRequest, unique: str) -> Backend:
        server = request.getfixturevalue("test_servers")(LocalFolder)
        backend = create_backend(parse_tier_url(server.contract_url(unique, "file")))
        backend.store.hardlinks = False  # type: ignore[attr-defined]
        return backend


def test_every_registered_scheme_has_a_contract_server() -> None:
    """A scheme with no server would run no contract test: name it. One covered by another
    scheme's run must be served by the same class, and that scheme must run."""
    assert sorted(set(SCHEMES) - set(CONTRACT_SERVERS)) == []
    for scheme, servers in CONTRACT_SERVERS.items():
        if isinstance(servers, str):
            assert SCHEMES[scheme].target == SCHEMES[servers].target, scheme
            assert not isinstance(CONTRACT_SERVERS[servers], str), scheme


def test_every_builtin_backend_supports_records() -> None:
    """Records (PGO profiles) must work on every built-in tier, so no built-in backend may
    skip the record tests of the contract."""
    for scheme in SCHEMES:
        assert issubclass(backend_class(scheme), RecordBackend), scheme
