"""Precompile entries: Dynamo's own compiled package of a function, saved and served through
objcache (docs/torch.md, "Precompile entries").

``precompile`` installs the feature; ``precompile_entry`` says what an entry is (kind, format,
key, state shared by save and serve); ``precompile_save`` is the save path and
``precompile_serve`` the load path; ``precompile_guards`` the guards a served entry still
checks, ``portable_guards`` the ones torch cannot save, ``compile_settings`` what the entry
was compiled with, ``unguarded`` the facts torch never guards (hash order, names looked up
in vain, shared objects, the objects its guards state is rebuilt into) and
``superseded_codes`` the variants a later dynamic-shape one replaces."""
