"""One way to open a store (docs/architecture.md, "Opening a store"): ``objcache.stores``.

No module but ``objcache/stores.py`` (and the definitions in ``objcache/core/tier.py``)
names ``create_backend``, ``Tier.from_backend`` or ``Tier.for_command``; the cache mode is
a tier whose failures are misses, the command mode a bounded backend that raises; the local
and disk specs are those the hand-built code made.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from objcache import stores
from objcache.backends.base import Backend, TierSpec
from objcache.client import build_cache
from objcache.config.settings import Config
from objcache.config.urls import parse_tier_url
from objcache.core.tier import Tier
from objcache.errors import PermanentBackendError, TransientBackendError
from tests.support.memory_backend import MemoryBackend

ROOT = Path(__file__).resolve().parent.parent
#: What opens a store; only these modules may name it.
OPENERS = frozenset({"create_backend", "from_backend", "for_command"})
ALLOWED = frozenset({"objcache/stores.py", "objcache/core/tier.py"})


def store_openers(root: Path = ROOT) -> list[str]:
    """Every use of an opener (a call, a reference, an import) in ``objcache/`` and
    ``backends/objcache/backends/`` outside :data:`ALLOWED`, as ``path:line: name``."""
    found: list[str] = []
    for top in ("objcache", "backends/objcache/backends"):
        for path in sorted((root / top).rglob("*.py")):
            where = path.relative_to(root).as_posix()
            if where in ALLOWED or where.startswith("objcache/backends/"):
                continue  # the latter: an installed tree's copy; the source is in backends/
            for node in ast.walk(ast.parse(path.read_text(), where)):
                if isinstance(node, ast.Name):
                    name = node.id
                elif isinstance(node, ast.Attribute):
                    name = node.attr
                elif isinstance(node, ast.alias):
                    name = node.name
                else:
                    continue
                if name in OPENERS:
                    found.append(f"{where}:{getattr(node, 'lineno', 0)}: {name}")
    return found


def test_only_the_stores_module_opens_a_store() -> None:
    assert store_openers() == []


def test_the_check_catches_a_planted_opener(tmp_path: Path) -> None:
    """The check above can fail: an opener planted anywhere else is reported, the allowed
    modules are not."""
    planted = {
        "objcache/stores.py": "x = create_backend(spec)\n",
        "objcache/core/tier.py": "x = Tier.for_command(b, timeout_ms=1)\n",
        "objcache/cli/rogue.py": (
            "from objcache.backends import create_backend\n"
            "t = Tier.from_backend(create_backend(s), timeout_ms=1)\n"
        ),
        "backends/objcache/backends/rogue.py": "b = tier_module.Tier.for_command(b)\n",
        "objcache/quiet.py": "opener = create_backend\n",
    }
    for where, source in planted.items():
        (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / where).write_text(source)
    assert sorted(store_openers(tmp_path)) == [
        "backends/objcache/backends/rogue.py:1: for_command",
        "objcache/cli/rogue.py:1: create_backend",
        "objcache/cli/rogue.py:2: create_backend",
        "objcache/cli/rogue.py:2: from_backend",
        "objcache/quiet.py:1: create_backend",
    ]


# --- the two modes -----------------------------------------------------------------------


def _config(tmp_path: Path, **fields: object) -> Config:
    return Config(local_dir=tmp_path / "local", prefetch=False, **fields)  # type: ignore[arg-type]


MEM = TierSpec("mem://test", "mem", "", "")


def _opened(monkeypatch: pytest.MonkeyPatch, **options: str) -> MemoryBackend:
    """The memory backend ``open_tier`` gets for the next spec, carrying ``options`` as its
    URL's (a fault-injecting store the registry does not know)."""
    backend = MemoryBackend()
    backend.spec = TierSpec(MEM.url, MEM.scheme, "", "", options)
    monkeypatch.setattr(stores, "create_backend", lambda spec: backend)
    return backend


def test_cache_mode_is_a_tier_with_the_configs_retries_breaker_and_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(
        tmp_path, timeout_ms=1234, retries=4, breaker_failures=7, breaker_cooldown_s=9.5
    )
    _opened(monkeypatch)
    tier = stores.open_tier(MEM, config)
    assert isinstance(tier, Tier)
    assert (tier.policy.timeout_s, tier.policy.retries) == (1.234, 4)
    assert (tier.breaker.threshold, tier.breaker.cooldown_s) == (7, 9.5)
    assert tier.writable
    read_only = stores.open_tier(MEM, config, read_only=True)
    assert not read_only.writable


def test_cache_mode_honours_the_urls_own_options(tmp_path: Path) -> None:
    config = _config(tmp_path, timeout_ms=1000, retries=2)
    spec = parse_tier_url(f"file://{tmp_path}/far?timeout_ms=5000&retries=0&read_only=1")
    tier = stores.open_tier(spec, config)
    assert (tier.policy.timeout_s, tier.policy.retries, tier.writable) == (5.0, 0, False)


async def test_cache_mode_turns_a_failing_store_into_a_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = _opened(monkeypatch)
    config = _config(tmp_path, timeout_ms=2000, retries=2, breaker_failures=2)
    tier = stores.open_tier(MEM, config)
    backend.fault = "transient"
    assert await tier.get("k") == (None, "error")
    assert backend.calls["get"] == 3  # the first try and the config's two retries
    assert await tier.get("k") == (None, "error")
    assert tier.breaker_open()  # the config's breaker: open after two failed calls
    assert await tier.get("k") == (None, "breaker")
    assert backend.calls["get"] == 6  # skipped while open


async def test_cache_mode_turns_a_missed_deadline_into_a_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = _opened(monkeypatch)
    tier = stores.open_tier(MEM, _config(tmp_path, timeout_ms=50))
    backend.fault = "hang"
    assert await tier.get("k") == (None, "timeout")
    assert await tier.put("k", b"v") is False


async def test_command_mode_raises_a_missed_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = _opened(monkeypatch, timeout_ms="50")
    config = _config(tmp_path, timeout_ms=10_000)
    bounded = stores.open_tier(MEM, config, mode="command")
    assert isinstance(bounded, Backend) and not isinstance(bounded, Tier)
    backend.fault = "hang"
    with pytest.raises(TransientBackendError, match="no answer within 50 ms"):
        await bounded.get("k")  # the tier's own deadline, not the config's 10 s


async def test_command_mode_raises_store_errors_without_retries_or_breaker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = _opened(monkeypatch)
    config = _config(tmp_path, retries=5, breaker_failures=1)
    bounded = stores.open_tier(MEM, config, mode="command")
    backend.fault = "transient"
    for attempt in range(1, 4):
        with pytest.raises(TransientBackendError, match="injected"):
            await bounded.get("k")
        assert backend.calls["get"] == attempt  # no retry, and no breaker skips a call
    backend.fault = "permanent"
    with pytest.raises(PermanentBackendError):
        await bounded.put("k", b"v")
    backend.fault = ""
    assert await bounded.put("k", b"v") and await bounded.get("k") == b"v"


async def test_command_mode_on_a_real_disk_store(tmp_path: Path) -> None:
    """Through the registry: a disk folder opened for a command reads what it wrote."""
    bounded = stores.open_tier(stores.disk_spec(tmp_path / "d"), _config(tmp_path), mode="command")
    try:
        assert await bounded.put("v1/e/k/ab/key", b"entry")
        assert await bounded.get("v1/e/k/ab/key") == b"entry"
        assert [i.key async for i in bounded.list("v1/")] == ["v1/e/k/ab/key"]
    finally:
        await bounded.close()


# --- specs -------------------------------------------------------------------------------


def test_disk_spec_is_the_hand_built_one_and_the_parsed_url(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    assert stores.disk_spec(folder) == TierSpec(f"disk://{folder}", "disk", "", str(folder), {})
    assert stores.disk_spec(folder) == parse_tier_url(f"disk://{folder}")
    assert stores.disk_spec(folder, max_bytes="5").options == {"max_bytes": "5"}


def test_local_spec_evicts_only_for_the_cache(tmp_path: Path) -> None:
    config = _config(tmp_path, local_max_bytes=12345)
    # what the CLI built by hand: no options, so no command evicts
    assert stores.local_spec(config) == TierSpec(
        f"disk://{config.local_dir}", "disk", "", str(config.local_dir), {}
    )
    # what the client built by hand: the local tier evicts above OBJCACHE_LOCAL_MAX_BYTES
    assert stores.local_spec(config, evict=True) == TierSpec(
        url=f"disk://{config.local_dir}",
        scheme="disk",
        location="",
        path=str(config.local_dir),
        options={"max_bytes": "12345"},
    )


def test_the_cache_opens_its_tiers_in_the_cache_mode(tmp_path: Path) -> None:
    """``build_cache``: the local tier evicting above the configured size and never
    read-only; the remotes read-only with the configuration, all with its policy."""
    config = _config(
        tmp_path,
        tiers=f"file://{tmp_path}/remote",
        local_max_bytes=4096,
        read_only=True,
        retries=3,
        breaker_failures=6,
        node_single_flight=False,
    )
    cache = build_cache(config, env_fields={"torch": "t"})
    assert cache.local is not None
    assert cache.local.backend.spec == stores.local_spec(config, evict=True)
    assert getattr(cache.local.backend, "max_bytes", None) == 4096
    assert cache.local.writable and not cache.remotes[0].writable
    for tier in cache.tiers:
        assert (tier.policy.retries, tier.breaker.threshold) == (3, 6)
