"""Mega-Cache bundles: ``torch.compiler.save_cache_artifacts()`` as a named, checked object.

torch's Mega-Cache bytes (``torch/compiler/_cache.py``) carry no torch/triton/device header
and "no FB/FC guarantees": a mismatched torch loads "successfully" and then never hits, and a
garbage artifact makes ``load_cache_artifacts`` raise. On CPU they do not carry the compiled
C++ kernels either. A bundle fixes all three:

``b"OCMB" | u8 format | u32 header length | header (JSON) | torch bytes | kernel bytes...``

The header holds the environment fingerprint (torch, Triton, CUDA/HIP, GPU, CPU ISA,
Python, architecture), the artifact counts, and the length and BLAKE2b digest of the torch
bytes and of every kernel artifact (:mod:`objcache.integrations.torch.kernels.kernels`, content
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

import contextlib
import dataclasses
import hashlib
import json
import struct
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from objcache.errors import ObjcacheError
from objcache.integrations import cache_client

if TYPE_CHECKING:
    from objcache.client import Client
    from objcache.core.writes import Written

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
    #: Kernels the saved graphs load that could not be found when saving.
    missing_kernels: int = 0
    #: Kernel parts a load skipped, one short reason each (filled by :meth:`from_bytes`).
    skipped: list[str] = field(default_factory=list)

    def contents(self) -> dict[str, Any]:
        """What the bundle holds: counts per artifact kind, kernels, bytes (header and ls)."""
        return {
            "artifacts": dict(self.artifacts),
            "kernels": len(self.kernels),
            "kernel_bytes": sum(len(d) for _, d in self.kernels),
            "torch_bytes": len(self.torch_bytes),
            "missing_kernels": self.missing_kernels,
        }

    def to_bytes(self) -> bytes:
        header = {
            "format": FORMAT,
            "name": self.name,
            "created": self.created,
            "fingerprint": self.fingerprint,
            "artifacts": self.artifacts,
            "contents": self.contents(),
            "torch": {"bytes": len(self.torch_bytes), "digest": _digest(self.torch_bytes)},
            # The kernels' own ISA stamp: a kernel part from another CPU is never installed,
            # even inside a bundle whose fingerprint matches.
            "kernel_isa": self.fingerprint.get("cpu_isa", ""),
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
        """Parse and verify every length and digest.

        The header and the torch part must be whole (:class:`BundleError` otherwise). Each
        kernel is checked on its own: one that is truncated, fails its digest or carries
        another CPU's ISA stamp is left out and named in :attr:`skipped`; the rest load.
        """
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
            fingerprint = {str(k): str(v) for k, v in header["fingerprint"].items()}
            kernels, skipped = _take_kernels(view, pos, header, fingerprint)
            contents = header.get("contents", {})
            return cls(
                name=str(header["name"]),
                fingerprint=fingerprint,
                torch_bytes=torch_bytes,
                kernels=kernels,
                artifacts={str(k): int(v) for k, v in header.get("artifacts", {}).items()},
                created=float(header.get("created", 0.0)),
                missing_kernels=int(contents.get("missing_kernels", 0)),
                skipped=skipped,
            )
        except BundleError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BundleError(f"bundle header is malformed: {exc!r}") from None


def _take_kernels(
    view: memoryview, pos: int, header: dict[str, Any], fingerprint: dict[str, str]
) -> tuple[list[tuple[str, bytes]], list[str]]:
    """The kernels that verify, and one reason per kernel part left out."""
    items = header["kernels"]
    isa = str(header.get("kernel_isa", fingerprint.get("cpu_isa", "")))
    if isa != fingerprint.get("cpu_isa", ""):
        return [], [f"{len(items)} kernels built for CPU ISA {isa!r}"]
    kernels: list[tuple[str, bytes]] = []
    skipped: list[str] = []
    for i, item in enumerate(items):
        key, n = str(item["key"]), int(item["bytes"])
        if n < 0 or pos + n > len(view):
            skipped.append(f"{len(items) - i} truncated kernels")
            return kernels, skipped
        if _digest(view[pos : pos + n]) == item["digest"]:
            kernels.append((key, bytes(view[pos : pos + n])))
        else:
            skipped.append(f"kernel {key} (digest mismatch)")
        pos += n
    if pos != len(view):
        skipped.append(f"{len(view) - pos} unexpected trailing bytes")
    return kernels, skipped


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


def pointer_key(name: str) -> str:
    """Where the pointer of bundle ``name`` is stored (the last saver's environment)."""
    from objcache.entry.layout import Namespace

    return str(Namespace(POINTER_ENV).object_key(KIND, name))


def write_overwrite(client: Client, okey: str, payload: bytes) -> Written:
    """Write ``okey`` to the local tier and, with OVERWRITE, to every writable remote tier
    (awaited: the caller reports how many stored it)."""
    from objcache.backends.base import PutMode
    from objcache.core.writes import Remote

    return client.write(okey, payload, mode=PutMode.OVERWRITE, remote=Remote.DIRECT)


def put_local(client: Client, kind: str, key: str, payload: bytes) -> None:
    """Write (kind, key) to the local tier only (imports: bundle kernels, seeded artifacts)."""
    client.put_local(kind, key, payload)


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


@dataclass
class Collected:
    bundle: Bundle
    #: One line on what a bundle lacks and what a load will cost for it ("" when complete).
    gaps: str = ""


#: torch's Mega-Cache artifact type of a Dynamo package (``PrecompileCacheArtifact``).
PRECOMPILE_ARTIFACT = "precompile"


@contextlib.contextmanager
def _without_precompile_artifacts() -> Iterator[None]:
    """Leave torch's precompile artifacts out of ``save_cache_artifacts()`` (they are put
    back after): a bundle carries no entry that bypasses objcache's keying and signing."""
    from torch.compiler._cache import CacheArtifactManager

    new = getattr(CacheArtifactManager, "_new_cache_artifacts", None)
    info = getattr(getattr(CacheArtifactManager, "_cache_info", None), "artifacts", None)
    held = [
        (store, store.pop(PRECOMPILE_ARTIFACT))
        for store in (new, info)
        if isinstance(store, dict) and PRECOMPILE_ARTIFACT in store
    ]
    try:
        yield
    finally:
        for store, value in held:
            store[PRECOMPILE_ARTIFACT] = value


def collect(name: str) -> Collected:
    """The bundle of this process's Mega-Cache artifacts and kernels (nothing stored).

    Kernels come from the saved FX graphs themselves
    (:mod:`objcache.integrations.torch.kernels.artifact_kernels`), so a process that compiled
    without ``objcache.install()`` saves them too; those the kernel hooks recorded are added.
    """
    import torch
    from torch.compiler._cache import CacheArtifactManager

    from objcache.config.fingerprint import fingerprint
    from objcache.integrations.torch.kernels import artifact_kernels, kernels

    with _without_precompile_artifacts():
        result = torch.compiler.save_cache_artifacts()
    torch_bytes, artifacts = b"", {}
    scan = artifact_kernels.KernelScan()
    if result is not None:
        torch_bytes, info = result
        artifacts = {k: len(v) for k, v in info.artifacts.items()}
        deserialized = CacheArtifactManager.deserialize(torch_bytes) or {}
        if PRECOMPILE_ARTIFACT in deserialized:
            raise BundleError("torch's precompile artifacts could not be left out of the bundle")
        scan = artifact_kernels.derive(deserialized)
    found = dict(scan.items)
    for key, data in kernels.used_artifacts():
        found.setdefault(key, data)
    if not torch_bytes and not found:
        raise BundleError("nothing to save: no torch.compile artifacts in this process yet")
    bundle = Bundle(
        _check_name(name),
        dict(fingerprint()),
        torch_bytes,
        sorted(found.items()),
        artifacts,
        missing_kernels=len(scan.missing),
    )
    return Collected(bundle, _gaps(scan))


def _gaps(scan: Any) -> str:
    parts = []
    if scan.missing:
        parts.append(
            f"{len(scan.missing)} kernels the graphs load are gone from the inductor cache dir "
            f"(a load compiles them: {len(scan.missing)} g++ builds)"
        )
    if scan.failed:
        parts.append(
            f"kernels of {len(scan.failed)} graphs could not be derived ({scan.failed[0]}; "
            "a load compiles theirs)"
        )
    return "; ".join(parts)


def save(name: str) -> str:
    """Store this process's Mega-Cache artifacts (and CPU kernels) as bundle ``name``."""
    collected = collect(name)
    bundle = collected.bundle
    payload = bundle.to_bytes()
    client = cache_client.get_client()
    okey = client.object_key(KIND, bundle.name)
    pointer = json.dumps(
        {
            "name": bundle.name,
            "env": client.env,
            "fingerprint": bundle.fingerprint,
            "bytes": len(payload),
            "created": bundle.created,
            "contents": bundle.contents(),
        },
        sort_keys=True,
    ).encode()

    try:
        result = write_overwrite(client, okey, payload)
        write_overwrite(client, pointer_key(bundle.name), pointer)
        written, asked = result.stored, result.asked
    except Exception as exc:
        raise BundleError(f"could not store bundle {bundle.name!r}: {exc}") from None
    counts = ", ".join(f"{n} {k}" for k, n in sorted(bundle.artifacts.items())) or "no torch"
    where = f"{written}/{asked} remote tiers" if asked else "the local tier only"
    note = "" if written == asked else " (some remote tiers failed: see objcache stats)"
    gaps = f"; incomplete: {collected.gaps}" if collected.gaps else ""
    return (
        f"saved bundle {bundle.name!r}: {counts} artifacts, {len(bundle.kernels)} kernels, "
        f"{_size(len(payload))} to {where}{note}{gaps}"
    )


def fetch(name: str) -> Bundle:
    """The verified bundle ``name`` of this environment; :class:`BundleError` otherwise."""
    from objcache.config.fingerprint import differences, fingerprint

    name = _check_name(name)
    client = cache_client.get_client()
    # the pointer (what to say when the bundle is not served) is read at the same time: a
    # store that never answers costs one deadline, not two
    with ThreadPoolExecutor(1, thread_name_prefix="objcache-mega") as pool:
        pointer_read = pool.submit(client.get_object, pointer_key(name))
        payload = client.get(KIND, name)
        raw = pointer_read.result()
    mine = dict(fingerprint())
    if payload is None:
        pointer = read_pointer(raw) if raw is not None else {}
        if pointer is None:
            raise BundleError(f"bundle {name!r}: its pointer in the store is malformed")
        theirs = pointer.get("fingerprint")
        if isinstance(theirs, dict) and pointer.get("env") != client.env:
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
    client = cache_client.get_client()
    populated = 0
    if bundle.torch_bytes:
        from torch.compiler._cache import CacheArtifactManager

        artifacts = CacheArtifactManager.deserialize(bundle.torch_bytes)
        if artifacts is None:
            raise BundleError(f"bundle {name!r}: torch cannot parse its Mega-Cache artifacts")
        # torch's precompile artifacts would land in its own unverified Dynamo store, keyed
        # by (qualname, line) alone: a bundle never installs them (precompile entries travel
        # as objcache's own kind, keyed and signed)
        artifacts = {k: v for k, v in artifacts.items() if k != PRECOMPILE_ARTIFACT}
        try:
            info = CacheArtifactManager.populate_caches(artifacts)
        except Exception as exc:
            raise BundleError(f"bundle {name!r}: torch refused an artifact: {exc!r}") from None
        populated = sum(len(v) for v in info.artifacts.values())
    if bundle.kernels:
        from objcache.integrations.torch.kernels import kernels

        for key, data in bundle.kernels:
            put_local(client, kernels.KIND, key, data)
        kernels.install()
    kernel_bytes = sum(len(d) for _, d in bundle.kernels)
    skipped = f"; skipped {', '.join(bundle.skipped)}" if bundle.skipped else ""
    return (
        f"loaded bundle {name!r}: {populated} torch artifacts, {len(bundle.kernels)} kernels "
        f"({_size(len(bundle.torch_bytes) + kernel_bytes)}){skipped}"
    )


@dataclass(frozen=True)
class BundleInfo:
    name: str
    size: int
    mtime: float
    tier: str
    #: :meth:`Bundle.contents` as recorded at save time; None for bundles saved by an older
    #: objcache (or whose name was saved again since in another environment).
    contents: dict[str, Any] | None = None


def list_infos(unlisted: list[str] | None = None) -> list[BundleInfo]:
    """Bundles of this environment on every tier (largest entry per name); the tiers that
    could not list are appended to ``unlisted``."""
    from objcache.entry.layout import parse_object_key

    client = cache_client.get_client()
    found: dict[str, BundleInfo] = {}
    listed, failed = client.listing(KIND)
    if unlisted is not None:
        unlisted.extend(failed)
    for tier, info in listed:
        parsed = parse_object_key(info.key)
        if parsed is not None and parsed[2] not in found:
            found[parsed[2]] = BundleInfo(parsed[2], info.size, info.mtime, tier)
    return [
        dataclasses.replace(
            b, contents=_recorded_contents(client.get_object(pointer_key(b.name)), client.env)
        )
        for b in sorted(found.values(), key=lambda b: b.name)
    ]


#: Largest pointer read (a pointer is a few hundred bytes; any fleet node can write one).
MAX_POINTER_BYTES = 64 * 1024


def read_pointer(raw: bytes) -> dict[str, Any] | None:
    """A bundle pointer as a dict, or None for anything else: oversized, not JSON, not an
    object, or nested deeper than Python parses (a planted pointer is never a traceback)."""
    if len(raw) > MAX_POINTER_BYTES:
        return None
    try:
        pointer = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return pointer if isinstance(pointer, dict) else None


def _recorded_contents(raw: bytes | None, env: str) -> dict[str, Any] | None:
    pointer = read_pointer(raw) if raw is not None else None
    if pointer is None or pointer.get("env") != env:
        return None
    contents = pointer.get("contents")
    return contents if isinstance(contents, dict) else None


def describe_contents(contents: dict[str, Any] | None) -> str:
    """``4 inductor, 2 aot_autograd, 2 pgo artifacts, 6 kernels`` plus what it lacks."""
    if contents is None:
        return "contents not recorded (saved by an older objcache)"
    try:
        artifacts = {str(k): int(v) for k, v in dict(contents.get("artifacts", {})).items()}
        n_kernels, missing = int(contents.get("kernels", 0)), int(contents["missing_kernels"])
    except (KeyError, TypeError, ValueError):
        return "contents unreadable"
    counts = ", ".join(f"{n} {k}" for k, n in sorted(artifacts.items())) or "no torch"
    text = f"{counts} artifacts, {n_kernels} kernels"
    if missing:
        text += f"; {missing} kernels missing (a load compiles them)"
    elif artifacts.get("inductor") and not n_kernels:
        text += "; no kernels: a load compiles every CPU kernel"
    return text


def list_bundles(unlisted: list[str] | None = None) -> list[str]:
    """One line per bundle of this environment, with what it holds (tiers that could not
    list appended to ``unlisted``)."""
    lines = []
    for b in list_infos(unlisted):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(b.mtime))
        lines.append(
            f"{b.name}  {_size(b.size)}  {when}  {b.tier}  {describe_contents(b.contents)}"
        )
    return lines or ["no bundles for this environment"]
