"""FaultProxy behaviour against a tiny echo server, a tiny HTTP server, redis-server
and moto, all on 127.0.0.1."""

from __future__ import annotations

import hashlib
import http.client
import http.server
import os
import socket
import socketserver
import statistics
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.proxy import FaultProxy, HttpRequest, Mode
from tests.support.servers import MotoS3, RedisServer
from tests.support.waiting import wait_until

MakeProxy = Callable[[str, int], FaultProxy]
Address = tuple[str, int]


# -- tiny local servers ------------------------------------------------------------


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)
        self.request.shutdown(socket.SHUT_WR)


class _HttpHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _reply(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        # /blob/<n>: n bytes of a counting pattern; anything else: "ok".
        if self.path.startswith("/blob/"):
            n = int(self.path.rsplit("/", 1)[1])
            self._reply(bytes(i % 251 for i in range(n)))
        else:
            self._reply(b"ok")

    def do_HEAD(self) -> None:
        self._reply(b"ok")

    def do_POST(self) -> None:
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            body = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b""):
                pass
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._reply(hashlib.sha256(body).hexdigest().encode())


@pytest.fixture(scope="module")
def echo_server() -> Iterator[Address]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _EchoHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "127.0.0.1", server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def http_server() -> Iterator[Address]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HttpHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "127.0.0.1", server.server_address[1]
    server.shutdown()
    server.server_close()


# -- helpers ---------------------------------------------------------------------


def recv_all(sock: socket.socket) -> bytes:
    chunks = []
    while data := sock.recv(1 << 20):
        chunks.append(data)
    return b"".join(chunks)


def echo(address: Address, payload: bytes) -> bytes:
    """Send payload (concurrently), half-close, and read the echo until EOF."""
    with socket.create_connection(address, timeout=10) as sock:

        def send() -> None:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send)
        sender.start()
        received = recv_all(sock)
        sender.join()
    return received


def ping_ms(client: redis.Redis, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        assert client.ping()
        times.append((time.perf_counter() - start) * 1000)
    return times


def no_retry_redis(proxy: FaultProxy, timeout: float = 2.0) -> redis.Redis:
    return redis.Redis(
        host=proxy.host,
        port=proxy.port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )


# -- pass-through, counters, robustness ----------------------------------------------


def test_pass_through_counts_connections_and_bytes(
    echo_server: Address, fault_proxy: MakeProxy
) -> None:
    proxy = fault_proxy(*echo_server)
    assert proxy.host == "127.0.0.1" and proxy.address == ("127.0.0.1", proxy.port)
    payload = os.urandom(100_000)
    assert echo(proxy.address, payload) == payload
    assert echo(proxy.address, b"x") == b"x"
    wait_until(lambda: proxy.bytes_to_client == 100_001, what="every byte counted")
    assert proxy.connections == 2
    assert proxy.bytes_to_server == 100_001
    assert proxy.http_requests == []  # not HTTP
    proxy.reset_counters()
    assert (proxy.connections, proxy.bytes_to_server, proxy.bytes_to_client) == (0, 0, 0)


def test_large_transfer_with_half_close(echo_server: Address, fault_proxy: MakeProxy) -> None:
    proxy = fault_proxy(*echo_server)
    payload = os.urandom(32 * 1024 * 1024)
    # EOF arrives only if half-close is relayed; otherwise recv() times out (10 s) and fails
    received = echo(proxy.address, payload)
    assert hashlib.sha256(received).digest() == hashlib.sha256(payload).digest()


def test_upstream_down_resets_client(fault_proxy: MakeProxy) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]  # nothing listens here
    proxy = fault_proxy("127.0.0.1", dead_port)
    # The proxy accepts, fails to connect upstream and resets; depending on
    # timing the client sees the reset while connecting or on its first read.
    with (
        pytest.raises(ConnectionResetError),
        socket.create_connection(proxy.address, timeout=2) as sock,
    ):
        sock.sendall(b"hello")
        sock.recv(10)


def test_settings_are_validated(echo_server: Address, fault_proxy: MakeProxy) -> None:
    proxy = fault_proxy(*echo_server)
    with pytest.raises(ValueError):
        proxy.delay_ms = -1
    with pytest.raises(ValueError):
        proxy.set_mode(Mode.BLACKHOLE, times=1)
    proxy.set_rtt_ms(30)
    assert proxy.delay_ms == 15
    assert proxy.mode is Mode.PASS


# -- latency and bandwidth -------------------------------------------------------------


def test_added_rtt_on_redis(redis_server: RedisServer, fault_proxy: MakeProxy) -> None:
    proxy = fault_proxy(redis_server.host, redis_server.port)
    client = no_retry_redis(proxy)
    assert client.ping()  # connect (and redis-py's handshake) before measuring
    proxy.set_rtt_ms(50)
    delayed = ping_ms(client, 10)
    # A busy machine only adds to a round trip, so the fastest one shows what the proxy
    # adds: the 50 ms, once (half each way), not twice.
    assert min(delayed) >= 50 - 0.5, delayed
    assert min(delayed) < 100, delayed
    proxy.set_rtt_ms(0)
    assert min(ping_ms(client, 10)) < 50, "the delay is gone"
    client.close()


def test_jitter_varies_round_trips(redis_server: RedisServer, fault_proxy: MakeProxy) -> None:
    proxy = fault_proxy(redis_server.host, redis_server.port)
    client = no_retry_redis(proxy)
    assert client.ping()  # connect (and redis-py's handshake) before measuring
    proxy.jitter_ms = 50
    times = ping_ms(client, 20)
    assert max(times) - min(times) > 5, times
    # two one-way jitters of < 50 ms each: 50 ms in the middle, never 100
    assert statistics.median(times) < 100, times
    client.close()


async def test_usable_from_another_event_loop(
    redis_server: RedisServer, fault_proxy: MakeProxy
) -> None:
    proxy = fault_proxy(redis_server.host, redis_server.port)
    client = redis.asyncio.Redis(host=proxy.host, port=proxy.port)
    await client.set("async-key", b"v")
    proxy.set_rtt_ms(20)
    start = time.perf_counter()
    assert await client.get("async-key") == b"v"
    assert time.perf_counter() - start >= 0.0195
    await client.aclose()


def test_bandwidth_cap_limits_throughput(echo_server: Address, fault_proxy: MakeProxy) -> None:
    proxy = fault_proxy(*echo_server)
    proxy.bandwidth_bps = 1_000_000  # bytes/s, each direction
    payload = os.urandom(500_000)
    start = time.perf_counter()
    assert echo(proxy.address, payload) == payload
    elapsed = time.perf_counter() - start
    assert elapsed >= 0.45, elapsed  # paced: 500 kB at 1 MB/s, both directions at once
    assert elapsed < 5, elapsed  # a cap ten times too strict would not fit
    proxy.bandwidth_bps = 0
    start = time.perf_counter()
    assert echo(proxy.address, payload) == payload
    assert time.perf_counter() - start < 0.45, "faster than the cap allowed"


# -- modes -------------------------------------------------------------------------------


def test_refuse_gives_connection_refused_and_recovers(
    echo_server: Address, fault_proxy: MakeProxy
) -> None:
    proxy = fault_proxy(*echo_server)
    existing = socket.create_connection(proxy.address, timeout=2)
    existing.sendall(b"a")
    assert existing.recv(1) == b"a"
    proxy.refuse()
    assert proxy.mode is Mode.REFUSE
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(proxy.address, timeout=2)
    with pytest.raises(ConnectionResetError):  # like a crashed server
        existing.sendall(b"b")
        existing.recv(1)
    existing.close()
    proxy.passthrough()
    assert echo(proxy.address, b"back") == b"back"


def test_blackhole_times_out_clients(
    redis_server: RedisServer, echo_server: Address, fault_proxy: MakeProxy
) -> None:
    proxy = fault_proxy(redis_server.host, redis_server.port)
    pooled = no_retry_redis(proxy, timeout=0.3)
    assert pooled.ping()
    proxy.blackhole()
    fresh = no_retry_redis(proxy, timeout=0.3)
    for client in (fresh, pooled):
        start = time.perf_counter()
        with pytest.raises(redis.TimeoutError):
            client.ping()
        elapsed = time.perf_counter() - start
        assert 0.29 <= elapsed < 8, elapsed  # its 0.3 s socket timeout: no reset, no hang
    raw = socket.create_connection(proxy.address, timeout=0.3)  # accepted...
    raw.sendall(b"PING\r\n")
    with pytest.raises(TimeoutError):  # ...but never answered
        raw.recv(10)
    proxy.passthrough()
    with pytest.raises(ConnectionResetError):  # its stream lost data: reset
        raw.recv(10)
    raw.close()
    assert no_retry_redis(proxy).ping()


def test_reset_after_n_bytes_mid_body(http_server: Address, fault_proxy: MakeProxy) -> None:
    proxy = fault_proxy(*http_server)
    proxy.reset_after(5000, times=1)
    received = bytearray()
    with socket.create_connection(proxy.address, timeout=5) as sock:
        sock.sendall(b"GET /blob/100000 HTTP/1.1\r\nHost: x\r\n\r\n")
        with pytest.raises(ConnectionResetError):
            while data := sock.recv(65536):
                received += data
    assert len(received) == 5000
    assert received.startswith(b"HTTP/1.1 200")
    assert proxy.resets == 1
    assert proxy.mode is Mode.PASS  # times=1 used up
    conn = http.client.HTTPConnection(*proxy.address, timeout=5)
    conn.request("GET", "/blob/100000")
    assert len(conn.getresponse().read()) == 100_000
    conn.close()


def test_reset_after_delivers_n_bytes_to_a_slow_reader(
    http_server: Address, fault_proxy: MakeProxy
) -> None:
    proxy = fault_proxy(*http_server)
    proxy.reset_after(300_000)
    received = bytearray()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # small window
        sock.settimeout(5)
        sock.connect(proxy.address)
        sock.sendall(b"GET /blob/1000000 HTTP/1.1\r\nHost: x\r\n\r\n")
        # the proxy has sent all 300 kB toward the reader, which has read none yet
        wait_until(lambda: proxy.bytes_to_client >= 300_000, what="300 kB sent to the reader")
        with pytest.raises(ConnectionResetError):
            while data := sock.recv(65536):
                received += data
    assert len(received) == 300_000


def test_reset_after_counts_from_when_it_is_set(
    http_server: Address, fault_proxy: MakeProxy
) -> None:
    proxy = fault_proxy(*http_server)
    conn = http.client.HTTPConnection(*proxy.address, timeout=5)
    conn.request("GET", "/blob/50000")
    assert len(conn.getresponse().read()) == 50_000
    proxy.reset_after(1000)
    conn.request("GET", "/blob/50000")
    with pytest.raises(ConnectionResetError):
        conn.getresponse().read()
    conn.close()


def test_close_immediately(echo_server: Address, fault_proxy: MakeProxy) -> None:
    proxy = fault_proxy(*echo_server)
    existing = socket.create_connection(proxy.address, timeout=2)
    existing.sendall(b"a")
    assert existing.recv(1) == b"a"
    proxy.close_immediately(times=1)
    assert existing.recv(1) == b""  # existing connections are closed too
    existing.close()
    with socket.create_connection(proxy.address, timeout=2) as sock:
        assert sock.recv(1) == b""
    assert proxy.mode is Mode.PASS
    assert echo(proxy.address, b"ok") == b"ok"


def test_close_drops_hung_connections_and_leaks_nothing(echo_server: Address) -> None:
    threads_before = set(threading.enumerate())
    proxy = FaultProxy(*echo_server)
    proxy.blackhole()
    hung = [socket.create_connection(proxy.address, timeout=2) for _ in range(3)]
    for sock in hung:
        sock.sendall(b"anyone there?")
    wait_until(lambda: proxy.active_connections == 3, what="3 hung connections")
    proxy.close()
    for sock in hung:
        try:
            data = sock.recv(10)  # times out (and fails) if the connection still hangs
        except ConnectionResetError:
            data = b""
        assert data == b""
        sock.close()
    assert proxy.tasks_left_at_close == 0
    assert set(threading.enumerate()) - threads_before == set()  # the proxy thread ended
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(proxy.address, timeout=2)
    proxy.close()  # idempotent


# -- HTTP request counting ----------------------------------------------------------


def test_http_request_framing(http_server: Address, fault_proxy: MakeProxy) -> None:
    proxy = fault_proxy(*http_server)
    conn = http.client.HTTPConnection(*proxy.address, timeout=5)  # one keep-alive stream
    conn.request("GET", "/a")
    assert conn.getresponse().read() == b"ok"
    tricky = b"GET /not-a-request HTTP/1.1\r\n\r\n" * 1000  # a body that looks like requests
    conn.request("POST", "/b", body=tricky)
    assert conn.getresponse().read() == hashlib.sha256(tricky).hexdigest().encode()
    chunks = [b"GET /nor-this HTTP/1.1\r\n\r\n", os.urandom(70_000), b"0\r\n\r\n"]
    conn.request("POST", "/c?x=1", body=iter(chunks), encode_chunked=True)
    assert conn.getresponse().read() == hashlib.sha256(b"".join(chunks)).hexdigest().encode()
    conn.request("HEAD", "/d")
    conn.getresponse().read()
    conn.close()
    assert proxy.http_requests == [
        HttpRequest("GET", "/a"),
        HttpRequest("POST", "/b"),
        HttpRequest("POST", "/c?x=1"),
        HttpRequest("HEAD", "/d"),
    ]
    assert proxy.count_requests("POST") == 2
    assert proxy.count_requests(path_prefix="/c") == 1


def test_counts_exactly_the_s3_gets_of_boto3(
    moto_s3: MotoS3, make_bucket: Callable[..., str], fault_proxy: MakeProxy
) -> None:
    bucket = make_bucket(moto_s3)
    proxy = fault_proxy(moto_s3.host, moto_s3.port)
    client = moto_s3.client(endpoint_url=proxy.url())
    big = os.urandom(3 * 1024 * 1024)  # boto3 sends Expect: 100-continue
    client.put_object(Bucket=bucket, Key="big", Body=big)
    for i in range(3):
        client.put_object(Bucket=bucket, Key=f"k{i}", Body=b"v%d" % i)
    proxy.reset_counters()
    for i in range(3):
        assert client.get_object(Bucket=bucket, Key=f"k{i}")["Body"].read() == b"v%d" % i
    client.head_object(Bucket=bucket, Key="k0")
    assert client.get_object(Bucket=bucket, Key="big")["Body"].read() == big
    client.put_object(Bucket=bucket, Key="big2", Body=big)
    client.get_object(Bucket=bucket, Key="k1")
    gets = [r.path for r in proxy.http_requests if r.method == "GET"]
    assert gets == [
        f"/{bucket}/k0",
        f"/{bucket}/k1",
        f"/{bucket}/k2",
        f"/{bucket}/big",
        f"/{bucket}/k1",
    ]
    assert proxy.count_requests("HEAD") == 1
    assert proxy.count_requests("PUT") == 1
