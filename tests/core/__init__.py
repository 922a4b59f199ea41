"""Tests of :mod:`objcache.core`, one test module per module (docs/testing.md, "Layout")."""
