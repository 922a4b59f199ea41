"""``file://``: a directory as a shared object store.

The folder: ``spec`` (what the registry reads: scheme, options, location check, extra),
``store`` (the backend, ``FileBackend``, which the registry names). Importing this package or
its ``spec`` imports no backend code."""
