"""Seed objcache's local tier from what a machine already has (``objcache push``).

CI compiles once, then pushes: ``objcache push --inductor-dir $TORCHINDUCTOR_CACHE_DIR`` or
``--bundle file`` imports those artifacts into the local tier under the keys the torch hooks
use, and the push copies the local tier to the remote tiers.

What can be imported, and under which key:

* ``fxgraph/<xx>/<key>/<entry>`` → ``fx-graph`` ``pt2:fx-graph-v1::<key>:c1``
  (``codecache.py`` ``_get_tmp_dir_for_key``, cache id from ``get_remote_cache``);
* ``aotautograd/<key>/<entry>`` → ``aot-autograd`` ``pt2:autograd-experimental::<key>:c1``;
* Mega-Cache files (torch's ``save_cache_artifacts`` bytes, or an objcache bundle, whose
  fingerprint must match this environment): the ``inductor``, ``aot_autograd`` and ``pgo``
  artifacts, plus an objcache bundle's kernels.

Not importable from a cache directory: PGO files (their names replace ``:`` and other
characters, so the key cannot be recovered), autotune results (the remote key hashes the
kernel's source file, not the local file name), and compiled C++ kernels (their objcache key
needs the build command line, which the directory does not record) — these travel by
running the compile with objcache installed, or in bundles.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from objcache.integrations import cache_client
from objcache.integrations.torch.remote.remote_cache_classes import CACHE_IDS

#: Mega-Cache artifact type -> objcache kind.
ARTIFACT_KINDS = {"inductor": "fx-graph", "aot_autograd": "aot-autograd", "pgo": "pgo"}


def remote_key(kind: str, key: str) -> str:
    """The key torch's remote cache classes use (``RedisRemoteCache.__init__``)."""
    return f"pt2:{CACHE_IDS[kind]}::{key}:c1"


#: Largest cache entry file read from an inductor directory (FX graphs are KBs to MBs).
MAX_ENTRY_BYTES = 256 * 1024 * 1024


class UnsafeDir(ValueError):
    """An inductor directory whose contents anyone but this user may have put there."""


def _trusted(st: os.stat_result) -> bool:
    """Owned by this user and not writable by group or others (lstat: never a symlink)."""
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def check_root(root: Path) -> None:
    """Refuse (:class:`UnsafeDir`) an inductor directory that is a symlink, not a directory,
    owned by someone else or writable by group or others: a pre-created
    ``/tmp/torchinductor_<user>`` or a restored cache whose contents would be signed and
    published as this user's (docs/security.md)."""
    try:
        st = os.lstat(root)
    except OSError as exc:
        raise UnsafeDir(f"{root}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDir(f"{root} is a symlink: give the directory itself")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDir(f"{root} is not a directory")
    if st.st_uid != os.getuid():
        raise UnsafeDir(f"{root} is owned by uid {st.st_uid}, not by this user")
    if st.st_mode & 0o022:
        raise UnsafeDir(f"{root} is writable by group or others (mode {st.st_mode & 0o777:o})")


def _trusted_dirs(base: Path, depth: int, skipped: Counter[str]) -> Iterator[Path]:
    """The directories ``depth`` levels under ``base``, every level a trusted directory."""
    level = [base]
    for _ in range(depth):
        nxt: list[Path] = []
        for d in level:
            for child in sorted(d.iterdir()):
                st = os.lstat(child)
                if stat.S_ISDIR(st.st_mode) and _trusted(st):
                    nxt.append(child)
                elif stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode):
                    skipped["untrusted" if not stat.S_ISLNK(st.st_mode) else "symlink"] += 1
        level = nxt
    return iter(level)


def _read_entry(path: Path, skipped: Counter[str]) -> bytes | None:
    """A trusted regular file's bytes (never through a symlink, bounded), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        skipped["symlink" if path.is_symlink() else "unreadable"] += 1
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or not _trusted(st):
            skipped["untrusted"] += 1
            return None
        if st.st_size > MAX_ENTRY_BYTES:
            skipped["oversized"] += 1
            return None
        return f.read(MAX_ENTRY_BYTES + 1)[:MAX_ENTRY_BYTES]


def scan_inductor_dir(
    root: Path, skipped: Counter[str] | None = None
) -> Iterator[tuple[str, str, bytes]]:
    """``(kind, key, raw pickle)`` of every FX graph and AOTAutograd entry under ``root``.

    ``root`` must pass :func:`check_root`; below it, a symlink, a file or directory owned by
    someone else or writable by group or others, or an entry over :data:`MAX_ENTRY_BYTES` is
    skipped and counted in ``skipped`` by reason."""
    check_root(root)
    skipped = Counter() if skipped is None else skipped
    layouts = (("fx-graph", root / "fxgraph", 2), ("aot-autograd", root / "aotautograd", 1))
    for kind, base, depth in layouts:
        try:
            st = os.lstat(base)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or not _trusted(st):
            skipped["symlink" if stat.S_ISLNK(st.st_mode) else "untrusted"] += 1
            continue
        for key_dir in _trusted_dirs(base, depth, skipped):
            entries = []
            for p in key_dir.iterdir():
                if p.name.startswith("."):
                    continue
                pst = os.lstat(p)
                if stat.S_ISREG(pst.st_mode):
                    entries.append((pst.st_mtime, p))
                else:
                    skipped["symlink" if stat.S_ISLNK(pst.st_mode) else "untrusted"] += 1
            if not entries:
                continue
            data = _read_entry(max(entries)[1], skipped)
            if data is not None:
                yield kind, remote_key(kind, key_dir.name), data


def bundle_items(data: bytes) -> Iterator[tuple[str, str, bytes]]:
    """``(kind, key, payload)`` of a Mega-Cache file (torch's bytes or an objcache bundle)."""
    from objcache.integrations.torch.mega import mega

    torch_bytes = data
    if data[:4] == mega.MAGIC:
        from objcache.config.fingerprint import differences, fingerprint

        bundle = mega.Bundle.from_bytes(data)
        diff = differences(dict(fingerprint()), bundle.fingerprint)
        if diff:
            raise mega.BundleError(f"bundle is for another environment: {'; '.join(diff)}")
        from objcache.integrations.torch.kernels import kernels

        for key, blob in bundle.kernels:
            yield kernels.KIND, key, blob
        torch_bytes = bundle.torch_bytes
    if not torch_bytes:
        return
    from torch.compiler._cache import CacheArtifactManager

    artifacts = CacheArtifactManager.deserialize(torch_bytes)
    if artifacts is None:
        raise mega.BundleError("not a Mega-Cache file: torch cannot parse it")
    for kind_name, items in artifacts.items():
        kind = ARTIFACT_KINDS.get(kind_name)
        if kind is None:
            continue
        for artifact in items:
            yield kind, remote_key(kind, artifact.key), artifact.content


def import_local(
    *,
    inductor_dir: Path | None = None,
    bundles: Sequence[Path] = (),
    skipped: Counter[str] | None = None,
) -> int:
    """Put the importable artifacts into objcache's local tier; returns how many. Raises
    :class:`UnsafeDir` for an inductor directory others may have filled; ``skipped`` counts
    what was left out below it, by reason."""
    from objcache.integrations.torch.mega.mega import put_local

    items: list[tuple[str, str, bytes]] = []
    if inductor_dir is not None:
        items.extend(scan_inductor_dir(Path(os.path.expanduser(str(inductor_dir))), skipped))
    for path in bundles:
        items.extend(bundle_items(Path(path).read_bytes()))
    client = cache_client.get_client()
    for kind, key, payload in items:
        put_local(client, kind, key, payload)
    return len(items)
