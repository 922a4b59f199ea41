"""Tests of :mod:`objcache.integrations.torch`, one test module per module
(docs/testing.md, "Layout")."""
