"""Soak: 16 workers doing mixed get/put through one sync Client against every tier kind
(local disk + redis + S3 on SeaweedFS + GCS on fake-gcs-server + file://), with faults
injected at random through FaultProxies, for a bounded time.

    .venv/bin/python bench/soak.py [--minutes 3] [--seed 1] [--out docs/benchmarks.md]

Loopback only. Reports ops/s, p50/p99 latency, misses and errors by kind (client.stats()),
open file descriptors and RSS. Exits non-zero when a value read back is not the value
written, when a cache call raises, or when FDs or RSS grow beyond noise (see THRESHOLDS).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._report import write_section
from objcache.client import Client
from objcache.config.settings import Config
from objcache.entry.codec import Codec
from objcache.errors import BackendError, EntryError
from tests.support.cloud import gcs_url, s3_url
from tests.support.proxy import FaultProxy
from tests.support.servers import FakeGCS, RedisServer, SeaweedS3

WORKERS = 16
KEYS = 1500
KIND = "blob"
#: Growth between the post-warm-up baseline and the settled end that counts as a leak.
#: FDs: each of the 4 remote tiers keeps a connection pool (redis 10+, aiohttp/botocore 10,
#: google-auth's requests sessions per worker thread, plus the disk tier's worker threads),
#: and faults make pools churn; 48 descriptors covers a full re-fill of every pool, while a
#: leak of one descriptor per failed call (thousands of faults per run) would exceed it fast.
#: RSS: 256 KiB values x 16 workers x (payload, entry, zstd buffers) plus allocator
#: fragmentation reach tens of MiB; 25% or 96 MiB, whichever is larger, is beyond that noise.
FD_GROWTH_MAX = 48
RSS_GROWTH_MAX_FRACTION = 0.25
RSS_GROWTH_MAX_BYTES = 96 << 20


def make_value(key: str, rng: random.Random) -> bytes:
    size = rng.choice((1 << 10, 8 << 10, 32 << 10, 128 << 10, 256 << 10))
    body = key.encode() + b"|" + rng.randbytes(size // 2) + b"x" * (size // 2)
    return body + hashlib.blake2b(body, digest_size=16).digest()


def valid(key: str, value: bytes) -> bool:
    body = value[:-16]
    return (
        body.startswith(key.encode() + b"|")
        and hashlib.blake2b(body, digest_size=16).digest() == value[-16:]
    )


def scan_stores(client: Client) -> dict[str, tuple[int, int]]:
    """``tier -> (entries, entries that fail verification)``: nothing partial may be stored."""
    codec = Codec()

    async def scan() -> dict[str, tuple[int, int]]:
        out = {}
        for tier in client.cache.tiers:
            for attempt in range(3):  # pooled connections may still be broken from faults
                n = bad = 0
                try:
                    async for info in tier.backend.list(""):
                        if "/blob/" not in info.key:
                            continue
                        data = await tier.backend.get(info.key)
                        if data is None:
                            continue
                        n += 1
                        try:
                            codec.decode(data, info.key)
                        except EntryError:
                            bad += 1
                    break
                except BackendError:
                    if attempt == 2:
                        raise
            out[tier.name.split("?")[0]] = (n, bad)
        return out

    return client.bridge.call(scan, 300)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def quantile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


FAULTS: dict[str, Callable[[FaultProxy, random.Random], None]] = {
    "delay": lambda p, r: p.set_rtt_ms(r.choice((50, 150, 400, 1200))),
    "jitter": lambda p, r: setattr(p, "jitter_ms", r.choice((20, 100))),
    "reset": lambda p, r: p.reset_after(r.choice((0, 4096, 65536)), times=r.randint(1, 20)),
    "refuse": lambda p, r: p.refuse(),
    "blackhole": lambda p, r: p.blackhole(),
    "close": lambda p, r: p.close_immediately(times=r.randint(1, 10)),
}


def clear(proxy: FaultProxy) -> None:
    proxy.passthrough()
    proxy.delay_ms = 0
    proxy.jitter_ms = 0


class Soak:
    def __init__(self, client: Client, proxies: dict[str, FaultProxy], seconds: float, seed: int):
        self.client = client
        self.proxies = proxies
        self.seconds = seconds
        self.seed = seed
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.get_ms: list[float] = []
        self.put_ms: list[float] = []
        self.outcomes: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.samples: list[tuple[float, int, int]] = []

    def worker(self, n: int) -> None:
        rng = random.Random(self.seed * 1000 + n)
        get_ms: list[float] = []
        put_ms: list[float] = []
        outcomes: Counter[str] = Counter()
        while not self.stop.is_set():
            key = f"soak-{rng.randrange(KEYS)}"
            try:
                if rng.random() < 0.7:
                    t = time.perf_counter()
                    got = self.client.get(KIND, key)
                    get_ms.append((time.perf_counter() - t) * 1000)
                    if got is None:
                        outcomes["get_miss"] += 1
                    elif valid(key, got):
                        outcomes["get_hit"] += 1
                    else:
                        outcomes["get_bad_value"] += 1
                else:
                    value = make_value(key, rng)
                    t = time.perf_counter()
                    self.client.put(KIND, key, value)
                    put_ms.append((time.perf_counter() - t) * 1000)
                    outcomes["put"] += 1
            except Exception as exc:  # a cache call must never raise
                outcomes[f"raised:{type(exc).__name__}"] += 1
        with self.lock:
            self.get_ms += get_ms
            self.put_ms += put_ms
            self.outcomes.update(outcomes)

    def chaos(self) -> None:
        rng = random.Random(self.seed)
        active: dict[str, float] = {}
        while not self.stop.wait(1.0):
            now = time.monotonic()
            for name, until in list(active.items()):
                if now >= until:
                    clear(self.proxies[name])
                    del active[name]
            if rng.random() < 0.5:
                name = rng.choice(sorted(self.proxies))
                if name not in active:
                    fault = rng.choice(sorted(FAULTS))
                    FAULTS[fault](self.proxies[name], rng)
                    active[name] = now + rng.uniform(2, 8)
                    self.faults[f"{name}:{fault}"] += 1
        for name in active:
            clear(self.proxies[name])

    def sampler(self, started: float) -> None:
        while not self.stop.wait(5.0):
            self.samples.append((time.monotonic() - started, open_fds(), rss_bytes()))

    def run(self) -> float:
        started = time.monotonic()
        threads = [threading.Thread(target=self.worker, args=(i,)) for i in range(WORKERS)]
        threads += [
            threading.Thread(target=self.chaos),
            threading.Thread(target=self.sampler, args=(started,)),
        ]
        for t in threads:
            t.start()
        self.stop.wait(self.seconds)
        self.stop.set()
        for t in threads:
            t.join(60)
        return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="docs/benchmarks.md to update")
    args = parser.parse_args()
    if not 0 < args.minutes <= 10:
        parser.error("--minutes must be in (0, 10]")
    seconds = args.minutes * 60

    tmp = Path(tempfile.mkdtemp(prefix="objcache-soak-"))
    with RedisServer(unix_socket=False) as rds, SeaweedS3() as s3, FakeGCS() as gcs:
        s3.create_bucket("soak")
        gcs.create_bucket("soak")
        proxies = {
            "redis": FaultProxy(rds.host, rds.port),
            "s3": FaultProxy("127.0.0.1", urlsplit(s3.endpoint_url).port or 0),
            "gcs": FaultProxy("127.0.0.1", urlsplit(gcs.endpoint).port or 0),
        }
        tiers = [
            f"redis://{proxies['redis'].host}:{proxies['redis'].port}/0?prefix=soak/",
            s3_url(s3, "soak", bucket="soak", endpoint_url=proxies["s3"].url()),
            gcs_url(gcs, "soak", bucket="soak", endpoint=proxies["gcs"].url()),
            f"file://{tmp / 'file-store'}",
        ]
        config = Config.from_env(
            {},
            tiers=",".join(tiers),
            local_dir=tmp / "local",
            local_max_bytes=48 << 20,  # smaller than the working set: evictions, remote hits
            timeout_ms=500,
            breaker_failures=5,
            breaker_cooldown_s=2.0,
            write_behind_max_bytes=32 << 20,
            flush_timeout_s=60,
            prefetch=False,
            stats_file=tmp / "stats.json",
        )
        client = Client(config)
        warm = min(30.0, seconds / 6)
        soak = Soak(client, proxies, seconds, args.seed)
        wall = soak.run()
        left = client.flush(60)  # every fault cleared: the queue must drain
        time.sleep(2)
        end_fds, end_rss = open_fds(), rss_bytes()
        stats = client.stats()
        at_rest = scan_stores(client)
        client.close()
        client.bridge.stop()
        for p in proxies.values():
            p.close()

    base = [s for s in soak.samples if s[0] >= warm][:3] or soak.samples[:1]
    base_fds = max(s[1] for s in base)
    base_rss = max(s[2] for s in base)
    ops = len(soak.get_ms) + len(soak.put_ms)
    problems = []
    raised = {k: v for k, v in soak.outcomes.items() if k.startswith("raised")}
    if raised:
        problems.append(f"cache calls raised: {raised}")
    if soak.outcomes["get_bad_value"]:
        problems.append(f"{soak.outcomes['get_bad_value']} gets returned a wrong value")
    if end_fds - base_fds > FD_GROWTH_MAX:
        problems.append(f"open FDs grew {base_fds} -> {end_fds} (> {FD_GROWTH_MAX})")
    rss_limit = max(RSS_GROWTH_MAX_BYTES, int(base_rss * RSS_GROWTH_MAX_FRACTION))
    if end_rss - base_rss > rss_limit:
        problems.append(f"RSS grew {base_rss >> 20} -> {end_rss >> 20} MiB")
    partial = {name: bad for name, (_, bad) in at_rest.items() if bad}
    if partial:
        problems.append(f"entries that fail verification at rest: {partial}")
    if left:
        problems.append(f"{left} remote writes still pending after the final flush")

    def misses(t: dict[str, Any]) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(t["misses"].items())) or "-"

    def errors(t: dict[str, Any]) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(t["put_errors"].items())) or "-"

    rows = "\n".join(
        f"| {'local disk' if t['local'] else t['name'].split('?')[0]} | {t['hits']} | "
        f"{misses(t)} | {t['puts']} | {errors(t)} | {t['breaker_opened']} |"
        for t in stats["tiers"]
    )
    cache = stats["cache"]
    fault_list = ", ".join(f"{k} {v}" for k, v in sorted(soak.faults.items()))
    body = f"""\
{WORKERS} threads through one sync `Client`, {wall:.0f} s, keys drawn from {KEYS} (values
1-256 KiB, self-verifying), 70% get / 30% put; tiers: local disk (48 MiB cap, so entries
are evicted and come back from remote tiers) + redis + S3 (SeaweedFS) + GCS (fake-gcs-server)
+ file://, redis/S3/GCS behind FaultProxies. Tier deadline 500 ms, breaker 5 failures / 2 s
cooldown. Every second, with probability 1/2, a healthy proxy gets a random fault for
2-8 s: {fault_list}.

| | |
|---|---|
| operations | {ops} ({ops / wall:.0f} ops/s) |
| get latency p50 / p99 | {quantile(soak.get_ms, 0.5):.2f} / {quantile(soak.get_ms, 0.99):.1f} ms |
| put latency p50 / p99 | {quantile(soak.put_ms, 0.5):.2f} / {quantile(soak.put_ms, 0.99):.1f} ms |
| gets: hits / misses / wrong values | {soak.outcomes["get_hit"]} / {soak.outcomes["get_miss"]} / \
{soak.outcomes["get_bad_value"]} |
| cache calls that raised | {sum(raised.values())} |
| write-behind dropped (queue full) / coalesced | {cache["write_behind_dropped"]} / \
{cache["write_behind_coalesced"]} |
| writes pending after the final flush | {left} |
| entries at rest (all tiers) / failing verification | {sum(n for n, _ in at_rest.values())} / \
{sum(b for _, b in at_rest.values())} |
| open FDs: after warm-up / end | {base_fds} / {end_fds} (limit +{FD_GROWTH_MAX}) |
| RSS: after warm-up / end | {base_rss >> 20} / {end_rss >> 20} MiB (limit +{rss_limit >> 20} MiB) |
| verdict | {"FAIL: " + "; ".join(problems) if problems else "pass"} |

| tier | hits | misses by kind | puts | put errors by kind | breaker opened |
|---|---|---|---|---|---|
{rows}
"""
    print(body)
    print(json.dumps({"samples": soak.samples}))
    if args.out is not None:
        command = "python bench/soak.py" + (f" --minutes {args.minutes:g}")
        write_section(args.out, "soak", command, body)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
