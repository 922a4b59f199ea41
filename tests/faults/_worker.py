"""Subprocess bodies of the process-level fault tests (``python -m tests.faults._worker``).

Arguments come as one JSON object on argv[1]: ``mode``, ``config`` (Config keywords),
and mode-specific fields. Values are self-verifying (see :func:`make_value`), so a reader
can tell a complete value from a torn or mixed one without knowing who wrote it.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any

from objcache.client import Client, get_client
from objcache.config.settings import Config
from tests.support.waiting import wait_until

KIND = "blob"
TRAILER = 32


def make_value(writer: int, key: str, size: int) -> bytes:
    rng = random.Random(f"{writer}:{key}")
    body = f"{writer}:{key}:".encode() + rng.randbytes(size)
    return body + hashlib.sha256(body).digest()


def check_value(key: str, value: bytes) -> bool:
    body, trailer = value[:-TRAILER], value[-TRAILER:]
    return hashlib.sha256(body).digest() == trailer and body.split(b":")[1] == key.encode()


def config_of(args: dict[str, Any]) -> Config:
    return Config(**args["config"])


def big_writer(args: dict[str, Any]) -> None:
    """Write big entries forever (until killed), printing each key before its put."""
    client = Client(config_of(args))
    size = int(args["size"])
    for i in range(10_000):
        key = f"big-{i}"
        print(key, flush=True)
        client.put(KIND, key, make_value(0, key, size))
        client.flush(30)


def contender(args: dict[str, Any]) -> None:
    """Write and read the same keys as every other contender; count what was seen."""
    client = Client(config_of(args))
    me, keys, rounds = int(args["id"]), list(args["keys"]), int(args["rounds"])
    seen = {"hit": 0, "miss": 0, "bad": 0}
    barrier = Path(args["barrier"])  # start together: the parent says go once all are ready
    (barrier / f"ready-{me}").touch()
    wait_until((barrier / "go").exists, what="the parent's go")
    for r in range(rounds):
        for key in keys if (me + r) % 2 else reversed(keys):
            client.put(KIND, key, make_value(me, key, int(args["size"])))
            got = client.get(KIND, key)
            if got is None:
                seen["miss"] += 1
            elif check_value(key, got):
                seen["hit"] += 1
            else:
                seen["bad"] += 1
    assert client.flush(30) == 0
    client.close()
    print(json.dumps(seen), flush=True)


def exit_writer(args: dict[str, Any]) -> None:
    """Put entries through the process-wide client and exit normally (atexit flushes)."""
    client = get_client(config_of(args))
    for i in range(int(args["n"])):
        key = f"wb-{i}"
        client.put(KIND, key, make_value(0, key, int(args["size"])))
    print("queued", client.stats()["write_behind_pending"], flush=True)


if __name__ == "__main__":
    params = json.loads(sys.argv[1])
    # The parent passes its environment fingerprint: the same namespace as the parent's
    # readers, without importing torch (3 s) in each of eight processes.
    import objcache.client

    fields = dict(params["env_fields"])
    objcache.client.fingerprint = lambda: fields  # type: ignore[attr-defined,assignment]
    {"big_writer": big_writer, "contender": contender, "exit_writer": exit_writer}[params["mode"]](
        params
    )
