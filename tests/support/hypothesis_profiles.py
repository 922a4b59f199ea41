"""Hypothesis example counts for the run at hand.

`make mutation` runs every mutant against the property tests; with
``OBJCACHE_HYPOTHESIS_PROFILE=mutation`` each property gets a few examples from a fixed seed,
so a mutant costs seconds rather than minutes (docs/testing.md). Every other run keeps the
counts the tests ask for.
"""

from __future__ import annotations

import os

from hypothesis import settings

MUTATION_EXAMPLES = 15
MUTATION = os.environ.get("OBJCACHE_HYPOTHESIS_PROFILE") == "mutation"

settings.register_profile(
    "mutation", max_examples=MUTATION_EXAMPLES, deadline=None, derandomize=True, database=None
)


def load() -> None:
    """Select the mutation profile when the environment asks for it (tests/conftest.py)."""
    if MUTATION:
        settings.load_profile("mutation")


def examples(n: int) -> int:
    """``n``, or the mutation profile's few examples in a mutation run."""
    return min(n, MUTATION_EXAMPLES) if MUTATION else n
