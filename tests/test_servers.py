"""Each real server starts, round-trips data with its real client, and shows the
create-if-absent behaviour (HTTP 412 / SET NX) that the backends rely on."""

from __future__ import annotations

import io
import os
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import boto3  # type: ignore[import-untyped,unused-ignore]
import pytest
import redis
from botocore.exceptions import ClientError
from google.api_core import exceptions as gcs_errors

from tests.support.proxy import FaultProxy
from tests.support.servers import (
    FakeGCS,
    MotoS3,
    RedisServer,
    S3Server,
    SeaweedS3,
    ServerStartError,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.servers

MakeBucket = Callable[..., str]


def listening_addresses(pid: int) -> set[str]:
    """Local ``ip:port`` of every TCP socket that process ``pid`` listens on (Linux)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                hex_ip, hex_port = fields[1].split(":")
                if len(hex_ip) == 8:
                    ip = ".".join(str(b) for b in reversed(bytes.fromhex(hex_ip)))
                else:
                    ip = f"ipv6:{hex_ip}"
                found.add(f"{ip}:{int(hex_port, 16)}")
    return found


# -- Redis ---------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_redis_roundtrip_and_set_nx(redis_server: RedisServer, transport: str) -> None:
    url = redis_server.url if transport == "tcp" else redis_server.unix_url
    client = redis.Redis.from_url(url)
    key = f"k-{uuid.uuid4().hex}"
    try:
        assert client.set(key, b"first")
        assert client.get(key) == b"first"
        # "create" mode: SET NX on an existing key is refused and changes nothing.
        assert client.set(key, b"second", nx=True) is None
        assert client.get(key) == b"first"
    finally:
        client.close()


# -- S3: SeaweedFS and moto ----------------------------------------------------


def test_s3_roundtrip(s3_server: S3Server, make_bucket: MakeBucket) -> None:
    bucket = make_bucket(s3_server)
    client = s3_server.client()
    body = os.urandom(300_000)
    client.put_object(Bucket=bucket, Key="a/b", Body=body)
    assert client.get_object(Bucket=bucket, Key="a/b")["Body"].read() == body
    listed = client.list_objects_v2(Bucket=bucket, Prefix="a/")
    assert [o["Key"] for o in listed["Contents"]] == ["a/b"]
    with pytest.raises(ClientError) as missing:
        client.get_object(Bucket=bucket, Key="nope")
    assert missing.value.response["Error"]["Code"] == "NoSuchKey"


def test_s3_put_if_none_match_on_existing_key_is_412(
    s3_server: S3Server, make_bucket: MakeBucket
) -> None:
    bucket = make_bucket(s3_server)
    client = s3_server.client()
    created = client.put_object(Bucket=bucket, Key="k", Body=b"first", IfNoneMatch="*")
    assert created["ResponseMetadata"]["HTTPStatusCode"] == 200
    with pytest.raises(ClientError) as refused:
        client.put_object(Bucket=bucket, Key="k", Body=b"second", IfNoneMatch="*")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"first"


def test_s3_multipart_complete_if_none_match_on_existing_key_is_412(
    s3_server: S3Server, make_bucket: MakeBucket
) -> None:
    bucket = make_bucket(s3_server)
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="k", Body=b"first")
    upload = client.create_multipart_upload(Bucket=bucket, Key="k")
    part = client.upload_part(
        Bucket=bucket, Key="k", UploadId=upload["UploadId"], PartNumber=1, Body=b"second"
    )
    with pytest.raises(ClientError) as refused:
        client.complete_multipart_upload(
            Bucket=bucket,
            Key="k",
            UploadId=upload["UploadId"],
            MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]},
            IfNoneMatch="*",
        )
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"first"


def test_seaweed_verifies_sigv4(seaweed_s3: SeaweedS3, make_bucket: MakeBucket) -> None:
    bucket = make_bucket(seaweed_s3)
    seaweed_s3.client().put_object(Bucket=bucket, Key="k", Body=b"x")
    forged = boto3.client(
        "s3", **{**seaweed_s3.client_kwargs(), "aws_secret_access_key": "not-the-secret"}
    )
    with pytest.raises(ClientError) as denied:
        forged.get_object(Bucket=bucket, Key="k")
    assert denied.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_moto_accepts_any_credentials(moto_s3: MotoS3, make_bucket: MakeBucket) -> None:
    bucket = make_bucket(moto_s3)
    moto_s3.client().put_object(Bucket=bucket, Key="k", Body=b"x")
    forged = boto3.client(
        "s3",
        **{**moto_s3.client_kwargs(), "aws_access_key_id": "someone", "aws_secret_access_key": "x"},
    )
    assert forged.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"


async def test_seaweed_aioboto3_roundtrip(seaweed_s3: SeaweedS3, make_bucket: MakeBucket) -> None:
    import aioboto3

    bucket = make_bucket(seaweed_s3)
    session = aioboto3.Session()
    async with session.client("s3", **seaweed_s3.client_kwargs()) as client:
        await client.put_object(Bucket=bucket, Key="k", Body=b"async")
        response = await client.get_object(Bucket=bucket, Key="k")
        assert await response["Body"].read() == b"async"
        with pytest.raises(ClientError) as refused:
            await client.put_object(Bucket=bucket, Key="k", Body=b"again", IfNoneMatch="*")
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412


# -- GCS: fake-gcs-server --------------------------------------------------------


def test_gcs_roundtrip(fake_gcs: FakeGCS, make_bucket: MakeBucket) -> None:
    bucket = fake_gcs.client().bucket(make_bucket(fake_gcs))
    body = os.urandom(300_000)
    bucket.blob("a/b").upload_from_string(body)
    assert bucket.blob("a/b").download_as_bytes() == body
    assert [b.name for b in fake_gcs.client().list_blobs(bucket.name, prefix="a/")] == ["a/b"]
    assert bucket.get_blob("nope") is None


@pytest.mark.parametrize(
    ("upload", "refused"), [("multipart", True), ("resumable", False), ("media", False)]
)
def test_gcs_if_generation_match_0_on_existing_object(
    fake_gcs: FakeGCS,
    make_bucket: MakeBucket,
    fault_proxy: Callable[[str, int], FaultProxy],
    upload: str,
    refused: bool,
) -> None:
    """Real GCS answers 412 to every upload type here; fake-gcs-server only to
    multipart uploads, and silently overwrites on resumable and media uploads.
    google-cloud-storage uploads <= 8 MiB of known size as multipart, larger or
    unknown-size ones as resumable (``chunk_size`` does not change that)."""
    name = make_bucket(fake_gcs)
    proxy = fault_proxy(fake_gcs.host, fake_gcs.port)  # to see which upload type was used
    bucket = fake_gcs.client(endpoint=proxy.url()).bucket(name)
    bucket.blob("k").upload_from_string(b"first")
    proxy.reset_counters()

    def upload_second() -> None:
        if upload == "multipart":
            bucket.blob("k").upload_from_string(b"second", if_generation_match=0)
        elif upload == "resumable":  # unknown size: resumable
            bucket.blob("k").upload_from_file(io.BytesIO(b"second"), if_generation_match=0)
        else:
            url = f"{proxy.url()}/upload/storage/v1/b/{name}/o"
            request = urllib.request.Request(
                f"{url}?uploadType=media&name=k&ifGenerationMatch=0", b"second", method="POST"
            )
            with urllib.request.urlopen(request) as response:
                assert response.status == 200

    if refused:
        with pytest.raises(gcs_errors.PreconditionFailed):
            upload_second()
    else:
        upload_second()
    upload_path = f"/upload/storage/v1/b/{name}/o?uploadType={upload}"
    assert proxy.count_requests("POST", upload_path) == 1
    assert bucket.blob("k").download_as_bytes() == (b"first" if refused else b"second")


# -- lifecycle -------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["redis_server", "seaweed_s3", "fake_gcs"])
def test_process_servers_listen_on_loopback_only(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    server = request.getfixturevalue(fixture)
    addresses = listening_addresses(server.pid)
    assert addresses, "no listening sockets found"
    assert all(a.startswith("127.0.0.1:") for a in addresses), addresses


def test_moto_listens_on_loopback(moto_s3: MotoS3) -> None:
    assert moto_s3.endpoint_url.startswith("http://127.0.0.1:")
    assert moto_s3._server.server_address[0] == "127.0.0.1"


def test_stop_leaves_no_process_and_no_files() -> None:
    with RedisServer() as server:
        pid, tmpdir = server.pid, server.tmpdir
        assert pid is not None and tmpdir.is_dir()
        os.kill(pid, 0)  # alive

    def group_gone() -> bool:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(group_gone, what=f"process group {pid} gone after stop()")
    assert not tmpdir.exists()
    assert not server.running


def test_failed_start_reports_reason_and_log_tail() -> None:
    server = RedisServer(extra_args=("--no-such-directive", "1"))
    with pytest.raises(ServerStartError) as failed:
        server.start()
    message = str(failed.value)
    assert "exited with code" in message
    assert "no-such-directive" in message  # from redis-server's own log
    assert not server.running


def test_missing_binary_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServerStartError, match=r"apt-get install -y redis-server"):
        RedisServer().start()


def test_the_test_harness_is_not_shipped() -> None:
    """Users install objcache, not 1,300 lines of test servers: the harness lives in tests/.
    ``objcache.testing`` holds only what third parties import: the backend contract."""
    import importlib.util
    import re

    testing = importlib.util.find_spec("objcache.testing")
    assert testing is not None and testing.submodule_search_locations
    shipped = sorted(p.stem for p in Path(testing.submodule_search_locations[0]).glob("*.py"))
    assert shipped == ["__init__", "backend_contract"], shipped
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    block = re.search(r"^packages = \[(.*?)\]", pyproject, re.S | re.M)
    assert block, "pyproject.toml lists its packages explicitly"
    packages = re.findall(r'"([^"]+)"', block.group(1))
    assert "objcache" in packages
    assert all(p == "objcache" or p.startswith("objcache.") for p in packages), packages
    assert not [p for p in packages if "support" in p or "fixtures" in p]
