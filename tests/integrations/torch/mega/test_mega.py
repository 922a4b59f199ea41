"""Mega-Cache bundles (:mod:`objcache.integrations.torch.mega.mega`): bytes verified before anything
else, a bad kernel part skipped and named, another environment's bundle refused with what
differs, ``mega ls``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.isa import other_isa

torch = pytest.importorskip("torch")


def test_bundle_bytes_are_verified_before_anything_else() -> None:
    from objcache.integrations.torch.mega import mega

    fp = {"torch": "2.13", "cpu_isa": "avx2"}
    bundle = mega.Bundle("b", fp, b"torch-bytes", [("k1-x.so", b"\x7fELF")])
    data = bundle.to_bytes()
    back = mega.Bundle.from_bytes(data)
    assert (back.torch_bytes, back.kernels, back.fingerprint, back.skipped) == (
        b"torch-bytes",
        [("k1-x.so", b"\x7fELF")],
        fp,
        [],
    )
    torch_at = data.index(b"torch-bytes")
    tampered = data[:torch_at] + b"X" + data[torch_at + 1 :]
    with pytest.raises(mega.BundleError, match="digest mismatch in torch"):
        mega.Bundle.from_bytes(tampered)
    with pytest.raises(mega.BundleError, match="truncated"):
        mega.Bundle.from_bytes(data[: torch_at + 3])
    with pytest.raises(mega.BundleError, match="bad magic"):
        mega.Bundle.from_bytes(b"XXXX" + data[4:])


def test_a_bad_kernel_part_is_skipped_and_named_never_loaded() -> None:
    from objcache.integrations.torch.mega import mega

    fp = {"torch": "2.13", "cpu_isa": "avx2"}
    kernels = [("k1-a.so", b"\x7fELF-a"), ("k1-b.so", b"\x7fELF-b"), ("k1-c.so", b"\x7fELF-c")]
    data = mega.Bundle("b", fp, b"torch-bytes", kernels).to_bytes()
    at = data.index(b"\x7fELF-b")
    flipped = mega.Bundle.from_bytes(data[:at] + b"X" + data[at + 1 :])
    assert flipped.torch_bytes == b"torch-bytes"
    assert flipped.kernels == [kernels[0], kernels[2]]
    assert flipped.skipped == ["kernel k1-b.so (digest mismatch)"]
    cut = mega.Bundle.from_bytes(data[:-3])
    assert cut.kernels == kernels[:2] and cut.skipped == ["1 truncated kernels"]
    # a kernel part stamped with another CPU's ISA is never installed, whatever its digests say
    foreign = data.replace(b'"kernel_isa": "avx2"', b'"kernel_isa": "neon"')  # same length
    assert foreign != data
    other = mega.Bundle.from_bytes(foreign)
    assert other.kernels == [] and other.skipped == ["3 kernels built for CPU ISA 'neon'"]


def test_loading_a_bundle_with_a_bad_kernel_installs_only_what_verifies(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objcache.client import get_client
    from objcache.config.fingerprint import fingerprint
    from objcache.integrations.torch.kernels import kernels
    from objcache.integrations.torch.mega import mega

    client = get_client()
    good, bad = ("k1-good.so", b"\x7fELF-good"), ("k1-bad.so", b"\x7fELF-bad")
    data = mega.Bundle("part", dict(fingerprint()), b"", [good, bad]).to_bytes()
    at = data.index(b"\x7fELF-bad")
    okey = client.object_key("mega", "part")
    blob = data[:at] + b"X" + data[at + 1 :]
    mega.write_overwrite(client, okey, blob)
    line = mega.load("part")
    assert "\n" not in line
    assert "1 kernels" in line and "skipped kernel k1-bad.so (digest mismatch)" in line
    assert client.get(kernels.KIND, "k1-good.so") == b"\x7fELF-good"
    assert client.get(kernels.KIND, "k1-bad.so") is None


def test_mega_ls_shows_what_each_bundle_holds(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objcache.config.fingerprint import fingerprint
    from objcache.integrations.torch.mega import mega

    def fake(name: str, kernels: list[tuple[str, bytes]], missing: int = 0) -> mega.Collected:
        artifacts = {"inductor": 4, "aot_autograd": 2, "pgo": 2}
        bundle = mega.Bundle(name, dict(fingerprint()), b"t", kernels, artifacts)
        bundle.missing_kernels = missing
        return mega.Collected(bundle, f"{missing} kernels gone" if missing else "")

    made = {
        "full": fake("full", [("k1-a.so", b"a"), ("k1-b.so", b"b")]),
        "bare": fake("bare", []),
        "gaps": fake("gaps", [("k1-a.so", b"a")], missing=3),
    }
    monkeypatch.setattr(mega, "collect", lambda name: made[name])
    for name in made:
        saved = mega.save(name)
        assert ("incomplete: 3 kernels gone" in saved) == (name == "gaps"), saved
    lines = {line.split()[0]: line for line in mega.list_bundles()}
    assert "2 aot_autograd, 4 inductor, 2 pgo artifacts, 2 kernels" in lines["full"]
    assert "no kernels: a load compiles every CPU kernel" in lines["bare"]
    assert "1 kernels; 3 kernels missing" in lines["gaps"]
    assert "no kernels" not in lines["full"] and "missing" not in lines["full"]


def test_loading_a_bundle_of_another_environment_lists_what_differs(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objcache.client import get_client
    from objcache.config.fingerprint import fingerprint
    from objcache.entry.layout import Namespace
    from objcache.integrations.torch.mega import mega

    client = get_client()
    ours = fingerprint()
    theirs = {**ours, "torch": "2.99.0", "cpu_isa": other_isa(ours["cpu_isa"])}
    other_env = Namespace("0123456789abcdef")
    blob = mega.Bundle("nightly", theirs, b"x").to_bytes()
    pointer = json.dumps({"env": other_env.env, "fingerprint": theirs}).encode()

    mega.write_overwrite(client, other_env.object_key("mega", "nightly"), blob)
    mega.write_overwrite(client, mega.pointer_key("nightly"), pointer)
    with pytest.raises(mega.BundleError) as info:
        mega.load("nightly")
    message = str(info.value)
    assert "\n" not in message
    assert "torch: 2.99.0 (stored) != " in message
    assert f"cpu_isa: {theirs['cpu_isa']} (stored) != {ours['cpu_isa']}" in message
    with pytest.raises(mega.BundleError, match="no bundle named 'absent'"):
        mega.load("absent")


def test_a_corrupt_bundle_is_refused_before_torch_sees_it(
    installed_file_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.compiler._cache import CacheArtifactManager

    from objcache.client import get_client
    from objcache.config.fingerprint import fingerprint
    from objcache.integrations.torch.mega import mega

    client = get_client()
    blob = bytearray(mega.Bundle("bad", dict(fingerprint()), b"torch artifacts").to_bytes())
    blob[-3] ^= 0xFF  # inside the torch part: the entry codec is fine, the bundle digest is not
    okey = client.object_key("mega", "bad")
    mega.write_overwrite(client, okey, bytes(blob))

    def never(*_: Any) -> None:
        raise AssertionError("torch saw the bundle")

    monkeypatch.setattr(CacheArtifactManager, "deserialize", never)
    monkeypatch.setattr(CacheArtifactManager, "populate_caches", never)
    with pytest.raises(mega.BundleError, match="corrupt"):
        mega.load("bad")
    assert "bad" in "\n".join(mega.list_bundles())
