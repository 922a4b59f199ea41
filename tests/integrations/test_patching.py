"""The ledger of what install() changed in torch
(:mod:`objcache.integrations.patching`): what it sets, it can put back."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_a_config_entry_holding_its_override_as_a_value_is_set_and_restored() -> None:
    """torch < 2.13 keeps a config override as the value itself (a bare sentinel object
    when unset), not a holder with get/set: install() set its flags through it (it failed
    and left every torch part off on 2.11) and uninstall() puts the attribute back."""
    from types import SimpleNamespace

    from objcache.integrations import patching

    module = SimpleNamespace(
        __name__="fake_config", flag=None, _config={"flag": SimpleNamespace(user_override=object())}
    )
    saved_before = dict(patching.saved)
    patching.set_config(module, "flag", True)
    try:
        assert module.flag is True
        assert patching.saved[("fake_config", "flag")] is None
    finally:
        patching.saved.clear()
        patching.saved.update(saved_before)
