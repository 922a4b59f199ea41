"""torch's remote caches carried by objcache (docs/torch.md, "How torch is hooked").

``remote_cache_classes`` replaces torch's remote cache classes, ``serde`` says what is stored
per kind, ``writethrough`` writes remote hits into Inductor's local cache,
``guarded_candidates`` keeps every guard variant of an entry, ``pgo_join`` stores the
dynamic-shape profiles as a join; the keys: ``process_keys`` (what only one process has),
``custom_ops`` (the implementations of the ops a graph calls) and ``keycard_capture`` (key
cards taken where torch computed a key)."""
