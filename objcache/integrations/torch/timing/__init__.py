"""Compile time in torch's own figures, read for the run summary: ``phase_times`` (where a
process's compile time went, docs/architecture.md, "Phase times") and ``time_saved`` (the
compile time its cache hits saved)."""
