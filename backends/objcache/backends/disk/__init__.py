"""``disk://``: the machine-local tier, LRU eviction by bytes.

The folder: ``spec`` (what the registry reads: scheme, options, location check, extra),
``store`` (the backend, ``DiskBackend``, which the registry names). Importing this package or
its ``spec`` imports no backend code."""
