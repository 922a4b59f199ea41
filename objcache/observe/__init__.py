"""Counters and what is made of them: per-tier counters and histograms (``metrics``), a run's
summary file (``run_summary``), the one-line stats at exit (``stats_lines``), the Prometheus
textfile (``prometheus``) and the safe replacement of a file in a shared folder
(``publish``). The core counts into these, so this layer sits below it: it may import the
storage backends' helpers, ``objcache.config``, ``objcache.entry`` and ``objcache.errors``,
never the core (docs/architecture.md, "Layers")."""
