"""Integrations: torch.compile (``torch/``, with the torch-only Mega-Cache bundles ``mega`` and
the ``objcache demo`` workload) and Triton's kernel cache (``triton``). They reach the cache
through the client (``objcache.get_client()``) and may import every layer below the CLI:
``objcache.client`` and ``objcache.bridge``, the core, observe, the backends, config, entry
and errors (docs/architecture.md, "Layers")."""
