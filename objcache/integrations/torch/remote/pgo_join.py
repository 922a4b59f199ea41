"""torch's dynamic-shape profiles (PGO) stored as a join, not last-writer-wins.

torch calls ``put_code_state()`` after frame compiles and expects the stored profile to grow
as it learns which dims are dynamic. objcache stores the profile as a record
(docs/architecture.md, "Records") whose value is the merge of every writer's, with torch's
own ``FrameStateSizeEntry`` merge (``|=``: a dim dynamic anywhere stays dynamic). Two hosts
that learned different dims never undo each other.

A stored profile that cannot be unpickled (corrupt, foreign torch) is counted and replaced by
the writer's own. Payloads are the raw pickles torch writes (see ``serde``); objcache has
verified their digest (and signature) before anything here unpickles them.
"""

from __future__ import annotations

import copy
import logging
import pickle
from collections import Counter
from typing import Any

from objcache.core.records import Change

log = logging.getLogger("objcache")

#: torch kinds stored as records (joined) rather than immutable entries.
RECORD_KINDS = frozenset({"pgo"})
#: ``unreadable``: stored profiles that could not be loaded (replaced by the next write).
counters: Counter[str] = Counter()


def _load(payload: bytes) -> dict[Any, Any] | None:
    try:
        profile = pickle.loads(payload)
    except Exception as exc:  # any unpickling failure: corrupt or written by another torch
        log.debug("objcache: unreadable PGO profile: %r", exc)
        return None
    return profile if isinstance(profile, dict) else None


def join(stored: dict[Any, Any], mine: dict[Any, Any]) -> dict[Any, Any]:
    """``stored`` merged with ``mine`` (a new object; neither input is changed)."""
    merged = copy.deepcopy(stored)
    for code_id, state in mine.items():
        if code_id not in merged:
            merged[code_id] = copy.deepcopy(state)
            continue
        target = merged[code_id].automatic_dynamic
        for name, entry in state.automatic_dynamic.items():
            if name in target:
                target[name] |= copy.deepcopy(entry)
            else:
                target[name] = copy.deepcopy(entry)
    return merged


def change_for(mine_payload: bytes) -> Change:
    """The record change that joins ``mine_payload`` into the stored profile."""
    mine = _load(mine_payload)

    def change(current: bytes | None) -> bytes | None:
        if mine is None:
            return None  # nothing usable to add
        stored = _load(current) if current is not None else None
        if current is not None and stored is None:
            counters["unreadable"] += 1
        if stored is None:
            return mine_payload
        merged = join(stored, mine)
        return None if merged == stored else pickle.dumps(merged)

    return change
