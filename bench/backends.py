"""objcache's cloud backends against the raw clients doing the same call, on loopback.

    python bench/backends.py [--out docs/benchmarks.md] [--only redis,s3,gcs]
                                          [--rtt-ms 20] [--scale 1.0]
    python bench/backends.py --cluster [--cluster-url redis://node:6379/0 --single-url ...]
                             [--out docs/benchmarks.md] [--scale 1.0]

Starts redis-server, SeaweedFS (S3) and fake-gcs-server on 127.0.0.1 (tests.support),
then, for each backend, entry size (10 KB, 1 MB), operation (put, get) and concurrency
(1 = sequential, 32 in flight), measures the per-call latency of:

* ``objcache``: the backend (``get`` / ``put(OVERWRITE)``): key check, prefix, shared
  client lookup, error mapping;
* ``raw``: the client library doing the same call, configured the same way (redis.asyncio
  ``get``/``set``; aiobotocore ``get_object`` + read / ``put_object`` with objcache's
  botocore config; google-cloud-storage ``download_as_bytes`` / ``upload_from_string`` in
  a 32-thread pool with a 32-connection HTTP pool, ``retry=None``, ``checksum=None``);
* ``gcloud-aio`` (GCS only, when gcloud-aio-storage is installed): its native asyncio
  ``download`` / ``upload``, to weigh it against google-cloud-storage + threads.

Each grid runs directly and through a FaultProxy adding ``--rtt-ms`` of round trip. The
two implementations of a cell run in alternating rounds so drift hits both alike. Prints a
markdown table (p50/p99 in ms) and the objcache/raw ratio of p50s (target <= 1.10), and
writes them to ``--out`` when given. With few samples per cell, p99 is close to the max.

``--cluster`` measures something else: GETs and PUTs per second of the objcache backend on
a Redis Cluster against one Redis node, at the same concurrency (the tier's one gate of
``max_connections`` calls in flight holds for both). Without URLs it starts one
``redis-server`` and a local cluster of 3 primaries + 3 replicas (all on this machine's
cores, so the cluster's gain here is bounded by them); ``--cluster-url`` /
``--single-url`` measure real servers instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support: the test servers

from objcache.backends import create_backend
from objcache.backends.base import Backend, PutMode
from objcache.config.urls import parse_tier_url
from tests.support.proxy import FaultProxy
from tests.support.servers import FakeGCS, RedisClusterServer, RedisServer, SeaweedS3

Get = Callable[[str], Awaitable[object]]
Put = Callable[[str, bytes], Awaitable[object]]
MiB = 1 << 20
SIZES = {"10KB": 10_000, "1MB": MiB}
CONCURRENCY = 32
BUCKET = "objcache-bench"


@dataclass
class Impl:
    name: str
    get: Get
    put: Put
    close: Callable[[], Awaitable[None]]


@dataclass
class Cell:
    backend: str
    network: str
    size: str
    op: str
    concurrency: int
    samples: dict[str, list[float]] = field(default_factory=dict)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


# --- implementations -----------------------------------------------------------------


def objcache_impl(url: str) -> Impl:
    backend: Backend = create_backend(parse_tier_url(url))

    async def put(key: str, data: bytes) -> object:
        return await backend.put(key, data, PutMode.OVERWRITE)

    return Impl("objcache", backend.get, put, backend.close)


async def redis_raw(endpoint: str) -> Impl:
    import redis.asyncio as aioredis

    host, port = endpoint.rsplit(":", 1)
    client = aioredis.Redis(host=host, port=int(port), max_connections=64)

    async def get(key: str) -> object:
        return await client.get(f"raw/{key}")

    async def put(key: str, data: bytes) -> object:
        return await client.set(f"raw/{key}", data)

    return Impl("raw", get, put, client.aclose)


async def s3_raw(endpoint: str) -> Impl:
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    config = AioConfig(
        connect_timeout=3,
        read_timeout=20,
        max_pool_connections=64,
        retries={"total_max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": "path"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    context = get_session().create_client(
        "s3", region_name="us-east-1", endpoint_url=endpoint, config=config
    )
    client = await context.__aenter__()

    async def get(key: str) -> object:
        response = await client.get_object(Bucket=BUCKET, Key=f"raw/{key}")
        return await response["Body"].read()

    async def put(key: str, data: bytes) -> object:
        return await client.put_object(Bucket=BUCKET, Key=f"raw/{key}", Body=data)

    async def close() -> None:
        await context.__aexit__(None, None, None)

    return Impl("raw", get, put, close)


async def gcs_raw(endpoint: str) -> Impl:
    import requests.adapters
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(
        project="bench",
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        client_options={"api_endpoint": endpoint},
    )
    adapter = requests.adapters.HTTPAdapter(pool_maxsize=CONCURRENCY, max_retries=0)
    client._http.mount("http://", adapter)
    bucket = client.bucket(BUCKET)
    pool = ThreadPoolExecutor(CONCURRENCY)
    loop = asyncio.get_running_loop()

    def download(key: str) -> bytes:
        blob = bucket.blob(f"raw/{key}")
        return blob.download_as_bytes(retry=None, checksum=None, timeout=(3, 20))  # type: ignore[no-any-return]

    def upload(key: str, data: bytes) -> None:
        bucket.blob(f"raw/{key}").upload_from_string(
            data, content_type="application/octet-stream", retry=None, checksum=None
        )

    async def get(key: str) -> object:
        return await loop.run_in_executor(pool, download, key)

    async def put(key: str, data: bytes) -> object:
        return await loop.run_in_executor(pool, functools.partial(upload, key, data))

    async def close() -> None:
        pool.shutdown(wait=False)

    return Impl("raw", get, put, close)


async def gcs_aio(endpoint: str) -> Impl | None:
    try:
        from gcloud.aio.storage import Storage
    except ImportError:
        return None
    storage = Storage(api_root=endpoint)

    async def get(key: str) -> object:
        return await storage.download(BUCKET, f"aio/{key}")

    async def put(key: str, data: bytes) -> object:
        return await storage.upload(
            BUCKET, f"aio/{key}", data, content_type="application/octet-stream"
        )

    return Impl("gcloud-aio", get, put, storage.close)


# --- measurement ---------------------------------------------------------------------


async def timed(fn: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await fn()
    return time.perf_counter() - started


async def run_cell(cell: Cell, impls: list[Impl], data: bytes, rounds: int, per: int) -> None:
    """``rounds`` alternating rounds; each round does ``per`` calls per implementation
    (sequentially, or ``per`` batches of CONCURRENCY calls in flight)."""
    tag = uuid.uuid4().hex[:8]
    for impl in impls:  # keys for the gets, and a warm connection pool
        keys = [f"{cell.size}/{tag}/{i}" for i in range(CONCURRENCY)]
        await asyncio.gather(*(impl.put(k, data) for k in keys))
        await asyncio.gather(*(impl.get(k) for k in keys))
    for r in range(rounds):
        for impl in impls[r % len(impls) :] + impls[: r % len(impls)]:  # rotate the order
            out = cell.samples.setdefault(impl.name, [])
            for i in range(per):

                def call(j: int, impl: Impl = impl, i: int = i, r: int = r) -> Awaitable[object]:
                    key = f"{cell.size}/{tag}/{j % CONCURRENCY}"
                    if cell.op == "get":
                        return impl.get(key)
                    return impl.put(f"{cell.size}/{tag}/w{r}-{i}-{j}", data)

                if cell.concurrency == 1:
                    out.append(await timed(functools.partial(call, i)))
                else:
                    batch = [timed(functools.partial(call, j)) for j in range(cell.concurrency)]
                    out.extend(await asyncio.gather(*batch))


@dataclass
class Target:
    name: str
    objcache_url: Callable[[str], str]  # endpoint -> tier URL
    raw: list[Callable[[str], Awaitable[Impl | None]]]
    address: tuple[str, int]
    endpoint: Callable[[str, int], str]


def targets(servers: dict[str, Any]) -> Iterator[Target]:
    if "redis" in servers:
        r: RedisServer = servers["redis"]
        yield Target(
            "redis",
            lambda ep: f"redis://{ep}/0?prefix=objcache/",
            [redis_raw],
            (r.host, r.port),
            lambda h, p: f"{h}:{p}",
        )
    if "s3" in servers:
        s: SeaweedS3 = servers["s3"]
        yield Target(
            "s3 (SeaweedFS)",
            lambda ep: (
                f"s3://{BUCKET}/objcache?endpoint_url={ep}&region=us-east-1&addressing_style=path"
            ),
            [s3_raw],
            (s.host, s.port),
            lambda h, p: f"http://{h}:{p}",
        )
    if "gcs" in servers:
        g: FakeGCS = servers["gcs"]
        yield Target(
            "gcs (fake-gcs-server)",
            lambda ep: f"gs://{BUCKET}/objcache?endpoint={ep}",
            [gcs_raw, gcs_aio],
            (g.host, g.port),
            lambda h, p: f"http://{h}:{p}",
        )


async def bench_target(target: Target, network: str, rtt_ms: float, scale: float) -> list[Cell]:
    host, port = target.address
    proxy = None
    if network != "direct":
        proxy = FaultProxy(host, port)
        proxy.set_rtt_ms(rtt_ms)
        host, port = proxy.address
    endpoint = target.endpoint(host, port)
    impls = [objcache_impl(target.objcache_url(endpoint))]
    for make in target.raw:
        impl = await make(endpoint)
        if impl is not None:
            impls.append(impl)
    cells = []
    slow = network != "direct"
    try:
        for size, nbytes in SIZES.items():
            data = os.urandom(nbytes)
            for op in ("put", "get"):
                for conc in (1, CONCURRENCY):
                    cell = Cell(target.name, network, size, op, conc)
                    # Many short alternating rounds: on a shared machine, drift and the
                    # position in a round otherwise favour one implementation.
                    if conc == 1:
                        rounds, per = max(2, int(6 * scale)), 3 if slow else 8
                    else:  # 1 MB batches are slow: fewer rounds keep the run near 2.5 min
                        rounds, per = max(2, int((5 if nbytes < MiB else 4) * scale)), 1
                    await run_cell(cell, impls, data, rounds, per)
                    cells.append(cell)
                    print(".", end="", flush=True, file=sys.stderr)
    finally:
        for impl in impls:
            with contextlib.suppress(Exception):
                await impl.close()
        if proxy is not None:
            proxy.close()
    return cells


# --- Redis Cluster against one node ----------------------------------------------------


async def throughput(url: str, op: str, data: bytes, calls: int, concurrency: int) -> float:
    """Calls per second of ``op`` through the objcache backend on ``url``, ``concurrency``
    workers taking keys off one counter (the keys spread over every slot)."""
    backend = create_backend(parse_tier_url(url))
    tag = uuid.uuid4().hex[:8]
    keys = [f"tp/{tag}/{i}" for i in range(calls)]
    try:
        await asyncio.gather(*(backend.put(k, data, PutMode.OVERWRITE) for k in keys[:64]))
        if op == "get":  # the values to read, written before the clock starts
            await asyncio.gather(*(backend.put(k, data, PutMode.OVERWRITE) for k in keys))
        pending = iter(keys)

        async def worker() -> None:
            for key in pending:
                if op == "get":
                    await backend.get(key)
                else:
                    await backend.put(key, data, PutMode.OVERWRITE)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return calls / (time.perf_counter() - started)
    finally:
        for key in keys:
            await backend.delete(key)
        await backend.close()


async def cluster_async(args: argparse.Namespace) -> str:
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        single = args.single_url
        if single is None:
            single = stack.enter_context(RedisServer(unix_socket=False)).url
        cluster = args.cluster_url
        if cluster is None:
            cluster = stack.enter_context(RedisClusterServer()).url
        calls = max(500, int(4000 * args.scale))
        rows = []
        for size, nbytes in (("1KB", 1000), ("100KB", 100_000)):
            data = os.urandom(nbytes)
            for op in ("get", "put"):
                for conc in (1, CONCURRENCY):
                    rates = []
                    for url in (single, cluster):  # alternating, best of 2: less drift
                        rates.append(
                            max(
                                [
                                    await throughput(f"{url}?prefix=bench/", op, data, calls, conc)
                                    for _ in range(2)
                                ]
                            )
                        )
                    rows.append((size, op, conc, rates[0], rates[1]))
                    print(".", end="", flush=True, file=sys.stderr)
        print(file=sys.stderr)
    shape = "local, 3 primaries + 3 replicas" if args.cluster_url is None else "given"
    lines = [
        f"Redis Cluster ({shape}) against one Redis node "
        f"({'local' if args.single_url is None else 'given'}): objcache backend calls per "
        f"second, {calls} calls per cell, best of 2.",
        "",
        "| size | op | concurrency | one node calls/s | cluster calls/s | cluster / node |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {size} | {op} | {conc} | {one:,.0f} | {many:,.0f} | {many / one:.2f} |"
        for size, op, conc, one, many in rows
    ]
    lines += ["", f"Run time {time.monotonic() - started:.0f} s."]
    return "\n".join(lines) + "\n"


# --- report --------------------------------------------------------------------------


def report(cells: list[Cell], rtt_ms: float, seconds: float) -> str:
    names = ["objcache", "raw", "gcloud-aio"]
    lines = [
        f"objcache backends vs raw clients, loopback (network `rtt{rtt_ms:g}` = FaultProxy "
        f"adding {rtt_ms:g} ms round trip). p50 / p99 per call in ms; ratio = objcache p50 "
        "/ raw p50 (target <= 1.10).",
        "",
        "| backend | network | size | op | conc | objcache p50 / p99 | raw p50 / p99 "
        "| ratio | gcloud-aio p50 / p99 | n |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios: list[float] = []
    for c in cells:
        cols = []
        for name in names:
            s = c.samples.get(name)
            cols.append(f"{pct(s, 0.5):.2f} / {pct(s, 0.99):.2f}" if s else "-")
        ratio = pct(c.samples["objcache"], 0.5) / pct(c.samples["raw"], 0.5)
        ratios.append(ratio)
        n = len(c.samples["objcache"])
        lines.append(
            f"| {c.backend} | {c.network} | {c.size} | {c.op} | {c.concurrency} | {cols[0]} "
            f"| {cols[1]} | {ratio:.2f} | {cols[2]} | {n} |"
        )
    over = [f"{c.backend}/{c.network}/{c.size}/{c.op}/c{c.concurrency}" for c, r in
            zip(cells, ratios, strict=True) if r > 1.10]  # fmt: skip
    lines += [
        "",
        f"objcache/raw p50 ratio: median {statistics.median(ratios):.2f}, "
        f"max {max(ratios):.2f}; cells above 1.10: {', '.join(over) or 'none'}.",
        f"Run time {seconds:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> str:
    only = set(args.only.split(","))
    started = time.monotonic()
    # The S3 backend uses the standard credential chain: the environment, here.
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    with contextlib.ExitStack() as stack:
        servers: dict[str, Any] = {}
        if "redis" in only:
            servers["redis"] = stack.enter_context(RedisServer(unix_socket=False))
        if "s3" in only:
            s3 = servers["s3"] = stack.enter_context(SeaweedS3())
            os.environ["AWS_ACCESS_KEY_ID"] = s3.access_key
            os.environ["AWS_SECRET_ACCESS_KEY"] = s3.secret_key
            s3.create_bucket(BUCKET)
        if "gcs" in only:
            servers["gcs"] = stack.enter_context(FakeGCS())
            servers["gcs"].create_bucket(BUCKET)
        print(f"servers up in {time.monotonic() - started:.0f} s", file=sys.stderr)
        cells: list[Cell] = []
        for target in targets(servers):
            for network in ("direct", f"rtt{args.rtt_ms:g}"):
                cells += await bench_target(target, network, args.rtt_ms, args.scale)
        print(file=sys.stderr)
    return report(cells, args.rtt_ms, time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="also write the markdown report here")
    parser.add_argument("--only", default="redis,s3,gcs", help="comma-separated backends")
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="added round trip")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply sample counts")
    parser.add_argument(
        "--cluster", action="store_true", help="Redis Cluster against one node, calls/s"
    )
    parser.add_argument("--cluster-url", help="with --cluster: this cluster, not a local one")
    parser.add_argument("--single-url", help="with --cluster: this node, not a local one")
    args = parser.parse_args()
    text = asyncio.run(cluster_async(args) if args.cluster else main_async(args))
    print(text)
    if args.out:
        from pathlib import Path

        from bench._report import write_section

        if args.cluster:
            command = "python bench/backends.py --cluster --out docs/benchmarks.md"
            write_section(Path(args.out), "redis-cluster", command, text)
        else:
            command = "python bench/backends.py --out docs/benchmarks.md"
            write_section(Path(args.out), "backends", command, text)


if __name__ == "__main__":
    main()
