"""Mega-Cache bundles (docs/torch.md): ``mega`` stores ``torch.compiler.save_cache_artifacts()``
as a named, checked object; ``seed`` fills the local tier from what a machine already has
(``objcache push``). The public face is :mod:`objcache.mega`."""
