"""Mega-Cache bundles: ``torch.compiler.save_cache_artifacts()`` as a named, checked object.

torch's Mega-Cache bytes (``torch/compiler/_cache.py``) carry no torch/triton/device header
and "no FB/FC guarantees": a mismatched torch loads "successfully" and then never hits, and a
garbage artifact makes ``load_cache_artifacts`` raise. On CPU they do not carry the compiled
C++ kernels either. A bundle fixes all three:

``b"OCMB" | u8 format | u32 header length | header (JSON) | torch bytes | kernel bytes...``

The header holds the environment fingerprint (torch, Triton, CUDA/HIP, GPU, CPU ISA,
Python, architecture), the artifact counts, and the length and BLAKE2b digest of the torch
bytes and of every kernel artifact (:mod:`objcache.integrations.torch.kernels`, content
keys). The bundle is stored under kind ``mega`` in the environment's namespace (zstd and the
entry digest come from the entry codec) and written with *overwrite* semantics, so saving a
name again replaces it. A small pointer ``v1/bundles/mega/<shard>/<name>`` records which
environment saved the name last, so that loading in another environment can say exactly what
differs instead of "not found".

Loading checks, in order, before torch sees a byte: the entry digest (codec), the bundle
magic and lengths, every digest, the fingerprint (refused with one line listing the
differing fields), and that torch can parse its part. Only then are the artifacts written
into torch's local caches and the kernels into objcache's local tier.

Every function returns a one-line summary for the CLI (``objcache mega save|load|ls``) and
raises :class:`BundleError` with a one-line message otherwise.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from objcache.errors import ObjcacheError

MAGIC = b"OCMB"
FORMAT = 1
_HEAD = struct.Struct(">4sBI")
KIND = "mega"
#: The pseudo-environment holding one pointer per bundle name (last saver's environment).
POINTER_ENV = "bundles"
#: Largest header accepted when reading.
MAX_HEADER = 64 << 20


class BundleError(ObjcacheError):
    """A bundle that cannot be saved or loaded; the message is one line."""


@dataclass
class Bundle:
    name: str
    fingerprint: dict[str, str]
    torch_bytes: bytes
    kernels: list[tuple[str, bytes]] = field(default_factory=list)
    artifacts: dict[str, int] = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    def to_bytes(self) -> bytes:
        header = {
            "format": FORMAT,
            "name": self.name,
            "created": self.created,
            "fingerprint": self.fingerprint,
            "artifacts": self.artifacts,
            "torch": {"bytes": len(self.torch_bytes), "digest": _digest(self.torch_bytes)},
            "kernels": [
                {"key": key, "bytes": len(data), "digest": _digest(data)}
                for key, data in self.kernels
            ],
        }
        head = json.dumps(header, sort_keys=True).encode()
        parts = [_HEAD.pack(MAGIC, FORMAT, len(head)), head, self.torch_bytes]
        parts += [data for _, data in self.kernels]
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> Bundle:
        """Parse and verify every length and digest; :class:`BundleError` otherwise."""
        view = memoryview(data)
        if len(view) < _HEAD.size:
            raise BundleError("bundle is truncated (no header)")
        magic, fmt, head_len = _HEAD.unpack_from(view)
        if magic != MAGIC:
            raise BundleError("not an objcache bundle (bad magic)")
        if fmt != FORMAT:
            raise BundleError(
                f"bundle format {fmt} is not supported (this objcache reads {FORMAT})"
            )
        if head_len > MAX_HEADER or _HEAD.size + head_len > len(view):
            raise BundleError("bundle is truncated (header)")
        try:
            header = json.loads(bytes(view[_HEAD.size : _HEAD.size + head_len]))
            pos = _HEAD.size + head_len
            torch_len = int(header["torch"]["bytes"])
            torch_bytes = _take(view, pos, torch_len, header["torch"]["digest"], "torch artifacts")
            pos += torch_len
            kernels = []
            for item in header["kernels"]:
                n = int(item["bytes"])
                kernels.append((str(item["key"]), _take(view, pos, n, item["digest"], item["key"])))
                pos += n
            if pos != len(view):
                raise BundleError(f"bundle has {len(view) - pos} unexpected trailing bytes")
            return cls(
                name=str(header["name"]),
                fingerprint={str(k): str(v) for k, v in header["fingerprint"].items()},
                torch_bytes=torch_bytes,
                kernels=kernels,
                artifacts={str(k): int(v) for k, v in header.get("artifacts", {}).items()},
                created=float(header.get("created", 0.0)),
            )
        except BundleError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BundleError(f"bundle header is malformed: {exc!r}") from None


def _digest(data: bytes | memoryview) -> str:
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def _take(view: memoryview, pos: int, n: int, digest: str, what: str) -> bytes:
    if n < 0 or pos + n > len(view):
        raise BundleError(f"bundle is truncated ({what})")
    part = view[pos : pos + n]
    if _digest(part) != digest:
        raise BundleError(f"bundle is corrupt: digest mismatch in {what}")
    return bytes(part)


# --- storage helpers -------------------------------------------------------------------------


def _client() -> Any:
    from objcache.client import get_client

    return get_client()


def _call(client: Any, factory: Any, timeout: float | None = None) -> Any:
    t = client.config.flush_timeout_s if timeout is None else timeout
    return client.bridge.call(factory, t + 5)


def _pointer_key(client: Any, name: str) -> str:
    from objcache.layout import Namespace

    return str(Namespace(POINTER_ENV).object_key(KIND, name))


async def _write_overwrite(cache: Any, okey: str, payload: bytes) -> tuple[int, int]:
    """Encode and write ``okey`` everywhere with OVERWRITE; (remote tiers written, asked)."""
    from objcache.backends.base import PutMode

    entry = await asyncio.to_thread(cache.codec.encode, payload, okey)
    if cache.local is not None:
        await cache.local.put(okey, entry, PutMode.OVERWRITE)
    if cache.read_only:
        return 0, 0
    targets = [t for t in cache.remotes if t.writable]
    done = await asyncio.gather(*(t.put(okey, entry, PutMode.OVERWRITE) for t in targets))
    return sum(1 for ok in done if ok), len(targets)


async def _put_local(cache: Any, kind: str, key: str, payload: bytes) -> None:
    from objcache.backends.base import PutMode

    if cache.local is None:
        return
    okey = cache.namespace.object_key(kind, key)
    entry = await asyncio.to_thread(cache.codec.encode, payload, okey)
    await cache.local.put(okey, entry, PutMode.OVERWRITE)


def _check_name(name: str) -> str:
    name = name.strip()
    if not name or "/" in name or len(name) > 200:
        raise BundleError(f"bad bundle name {name!r}: 1-200 characters, no '/'")
    return name


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


# --- save / load / ls ------------------------------------------------------------------------


def collect(name: str) -> Bundle:
    """The bundle of this process's Mega-Cache artifacts and kernels (nothing stored)."""
    import torch

    from objcache.fingerprint import fingerprint
    from objcache.integrations.torch import kernels

    result = torch.compiler.save_cache_artifacts()
    torch_bytes, artifacts = b"", {}
    if result is not None:
        torch_bytes, info = result
        artifacts = {k: len(v) for k, v in info.artifacts.items()}
    kernel_items = list(kernels.used_artifacts())
    if not torch_bytes and not kernel_items:
        raise BundleError("nothing to save: no torch.compile artifacts in this process yet")
    return Bundle(_check_name(name), dict(fingerprint()), torch_bytes, kernel_items, artifacts)


def save(name: str) -> str:
    """Store this process's Mega-Cache artifacts (and CPU kernels) as bundle ``name``."""
    bundle = collect(name)
    payload = bundle.to_bytes()
    client = _client()
    okey = client.cache.namespace.object_key(KIND, bundle.name)
    pointer = json.dumps(
        {
            "name": bundle.name,
            "env": client.cache.namespace.env,
            "fingerprint": bundle.fingerprint,
            "bytes": len(payload),
            "created": bundle.created,
        },
        sort_keys=True,
    ).encode()

    async def write() -> tuple[int, int]:
        written = await _write_overwrite(client.cache, okey, payload)
        await _write_overwrite(client.cache, _pointer_key(client, bundle.name), pointer)
        return written

    try:
        written, asked = _call(client, write)
    except Exception as exc:
        raise BundleError(f"could not store bundle {bundle.name!r}: {exc}") from None
    counts = ", ".join(f"{n} {k}" for k, n in sorted(bundle.artifacts.items())) or "no torch"
    where = f"{written}/{asked} remote tiers" if asked else "the local tier only"
    note = "" if written == asked else " (some remote tiers failed: see objcache stats)"
    return (
        f"saved bundle {bundle.name!r}: {counts} artifacts, {len(bundle.kernels)} kernels, "
        f"{_size(len(payload))} to {where}{note}"
    )


def fetch(name: str) -> Bundle:
    """The verified bundle ``name`` of this environment; :class:`BundleError` otherwise."""
    from objcache.fingerprint import differences, fingerprint

    name = _check_name(name)
    client = _client()
    payload = client.get(KIND, name)
    mine = dict(fingerprint())
    if payload is None:
        raw = _call(client, lambda: client.cache.get_object(_pointer_key(client, name)))[0]
        pointer: dict[str, Any] = {}
        if raw is not None:
            try:
                pointer = json.loads(raw)
            except ValueError:
                pointer = {}
        theirs = pointer.get("fingerprint")
        if isinstance(theirs, dict) and pointer.get("env") != client.cache.namespace.env:
            diff = "; ".join(differences(mine, {str(k): str(v) for k, v in theirs.items()}))
            raise BundleError(f"bundle {name!r} was saved for another environment: {diff}")
        if pointer:
            raise BundleError(
                f"bundle {name!r} exists for this environment but could not be read "
                "(corrupt, refused or unreachable: see 'objcache stats')"
            )
        raise BundleError(f"no bundle named {name!r} for this environment")
    bundle = Bundle.from_bytes(payload)
    diff_lines = differences(mine, bundle.fingerprint)
    if diff_lines:
        raise BundleError(
            f"bundle {name!r} was saved for another environment: {'; '.join(diff_lines)}"
        )
    return bundle


def load(name: str) -> str:
    """Load bundle ``name`` into torch's local caches and objcache's local tier."""
    bundle = fetch(name)
    client = _client()
    populated = 0
    if bundle.torch_bytes:
        from torch.compiler._cache import CacheArtifactManager

        artifacts = CacheArtifactManager.deserialize(bundle.torch_bytes)
        if artifacts is None:
            raise BundleError(f"bundle {name!r}: torch cannot parse its Mega-Cache artifacts")
        try:
            info = CacheArtifactManager.populate_caches(artifacts)
        except Exception as exc:
            raise BundleError(f"bundle {name!r}: torch refused an artifact: {exc!r}") from None
        populated = sum(len(v) for v in info.artifacts.values())
    if bundle.kernels:
        from objcache.integrations.torch import kernels

        async def put_all() -> None:
            for key, data in bundle.kernels:
                await _put_local(client.cache, kernels.KIND, key, data)

        _call(client, put_all)
        kernels.install()
    kernel_bytes = sum(len(d) for _, d in bundle.kernels)
    return (
        f"loaded bundle {name!r}: {populated} torch artifacts, {len(bundle.kernels)} kernels "
        f"({_size(len(bundle.torch_bytes) + kernel_bytes)})"
    )


@dataclass(frozen=True)
class BundleInfo:
    name: str
    size: int
    mtime: float
    tier: str


def list_infos() -> list[BundleInfo]:
    """Bundles of this environment on every tier (largest entry per name)."""
    client = _client()
    cache = client.cache
    prefix = cache.namespace.kind_prefix(KIND)

    async def scan() -> list[BundleInfo]:
        from objcache.layout import parse_object_key

        found: dict[str, BundleInfo] = {}

        async def one(tier: Any) -> None:
            try:
                async for info in tier.backend.list(prefix):
                    parsed = parse_object_key(info.key)
                    if parsed is None:
                        continue
                    name = parsed[2]
                    if name not in found:
                        found[name] = BundleInfo(name, info.size, info.mtime, tier.name)
            except Exception:
                return

        for tier in cache.tiers:
            await one(tier)
        return sorted(found.values(), key=lambda b: b.name)

    result: list[BundleInfo] = _call(client, scan)
    return result


def list_bundles() -> list[str]:
    """One line per bundle of this environment."""
    lines = []
    for b in list_infos():
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(b.mtime))
        lines.append(f"{b.name}  {_size(b.size)}  {when}  {b.tier}")
    return lines or ["no bundles for this environment"]
