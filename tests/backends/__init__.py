"""Tests of :mod:`objcache.backends`, one test module per module (docs/testing.md, "Layout")."""
