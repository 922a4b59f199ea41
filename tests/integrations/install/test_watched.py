"""The torch modules the install watches (:mod:`objcache.integrations.install.watched`): each
has a part that applies it."""

from __future__ import annotations

from typing import get_args

import pytest

torch = pytest.importorskip("torch")


def test_every_watched_module_has_a_part_that_applies_it() -> None:
    from objcache.integrations.install import hooks, watched

    assert set(hooks.APPLY) == set(get_args(watched.Part))
    parts = set(watched.WATCHED.values()) | set(watched.WATCHED_PACKAGES.values())
    assert parts == set(hooks.APPLY)
