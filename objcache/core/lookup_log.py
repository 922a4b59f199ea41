"""Lookup logging: one DEBUG line per lookup, one INFO line per miss cause per run
(docs/troubleshooting.md, "Logs"; docs/architecture.md, "Read path").

A lookup collects its per-tier outcomes in a *trail* (``LOOKUP_TRAIL``, set by the caller,
appended by each tier) only when the lines will be written: :func:`new_trail` is None below
INFO, and nothing is collected.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from objcache.observe.plaintext import plain

log = logging.getLogger("objcache")

#: Miss reasons that mean a tier held an entry and the decoder refused it (metrics.py).
REFUSALS = frozenset({"corrupt", "version", "unsigned", "bad_signature", "too_large"})


def miss_cause(trail: Sequence[tuple[str, str]]) -> str:
    """The cause of a lookup that missed, from its per-tier outcomes: the first reason that
    says more than ``absent`` (a refused entry, a timeout, an error), else ``absent``."""
    return next((o for _, o in trail if o not in ("hit", "absent")), "absent")


def new_trail() -> list[tuple[str, str]] | None:
    """A list to collect a lookup's per-tier outcomes in, when they will be logged."""
    return [] if log.isEnabledFor(logging.INFO) else None


class LookupLog:
    """The lookup lines of one cache; remembers which (kind, cause) it already told at INFO."""

    def __init__(self) -> None:
        #: (kind, cause) pairs already logged at INFO: one line per miss cause per run.
        self._causes_logged: set[tuple[str, str]] = set()

    def lookup(
        self,
        kind: str,
        okey: str,
        tier: str,
        size: int | None,
        ms: float,
        trail: Sequence[tuple[str, str]],
        *,
        local: str | None,
        how: str = "",
    ) -> None:
        """One DEBUG line per lookup (``size`` None: a miss; ``local``: the local tier's name,
        None without one), and one INFO line the first time a (kind, cause) misses in this
        process. Keys and tier names can come from a store's listings: they are escaped
        (objcache/observe/plaintext.py)."""
        tiers = ",".join(f"{plain(name)}={outcome}" for name, outcome in trail) or "-"
        extra = f" via={how}" if how else ""
        if size is not None:
            where = "local" if local is not None and tier == local else "remote"
            log.debug(
                "lookup kind=%s outcome=%s-hit tier=%s size=%d ms=%.3f tiers=%s key=%s%s",
                plain(kind), where, plain(tier), size, ms, tiers, plain(okey), extra,
            )  # fmt: skip
            return
        cause = miss_cause(trail)
        refused = any(outcome in REFUSALS for _, outcome in trail)
        log.debug(
            "lookup kind=%s outcome=%s cause=%s tier=- size=0 ms=%.3f tiers=%s key=%s%s",
            plain(kind), "refused" if refused else "miss", cause, ms, tiers, plain(okey), extra,
        )  # fmt: skip
        if not trail or (kind, cause) in self._causes_logged:
            return  # a lookup that joined another's fetch: that one logs the cause
        self._causes_logged.add((kind, cause))
        log.info(
            "%s lookups miss: %s (first at %s; tiers %s); further %s misses of this cause are "
            "counted in `objcache stats`, not logged (DEBUG logs every lookup)",
            plain(kind), cause, plain(okey), tiers, plain(kind),
        )  # fmt: skip
