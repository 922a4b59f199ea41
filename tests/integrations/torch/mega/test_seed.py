"""``objcache push --inductor-dir`` (:mod:`objcache.integrations.torch.mega.seed`): torch's local
entries and Mega-Cache files imported under the hook keys, only what this user put there."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def test_seed_imports_inductor_dirs_and_mega_cache_files_under_the_hook_keys(
    installed_file_store: Path,
) -> None:
    from torch.compiler._cache import CacheArtifactManager

    from objcache.client import get_client
    from objcache.integrations.torch.mega import seed

    inductor = installed_file_store / "seed-inductor"
    (inductor / "fxgraph" / "ab" / "fabc1").mkdir(parents=True)
    (inductor / "fxgraph" / "ab" / "fabc1" / "entry").write_bytes(b"\x80fx")
    (inductor / "aotautograd" / "aqq2").mkdir(parents=True)
    (inductor / "aotautograd" / "aqq2" / "entry").write_bytes(b"\x80aot")
    CacheArtifactManager._ensure_cache_artifacts_registered()
    with CacheArtifactManager.with_fresh_cache():
        CacheArtifactManager.record_artifact("inductor", "fmega3", b"\x80mega")
        CacheArtifactManager.record_artifact("pgo", "job:None:", b"\x80pgo")
        serialized = CacheArtifactManager.serialize()
    assert serialized is not None
    bundle = installed_file_store / "artifacts.bin"
    bundle.write_bytes(serialized[0])

    assert seed.import_local(inductor_dir=inductor, bundles=[bundle]) == 4
    client = get_client()
    assert client.get("fx-graph", "pt2:fx-graph-v1::fabc1:c1") == b"\x80fx"
    assert client.get("aot-autograd", "pt2:autograd-experimental::aqq2:c1") == b"\x80aot"
    assert client.get("fx-graph", "pt2:fx-graph-v1::fmega3:c1") == b"\x80mega"
    assert client.get("pgo", "pt2:dynamo-pgo::job:None::c1") == b"\x80pgo"


def test_seed_reads_only_what_this_user_put_in_the_inductor_dir(
    installed_file_store: Path, tmp_path: Path
) -> None:
    """``push --inductor-dir``: a symlinked or shared (group/other-writable, foreign-owned)
    directory is refused whole; below it, symlinks and entries others could have written are
    left out and counted; this user's own entries are imported."""
    from objcache.client import get_client
    from objcache.integrations.torch.mega import seed

    outside = tmp_path / "elsewhere"
    (outside / "fxgraph" / "ab" / "fevil").mkdir(parents=True)
    (outside / "fxgraph" / "ab" / "fevil" / "entry").write_bytes(b"\x80planted")
    root = installed_file_store / "inductor-own"
    (root / "fxgraph" / "ab" / "fgood").mkdir(parents=True)
    (root / "fxgraph" / "ab" / "fgood" / "entry").write_bytes(b"\x80good")
    (root / "fxgraph" / "ab" / "flink").symlink_to(outside / "fxgraph" / "ab" / "fevil")
    (root / "fxgraph" / "cd").symlink_to(outside / "fxgraph" / "ab")
    (root / "fxgraph" / "ab" / "fshared").mkdir()
    shared = root / "fxgraph" / "ab" / "fshared" / "entry"
    shared.write_bytes(b"\x80shared")
    shared.chmod(0o666)
    (root / "aotautograd" / "afile").mkdir(parents=True)
    (root / "aotautograd" / "afile" / "entry").symlink_to(
        outside / "fxgraph" / "ab" / "fevil" / "entry"
    )

    skipped: Counter[str] = Counter()
    assert seed.import_local(inductor_dir=root, skipped=skipped) == 1
    assert get_client().get("fx-graph", "pt2:fx-graph-v1::fgood:c1") == b"\x80good"
    for key in ("flink", "fevil", "fshared"):
        assert get_client().get("fx-graph", f"pt2:fx-graph-v1::{key}:c1") is None
    assert skipped == {"symlink": 3, "untrusted": 1}, skipped

    link = installed_file_store / "inductor-link"
    link.symlink_to(root)
    with pytest.raises(seed.UnsafeDir, match="symlink"):
        seed.import_local(inductor_dir=link)
    root.chmod(0o777)
    with pytest.raises(seed.UnsafeDir, match="writable by group or others"):
        seed.import_local(inductor_dir=root)
    root.chmod(0o700)
    if os.getuid() == 0:  # only root can give the directory to someone else
        os.chown(root, 12345, -1)
        with pytest.raises(seed.UnsafeDir, match="owned by uid 12345"):
            seed.import_local(inductor_dir=root)
