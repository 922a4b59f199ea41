"""``objcache demo``: objcache at work on this machine, three runs of one real compile.

``demo`` renders the runs, ``demo_worker`` is the compile workload one process runs (shared
with the tests and benchmarks), ``demo_jobs`` runs workers as simulated machines, and
``demo_models`` holds the built-in models. It sits above the integrations it drives and below
the CLI (docs/architecture.md, "Layers")."""
