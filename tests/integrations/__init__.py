"""Tests of :mod:`objcache.integrations`, one test module per module (docs/testing.md, "Layout")."""
