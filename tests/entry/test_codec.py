"""The entry codec: any byte string decodes to the exact payload or a typed error."""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from objcache.entry import codec as codec_module
from objcache.entry.codec import (
    CODEC_ZSTD,
    HEADER_SIZE,
    MAC_SIZE,
    MAGIC,
    MAX_PAYLOAD,
    MIN_COMPRESS,
    VERSION,
    Codec,
)
from objcache.entry.signing import Ed25519PrivateKey
from objcache.errors import (
    BadSignature,
    CorruptEntry,
    EntryError,
    OversizedEntry,
    UnsignedEntry,
    UnsupportedVersion,
)
from tests.support.hypothesis_profiles import examples

OKEY = "v1/0123456789abcdef/fx-graph/00/key"
PLAIN = Codec()
SIGNED = Codec(signing_keys=(b"k1-secret".ljust(32, b"."),))
OLD = b"old".ljust(32, b".")
NEW = b"new".ljust(32, b".")
payloads = st.binary(max_size=4096) | st.text(max_size=3000).map(str.encode)


@given(payloads, st.sampled_from([PLAIN, SIGNED]))
def test_round_trip(payload: bytes, codec: Codec) -> None:
    entry = codec.encode(payload, OKEY)
    assert entry[:4] == MAGIC
    assert codec.decode(entry, OKEY) == payload


def test_compressible_payload_is_compressed_and_tiny_stays_raw() -> None:
    big = b"torch.compile " * 1000
    assert len(PLAIN.encode(big, OKEY)) < len(big) // 10
    tiny = b"x" * (MIN_COMPRESS - 1)
    assert len(PLAIN.encode(tiny, OKEY)) == HEADER_SIZE + len(tiny)
    smallest = b"x" * MIN_COMPRESS  # the threshold itself is compressed
    assert len(PLAIN.encode(smallest, OKEY)) < HEADER_SIZE + len(smallest)
    noise = os.urandom(4096)  # zstd would grow it: stored raw
    assert PLAIN.encode(noise, OKEY)[HEADER_SIZE:] == noise


def streamed(codec: Codec, entry: bytes, pieces: list[int], max_payload: int = MAX_PAYLOAD) -> None:
    """``codec.stream_check`` fed ``entry`` cut at the sizes of ``pieces`` (cycled), then
    finished: what a large entry received in pieces goes through."""
    check = codec.stream_check(OKEY, max_payload)
    at = i = 0
    while at < len(entry):
        size = max(1, pieces[i % len(pieces)])
        check.feed(entry[at : at + size])
        at, i = at + size, i + 1
    check.finish()


#: Every way of checking an entry: decoding it, verifying it without decoding (copies), and
#: verifying it as its pieces arrive (a large entry streamed to its local file).
CHECKS: dict[str, Callable[[Codec, bytes], object]] = {
    "decode": lambda c, e: c.decode(e, OKEY),
    "verify": lambda c, e: c.verify(e, OKEY),
    "streamed": lambda c, e: streamed(c, e, [1, 7, 49, 3]),
}


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
@pytest.mark.parametrize("codec", [PLAIN, SIGNED], ids=["plain", "signed"])
@pytest.mark.parametrize("payload", [b"", b"a", os.urandom(300), b"ab" * 500])
def test_every_single_bit_flip_is_detected(
    codec: Codec, payload: bytes, check: Callable[[Codec, bytes], object]
) -> None:
    entry = codec.encode(payload, OKEY)
    check(codec, entry)
    for bit in range(len(entry) * 8):
        flipped = bytearray(entry)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(EntryError):
            check(codec, bytes(flipped))


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
@pytest.mark.parametrize("codec", [PLAIN, SIGNED], ids=["plain", "signed"])
def test_truncation_at_every_length_is_detected(
    codec: Codec, check: Callable[[Codec, bytes], object]
) -> None:
    entry = codec.encode(b"payload " * 100, OKEY)
    for n in range(len(entry)):
        with pytest.raises(EntryError):
            check(codec, entry[:n])


@settings(max_examples=examples(300))
@given(st.binary(max_size=200))
def test_verify_accepts_exactly_what_decode_accepts(blob: bytes) -> None:
    for codec in (PLAIN, SIGNED):
        for entry in (blob, codec.encode(blob, OKEY)):
            try:
                codec.decode(entry, OKEY)
            except EntryError as exc:
                with pytest.raises(type(exc)):
                    codec.verify(entry, OKEY)
            else:
                codec.verify(entry, OKEY)


@settings(max_examples=examples(300))
@given(
    st.binary(max_size=200),
    st.lists(st.integers(min_value=1, max_value=80), min_size=1, max_size=5),
    st.sampled_from([PLAIN, SIGNED]),
    st.booleans(),
    st.integers(min_value=0, max_value=300),
)
def test_a_streamed_check_refuses_and_accepts_exactly_what_verify_does(
    blob: bytes, pieces: list[int], codec: Codec, encoded: bool, cap: int
) -> None:
    """Whatever the bytes and wherever they are cut: the same error (type and message) as
    ``verify`` of the whole, or none; the cap of the key's kind included."""
    entry = codec.encode(blob, OKEY) if encoded else blob
    try:
        codec.verify(entry, OKEY, cap)
    except EntryError as exc:
        with pytest.raises(type(exc)) as raised:
            streamed(codec, entry, pieces, cap)
        assert str(raised.value) == str(exc)
    else:
        streamed(codec, entry, pieces, cap)


def test_a_streamed_check_refuses_a_declared_length_over_the_cap_at_its_first_piece() -> None:
    """A transfer of an entry too big for its kind stops as its header arrives."""
    entry = PLAIN.encode(os.urandom(1000), OKEY)
    check = PLAIN.stream_check(OKEY, 999)
    with pytest.raises(OversizedEntry):
        check.feed(entry[:HEADER_SIZE])


@settings(max_examples=examples(300))
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash(blob: bytes) -> None:
    for codec in (PLAIN, SIGNED):
        try:
            out = codec.decode(blob, OKEY)
        except EntryError:
            continue
        # Only a genuine entry decodes; then re-encoding reproduces its payload.
        assert codec.decode(codec.encode(out, OKEY), OKEY) == out


@settings(max_examples=examples(200))
@given(payloads, st.binary(min_size=1, max_size=64), st.integers(min_value=0))
def test_appended_or_spliced_bytes_are_refused(payload: bytes, junk: bytes, pos: int) -> None:
    entry = PLAIN.encode(payload, OKEY)
    with pytest.raises(EntryError):
        PLAIN.decode(entry + junk, OKEY)
    i = pos % len(entry)
    spliced = entry[:i] + junk + entry[i + len(junk) :]
    if spliced != entry:
        with pytest.raises(EntryError):
            PLAIN.decode(spliced, OKEY)


def test_signing_refuses_unsigned_and_foreign_keys() -> None:
    unsigned = PLAIN.encode(b"pickle", OKEY)
    with pytest.raises(UnsignedEntry):
        SIGNED.decode(unsigned, OKEY)
    foreign = Codec(signing_keys=(b"attacker".ljust(32, b"."),)).encode(b"pickle", OKEY)
    with pytest.raises(BadSignature):
        SIGNED.decode(foreign, OKEY)
    # A reader without a key still checks the digest of a signed entry.
    assert PLAIN.decode(SIGNED.encode(b"pickle", OKEY), OKEY) == b"pickle"


def test_key_rotation_accepts_old_and_new_keys() -> None:
    old_writer = Codec(signing_keys=(OLD,))
    new_writer = Codec(signing_keys=(NEW,))
    rotating_reader = Codec(signing_keys=(NEW, OLD))
    assert rotating_reader.decode(old_writer.encode(b"a", OKEY), OKEY) == b"a"
    assert rotating_reader.decode(new_writer.encode(b"b", OKEY), OKEY) == b"b"
    with pytest.raises(BadSignature):
        new_writer.decode(old_writer.encode(b"a", OKEY), OKEY)


def test_resigning_a_tampered_payload_requires_the_key() -> None:
    entry = bytearray(SIGNED.encode(b"good" * 100, OKEY))
    # An attacker swaps the payload and fixes the digest, but cannot fix the HMAC.
    evil = PLAIN.encode(b"evil" * 100, OKEY)[HEADER_SIZE:]
    start = HEADER_SIZE + MAC_SIZE
    forged = bytes(entry[:start]) + evil
    forged = bytearray(forged)
    forged[16:48] = codec_module._digest(OKEY, evil)
    with pytest.raises(BadSignature):
        SIGNED.decode(bytes(forged), OKEY)


def test_version_and_length_bomb_are_refused() -> None:
    entry = bytearray(PLAIN.encode(b"x" * 1000, OKEY))
    entry[4] = 3
    with pytest.raises(UnsupportedVersion):
        PLAIN.decode(bytes(entry), OKEY)
    bomb = bytearray(PLAIN.encode(b"x" * 1000, OKEY))
    bomb[8:16] = (1 << 40).to_bytes(8, "big")
    with pytest.raises(CorruptEntry):
        PLAIN.decode(bytes(bomb), OKEY)


def test_v1_entries_are_refused_as_version() -> None:
    """A v1 entry (digest and HMAC without the object key) cannot show its name."""
    v2 = bytearray(SIGNED.encode(b"x" * 1000, OKEY))
    v2[4] = 1
    for codec in (PLAIN, SIGNED):
        with pytest.raises(UnsupportedVersion, match="version 1"):
            codec.decode(bytes(v2), OKEY)


@pytest.mark.parametrize("codec", [PLAIN, SIGNED], ids=["plain", "signed"])
def test_an_entry_is_bound_to_its_object_key(codec: Codec) -> None:
    entry = codec.encode(b"kernel for key A" * 50, "v1/e/kernel/00/A")
    for other in ("v1/e/kernel/00/B", "v1/e/fx-graph/00/A", "v1/f/kernel/00/A"):
        with pytest.raises(CorruptEntry, match="another key"):
            codec.decode(entry, other)
        with pytest.raises(CorruptEntry):
            codec.decode(entry, other, signature=False)
    assert codec.decode(entry, "v1/e/kernel/00/A") == b"kernel for key A" * 50


def zstd_frame_declaring(size: int) -> bytes:
    """A genuine zstd frame of ``size`` zero bytes: its header records the content size and
    its body is RLE blocks of 128 KiB (4 bytes each), so 16 GiB fit in half a megabyte."""
    block = 128 << 10
    assert size % block == 0
    header = struct.pack("<IB", 0xFD2FB528, 0xE0)  # single segment, 8-byte content size
    rle = 1 << 1  # block type RLE: one byte repeated block-size times

    def block_header(last: int) -> bytes:
        return (last | rle | block << 3).to_bytes(3, "little")

    blocks = (block_header(0) + b"\0") * (size // block - 1) + block_header(1) + b"\0"
    return header + size.to_bytes(8, "little") + blocks


def bomb_entry(size: int) -> bytes:
    """An unsigned entry whose header and zstd frame both declare ``size``, digest valid."""
    stored = zstd_frame_declaring(size)
    digest = codec_module._digest(OKEY, stored)
    head = struct.pack(">4sBBBBQ32s", MAGIC, VERSION, CODEC_ZSTD, 0, 0, size, digest)
    return head + stored


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
def test_an_entry_declaring_more_than_the_limit_everywhere_is_refused(
    check: Callable[[Codec, bytes], object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header and the frame agree, the digest is right: only the hard limit stands
    between this entry and a 16 GiB allocation in the zstd decoder."""
    bomb = bomb_entry(2 * MAX_PAYLOAD)

    def no_decompressor() -> None:
        raise AssertionError("an over-limit entry reached the zstd decoder")

    monkeypatch.setattr(codec_module, "_decompressor", no_decompressor)
    with pytest.raises(CorruptEntry):
        check(PLAIN, bomb)
    # Nothing else is wrong with it: under a higher limit it verifies.
    monkeypatch.setattr(codec_module, "MAX_PAYLOAD", 4 * MAX_PAYLOAD)
    PLAIN._check(memoryview(bomb), OKEY, 4 * MAX_PAYLOAD)  # what verify() runs, cap raised


@pytest.mark.parametrize("payload", [b"k" * 100, b"compressible " * 100])
def test_the_size_cap_admits_a_payload_of_exactly_its_size(payload: bytes) -> None:
    entry = SIGNED.encode(payload, OKEY)
    assert SIGNED.decode(entry, OKEY, max_payload=len(payload)) == payload
    with pytest.raises(OversizedEntry):
        SIGNED.decode(entry, OKEY, max_payload=len(payload) - 1)


def test_the_configured_compression_level_is_used() -> None:
    rng = random.Random(1)
    words = [bytes(rng.choices(b"abcdefghij", k=rng.randint(3, 9))) for _ in range(2000)]
    text = b" ".join(rng.choice(words) for _ in range(20000))
    fast, small = Codec(level=1).encode(text, OKEY), Codec(level=19).encode(text, OKEY)
    assert len(small) < len(fast)
    assert PLAIN.decode(fast, OKEY) == PLAIN.decode(small, OKEY) == text


def test_an_ed25519_signer_verifies_its_own_entries() -> None:
    ci = Codec(signer=Ed25519PrivateKey.generate())
    entry = ci.encode(b"payload", OKEY)
    assert ci.decode(entry, OKEY) == b"payload"
    ci.verify(entry, OKEY)
    with pytest.raises(BadSignature):
        Codec(signer=Ed25519PrivateKey.generate()).decode(entry, OKEY)


def test_decode_without_the_signature_check_still_checks_the_digest() -> None:
    unsigned = PLAIN.encode(b"payload", OKEY)
    with pytest.raises(UnsignedEntry):
        SIGNED.decode(unsigned, OKEY)
    assert SIGNED.decode(unsigned, OKEY, signature=False) == b"payload"
    with pytest.raises(CorruptEntry):
        SIGNED.decode(unsigned[:-1] + b"!", OKEY, signature=False)


def test_the_hard_limit_admits_an_entry_of_exactly_its_size() -> None:
    # Header and frame declare the limit itself (more is refused: the test above).
    PLAIN.verify(bomb_entry(MAX_PAYLOAD), OKEY)


def test_entry_format_v2_is_stable() -> None:
    """A fixed entry, byte for byte: a change to the header or to how the digest binds the
    key (docs/architecture.md, "Entry format") would strand every entry already stored."""
    golden = bytes.fromhex(
        "4f424a43020000000000000000000007"
        "8ea4b3a058a2478d740f280987e500c215b9c8f5857f0419f52172b18832e600"
        "7061796c6f6164"
    )
    assert PLAIN.encode(b"payload", OKEY) == golden
    assert PLAIN.decode(golden, OKEY) == b"payload"
