"""The ``objcache`` command (``main``; ``python -m objcache.cli``), the store operations it
runs (``ops``: push, pull, gc, verify, ls), ``objcache report`` over a job's run summaries
(``report``), the configuration reference generator (``docgen``) and terminal-safe text
(``plaintext``). The top layer: it may import every other layer of objcache
(docs/architecture.md, "Layers")."""
