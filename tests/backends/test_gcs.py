"""gs:// backend against fake-gcs-server, directly and through a fault proxy. The shared
contract and the fault contract (refused, black-holed and reset connections, client sharing,
paged listing, a missing bucket, a 503) run in tests/contract; these tests cover what is
GCS's own: the thread pool, resumable uploads of large entries, conditional creates, and
that every failure is classified and actionable (google's own retries are off)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.auth import exceptions as gauth

from objcache.backends.gcs.errors import classify
from objcache.backends.gcs.store import GCSBackend
from objcache.config.urls import parse_tier_url
from objcache.errors import PermanentBackendError, TransientBackendError
from tests.support.cloud import gcs_url
from tests.support.proxy import FaultProxy
from tests.support.servers import FakeGCS
from tests.support.waiting import until

pytestmark = pytest.mark.servers

MiB = 1 << 20
MakeProxy = Callable[[str, int], FaultProxy]


def make(url: str) -> GCSBackend:
    return GCSBackend(parse_tier_url(url))


@pytest.fixture
def gcs_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def gcs_proxy(fake_gcs: FakeGCS, fault_proxy: MakeProxy) -> FaultProxy:
    return fault_proxy(fake_gcs.host, fake_gcs.port)


@pytest.fixture
async def gcs_via_proxy(
    fake_gcs: FakeGCS, gcs_proxy: FaultProxy, gcs_prefix: str
) -> AsyncIterator[Callable[..., GCSBackend]]:
    made: list[GCSBackend] = []

    def factory(**options: Any) -> GCSBackend:
        backend = make(gcs_url(fake_gcs, gcs_prefix, endpoint=gcs_proxy.url(), **options))
        made.append(backend)
        return backend

    yield factory
    gcs_proxy.passthrough()
    gcs_proxy.bandwidth_bps = 0
    for backend in made:
        await backend.close()


# --- client sharing ------------------------------------------------------------------


async def test_a_miss_costs_one_request(
    gcs_proxy: FaultProxy, gcs_via_proxy: Callable[..., GCSBackend]
) -> None:
    """No hidden traffic: no retries, no background bucket-metadata lookups.

    google-cloud-storage makes those lookups in a thread of its own: a thread other than
    the backend's pool that is alive after the calls is one (one that ended has had its
    request counted)."""
    threads = set(threading.enumerate())
    backend = gcs_via_proxy()
    assert await backend.get("absent") is None  # the first 404 also checks the bucket
    gcs_proxy.reset_counters()
    assert await backend.get("absent") is None
    assert await backend.exists("absent") is False
    started = {t for t in set(threading.enumerate()) - threads if not t.name.startswith("gcs_")}
    assert not started, f"background threads: {started}"
    assert len(gcs_proxy.http_requests) == 2, gcs_proxy.http_requests


async def test_storage_emulator_host_is_honoured(
    fake_gcs: FakeGCS, gcs_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"{fake_gcs.host}:{fake_gcs.port}")
    url = gcs_url(fake_gcs, gcs_prefix).split("?", 1)[0]  # no endpoint option
    backend = make(url)
    assert backend.client_key.endpoint == fake_gcs.endpoint
    assert await backend.put("k", b"v") is True
    assert await backend.get("k") == b"v"


# --- large entries -------------------------------------------------------------------


async def test_large_entry_goes_resumable_and_round_trips(
    gcs_proxy: FaultProxy, gcs_via_proxy: Callable[..., GCSBackend]
) -> None:
    backend = gcs_via_proxy()
    data = os.urandom(20 * MiB)  # > 8 MiB: resumable
    assert await backend.put("big", data) is True
    assert gcs_proxy.count_requests("POST", "/upload/storage/v1/b/") == 1
    assert any("uploadType=resumable" in r.path for r in gcs_proxy.http_requests)
    got = await backend.get("big")
    assert got is not None and hashlib.sha256(got).digest() == hashlib.sha256(data).digest()


async def test_small_entry_is_one_multipart_request(
    gcs_proxy: FaultProxy, gcs_via_proxy: Callable[..., GCSBackend]
) -> None:
    backend = gcs_via_proxy()
    await backend.put("small", b"x" * 1000)
    uploads = [r for r in gcs_proxy.http_requests if r.path.startswith("/upload/")]
    assert len(uploads) == 1 and "uploadType=multipart" in uploads[0].path
    assert "ifGenerationMatch=0" in uploads[0].path


@pytest.mark.xfail(
    reason="fake-gcs-server 1.54 checks ifGenerationMatch of a resumable upload when the "
    "session starts, not when it is finalized (fsouza/fake-gcs-server#1967, fixed by #2260); "
    "GCS itself is atomic",
    strict=False,
)
async def test_concurrent_large_creates_have_one_winner(
    gcs_via_proxy: Callable[..., GCSBackend],
) -> None:
    backend = gcs_via_proxy()
    values = [bytes([i]) * (10 * MiB) for i in range(3)]
    results = await asyncio.gather(*(backend.put("race", v) for v in values))
    assert sorted(results) == [False, False, True]
    assert await backend.get("race") == values[results.index(True)]


@pytest.mark.parametrize("size", [2 * MiB, 12 * MiB], ids=["multipart", "resumable"])
async def test_reset_mid_upload_leaves_nothing(
    gcs_proxy: FaultProxy, gcs_via_proxy: Callable[..., GCSBackend], size: int
) -> None:
    backend = gcs_via_proxy()
    gcs_proxy.bandwidth_bps = 8 * MiB
    put = asyncio.ensure_future(backend.put("partial", os.urandom(size)))
    await until(lambda: gcs_proxy.bytes_to_server > size // 4, what="a quarter uploaded")
    gcs_proxy.reset_after(0)  # the answer to the upload is cut by a TCP RST
    with pytest.raises(TransientBackendError):
        await asyncio.wait_for(put, 60)
    gcs_proxy.passthrough()
    gcs_proxy.bandwidth_bps = 0
    # The server may have received every byte before the reset: then the object is
    # whole. What must never exist is a part of it.
    got = await backend.get("partial")
    assert got is None or len(got) == size
    listed = [i async for i in backend.list()]
    assert all(i.size == size for i in listed)


# --- errors --------------------------------------------------------------------------


async def test_no_application_default_credentials_is_permanent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    backend = make("gs://some-bucket/p")  # no emulator: ADC only, which fails offline
    with pytest.raises(PermanentBackendError, match="Application Default Credentials"):
        await asyncio.wait_for(backend.get("k"), 60)


# --- classification of conditions the emulator cannot produce -------------------------


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (gexc.TooManyRequests("slow down"), TransientBackendError),
        (gexc.InternalServerError("oops"), TransientBackendError),
        (gexc.ServiceUnavailable("busy"), TransientBackendError),
        (gexc.GatewayTimeout("late"), TransientBackendError),
        (gexc.Forbidden("no"), PermanentBackendError),
        (gexc.Unauthorized("who"), PermanentBackendError),
        (gexc.BadRequest("bad"), PermanentBackendError),
        (gauth.RefreshError("metadata server hiccup", retryable=True), TransientBackendError),
        (gauth.RefreshError("invalid_grant"), PermanentBackendError),
        (gauth.TransportError("dns"), TransientBackendError),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else v.__name__,
)
def test_classification(error: Exception, kind: type[Exception]) -> None:
    assert type(classify(error, "get", "b", "gs://b")) is kind


def test_permission_denied_message_names_the_roles() -> None:
    message = str(classify(gexc.Forbidden("denied"), "put", "b", "gs://b/p"))
    assert "roles/storage.objectUser" in message and message.startswith("gs://b/p")
