"""A lookup's local look and node lease, in one worker-thread hop (docs/architecture.md, "One
remote fetch per node"): what :class:`objcache.core.tiered.TieredCache` does on a local miss
before it asks the remote tiers, when node leases are on (objcache/core/fetch_once/nodelease.py).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable

from objcache.backends.base import LocalStore
from objcache.core.fetch_once.nodelease import Claim, Lease, NodeLeases
from objcache.core.read_decision import LEASED_ELSEWHERE, lease_outcome_of_write
from objcache.core.tier import Tier
from objcache.observe.metrics import CacheStats

#: Verifies a local entry read outside the tier: its payload, or None (refused, counted).
Verify = Callable[[str, bytes], Awaitable[bytes | None]]


def let_go(lease: Lease, stored: bool) -> None:
    """Release a write-through's lease from the thread that wrote the entry."""
    lease.release_sync(lease_outcome_of_write(stored))


async def claim(
    leases: NodeLeases,
    store: LocalStore,
    local: Tier,
    stats: CacheStats,
    verify: Verify,
    okey: str,
    *,
    wait: bool,
    absent_locally: bool,
) -> tuple[bytes | None, Lease | None, str | None]:
    """The local look and the node lease in one worker-thread hop (nodelease.py):
    ``(payload, None, None)`` on a local hit; ``(None, lease or None, None)`` to fetch
    from the remotes (holding the lease when it is ours); ``(None, None, tier)`` to
    answer the lookup without a fetch: another process found the entry absent
    everywhere (``""``) or, without ``wait``, is fetching it (``LEASED_ELSEWHERE``)."""
    started = time.perf_counter()
    claimed, lease, entry = await leases.lookup(
        okey,
        read=functools.partial(store.read_sync, okey),
        wait=wait,
        look_first=not absent_locally,
    )
    if claimed is not Claim.LOCAL:
        if claimed is not Claim.HELD:  # waited on another process's fetch (phase times)
            stats.add_phase("node lease", (time.perf_counter() - started) * 1000)
        stats.node_leases[claimed.value] += 1
        if not absent_locally:  # the look before the lease missed
            local.missed(okey, "absent")
    if lease is not None and lease.took_over:
        stats.node_leases["took_over"] += 1
    if entry is not None:
        # read outside the tier (``read_sync``): verified and accounted as a local read is
        local.read_outside(len(entry))
        payload = await verify(okey, entry)
        if payload is not None:
            local.hit(okey)
            store.note_hit(okey, len(entry))
            return payload, None, None
    if claimed is Claim.BUSY:
        return None, None, LEASED_ELSEWHERE
    if claimed is Claim.MISSED:
        return None, None, ""
    return None, lease, None
