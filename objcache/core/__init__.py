"""The cache engine: the read engine (``tiered``) and what is built on it: reads (``reads``),
the write path (``writes``), guarded candidates (``candidates``), records across the tiers
(``tiered_records``, over ``records``) and prefetch manifests (``manifest``); one tier with its
deadline, retries and breaker (``tier``, ``policy``), background writes (``writebehind``), one
fetch per key in a process and on a node (``fetch_once/``),
lookup logging (``lookup_log``) and ``ENV.json`` (``env_note``). It may import
``objcache.observe``, the storage backends (``objcache.backends``), ``objcache.config``,
``objcache.entry`` and ``objcache.errors``; never the client, the integrations or the CLI
(docs/architecture.md, "Layers")."""
