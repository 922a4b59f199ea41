"""What the environment says: ``Config`` and every ``OBJCACHE_*`` option (``settings``), tier
URLs and ``TierSpec`` (``urls``), URL query options (``options``), the scheme table
(``registry``), logging (``logs``) and the environment fingerprint (``fingerprint``). It may
import the storage contract (``objcache.backends.base``, ``objcache.backends.records_contract``),
``objcache.entry`` and ``objcache.errors``; the backends themselves sit above it and read
their options from it (docs/architecture.md, "Layers")."""
