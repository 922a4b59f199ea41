"""Test suites shipped in the package for third parties: the backend contract
(``backend_contract``, documented as ``objcache.backend_contract``). It may import every layer
below the client (docs/architecture.md, "Layers")."""
