"""``gs://bucket/prefix``: Google Cloud Storage through google-cloud-storage.

URL options (all optional)::

    project=my-project        endpoint=http://127.0.0.1:4443   (emulators)
    connect_timeout=3  read_timeout=20   (seconds)
    resumable_threshold=8388608          (bytes; larger entries use a resumable upload)
    resumable_chunk=67108864             (bytes, a multiple of 256 KiB)

google-cloud-storage is blocking. Its calls run in one bounded thread pool per process
(:data:`MAX_THREADS` threads) on one ``storage.Client`` per process and configuration,
whose HTTP pool is sized to match so that no thread waits for a connection. Both are
created on first use, never in ``__init__``; after a fork the child makes its own.

* **No hidden retries**: every call passes ``retry=None`` (the library's default retries
  for up to 120 s, far past any tier deadline); :mod:`objcache.core.policy` retries transient
  errors inside the deadline. Socket timeouts are explicit.
* **CREATE** is ``if_generation_match=0``; 412 means another writer won. Entries up to
  ``resumable_threshold`` (8 MiB, google-cloud-storage's own multipart limit) go in one
  multipart request; larger ones through a resumable upload whose chunk is
  ``resumable_chunk`` (64 MiB: objcache never resumes a session, the policy layer re-sends
  the whole put, so fewer chunks only save round trips). An interrupted resumable session
  leaves no object behind. A large CREATE first checks that the object is absent, so a
  loser usually skips the upload altogether. Real GCS enforces the precondition when the
  object is finalized, on every upload path. fake-gcs-server 1.54 checks it on a
  resumable upload only when the session starts (fixed upstream by
  fsouza/fake-gcs-server#2260), so there concurrent large CREATEs can all succeed.
* google-cloud-storage 3.x's bucket-metadata lookups for tracing (a background
  ``buckets.get`` per bucket and after every 404) are switched off.
* Checksums are left off (``checksum=None``): every entry carries its own BLAKE2b digest,
  checked by :mod:`objcache.entry.codec` on every read.
* Credentials: Application Default Credentials only; anonymous credentials only when an
  emulator endpoint is configured (``endpoint=`` or ``STORAGE_EMULATOR_HOST``).
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from objcache.backends.base import (
    Backend,
    ObjectInfo,
    PutMode,
    TierSpec,
    check_size,
    validate_key,
)
from objcache.backends.gcs.errors import (
    classify,
    is_not_found,
    is_precondition_failure,
    missing_bucket,
)
from objcache.backends.options import opt_float, opt_int, opt_str
from objcache.backends.records_contract import Versioned
from objcache.backends.shared import DaemonThreadPool
from objcache.errors import ConfigError, TransientBackendError

T = TypeVar("T")

#: Threads running blocking google-cloud-storage calls, per process.
MAX_THREADS = 32
#: GCS requires resumable chunks to be multiples of this.
CHUNK_QUANTUM = 256 * 1024
_SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)


@dataclass(frozen=True)
class ClientKey:
    project: str | None
    endpoint: str | None
    pool_size: int


def _make_client(key: ClientKey) -> Any:
    """A storage.Client with a right-sized HTTP pool (blocking: run in the pool)."""
    import google.auth
    import requests.adapters
    from google.auth.credentials import AnonymousCredentials
    from google.auth.transport.requests import AuthorizedSession
    from google.cloud import storage

    project = key.project
    if key.endpoint:
        credentials: Any = AnonymousCredentials()  # type: ignore[no-untyped-call]
        project = project or "objcache"
    else:
        credentials, default_project = google.auth.default(scopes=_SCOPES)
        project = project or default_project
    session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
    adapter = requests.adapters.HTTPAdapter(
        pool_connections=4, pool_maxsize=key.pool_size, max_retries=0
    )
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    options = {"api_endpoint": key.endpoint} if key.endpoint else None
    client = storage.Client(
        project=project, credentials=credentials, _http=session, client_options=options
    )
    # google-cloud-storage >= 3.x fetches bucket metadata (buckets.get, with its own
    # retries) in a new background thread on first use of each bucket and again after
    # every 404, only to label tracing spans: an extra request per miss, and a permission
    # readers lack. Every use of the cache is guarded by a truthiness check.
    if getattr(client, "_bucket_metadata_cache", None) is not None:
        client._bucket_metadata_cache = None
    return client


class _Shared:
    """The per-process thread pool and clients (re-created in a forked child)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = -1
        self.executor: DaemonThreadPool | None = None
        self.clients: dict[ClientKey, Any] = {}

    def pool(self) -> DaemonThreadPool:
        if self.pid != os.getpid() or self.executor is None:
            with self.lock:
                if self.pid != os.getpid() or self.executor is None:
                    # daemon threads: a call stuck past its deadline never delays exit
                    self.executor = DaemonThreadPool(MAX_THREADS, "gcs")
                    self.clients = {}
                    self.pid = os.getpid()
        return self.executor

    def client(self, key: ClientKey) -> Any:
        """Called in a pool thread."""
        client = self.clients.get(key)
        if client is None:
            with self.lock:
                client = self.clients.get(key)
                if client is None:
                    client = self.clients[key] = _make_client(key)
        return client


SHARED = _Shared()
_BUCKETS_SEEN: set[tuple[str | None, str]] = set()


class GCSBackend(Backend):
    #: google-cloud-storage's calls block: they run on the process's worker threads
    max_in_flight = MAX_THREADS

    def __init__(self, spec: TierSpec) -> None:
        super().__init__(spec)
        self.bucket = spec.location
        self.prefix = f"{spec.path}/" if spec.path else ""
        endpoint = opt_str(spec, "endpoint") or os.environ.get("STORAGE_EMULATOR_HOST") or None
        if endpoint and "://" not in endpoint:
            endpoint = f"http://{endpoint}"
        self.client_key = ClientKey(
            project=opt_str(spec, "project"), endpoint=endpoint, pool_size=MAX_THREADS
        )
        self.timeout = (
            opt_float(spec, "connect_timeout"),
            opt_float(spec, "read_timeout"),
        )
        self.resumable_threshold = opt_int(spec, "resumable_threshold")
        self.resumable_chunk = opt_int(spec, "resumable_chunk")
        if self.resumable_chunk % CHUNK_QUANTUM:
            raise ConfigError(f"{spec.display}: resumable_chunk must be a multiple of 256 KiB")
        #: objects per listing page (GCS's maximum; tests lower it to exercise paging)
        self.list_page_size = 1000

    # --- plumbing ----------------------------------------------------------------------

    async def _run(self, op: str, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(client, *args)`` in the pool; exceptions come back classified."""
        loop = asyncio.get_running_loop()
        call = functools.partial(self._in_thread, fn, *args)
        try:
            return await loop.run_in_executor(SHARED.pool(), call)
        except Exception as exc:
            raise classify(exc, op, self.bucket, self.name) from exc

    def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(SHARED.client(self.client_key), *args)

    def _object_name(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def _check_bucket(self, client: Any) -> None:
        """Raise when the bucket is missing; asked once per process (a 404 cannot tell).

        Uses a one-item listing: readers hold storage.objects.list, not buckets.get."""
        seen = (self.client_key.endpoint, self.bucket)
        if seen in _BUCKETS_SEEN:
            return
        try:
            pages = client.list_blobs(
                self.bucket, max_results=1, retry=None, timeout=self.timeout
            ).pages
            next(iter(pages), None)
        except Exception as exc:
            if is_not_found(exc):
                raise missing_bucket(self.bucket, self.name) from None
            if getattr(exc, "code", 0) not in (401, 403):
                raise
            # no storage.objects.list permission: cannot tell, assume the bucket exists
        _BUCKETS_SEEN.add(seen)

    # --- blocking bodies (run in the pool) ---------------------------------------------

    def _get(self, client: Any, name: str, end: int | None = None) -> bytes | None:
        """The object, or with ``end`` its bytes 0..end (one ranged GET, no metadata call)."""
        blob = client.bucket(self.bucket).blob(name)
        try:
            data: bytes = blob.download_as_bytes(
                retry=None,
                timeout=self.timeout,
                checksum=None,
                start=None if end is None else 0,
                end=end,
            )
        except Exception as exc:
            if end is not None and getattr(exc, "code", None) == 416:
                return b""  # an empty object: no entry, refused by the codec as corrupt
            if not is_not_found(exc):
                raise
            self._check_bucket(client)
            return None
        return data

    def _exists(self, client: Any, name: str) -> bool:
        blob = client.bucket(self.bucket).blob(name)
        if blob.exists(retry=None, timeout=self.timeout):
            return True
        self._check_bucket(client)
        return False

    def _put(self, client: Any, name: str, data: bytes, create: bool) -> bool:
        large = len(data) > self.resumable_threshold
        chunk = self.resumable_chunk if large else None
        blob = client.bucket(self.bucket).blob(name, chunk_size=chunk)
        if large and create and blob.exists(retry=None, timeout=self.timeout):
            return False  # cheap early exit; if_generation_match=0 is what makes it atomic
        try:
            blob.upload_from_string(
                data,
                content_type="application/octet-stream",
                if_generation_match=0 if create else None,
                retry=None,
                timeout=self.timeout,
                checksum=None,
            )
        except Exception as exc:
            if create and is_precondition_failure(exc):
                return False
            if is_not_found(exc):
                raise missing_bucket(self.bucket, self.name) from None
            raise
        return True

    def _get_versioned(self, client: Any, name: str, max_bytes: int) -> Versioned | None:
        """The object and its generation: metadata first, then the bytes of exactly that
        generation (a newer one in between fails the download's precondition: retried).
        A generation over a non-zero ``max_bytes`` (the metadata's size) is not downloaded
        (docs/security.md, "Records")."""
        blob = client.bucket(self.bucket).get_blob(name, retry=None, timeout=self.timeout)
        if blob is None:
            self._check_bucket(client)
            return None
        generation = int(blob.generation)
        if max_bytes and int(blob.size or 0) > max_bytes:
            return Versioned(b"", str(generation), too_large=True)
        try:
            data: bytes = blob.download_as_bytes(
                if_generation_match=generation, retry=None, timeout=self.timeout, checksum=None
            )
        except Exception as exc:
            if is_precondition_failure(exc) or is_not_found(exc):
                raise TransientBackendError("record changed while read", tier=self.name) from exc
            raise
        return Versioned(data, str(generation))

    def _put_if_generation(self, client: Any, name: str, data: bytes, generation: int) -> bool:
        blob = client.bucket(self.bucket).blob(name)
        try:
            blob.upload_from_string(
                data,
                content_type="application/octet-stream",
                if_generation_match=generation,
                retry=None,
                timeout=self.timeout,
                checksum=None,
            )
        except Exception as exc:
            if is_precondition_failure(exc):
                return False
            if is_not_found(exc):
                raise missing_bucket(self.bucket, self.name) from None
            raise
        return True

    def _delete(self, client: Any, name: str) -> bool:
        try:
            client.bucket(self.bucket).blob(name).delete(retry=None, timeout=self.timeout)
        except Exception as exc:
            if not is_not_found(exc):
                raise
            self._check_bucket(client)
            return False
        return True

    def _list_page(self, client: Any, prefix: str, token: str | None) -> tuple[Any, str | None]:
        iterator = client.list_blobs(
            self.bucket,
            prefix=prefix,
            page_token=token,
            page_size=self.list_page_size,
            fields="items(name,size,updated),nextPageToken",
            retry=None,
            timeout=self.timeout,
        )
        try:
            page = next(iterator.pages, None)
        except Exception as exc:
            if is_not_found(exc):
                raise missing_bucket(self.bucket, self.name) from None
            raise
        items = [] if page is None else [(b.name, b.size, b.updated) for b in page]
        return items, iterator.next_page_token

    # --- Backend API -------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        return await self._run("get", self._get, self._object_name(key))

    async def get_capped(self, key: str, max_bytes: int) -> bytes | None:
        """One ranged GET of the first ``max_bytes + 1`` bytes: an oversized object is
        refused after moving one byte more than the cap (docs/security.md)."""
        if not max_bytes:
            return await self.get(key)
        data = await self._run("get", self._get, self._object_name(key), max_bytes)
        if data is not None:
            check_size(len(data), max_bytes)
        return data

    async def exists(self, key: str) -> bool:
        return await self._run("exists", self._exists, self._object_name(key))

    async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
        name = self._object_name(key)
        return await self._run("put", self._put, name, data, mode is PutMode.CREATE)

    async def get_versioned(self, key: str, max_bytes: int = 0) -> Versioned | None:
        return await self._run("get", self._get_versioned, self._object_name(key), max_bytes)

    async def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        """``if_generation_match``: the generation read, or 0 for "must not exist"."""
        generation = 0 if version is None else int(version)
        name = self._object_name(key)
        return await self._run("put", self._put_if_generation, name, data, generation)

    async def delete(self, key: str) -> bool:
        return await self._run("delete", self._delete, self._object_name(key))

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        cut = len(self.prefix)
        token: str | None = None
        while True:
            items, token = await self._run("list", self._list_page, self.prefix + prefix, token)
            for name, size, updated in items:
                mtime = updated.timestamp() if updated is not None else 0.0
                yield ObjectInfo(key=name[cut:], size=int(size or 0), mtime=mtime)
            if not token:
                return

    async def close(self) -> None:
        """Nothing per instance: the pool and clients live as long as the process."""
