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
from collections.abc import Iterator, Sequence
from pathlib import Path

from objcache.integrations.torch.hooks import CACHE_IDS

#: Mega-Cache artifact type -> objcache kind.
ARTIFACT_KINDS = {"inductor": "fx-graph", "aot_autograd": "aot-autograd", "pgo": "pgo"}


def remote_key(kind: str, key: str) -> str:
    """The key torch's remote cache classes use (``RedisRemoteCache.__init__``)."""
    return f"pt2:{CACHE_IDS[kind]}::{key}:c1"


def scan_inductor_dir(root: Path) -> Iterator[tuple[str, str, bytes]]:
    """``(kind, key, raw pickle)`` of every FX graph and AOTAutograd entry under ``root``."""
    layouts = (("fx-graph", root / "fxgraph", 2), ("aot-autograd", root / "aotautograd", 1))
    for kind, base, depth in layouts:
        if not base.is_dir():
            continue
        pattern = "*/*" if depth == 2 else "*"
        for key_dir in sorted(base.glob(pattern)):
            if not key_dir.is_dir():
                continue
            entries = [p for p in key_dir.iterdir() if p.is_file() and not p.name.startswith(".")]
            if not entries:
                continue
            newest = max(entries, key=lambda p: p.stat().st_mtime)
            yield kind, remote_key(kind, key_dir.name), newest.read_bytes()


def bundle_items(data: bytes) -> Iterator[tuple[str, str, bytes]]:
    """``(kind, key, payload)`` of a Mega-Cache file (torch's bytes or an objcache bundle)."""
    from objcache.integrations.torch import mega

    torch_bytes = data
    if data[:4] == mega.MAGIC:
        from objcache.config.fingerprint import differences, fingerprint

        bundle = mega.Bundle.from_bytes(data)
        diff = differences(dict(fingerprint()), bundle.fingerprint)
        if diff:
            raise mega.BundleError(f"bundle is for another environment: {'; '.join(diff)}")
        from objcache.integrations.torch import kernels

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


def import_local(*, inductor_dir: Path | None = None, bundles: Sequence[Path] = ()) -> int:
    """Put the importable artifacts into objcache's local tier; returns how many."""
    from objcache.client import get_client
    from objcache.integrations.torch.mega import put_local

    items: list[tuple[str, str, bytes]] = []
    if inductor_dir is not None:
        items.extend(scan_inductor_dir(Path(os.path.expanduser(str(inductor_dir)))))
    for path in bundles:
        items.extend(bundle_items(Path(path).read_bytes()))
    client = get_client()
    for kind, key, payload in items:
        put_local(client, kind, key, payload)
    return len(items)
