"""A bulk GCS copy with ``gcloud storage``'s parallelism, for ``bench/bulk_gcs.py`` to compare
objcache with (the ``gcloud`` CLI cannot be installed here: no internet but PyPI).

``gcloud storage cp`` moves many objects over processes, each running threads; its defaults
for multi-object transfers are 2 processes x 10 threads on fewer than 4 vCPUs and 16 x 4 from
4 to 47 (Google's "Tune gcloud CLI performance" page). This does the same with
google-cloud-storage's own client (one per process, as each gcloud process has its own):
the file list (or the bucket listing) is split over the processes, each copies its share
on a pool of threads, one object a request, bytes moved as they are (no encoding, no
checks beyond the client's own).

    python bench/gcs_parallel.py upload SRC_DIR BUCKET PREFIX --endpoint URL
    python bench/gcs_parallel.py download BUCKET PREFIX DST_DIR --endpoint URL
        [--processes N] [--threads N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def gcloud_defaults(cores: int) -> tuple[int, int]:
    """(processes, threads) ``gcloud storage`` uses for multi-object transfers on ``cores``."""
    if cores < 4:
        return 2, 10
    if cores < 48:
        return 16, 4
    return min(96, int(cores * 0.75)), 1


def _client(endpoint: str, project: str) -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project=project,
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call,unused-ignore]
        client_options={"api_endpoint": endpoint},
    )


def _upload_share(args: tuple[str, str, str, str, str, list[str], int]) -> int:
    endpoint, project, bucket_name, prefix, src, names, threads = args
    bucket = _client(endpoint, project).bucket(bucket_name)

    def one(name: str) -> None:
        bucket.blob(f"{prefix}/{name}").upload_from_filename(os.path.join(src, name))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, names))
    return len(names)


def _download_share(args: tuple[str, str, str, str, str, list[str], int]) -> int:
    endpoint, project, bucket_name, prefix, dst, names, threads = args
    # a fresh blob per name: fake-gcs-server's listed mediaLinks name the server, not a proxy
    bucket = _client(endpoint, project).bucket(bucket_name)

    def one(name: str) -> None:
        target = os.path.join(dst, name[len(prefix) + 1 :])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        bucket.blob(name).download_to_filename(target)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, names))
    return len(names)


def _split(names: list[str], parts: int) -> list[list[str]]:
    return [names[i::parts] for i in range(parts)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("direction", choices=("upload", "download"))
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("c")
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--project", default="objcache-test")
    default_p, default_t = gcloud_defaults(os.cpu_count() or 1)
    ap.add_argument("--processes", type=int, default=default_p)
    ap.add_argument("--threads", type=int, default=default_t)
    args = ap.parse_args()
    if args.direction == "upload":
        src, bucket, prefix = args.a, args.b, args.c
        names = sorted(str(p.relative_to(src)) for p in Path(src).rglob("*") if p.is_file())
        work = _upload_share
        local = src
    else:
        bucket, prefix, local = args.a, args.b, args.c
        client = _client(args.endpoint, args.project)
        names = [b.name for b in client.list_blobs(bucket, prefix=prefix + "/")]
        work = _download_share
    shares = [s for s in _split(names, args.processes) if s]
    jobs = [
        (args.endpoint, args.project, bucket, prefix, local, share, args.threads)
        for share in shares
    ]
    # forked before any client exists in the children (the download's listing client is
    # the parent's own and is not used by them)
    with multiprocessing.get_context("fork").Pool(len(jobs) or 1) as pool:
        moved = sum(pool.map(work, jobs))
    if moved != len(names):
        raise SystemExit(f"moved {moved} of {len(names)}")


if __name__ == "__main__":
    main()
