"""Tests of :mod:`objcache.mega`, one test module per module (docs/testing.md, "Layout")."""
