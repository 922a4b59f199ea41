"""Tests of :mod:`objcache.entry`, one test module per module (docs/testing.md, "Layout")."""
