"""aiofiles vs one thread hop per entry, for filesystem-store reads and writes.

    PYTHONPATH=. python bench/fs_io.py [--dir DIR] [--scale 1.0] [--concurrency 16]

For each entry size it measures, per implementation, the latency of one operation issued
alone (p50/p99 over many) and the throughput with ``--concurrency`` operations in flight.

* ``aiofiles``: ``aiofiles.open`` + ``read``/``write`` + close, then ``aiofiles.os.replace``
  for writes: one executor hop per call, as aiofiles does.
* ``to_thread``: the same open/read/write/close/replace sequence as one synchronous
  function run with one ``asyncio.to_thread`` call.
* ``backend``: ``DiskBackend.get``/``put(OVERWRITE)`` end to end (key checks, symlink
  guard, temp file + publish, one thread hop).

Writes are atomic (temp file then replace) and not fsynced in every row, so the rows differ
only in how they reach the worker thread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable

import aiofiles
import aiofiles.os

from objcache.backends.base import PutMode
from objcache.backends.disk.store import DiskBackend
from objcache.config.urls import parse_tier_url

Op = Callable[[int], Awaitable[object]]
SIZES = {"1KB": 1 << 10, "100KB": 100 << 10, "1MB": 1 << 20}
POOL = 64  # distinct files per size, read and written round robin


def _read_sync(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write_sync(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}-{time.perf_counter_ns()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def make_ops(root: str, data: bytes, backend: DiskBackend) -> dict[str, dict[str, Op]]:
    # Each implementation has its own files: replacing a file another implementation has
    # just written (its writeback in flight) would charge one row for another's work.
    aio_paths = [os.path.join(root, f"aio{i}") for i in range(POOL)]
    paths = [os.path.join(root, f"thread{i}") for i in range(POOL)]
    keys = [f"bench/{len(data)}/e{i}" for i in range(POOL)]

    async def aio_read(i: int) -> bytes:
        async with aiofiles.open(aio_paths[i % POOL], "rb") as f:
            return await f.read()

    async def aio_write(i: int) -> None:
        path = aio_paths[i % POOL]
        tmp = f"{path}.tmp-{os.getpid()}-{time.perf_counter_ns()}"
        async with aiofiles.open(tmp, "wb") as f:
            await f.write(data)
        await aiofiles.os.replace(tmp, path)

    async def thread_read(i: int) -> bytes:
        return await asyncio.to_thread(_read_sync, paths[i % POOL])

    async def thread_write(i: int) -> None:
        await asyncio.to_thread(_write_sync, paths[i % POOL], data)

    async def backend_read(i: int) -> bytes | None:
        return await backend.get(keys[i % POOL])

    async def backend_write(i: int) -> bool:
        return await backend.put(keys[i % POOL], data, PutMode.OVERWRITE)

    return {
        "read": {"aiofiles": aio_read, "to_thread": thread_read, "backend": backend_read},
        "write": {"aiofiles": aio_write, "to_thread": thread_write, "backend": backend_write},
    }


async def latency(ops: dict[str, Op], n: int) -> dict[str, tuple[float, float]]:
    """p50/p99 µs per implementation; implementations alternate so that noise from other
    processes on the machine hits them all alike."""
    for op in ops.values():
        for i in range(min(n, 20)):  # warm up the executor and the page cache
            await op(i)
    samples: dict[str, list[float]] = {impl: [] for impl in ops}
    for i in range(n):
        for impl, op in ops.items():
            t0 = time.perf_counter_ns()
            await op(i)
            samples[impl].append((time.perf_counter_ns() - t0) / 1000)
    out = {}
    for impl, values in samples.items():
        q = statistics.quantiles(values, n=100, method="inclusive")
        out[impl] = (q[49], q[98])
    return out


async def throughput(op: Op, n: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            await op(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - t0)


async def main(root: str, scale: float, concurrency: int) -> None:
    backend = DiskBackend(parse_tier_url(f"disk://{root}/store"))
    print(f"dir={root} concurrency={concurrency} cpus={os.cpu_count()}")
    print(f"{'op':<6}{'size':>6}  {'impl':<10}{'p50 µs':>9}{'p99 µs':>9}{'ops/s':>10}")
    for label, size in SIZES.items():
        data = os.urandom(size)
        sub = os.path.join(root, label)
        os.makedirs(sub, exist_ok=True)
        ops = make_ops(sub, data, backend)
        for i in range(POOL):  # seed what the reads read
            for write in ops["write"].values():
                await write(i)
        n = max(50, int(scale * 200_000_000 / max(size, 100_000) ** 1.1))
        n = min(n, int(scale * 3000))
        for kind in ("read", "write"):
            lat = await latency(ops[kind], n)
            for impl, op in ops[kind].items():
                p50, p99 = lat[impl]
                ops_s = await throughput(op, n, concurrency)
                print(f"{kind:<6}{label:>6}  {impl:<10}{p50:>9.0f}{p99:>9.0f}{ops_s:>10.0f}")
    await backend.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="folder to write in (default: a temp folder)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply iteration counts")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        asyncio.run(main(tmp, args.scale, args.concurrency))
