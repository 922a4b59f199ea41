"""``redis://``, ``rediss://`` and ``unix://``: Redis through redis-py.

The folder: ``spec`` (what the registry reads: scheme, options, location check, extra),
``store`` (the backend, ``RedisBackend``, which the registry names), ``cluster`` (Redis
Cluster: detection, the cluster client, SCAN over every primary, the topology
``objcache doctor`` reports). Importing this package or its ``spec`` imports no SDK and no
backend code."""
