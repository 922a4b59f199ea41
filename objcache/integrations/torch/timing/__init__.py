"""When torch compiles, and for how long, in torch's own figures: ``compile_windows`` (torch
at work compiling, the span the program's registrations are read once for), ``phase_times``
(where a process's compile time went, docs/architecture.md, "Phase times") and
``time_saved`` (the compile time its cache hits saved)."""
