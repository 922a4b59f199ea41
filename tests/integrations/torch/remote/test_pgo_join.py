"""PGO profiles stored as a join (objcache/integrations/torch/remote/pgo_join.py), with torch's own
profile classes, through the core's records on a real file:// store and disk local tiers."""

from __future__ import annotations

import asyncio
import pickle
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

pgo = pytest.importorskip("torch._dynamo.pgo")

from objcache.client import build_cache  # noqa: E402
from objcache.config.settings import Config  # noqa: E402
from objcache.core.tiered_records import get_record, update_record  # noqa: E402
from objcache.integrations.torch.remote import pgo_join  # noqa: E402
from tests.support.servers import CONTRACT_SERVERS, LocalFolder  # noqa: E402

CODE = pgo.CodeId("model.py", 1, "forward", "f" * 16)
DIMS = 8
BASE = tuple(range(2, 2 + DIMS))


def profile_with_dynamic_dim(dim: int) -> bytes:
    """What a host that saw dim ``dim`` change (and nothing else) would have learned."""
    entry = pgo.FrameStateSizeEntry.make_size(BASE)
    entry |= pgo.FrameStateSizeEntry.make_size(
        tuple(s + 1 if i == dim else s for i, s in enumerate(BASE))
    )
    state: defaultdict[Any, Any] = defaultdict(pgo.CodeState)
    state[CODE].automatic_dynamic["L['x']"] = entry
    return pickle.dumps(state)


def dynamic_dims(payload: bytes | None) -> set[int]:
    assert payload is not None
    size = pickle.loads(payload)[CODE].automatic_dynamic["L['x']"].size
    return {i for i, s in enumerate(size) if s is pgo.auto_dynamic}


def test_a_join_keeps_every_dynamic_dim_and_changes_neither_input() -> None:
    a, b = pickle.loads(profile_with_dynamic_dim(0)), pickle.loads(profile_with_dynamic_dim(3))
    merged = pgo_join.join(a, b)
    assert dynamic_dims(pickle.dumps(merged)) == {0, 3}
    assert dynamic_dims(pickle.dumps(a)) == {0} and dynamic_dims(pickle.dumps(b)) == {3}
    change = pgo_join.change_for(profile_with_dynamic_dim(0))
    assert change(profile_with_dynamic_dim(0)) is None  # nothing new: no write


#: Every test server of the contract suite but the local folder (file:// runs on tmp_path).
REMOTE_SERVERS = dict.fromkeys(
    server
    for servers in CONTRACT_SERVERS.values()
    if not isinstance(servers, str)
    for server in servers
    if server is not LocalFolder
)


@pytest.mark.parametrize(
    "store", ["file", *(pytest.param(c, marks=pytest.mark.servers) for c in REMOTE_SERVERS)],
    ids=lambda s: s if isinstance(s, str) else s.__name__,
)  # fmt: skip
async def test_eight_hosts_racing_on_one_profile_leave_the_join(
    tmp_path: Path, request: pytest.FixtureRequest, store: Any
) -> None:
    """Every backend: eight hosts, each with a different dynamic dim, race on one profile."""
    unique = f"pgo{uuid.uuid4().hex[:10]}"
    if store == "file":
        url = f"file://{tmp_path / 'store'}"
    else:
        url = request.getfixturevalue("test_servers")(store).contract_url(unique)
    hosts = [
        build_cache(
            Config(tiers=url, local_dir=tmp_path / f"h{i}", prefetch=False, timeout_ms=10_000),
            env_fields={"torch": "t"},
        )
        for i in range(DIMS)
    ]
    try:
        await asyncio.gather(
            *(
                update_record(h, "pgo", "job", pgo_join.change_for(profile_with_dynamic_dim(i)))
                for i, h in enumerate(hosts)
            )
        )
        for h in hosts:
            assert await h.flush(10) == 0
        assert dynamic_dims(await get_record(hosts[0], "pgo", "job")) == set(range(DIMS))
    finally:
        for h in hosts:
            await h.close()


@pytest.mark.parametrize(
    "stored",
    [b"\x80\x04not a pickle", pickle.dumps(["a list, not a profile"]), b"\x80\x04cnope\nGone\n."],
    ids=["corrupt", "not-a-profile", "foreign-torch-class"],
)
def test_an_unloadable_stored_profile_is_counted_and_replaced(stored: bytes) -> None:
    before = pgo_join.counters["unreadable"]
    mine = profile_with_dynamic_dim(2)
    assert pgo_join.change_for(mine)(stored) == mine
    assert pgo_join.counters["unreadable"] == before + 1
