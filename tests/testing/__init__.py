"""Tests of :mod:`objcache.testing`, one test module per module (docs/testing.md, "Layout")."""
