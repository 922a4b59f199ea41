"""Per-kind size caps (objcache/entry/caps.py, docs/security.md "Size caps in detail")."""

from __future__ import annotations

import pytest

from objcache.config.settings import Config
from objcache.entry.caps import DEFAULT_CAP, DEFAULT_PER_KIND, LARGE_KINDS, SizeCaps
from tests.support.kinds import all_kinds


@pytest.mark.parametrize("kind", sorted(all_kinds()))
def test_every_kind_has_an_explicit_cap(kind: str) -> None:
    """A kind objcache stores is capped on purpose: its own cap, or the default as one of the
    large kinds; never the 1 GiB default by omission."""
    assert (kind in DEFAULT_PER_KIND) != (kind in LARGE_KINDS), kind


def test_the_caps_are_the_readers_limits() -> None:
    """Each small kind's cap is no smaller than what its reader accepts, and the vLLM kinds'
    are exactly their integrations' limits: an entry the reader would refuse is not fetched."""
    from objcache.integrations import triton_host, vllm, vllm_aot
    from objcache.observe import keycards
    from objcache.observe import run_summary as summary

    caps = SizeCaps()
    assert caps.for_kind(vllm.KIND_MODELINFO) == vllm.MAX_BYTES == 64 << 10
    assert caps.for_kind(vllm_aot.KIND) == vllm_aot.MAX_BYTES == 256 << 20
    assert caps.for_kind(triton_host.KIND) >= triton_host.MAX_BYTES
    assert caps.for_kind(summary.KIND) >= summary.MAX_BYTES
    assert caps.for_kind(keycards.MISSES_KIND) >= keycards.MAX_MISSES_BYTES
    for card_kind in keycards.CARD_KIND.values():
        assert caps.for_kind(card_kind) >= keycards.MAX_CARD_BYTES
    assert all(caps.for_kind(k) == DEFAULT_CAP for k in LARGE_KINDS)


def test_a_configured_default_moves_the_large_kinds_only() -> None:
    caps = Config.from_env({"OBJCACHE_MAX_ENTRY_BYTES": "512M,vllm-modelinfo=1M"}).max_entry_bytes
    assert caps.for_kind("fx-graph") == caps.for_kind("a-clients-own") == 512 << 20
    assert caps.for_kind("vllm-modelinfo") == 1 << 20
    assert caps.for_kind("vllm-aot") == 256 << 20
