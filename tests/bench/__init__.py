"""Tests of the benchmark scripts under bench/ (no benchmark is run)."""
