"""Tier URLs for the cloud test servers: shared by the backend tests and the contract list.

Credentials never go into a tier URL. S3 tests use the standard chain like production:
each server's keys become a named profile in a process-wide shared-credentials file
(``AWS_SHARED_CREDENTIALS_FILE``), and the URL says ``profile=<name>``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from tests.support.servers import FakeGCS, S3Server

_lock = threading.Lock()
_profiles: dict[str, tuple[str, str]] = {}
_buckets: dict[int, str] = {}
_folder: list[Path] = []  # made at the first profile, removed as the process exits


def _credentials() -> Path:
    if not _folder:
        _folder.append(Path(tempfile.mkdtemp(prefix="objcache-aws-")))
        atexit.register(shutil.rmtree, _folder[0], True)
    return _folder[0] / "credentials"


def aws_profile(name: str, access_key: str, secret_key: str) -> str:
    """Register profile ``name`` in the test process's AWS credentials file."""
    with _lock:
        credentials = _credentials()
        if _profiles.get(name) != (access_key, secret_key):
            _profiles[name] = (access_key, secret_key)
            credentials.write_text(
                "".join(
                    f"[{p}]\naws_access_key_id = {a}\naws_secret_access_key = {s}\n\n"
                    for p, (a, s) in _profiles.items()
                )
            )
        os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(credentials)
        os.environ.setdefault("AWS_CONFIG_FILE", str(credentials.with_name("config")))
        os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # never probe IMDS from tests
    return name


def server_profile(server: S3Server) -> str:
    return aws_profile(f"objcache-{server.name}", server.access_key, server.secret_key)


def session_bucket(server: S3Server | FakeGCS, name: str = "objcache-tests") -> str:
    """One bucket per server for the whole session (tests use unique prefixes in it)."""
    with _lock:
        if id(server) not in _buckets:
            server.create_bucket(name)
            _buckets[id(server)] = name
        return _buckets[id(server)]


def s3_url(
    server: S3Server,
    prefix: str,
    *,
    bucket: str | None = None,
    endpoint_url: str | None = None,
    profile: str | None = None,
    **options: Any,
) -> str:
    """``s3://bucket/prefix?...`` for ``server`` (or a proxy in front of it).

    ``profile=None`` uses the server's own profile; ``profile=""`` names none (the default
    credential chain)."""
    query = {
        "endpoint_url": endpoint_url or server.endpoint_url,
        "region": server.region,
        "addressing_style": "path",
        "profile": server_profile(server) if profile is None else profile,
        **{k: str(v) for k, v in options.items()},
    }
    query = {k: v for k, v in query.items() if v}
    return f"s3://{bucket or session_bucket(server)}/{prefix}?{urlencode(query, safe=':/')}"


def gcs_url(
    server: FakeGCS,
    prefix: str,
    *,
    bucket: str | None = None,
    endpoint: str | None = None,
    **options: Any,
) -> str:
    """``gs://bucket/prefix?endpoint=...`` for ``server`` (or a proxy in front of it)."""
    query = {"endpoint": endpoint or server.endpoint, **{k: str(v) for k, v in options.items()}}
    return f"gs://{bucket or session_bucket(server)}/{prefix}?{urlencode(query, safe=':/')}"
