"""Integrations: torch.compile (``torch/``, by feature: ``precompile``, ``kernels``, ``remote``,
``mega``, ``timing``), Triton's kernel cache (``triton``, ``triton_host``) and vLLM's
(``vllm``, ``vllm_aot``), all applied by one installer (``install/``) and recorded in one patch
ledger (``patching``). They reach the cache through one typed accessor,
:func:`objcache.integrations.cache_client.get_client`, never through the root package, and may
import every layer below the demo and the CLI: ``objcache.client`` and ``objcache.bridge``, the
core, observe, the backends, config, entry and errors (docs/architecture.md, "Layers")."""
