"""Test support."""
