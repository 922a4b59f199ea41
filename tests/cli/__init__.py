"""Tests of :mod:`objcache.cli`, one test module per module (docs/testing.md, "Layout")."""
