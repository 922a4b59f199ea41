"""Tests of :mod:`objcache.config`, one test module per module (docs/testing.md, "Layout")."""
