"""Tests of :mod:`objcache.observe`, one test module per module (docs/testing.md, "Layout")."""
