"""The cache engine: the tiered read and write paths (``tiered``), one tier with its deadline,
retries and breaker (``tier``, ``policy``), background writes (``writebehind``),
one fetch per key in a process and on a node (``singleflight``, ``nodelease``), records and
prefetch manifests (``records``, ``manifest``). It may import ``objcache.observe``, the storage
backends (``objcache.backends``), ``objcache.config``, ``objcache.entry`` and
``objcache.errors``; never the client, the integrations or the CLI (docs/architecture.md,
"Layers")."""
