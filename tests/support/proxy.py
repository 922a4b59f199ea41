"""Fault-injecting TCP proxy on 127.0.0.1 for tests and benchmarks.

``FaultProxy`` runs its own asyncio loop in a daemon thread, so sync tests,
benchmarks and asyncio code running on any other loop can use it alike::

    with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        client = redis.Redis(host=proxy.host, port=proxy.port)
        proxy.set_rtt_ms(20)        # every request/response round trip +20 ms
        proxy.refuse()              # ECONNREFUSED from now on
        proxy.passthrough()         # back to normal, same port

Every setting may be changed at any time from any thread; mode changes take
effect before the setter returns.

Shaping (applies to new and existing connections, to data read after the change):

- ``delay_ms``: one-way latency added to every chunk in *each* direction, so
  a request/response round trip costs ``2 * delay_ms`` more;
  ``set_rtt_ms(n)`` sets ``delay_ms = n / 2``. Chunks are pipelined, so delay
  does not cap throughput beyond a ~2 MiB in-flight window per direction.
  Connection set-up itself is not delayed.
- ``jitter_ms``: each chunk gets an extra uniform ``[0, jitter_ms)`` delay;
  byte order is preserved.
- ``bandwidth_bps``: per-connection cap in **bytes** per second, applied to
  each direction separately (``0`` = unlimited).

Modes (``proxy.mode``):

- ``pass``: forward everything.
- ``refuse``: the listening socket is closed, so connects fail with
  ``ConnectionRefusedError``, and existing connections are reset, as when a
  server process dies. Switching back listens again on the same port.
- ``blackhole``: connections are accepted, data is read and discarded in both
  directions, nothing is answered and nothing is closed. Existing connections
  are black-holed too; leaving the mode resets every connection that lost
  data, since its byte stream is no longer coherent.
- ``reset_after(n)``: each connection forwards ``n`` more server-to-client
  bytes, then is aborted with a TCP RST (``SO_LINGER`` 0), i.e. a reset
  mid-body. The proxy waits (up to 2 s) for those ``n`` bytes to reach the
  client's socket first, so a reading client gets them before the reset.
- ``close_immediately``: new connections are closed (FIN) on accept and
  existing connections are closed, as when a server drops idle keep-alives.

``reset_after`` and ``close_immediately`` take ``times=k``: after ``k`` faults
(resets, or new connections closed) the proxy returns to ``pass``.

Counters: ``connections`` (accepted), ``bytes_to_server``,
``bytes_to_client`` (forwarded), ``resets`` (RSTs injected) and
``http_requests``: the HTTP/1.x requests forwarded to the server, as
``(method, target)`` pairs where target is the raw request-target (path and
query). ``reset_counters()`` zeroes them all.

``settle()`` returns once every connection made to the proxy before the call has been
accepted and counted (a probe queues behind them in the listen backlog), so
``connections`` can be read as "nothing connected" without waiting on the clock.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import enum
import random
import socket
import struct
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from types import TracebackType
from typing import Any, NamedTuple, TypeVar

from tests.support.ports import LOOPBACK
from tests.support.waiting import wait_until

try:
    import fcntl
    import termios

    _TIOCOUTQ: int | None = termios.TIOCOUTQ
except (ImportError, AttributeError):  # pragma: no cover - non-Linux
    _TIOCOUTQ = None

__all__ = ["FaultProxy", "HttpRequest", "Mode"]

_CHUNK = 64 * 1024
_QUEUE_CHUNKS = 32  # per direction: at most ~2 MiB in flight inside the proxy
_UPSTREAM_CONNECT_TIMEOUT = 10.0
_RESET_FLUSH_TIMEOUT = 2.0
_MAX_HTTP_HEAD = 64 * 1024

_T = TypeVar("_T")


class Mode(str, enum.Enum):
    PASS = "pass"
    REFUSE = "refuse"
    BLACKHOLE = "blackhole"
    RESET_AFTER = "reset_after"
    CLOSE_IMMEDIATELY = "close_immediately"


class HttpRequest(NamedTuple):
    method: str
    path: str  # raw request-target: path and query string


class _HttpRequestParser:
    """Frames HTTP/1.x requests in a client-to-server byte stream.

    Reads request lines and headers, skips ``Content-Length`` and chunked
    bodies, and calls ``on_request(method, target)`` for each request. Gives
    up for good (``active = False``) on anything that is not HTTP/1.x, e.g.
    the Redis protocol.
    """

    _HEAD, _CHUNK_SIZE, _CHUNK_END, _TRAILERS = range(4)

    def __init__(self, on_request: Callable[[str, str], None]) -> None:
        self.active = True
        self._on_request = on_request
        self._state = self._HEAD
        self._buf = bytearray()
        self._skip = 0  # body bytes still to skip
        self._after_skip = self._HEAD

    def feed(self, data: bytes) -> None:
        if not self.active:
            return
        if self._skip >= len(data) and not self._buf:
            self._skip -= len(data)  # fast path: inside a large body
            return
        self._buf += data
        while self.active and self._buf:
            if self._skip:
                taken = min(self._skip, len(self._buf))
                del self._buf[:taken]
                self._skip -= taken
                if not self._skip:
                    self._state = self._after_skip
                continue
            if not self._step():
                return

    def _step(self) -> bool:
        """Consume one head or line from the buffer; False if more data is needed."""
        if self._state == self._HEAD:
            while self._buf.startswith(b"\r\n"):  # tolerated between requests
                del self._buf[:2]
            if self._buf and not (65 <= self._buf[0] <= 90):  # methods start A-Z
                self.active = False
                return False
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                line_end = self._buf.find(b"\r\n")
                bad_line = line_end >= 0 and not self._is_request_line(self._buf[:line_end])
                if bad_line or len(self._buf) > _MAX_HTTP_HEAD:
                    self.active = False
                return False
            head = bytes(self._buf[:end]).decode("latin-1")
            del self._buf[: end + 4]
            self._parse_head(head)
            return True
        line_end = self._buf.find(b"\r\n")
        if line_end < 0:
            if len(self._buf) > _MAX_HTTP_HEAD:
                self.active = False
            return False
        line = bytes(self._buf[:line_end])
        del self._buf[: line_end + 2]
        if self._state == self._CHUNK_SIZE:
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                self.active = False
                return False
            if size == 0:
                self._state = self._TRAILERS
            else:
                self._skip, self._after_skip = size, self._CHUNK_END
        elif self._state == self._CHUNK_END:
            if line:  # chunk data must be followed by an empty line
                self.active = False
                return False
            self._state = self._CHUNK_SIZE
        elif self._state == self._TRAILERS and not line:
            self._state = self._HEAD
        return True

    @staticmethod
    def _is_request_line(line: bytes | bytearray) -> bool:
        parts = bytes(line).split(b" ")
        return len(parts) == 3 and parts[0].isalpha() and parts[2].startswith(b"HTTP/1.")

    def _parse_head(self, head: str) -> None:
        request_line, *header_lines = head.split("\r\n")
        if not self._is_request_line(request_line.encode("latin-1")):
            self.active = False
            return
        method, target, _ = request_line.split(" ")
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self._on_request(method, target)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = self._CHUNK_SIZE
            return
        self._state = self._HEAD
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            self.active = False
            return
        self._skip, self._after_skip = length, self._HEAD


def _rst(writer: asyncio.StreamWriter) -> None:
    """Abort the connection with a TCP RST instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _wait_until_sent(writer: asyncio.StreamWriter, timeout: float) -> None:
    """Wait until the kernel has delivered what was written (Linux), at most ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    sock = writer.get_extra_info("socket")
    pending = array.array("i", [0])
    while loop.time() < deadline:
        if writer.transport.get_write_buffer_size() == 0:
            if sock is None or _TIOCOUTQ is None:
                await asyncio.sleep(0.05)
                return
            try:
                fcntl.ioctl(sock.fileno(), _TIOCOUTQ, pending)
            except OSError:
                return
            if pending[0] == 0:
                return
        await asyncio.sleep(0.002)


class _Done(Exception):
    """A pump ended the connection on purpose (injected reset)."""


_STOP = object()  # queue item: end the writer without forwarding EOF


class _Connection:
    def __init__(
        self,
        proxy: FaultProxy,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
    ) -> None:
        self.client_reader = client_reader
        self.client_writer = client_writer
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None
        self.lost_data = False  # something was black-holed
        self.to_client = 0
        self.reset_generation = -1
        self.reset_base = 0
        self.http = _HttpRequestParser(proxy._record_request)

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client_writer, self.upstream_writer) if w is not None]

    def kill(self, *, rst: bool) -> None:
        for writer in self.writers():
            if rst:
                _rst(writer)
            else:
                writer.close()
        if self.task is not None:
            self.task.cancel()


class FaultProxy:
    """TCP proxy from ``127.0.0.1:<port>`` to ``target_host:target_port`` with faults.

    Starts listening on construction; ``close()`` (or leaving the ``with``
    block) stops it and drops all connections.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = LOOPBACK
        self.port = 0
        self._delay_ms = 0.0
        self._jitter_ms = 0.0
        self._bandwidth_bps = 0.0
        self._mode = Mode.PASS
        self._reset_after_bytes = 0
        self._times_left: int | None = None
        self._generation = 0
        self._lock = threading.Lock()
        self._connections = 0
        self._bytes_to_server = 0
        self._bytes_to_client = 0
        self._resets = 0
        self._http_requests: list[HttpRequest] = []
        self._conns: set[_Connection] = set()
        self._probes: dict[tuple[str, int], threading.Event] = {}
        self._server: asyncio.Server | None = None
        self._closed = False
        self.tasks_left_at_close = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="FaultProxy", daemon=True
        )
        self._thread.start()
        try:
            self._server = self._call(self._listen())
        except BaseException:
            self._stop_loop()
            raise
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._thread.name = f"FaultProxy-{self.port}->{target_host}:{target_port}"

    # -- public API ---------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def delay_ms(self) -> float:
        """One-way delay added per chunk in each direction."""
        return self._delay_ms

    @delay_ms.setter
    def delay_ms(self, value: float) -> None:
        self._delay_ms = _non_negative("delay_ms", value)

    def set_rtt_ms(self, rtt_ms: float) -> None:
        """Add ``rtt_ms`` to every request/response round trip (half each way)."""
        self.delay_ms = _non_negative("rtt_ms", rtt_ms) / 2

    @property
    def jitter_ms(self) -> float:
        return self._jitter_ms

    @jitter_ms.setter
    def jitter_ms(self, value: float) -> None:
        self._jitter_ms = _non_negative("jitter_ms", value)

    @property
    def bandwidth_bps(self) -> float:
        """Per-connection, per-direction cap in bytes per second; 0 = unlimited."""
        return self._bandwidth_bps

    @bandwidth_bps.setter
    def bandwidth_bps(self, value: float) -> None:
        self._bandwidth_bps = _non_negative("bandwidth_bps", value)

    @property
    def mode(self) -> Mode:
        return self._mode

    def set_mode(self, mode: Mode | str, *, n_bytes: int = 0, times: int | None = None) -> None:
        mode = Mode(mode)
        if times is not None and (
            times < 1 or mode not in (Mode.RESET_AFTER, Mode.CLOSE_IMMEDIATELY)
        ):
            raise ValueError("times must be >= 1 and only applies to reset_after/close_immediately")
        if n_bytes < 0:
            raise ValueError("n_bytes must be >= 0")
        self._call(self._apply_mode(mode, n_bytes, times))

    def passthrough(self) -> None:
        self.set_mode(Mode.PASS)

    def refuse(self) -> None:
        self.set_mode(Mode.REFUSE)

    def blackhole(self) -> None:
        self.set_mode(Mode.BLACKHOLE)

    def reset_after(self, n_bytes: int, *, times: int | None = None) -> None:
        self.set_mode(Mode.RESET_AFTER, n_bytes=n_bytes, times=times)

    def close_immediately(self, *, times: int | None = None) -> None:
        self.set_mode(Mode.CLOSE_IMMEDIATELY, times=times)

    @property
    def connections(self) -> int:
        return self._connections

    @property
    def active_connections(self) -> int:
        return len(self._conns)

    @property
    def bytes_to_server(self) -> int:
        return self._bytes_to_server

    @property
    def bytes_to_client(self) -> int:
        return self._bytes_to_client

    @property
    def resets(self) -> int:
        return self._resets

    @property
    def http_requests(self) -> list[HttpRequest]:
        with self._lock:
            return list(self._http_requests)

    def count_requests(self, method: str | None = None, path_prefix: str = "") -> int:
        return sum(
            1
            for r in self.http_requests
            if (method is None or r.method == method) and r.path.startswith(path_prefix)
        )

    def settle(self) -> None:
        """Return once every connection made to the proxy before this call is accepted and
        counted in ``connections``. A probe connection queues behind them in the listen
        backlog, which is accepted in order; the probe itself is not counted. Needs a
        listening proxy (not ``refuse``)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((self.host, 0))
            accepted = threading.Event()
            name = probe.getsockname()
            with self._lock:
                self._probes[name[0], name[1]] = accepted
            probe.settimeout(30)
            probe.connect(self.address)
            wait_until(accepted.is_set, what="the proxy accepting its probe connection")

    def reset_counters(self) -> None:
        with self._lock:
            self._connections = 0
            self._bytes_to_server = 0
            self._bytes_to_client = 0
            self._resets = 0
            self._http_requests.clear()

    def close(self) -> None:
        """Stop listening, drop every connection (hung ones too) and end the thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._shutdown())
        finally:
            self._stop_loop()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"FaultProxy({self.host}:{self.port} -> {self.target_host}:{self.target_port}, "
            f"mode={self._mode.value}, delay_ms={self._delay_ms}, "
            f"bandwidth_bps={self._bandwidth_bps})"
        )

    # -- loop-thread plumbing -----------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, _T], timeout: float = 30.0) -> _T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("FaultProxy methods cannot be called from its own loop")
        if self._closed and self._loop.is_closed():
            coro.close()
            raise RuntimeError("FaultProxy is closed")
        future: Future[_T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def _record_request(self, method: str, target: str) -> None:
        with self._lock:
            self._http_requests.append(HttpRequest(method, target))

    def _count(self, *, to_server: int = 0, to_client: int = 0, resets: int = 0) -> None:
        with self._lock:
            self._bytes_to_server += to_server
            self._bytes_to_client += to_client
            self._resets += resets

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(
            self._on_client, self.host, self.port, reuse_address=True, backlog=512
        )

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        conns = list(self._conns)
        for conn in conns:
            conn.kill(rst=False)
        tasks = [c.task for c in conns if c.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        for conn in conns:
            for writer in conn.writers():
                writer.transport.abort()
        current = asyncio.current_task()
        leftover = [task for task in asyncio.all_tasks() if task is not current]
        self.tasks_left_at_close = len(leftover)  # a leak if not 0; checked by tests
        for task in leftover:
            task.cancel()
        await asyncio.gather(*leftover, return_exceptions=True)
        await asyncio.sleep(0)  # let transports run connection_lost and close sockets

    async def _apply_mode(self, mode: Mode, n_bytes: int, times: int | None) -> None:
        if mode is Mode.REFUSE:
            if self._server is not None:
                self._server.close()
                self._server = None
        elif self._server is None:
            self._server = await self._listen()
        old = self._mode
        self._mode = mode
        self._reset_after_bytes = n_bytes
        self._times_left = times
        self._generation += 1
        for conn in list(self._conns):
            if mode is Mode.REFUSE or (
                old is Mode.BLACKHOLE and mode is not Mode.BLACKHOLE and conn.lost_data
            ):
                conn.kill(rst=True)
            elif mode is Mode.CLOSE_IMMEDIATELY:
                conn.kill(rst=False)

    def _fault_done(self) -> None:
        if self._times_left is not None:
            self._times_left -= 1
            if self._times_left <= 0:
                self._mode = Mode.PASS
                self._times_left = None
                self._generation += 1

    # -- connections --------------------------------------------------------

    def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        with self._lock:
            probe = self._probes.pop((peer[0], peer[1]), None) if peer else None
        if probe is not None:  # settle(): everything connected before it is counted now
            writer.close()
            probe.set()
            return
        conn = _Connection(self, reader, writer)
        with self._lock:
            self._connections += 1
        self._conns.add(conn)
        conn.task = self._loop.create_task(self._handle(conn))

    async def _handle(self, conn: _Connection) -> None:
        try:
            await self._serve(conn)
        except (asyncio.CancelledError, _Done):
            pass
        except Exception:
            conn.kill(rst=True)  # propagate a reset/error on one side to the other
        finally:
            self._conns.discard(conn)
            for writer in conn.writers():
                writer.close()

    async def _serve(self, conn: _Connection) -> None:
        mode = self._mode
        if mode is Mode.REFUSE:  # accepted just before the listener closed
            conn.kill(rst=True)
            return
        if mode is Mode.CLOSE_IMMEDIATELY:
            self._fault_done()
            conn.client_writer.close()
            return
        if mode is Mode.BLACKHOLE:
            conn.lost_data = True
            while await conn.client_reader.read(_CHUNK):
                pass
            return
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(self.target_host, self.target_port),
                _UPSTREAM_CONNECT_TIMEOUT,
            )
        except (OSError, asyncio.TimeoutError):
            conn.kill(rst=True)
            return
        conn.upstream_writer = upstream_writer
        up: asyncio.Queue[Any] = asyncio.Queue(_QUEUE_CHUNKS)
        down: asyncio.Queue[Any] = asyncio.Queue(_QUEUE_CHUNKS)
        tasks = [
            asyncio.ensure_future(self._read_side(conn, conn.client_reader, up)),
            asyncio.ensure_future(self._write_side(conn, upstream_writer, up, True)),
            asyncio.ensure_future(self._read_side(conn, upstream_reader, down)),
            asyncio.ensure_future(self._write_side(conn, conn.client_writer, down, False)),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # re-raise the first failure
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _read_side(
        self, conn: _Connection, reader: asyncio.StreamReader, queue: asyncio.Queue[Any]
    ) -> None:
        loop = asyncio.get_running_loop()
        last_due = 0.0
        while True:
            data = await reader.read(_CHUNK)
            if self._mode is Mode.BLACKHOLE:
                conn.lost_data = True
                if not data:
                    await queue.put(_STOP)
                    return
                continue
            delay = self._delay_ms
            if self._jitter_ms:
                delay += random.uniform(0, self._jitter_ms)
            last_due = max(last_due, loop.time() + delay / 1000)
            await queue.put((last_due, data))
            if not data:
                return

    async def _write_side(
        self,
        conn: _Connection,
        writer: asyncio.StreamWriter,
        queue: asyncio.Queue[Any],
        to_server: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        next_free = 0.0  # bandwidth pacing: when the link is free again
        while True:
            item = await queue.get()
            if item is _STOP:
                return
            due, data = item
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if self._mode is Mode.BLACKHOLE:
                conn.lost_data = True
                continue
            if not data:
                if writer.can_write_eof():
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                return
            reset = False
            if not to_server:
                budget = self._reset_budget(conn)
                if budget is not None and budget < len(data):
                    data, reset = data[:budget], True
            else:
                conn.http.feed(data)
            view = memoryview(data)
            while view:
                bps = self._bandwidth_bps
                size = len(view) if not bps else max(1024, min(len(view), int(bps / 100)))
                piece, view = view[:size], view[size:]
                if bps:
                    now = loop.time()
                    next_free = max(now, next_free) + len(piece) / bps
                    await asyncio.sleep(next_free - now)
                writer.write(piece)
                await writer.drain()
                if to_server:
                    self._count(to_server=len(piece))
                else:
                    conn.to_client += len(piece)
                    self._count(to_client=len(piece))
            if reset:
                await _wait_until_sent(writer, _RESET_FLUSH_TIMEOUT)
                self._count(resets=1)
                self._fault_done()
                conn.kill(rst=True)
                raise _Done

    def _reset_budget(self, conn: _Connection) -> int | None:
        """Bytes this connection may still send to the client, or None if unlimited."""
        if self._mode is not Mode.RESET_AFTER:
            return None
        if conn.reset_generation != self._generation:
            conn.reset_generation = self._generation
            conn.reset_base = conn.to_client
        return max(0, conn.reset_base + self._reset_after_bytes - conn.to_client)


def _non_negative(name: str, value: float) -> float:
    value = float(value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value
