"""The ``objcache`` command (``main``; ``python -m objcache.cli``), the store operations it
runs (``ops``: push, pull, gc, verify, ls), ``objcache report`` over a job's run summaries
(``report``), why a job's lookups missed (``explain``, over key cards) and the configuration
reference generator (``docgen``). The top layer: it may import every other layer of objcache
(docs/architecture.md, "Layers")."""
