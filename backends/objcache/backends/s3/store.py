"""``s3://bucket/prefix``: Amazon S3 and S3-compatible stores, through aiobotocore (which
the ``s3`` extra installs with aioboto3).

URL options (all optional)::

    region=us-east-1            endpoint_url=http://host:port    profile=ci
    addressing_style=path|virtual|auto
    connect_timeout=3  read_timeout=20           (seconds, per socket operation)
    max_pool_connections=256
    multipart_threshold=16777216  part_size=8388608  part_concurrency=8
    direct=1                    (0: send every request through botocore)

* **One client per (process, event loop, region/endpoint/profile/...)**, shared by every
  instance: construction does no I/O; the client is created on the first call and closed
  when the last instance that used it is closed (:mod:`objcache.backends.shared`).
* **Single-part GET, PUT and HEAD, and the parts of a multipart upload, skip botocore's
  per-call machinery** (:mod:`objcache.backends.s3.direct`): signed here, sent over
  aiohttp, at about a quarter of the CPU. botocore still resolves the endpoint and
  credentials and makes every other call; ``direct=0`` sends everything through it.
* **No hidden retries**: botocore makes one attempt; :mod:`objcache.core.policy` retries
  transient errors inside the tier deadline. Errors are classified in
  :mod:`objcache.backends.s3.errors`.
* **CREATE** sends ``If-None-Match: *`` (on PutObject, and on CompleteMultipartUpload for
  large entries); 412 / 409 ConditionalRequestConflict means another writer won. AWS S3
  enforces both atomically; SeaweedFS does for PutObject, moto checks the header and then
  writes without a lock (the test suite's moto server serialises conditional requests), and
  both check it before assembling a multipart upload, so racing large CREATEs can all
  succeed there (the stored object is still one writer's whole entry). A server that
  ignores the header silently turns CREATE into OVERWRITE (last writer wins): the bytes
  are the same entry, so this is harmless for a content-addressed cache, but the race is
  not detected.
* **Large entries** (> ``multipart_threshold``) go through a multipart upload with
  ``part_concurrency`` parts in flight; any failure or cancellation aborts the upload, so
  no partial object or orphaned parts stay behind.
* Credentials come only from the standard AWS chain (environment, ``profile``, SSO,
  container/instance role); they are never logged. Note that without ``s3:ListBucket``
  S3 answers 403 for a missing key, which is reported as a permanent access error.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import os
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession
from botocore import exceptions as bce
from botocore.httpsession import get_cert_path

from objcache.backends.base import (
    Backend,
    ObjectInfo,
    PutMode,
    Sink,
    TierSpec,
    check_size,
    validate_key,
)
from objcache.backends.options import opt_bool, opt_float, opt_int, opt_str
from objcache.backends.records_contract import Versioned
from objcache.backends.s3.direct import DirectS3, Reroute, Route
from objcache.backends.s3.errors import (
    classify,
    error_code,
    is_not_found,
    is_precondition_failure,
    missing_bucket,
    status_code,
)
from objcache.backends.shared import Memo, SharedClients
from objcache.errors import BackendError, ConfigError, TransientBackendError

#: S3 refuses uploads above 10,000 parts (the part size minimum: spec.MIN_PART_SIZE).
MAX_PARTS = 10_000


@dataclass(frozen=True)
class ClientKey:
    """Everything that makes two clients different. Instances with equal keys share one."""

    region: str | None
    endpoint_url: str | None
    profile: str | None
    addressing_style: str
    connect_timeout: float
    read_timeout: float
    max_pool_connections: int
    direct: bool


@dataclass(frozen=True)
class S3Client:
    """The botocore client, and the direct path for the calls it makes per entry (None
    when turned off or when there are no credentials to sign with)."""

    boto: Any
    direct: DirectS3 | None


async def _open_client(key: ClientKey) -> S3Client:
    # aiobotocore's session, not aioboto3's: boto3 (the resource layer, S3 transfer
    # helpers) is 0.1 s of every command's start-up and none of this backend's calls
    # (docs/architecture.md, "S3 requests").
    session = AioSession()
    if key.profile is not None:
        session.set_config_variable("profile", key.profile)
    if key.region is not None:
        session.set_config_variable("region", key.region)
    config = AioConfig(
        region_name=key.region,
        connect_timeout=key.connect_timeout,
        read_timeout=key.read_timeout,
        max_pool_connections=key.max_pool_connections,
        # One attempt: objcache.core.policy retries transient errors within the tier deadline.
        retries={"total_max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": key.addressing_style},
        # Entries carry their own BLAKE2b digest (objcache.entry.codec); skip per-request CRCs.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    creating = session.create_client("s3", endpoint_url=key.endpoint_url, config=config)
    boto = await creating.__aenter__()
    direct = None
    if key.direct:
        credentials = await session.get_credentials()
        if credentials is not None:
            ca_bundle = _configured_ca_bundle(session)
            direct = DirectS3(
                boto,
                credentials,
                connect_timeout=key.connect_timeout,
                read_timeout=key.read_timeout,
                max_connections=key.max_pool_connections,
                ca_bundle=ca_bundle or get_cert_path(True),
            )
    return S3Client(boto, direct)


def _configured_ca_bundle(session: Any) -> str | None:
    """``AWS_CA_BUNDLE`` or the profile's ``ca_bundle``, as botocore reads them."""
    try:
        value = session.get_config_variable("ca_bundle")
    except Exception:
        value = os.environ.get("AWS_CA_BUNDLE")
    return str(value) if value else None


async def _close_client(client: S3Client) -> None:
    if client.direct is not None:
        await client.direct.close()
    await client.boto.close()


#: Shared by every S3Backend in the process.
CLIENTS: SharedClients[ClientKey, S3Client] = SharedClients(_open_client, _close_client)

#: Waits between attempts to abort a failed multipart upload (in the background).
ABORT_RETRY_DELAYS_S = (0.0, 0.5, 2.0, 5.0, 10.0)
#: How long a failed put waits for its abort before returning its error.
ABORT_WAIT_S = 1.0
#: Aborts of failed multipart uploads still running (held so they are not collected).
_BACKGROUND: set[asyncio.Task[None]] = set()
#: (endpoint, bucket) pairs whose existence has been confirmed: a HEAD 404 is then a miss.
_BUCKETS_SEEN: set[tuple[str | None, str]] = set()


class S3Backend(Backend):
    def __init__(self, spec: TierSpec) -> None:
        super().__init__(spec)
        self.bucket = spec.location
        self.prefix = f"{spec.path}/" if spec.path else ""
        style = opt_str(spec, "addressing_style")
        if style not in ("auto", "path", "virtual"):
            raise ConfigError(f"{spec.display}: addressing_style must be auto, path or virtual")
        assert style is not None
        self.client_key = ClientKey(
            region=opt_str(spec, "region"),
            endpoint_url=opt_str(spec, "endpoint_url"),
            profile=opt_str(spec, "profile"),
            addressing_style=style,
            connect_timeout=opt_float(spec, "connect_timeout"),
            read_timeout=opt_float(spec, "read_timeout"),
            max_pool_connections=opt_int(spec, "max_pool_connections"),
            direct=opt_bool(spec, "direct"),
        )
        self.multipart_threshold = opt_int(spec, "multipart_threshold")
        self.part_size = opt_int(spec, "part_size")
        self.part_concurrency = opt_int(spec, "part_concurrency")
        self._memo: Memo[S3Client] = Memo()
        #: keys per ListObjectsV2 page (S3's maximum; tests lower it to exercise paging)
        self.list_page_size = 1000

    # --- plumbing ----------------------------------------------------------------------

    async def _client(self) -> S3Client:
        client = self._memo.get()
        if client is not None:
            return client
        try:
            return self._memo.set(await CLIENTS.acquire(self.client_key, self))
        except Exception as exc:
            raise self._error(exc, "client") from exc

    def _object_name(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def _error(self, exc: BaseException, op: str) -> BackendError:
        return classify(exc, op, self.bucket, self.name)

    async def _bucket_missing(self, client: Any) -> bool:
        """Whether the bucket is absent; asked once per process (a HEAD 404 cannot tell)."""
        seen = (self.client_key.endpoint_url, self.bucket)
        if seen in _BUCKETS_SEEN:
            return False
        try:
            await client.head_bucket(Bucket=self.bucket)
        except bce.ClientError as exc:
            if is_not_found(exc) or error_code(exc) == "NoSuchBucket":
                return True
            if isinstance(self._error(exc, "head_bucket"), TransientBackendError):
                raise
            # 403 (no s3:ListBucket) and the like: cannot tell, assume it exists
        _BUCKETS_SEEN.add(seen)
        return False

    async def _route(self, client: S3Client) -> Route | None:
        """The direct path's route to this bucket, or None to use botocore."""
        if client.direct is None:
            return None
        try:
            return await client.direct.route(self.bucket)
        except Exception:
            return None  # botocore's own call reports the cause (e.g. no credentials)

    async def _direct(
        self, client: S3Client, method: str, name: str, operation: str, **kwargs: Any
    ) -> bytes | None:
        """The direct path's answer, or None when botocore must make this call."""
        route = await self._route(client)
        if route is None or client.direct is None:
            return None
        try:
            return await client.direct.request(method, route, name, operation, **kwargs)
        except Reroute:
            client.direct.disable(self.bucket)
            return None

    async def _fail(self, client: Any, exc: BaseException, op: str) -> BackendError:
        """Classify ``exc``; an access error on an unconfirmed bucket may be a missing one
        (SeaweedFS answers AccessDenied to a put into a missing bucket)."""
        error = self._error(exc, op)
        if isinstance(exc, bce.ClientError) and status_code(exc) == 403:
            with contextlib.suppress(Exception):
                if await self._bucket_missing(client):
                    return missing_bucket(self.bucket, self.name)
        return error

    # --- reads -------------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        found = await self._read(key, versioned=False)
        return None if found is None else found.data

    async def get_capped(self, key: str, max_bytes: int) -> bytes | None:
        """One ranged GET of the first ``max_bytes + 1`` bytes (no HEAD round trip): an
        oversized object is refused after moving one byte more than the cap."""
        if not max_bytes:
            return await self.get(key)
        found = await self._read(key, versioned=False, byte_range=f"bytes=0-{max_bytes}")
        if found is None:
            return None
        check_size(len(found.data), max_bytes)
        return found.data

    async def get_into(self, key: str, max_bytes: int, sink: Sink) -> bool:
        """The direct path's GET hands the body to ``sink`` as it arrives (a large entry
        streamed to its local file, docs/architecture.md, "Streamed entries"); where
        botocore makes the call, or with no cap, the body is handed whole."""
        client = await self._client()
        route = await self._route(client)
        if route is None or client.direct is None or not max_bytes:
            return await super().get_into(key, max_bytes, sink)
        name = self._object_name(key)
        try:
            await client.direct.get_into(
                route, name, sink, max_bytes, {"range": f"bytes=0-{max_bytes}"}
            )
            return True
        except Reroute:
            client.direct.disable(self.bucket)
            return await super().get_into(key, max_bytes, sink)
        except bce.ClientError as exc:
            if is_not_found(exc):
                return False
            if status_code(exc) == 416:  # an empty object: refused by the codec as corrupt
                await sink.begin(0)
                await sink.piece(b"")
                return True
            raise await self._fail(client.boto, exc, "get") from exc
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            # the transfer's own failures; what the sink raises is the sink's to tell
            raise await self._fail(client.boto, exc, "get") from exc

    async def _read(
        self, key: str, *, versioned: bool, byte_range: str | None = None
    ) -> Versioned | None:
        """The object (its first bytes with ``byte_range``), with its ETag as version when
        ``versioned`` (else version "")."""
        name = self._object_name(key)
        client = await self._client()
        headers: dict[str, str] | None = {} if versioned else None
        ranged: dict[str, Any] = {"Range": byte_range} if byte_range else {}
        try:
            extra = {"range": byte_range} if byte_range else None
            # a ranged read never reads more than the range, whatever the answer says
            most = int(byte_range.rpartition("-")[2]) + 1 if byte_range else 0
            data = await self._direct(
                client,
                "GET",
                name,
                "GetObject",
                extra=extra,
                response_headers=headers,
                max_bytes=most,
            )
            if data is not None:
                return Versioned(data, headers["etag"] if headers is not None else "")
            response = await client.boto.get_object(Bucket=self.bucket, Key=name, **ranged)
            body = response["Body"]
            try:
                # read() validates the length against Content-Length (IncompleteReadError)
                payload: bytes = await body.read()
            except BaseException:
                body.close()  # drop the half-read connection instead of pooling it
                raise
            return Versioned(payload, response["ETag"] if versioned else "")
        except bce.ClientError as exc:
            if is_not_found(exc):
                return None
            if byte_range and status_code(exc) == 416:
                return Versioned(b"", "")  # an empty object: refused by the codec as corrupt
            raise await self._fail(client.boto, exc, "get") from exc
        except Exception as exc:
            raise await self._fail(client.boto, exc, "get") from exc

    async def exists(self, key: str) -> bool:
        name = self._object_name(key)
        client = await self._client()
        return await self._head(client, name, "exists")

    async def _head(self, client: S3Client, name: str, op: str) -> bool:
        boto = client.boto
        try:
            if await self._direct(client, "HEAD", name, "HeadObject") is None:
                await boto.head_object(Bucket=self.bucket, Key=name)
            return True
        except bce.ClientError as exc:
            if not is_not_found(exc):
                raise await self._fail(boto, exc, op) from exc
        except Exception as exc:
            raise await self._fail(boto, exc, op) from exc
        try:
            missing = await self._bucket_missing(boto)
        except Exception as exc:
            raise await self._fail(boto, exc, op) from exc
        if missing:
            raise missing_bucket(self.bucket, self.name)
        return False

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        client = (await self._client()).boto
        cut = len(self.prefix)
        try:
            paginator = client.get_paginator("list_objects_v2")
            pages = paginator.paginate(
                Bucket=self.bucket,
                Prefix=self.prefix + prefix,
                PaginationConfig={"PageSize": self.list_page_size},
            )
            async for page in pages:
                for obj in page.get("Contents", ()):
                    yield ObjectInfo(
                        key=obj["Key"][cut:],
                        size=int(obj["Size"]),
                        mtime=obj["LastModified"].timestamp(),
                    )
        except Exception as exc:
            raise await self._fail(client, exc, "list") from exc

    # --- writes ------------------------------------------------------------------------

    async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
        name = self._object_name(key)
        client = await self._client()
        if len(data) > self.multipart_threshold:
            return await self._put_multipart(client, name, data, mode)
        # A body checksum makes the server refuse a body cut short by a broken connection:
        # SeaweedFS otherwise stored such a PUT as an empty object (found by bench/soak.py).
        # CRC32 is the checksum the AWS SDKs send by default, at 5x the speed of Content-MD5;
        # SeaweedFS checks it too (and ignores a wrong signed payload hash).
        crc = await crc32_checksum(data)
        try:
            headers = {"x-amz-checksum-crc32": crc}
            if mode is PutMode.CREATE:
                headers["If-None-Match"] = "*"
            sent = await self._direct(client, "PUT", name, "PutObject", body=data, extra=headers)
            if sent is None:
                extra = {"IfNoneMatch": "*"} if mode is PutMode.CREATE else {}
                await client.boto.put_object(
                    Bucket=self.bucket, Key=name, Body=data, ChecksumCRC32=crc, **extra
                )
        except Exception as exc:
            if mode is PutMode.CREATE and is_precondition_failure(exc):
                return False
            raise await self._fail(client.boto, exc, "put") from exc
        return True

    # --- records (backends/records_contract.py): If-Match on the ETag, If-None-Match: * ---------

    async def get_versioned(self, key: str, max_bytes: int = 0) -> Versioned | None:
        """With ``max_bytes``: one ranged GET of the first ``max_bytes + 1`` bytes, whose
        ETag is the whole object's: an oversized record is answered with its version only
        (docs/security.md, "Records")."""
        if not max_bytes:
            return await self._read(key, versioned=True)
        found = await self._read(key, versioned=True, byte_range=f"bytes=0-{max_bytes}")
        if found is None:
            return None
        if not found.version:  # 416: an empty object, whose ETag a HEAD tells
            return await self._empty_versioned(key)
        if len(found.data) > max_bytes:
            return Versioned(b"", found.version, too_large=True)
        return found

    async def _empty_versioned(self, key: str) -> Versioned | None:
        name = self._object_name(key)
        client = await self._client()
        headers: dict[str, str] = {}
        try:
            sent = await self._direct(client, "HEAD", name, "HeadObject", response_headers=headers)
            if sent is None:
                response = await client.boto.head_object(Bucket=self.bucket, Key=name)
                headers = {
                    "etag": response["ETag"],
                    "content-length": str(response["ContentLength"]),
                }
        except bce.ClientError as exc:
            if is_not_found(exc):
                return None
            raise await self._fail(client.boto, exc, "get") from exc
        except Exception as exc:
            raise await self._fail(client.boto, exc, "get") from exc
        if headers.get("content-length", "0") != "0":
            raise TransientBackendError("record changed while read", tier=self.name)
        return Versioned(b"", headers["etag"])

    async def put_if_version(self, key: str, data: bytes, version: str | None) -> bool:
        """One conditional PutObject (records are small: never multipart)."""
        name = self._object_name(key)
        client = await self._client()
        crc = await crc32_checksum(data)
        condition = {"If-None-Match": "*"} if version is None else {"If-Match": version}
        try:
            headers = {"x-amz-checksum-crc32": crc, **condition}
            sent = await self._direct(client, "PUT", name, "PutObject", body=data, extra=headers)
            if sent is None:
                extra = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
                await client.boto.put_object(
                    Bucket=self.bucket, Key=name, Body=data, ChecksumCRC32=crc, **extra
                )
        except Exception as exc:
            if is_precondition_failure(exc) or (version is not None and is_not_found(exc)):
                return False
            raise await self._fail(client.boto, exc, "put") from exc
        return True

    async def _put_multipart(self, s3: S3Client, name: str, data: bytes, mode: PutMode) -> bool:
        # Cheap early exit for a large CREATE that already lost; the conditional
        # CompleteMultipartUpload below is what makes the create atomic.
        if mode is PutMode.CREATE and await self._head(s3, name, "put"):
            return False
        client = s3.boto
        try:
            created = await client.create_multipart_upload(Bucket=self.bucket, Key=name)
        except Exception as exc:
            raise await self._fail(client, exc, "put") from exc
        upload_id: str = created["UploadId"]
        try:
            parts = await self._upload_parts(s3, name, upload_id, data)
            extra = {"IfNoneMatch": "*"} if mode is PutMode.CREATE else {}
            await client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=name,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
                **extra,
            )
        except BaseException as exc:
            abort = self._start_abort(client, name, upload_id)
            if not isinstance(exc, Exception):
                raise  # cancelled (tier deadline): the abort finishes in the background
            # Usually done in one round trip; when the network is failing, the put's error
            # is not held back: the abort keeps trying in the background.
            await asyncio.wait({abort}, timeout=ABORT_WAIT_S)
            if mode is PutMode.CREATE and is_precondition_failure(exc):
                return False
            raise await self._fail(client, exc, "put") from exc
        return True

    async def _upload_parts(
        self, s3: S3Client, name: str, upload_id: str, data: bytes
    ) -> builtins.list[dict[str, Any]]:
        size = max(self.part_size, -(-len(data) // MAX_PARTS))
        offsets = range(0, len(data), size)
        gate = asyncio.Semaphore(self.part_concurrency)
        view = memoryview(data)

        async def part(number: int, start: int) -> dict[str, Any]:
            async with gate:  # bounds both requests and the bytes sliced out of ``data``
                # The direct path sends a view of ``data`` (no copy of the part) and signs
                # it off the event loop; botocore hashed each part on the loop over http
                # (docs/architecture.md, "S3 requests").
                query = {"partNumber": str(number), "uploadId": upload_id}
                headers: dict[str, str] = {}
                body = view[start : start + size]
                sent = await self._direct(
                    s3, "PUT", name, "UploadPart", body=body, query=query, response_headers=headers
                )
                if sent is not None:
                    return {"PartNumber": number, "ETag": headers["etag"]}
                response = await s3.boto.upload_part(
                    Bucket=self.bucket,
                    Key=name,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=data[start : start + size],
                )
            return {"PartNumber": number, "ETag": response["ETag"]}

        tasks = [asyncio.ensure_future(part(i + 1, off)) for i, off in enumerate(offsets)]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()  # no-op for finished ones; stops the rest after a failure
            await asyncio.gather(*tasks, return_exceptions=True)

    def _start_abort(self, client: Any, name: str, upload_id: str) -> asyncio.Task[None]:
        """Abort the upload in a task of its own, retried a few times over
        :data:`ABORT_RETRY_DELAYS_S`, so that neither a cancelled put (the tier deadline)
        nor a failing network leaves parts behind; the bucket's lifecycle rule
        (AbortIncompleteMultipartUpload, terraform/modules/s3-cache) is the last resort."""

        async def abort() -> None:
            for delay in ABORT_RETRY_DELAYS_S:
                await asyncio.sleep(delay)
                try:
                    await client.abort_multipart_upload(
                        Bucket=self.bucket, Key=name, UploadId=upload_id
                    )
                    return
                except bce.ClientError as exc:
                    if error_code(exc) == "NoSuchUpload" or status_code(exc) == 404:
                        return  # already gone
                    if not isinstance(self._error(exc, "abort"), TransientBackendError):
                        return
                except Exception:
                    continue

        task = asyncio.ensure_future(abort())
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)
        return task

    async def delete(self, key: str) -> bool:
        name = self._object_name(key)
        client = await self._client()
        existed = await self._head(client, name, "delete")
        if existed:
            try:
                await client.boto.delete_object(Bucket=self.bucket, Key=name)
            except Exception as exc:
                raise await self._fail(client.boto, exc, "delete") from exc
        return existed

    async def close(self) -> None:
        self._memo.clear()
        await CLIENTS.release(self.client_key, self)


#: Bodies at least this big are checksummed in a worker thread (zlib releases the GIL);
#: below it the thread hop costs the event loop more than the checksum (4 GB/s).
CHECKSUM_OFFLOAD_BYTES = 1 << 20


async def crc32_checksum(data: bytes) -> str:
    """The ``x-amz-checksum-crc32`` header of ``data``."""
    if len(data) >= CHECKSUM_OFFLOAD_BYTES:
        crc = await asyncio.to_thread(zlib.crc32, data)
    else:
        crc = zlib.crc32(data)
    return base64.b64encode(crc.to_bytes(4, "big")).decode()
