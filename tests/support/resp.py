"""Fake Redis nodes: small asyncio TCP servers speaking RESP (RESP3 after ``HELLO 3``), enough
for redis-py's standalone and cluster clients: HELLO, AUTH, CLIENT, INFO, CLUSTER SLOTS,
COMMAND, PING, GET, SET. Each records the commands it received, so a test can tell whether
a client sent it a password or asked for maintenance notifications; a node can be told to
never answer some commands (a hung primary) or to answer a GET with a MOVED elsewhere.

Run them in the test's own event loop (``async with FakeCluster(...)``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from types import TracebackType

from redis.crc import key_slot

SLOTS = 16384
#: Entries of the COMMAND table (name, arity, first key, last key, step) redis-py's cluster
#: client needs to route the commands the backend sends.
_COMMANDS = (("get", 2, 1, 1, 1), ("set", -3, 1, 1, 1), ("exists", -2, 1, -1, 1),
             ("getrange", 4, 1, 1, 1), ("del", -2, 1, -1, 1), ("ping", -1, 0, 0, 0))  # fmt: skip

Reply = bytes | int | str | list["Reply"] | dict[bytes, "Reply"] | None | Exception


class FakeNode:
    """One node on ``host``: a Redis Cluster node of ``cluster`` (None: a standalone server)."""

    def __init__(self, host: str = "127.0.0.1", cluster: FakeCluster | None = None) -> None:
        self.host = host
        self.port = 0
        self.cluster = cluster
        self.data: dict[bytes, bytes] = {}
        #: every command received, its arguments as bytes (AUTH's password included)
        self.received: list[list[bytes]] = []
        #: commands (upper case) this node reads and never answers
        self.hang: set[str] = set()
        #: a GET here answers MOVED to this address
        self.moved_to: tuple[str, int] | None = None
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def names(self) -> set[bytes]:
        """Upper-cased command names received (``CLIENT MAINT_NOTIFICATIONS`` as two words)."""
        named = set()
        for args in self.received:
            name = args[0].upper()
            if name in (b"CLIENT", b"CLUSTER") and len(args) > 1:
                name += b" " + args[1].upper()
            named.add(name)
        return named

    def credentials(self) -> list[bytes]:
        """The passwords sent here (AUTH, or HELLO ... AUTH user password)."""
        sent = []
        for args in self.received:
            name = args[0].upper()
            if name == b"AUTH":
                sent.append(args[-1])
            elif name == b"HELLO" and b"AUTH" in (a.upper() for a in args):
                at = [a.upper() for a in args].index(b"AUTH")
                sent.append(args[at + 2])
        return sent

    async def start(self) -> FakeNode:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        for task in list(self._handlers):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        resp3 = False
        try:
            while True:
                args = await _read_command(reader)
                if args is None:
                    return
                self.received.append(args)
                name = args[0].decode().upper()
                if name in self.hang:
                    continue  # read, never answered
                if name == "HELLO":
                    resp3 = len(args) > 1 and args[1] == b"3"
                writer.write(_encode(self._answer(name, args[1:]), resp3))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._handlers.discard(task)
            writer.close()

    def _answer(self, name: str, args: list[bytes]) -> Reply:
        if name == "HELLO":
            proto = int(args[0]) if args else 2
            mode = b"cluster" if self.cluster else b"standalone"
            return {b"server": b"redis", b"version": b"7.2.0", b"proto": proto, b"mode": mode}
        if name in ("AUTH", "CLIENT", "READONLY", "SELECT"):
            return "OK"
        if name == "PING":
            return "PONG"
        if name == "INFO":
            return f"# Cluster\r\ncluster_enabled:{int(self.cluster is not None)}\r\n".encode()
        if name == "COMMAND":
            return [[n.encode(), a, [], f, la, s, []] for n, a, f, la, s in _COMMANDS]
        if name == "CLUSTER" and self.cluster and args and args[0].upper() == b"SLOTS":
            return self.cluster.slots()
        if name == "GET":
            if self.moved_to is not None:
                host, port = self.moved_to
                return ValueError(f"MOVED {key_slot(args[0])} {host}:{port}")
            return self.data.get(args[0])
        if name == "SET":
            self.data[args[0]] = args[1]
            return "OK"
        return ValueError(f"ERR unknown command '{name}'")


class FakeCluster:
    """Fake nodes, each announced in CLUSTER SLOTS with an equal share of the slots, in order.
    ``hosts``: the address each node listens on (127.0.0.2 is loopback too on Linux)."""

    def __init__(self, hosts: Iterable[str] = ("127.0.0.1", "127.0.0.1")) -> None:
        self.nodes = [FakeNode(host, self) for host in hosts]

    def slots(self) -> list[Reply]:
        share = SLOTS // len(self.nodes)
        spans: list[Reply] = []
        for i, node in enumerate(self.nodes):
            last = SLOTS - 1 if i == len(self.nodes) - 1 else (i + 1) * share - 1
            spans.append([i * share, last, [node.host.encode(), node.port, f"n{i}".encode()]])
        return spans

    def owner(self, key: str) -> FakeNode:
        """The node whose slots hold ``key``."""
        share = SLOTS // len(self.nodes)
        return self.nodes[min(key_slot(key.encode()) // share, len(self.nodes) - 1)]

    async def __aenter__(self) -> FakeCluster:
        for node in self.nodes:
            await node.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for node in self.nodes:
            await node.stop()


async def _read_command(reader: asyncio.StreamReader) -> list[bytes] | None:
    line = await reader.readline()
    if not line:
        return None
    if not line.startswith(b"*"):
        return line.split()  # an inline command
    args = []
    for _ in range(int(line[1:])):
        size = int((await reader.readline())[1:])
        args.append((await reader.readexactly(size + 2))[:-2])
    return args


def _encode(reply: Reply, resp3: bool) -> bytes:
    if reply is None:
        return b"_\r\n" if resp3 else b"$-1\r\n"
    if isinstance(reply, Exception):
        return f"-{reply}\r\n".encode()
    if isinstance(reply, str):
        return f"+{reply}\r\n".encode()
    if isinstance(reply, bool | int):
        return f":{int(reply)}\r\n".encode()
    if isinstance(reply, bytes):
        return b"$%d\r\n%s\r\n" % (len(reply), reply)
    if isinstance(reply, dict):
        if not resp3:
            return _encode([x for pair in reply.items() for x in pair], resp3)
        items = b"".join(_encode(k, resp3) + _encode(v, resp3) for k, v in reply.items())
        return b"%%%d\r\n%s" % (len(reply), items)
    return b"*%d\r\n%s" % (len(reply), b"".join(_encode(x, resp3) for x in reply))
