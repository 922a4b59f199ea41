"""Facts a served precompile entry depends on that torch never guards, because one process
never changes them: the hash order, names looked up in vain, which objects are one object,
and the live objects the guards state is rebuilt into (docs/torch.md, "What a served entry
depends on")."""
