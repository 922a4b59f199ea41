"""The ``objcache`` command (``main``; ``python -m objcache.cli``): its commands by group
(``commands_inspect``, ``commands_store``, ``commands_fleet``, ``commands_setup``) over what
they share (``common``), the store operations they run (``ops``: push, pull, gc, verify,
ls), ``objcache report`` over a job's run summaries (``report``), why a job's lookups missed
(``explain``, over key cards; ``timing`` for ``--time``) and the configuration reference
generator (``docgen``). The top layer: it may import every other layer of objcache
(docs/architecture.md, "Layers")."""
