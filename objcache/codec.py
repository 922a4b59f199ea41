"""The entry format every tier stores (docs/architecture.md, "Entry format").

::

    offset size
    0      4    magic b"OBJC"
    4      1    format version (1)
    5      1    codec (0 raw, 1 zstd)
    6      1    flags (bit 0: signed)
    7      1    reserved (0)
    8      8    uncompressed payload length, big endian
    16     32   BLAKE2b-256 of the stored payload bytes (after compression)
    48     32   HMAC-SHA256 over bytes 0..48 and the stored payload (only when signed)
    48|80  ...  stored payload

The digest covers the *stored* bytes so that nothing unverified ever reaches the zstd
decoder, let alone pickle. Decompression is bounded by the declared length. The HMAC covers
the header too, so a signed entry cannot be re-labelled (codec, length) without the key.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import zstandard

from objcache.errors import BadSignature, CorruptEntry, UnsignedEntry, UnsupportedVersion

MAGIC = b"OBJC"
VERSION = 1
CODEC_RAW = 0
CODEC_ZSTD = 1
FLAG_SIGNED = 1
_HEAD = struct.Struct(">4sBBBBQ32s")
HEADER_SIZE = _HEAD.size  # 48
MAC_SIZE = 32
#: Payloads shorter than this are stored raw: zstd's frame overhead would not pay off.
MIN_COMPRESS = 256
#: Refuse to allocate more than this for one entry, whatever the header claims.
MAX_PAYLOAD = 8 << 30


@dataclass(frozen=True)
class Codec:
    """Encoder/decoder bound to a compression level and signing keys.

    ``signing_keys[0]`` signs; every key in the list verifies (key rotation window).
    With no keys, entries are unsigned, and signed entries are still accepted if their
    digest checks out (the HMAC is not verifiable without a key).
    """

    level: int = 3
    signing_keys: Sequence[bytes] = ()

    @property
    def signs(self) -> bool:
        return bool(self.signing_keys)

    def encode(self, payload: bytes) -> bytes:
        codec, stored = CODEC_RAW, payload
        if len(payload) >= MIN_COMPRESS:
            compressed = _compressor(self.level).compress(payload)
            if len(compressed) < len(payload):
                codec, stored = CODEC_ZSTD, compressed
        flags = FLAG_SIGNED if self.signs else 0
        digest = hashlib.blake2b(stored, digest_size=32).digest()
        header = _HEAD.pack(MAGIC, VERSION, codec, flags, 0, len(payload), digest)
        if not self.signs:
            return header + stored
        mac = _mac(self.signing_keys[0], header, stored)
        return b"".join((header, mac, stored))

    def verify(self, entry: bytes | memoryview) -> None:
        """Check an entry without decoding it (bulk copies store the verified bytes as they
        are): raises the :class:`~objcache.errors.EntryError` that :meth:`decode` would."""
        self._check(memoryview(entry))

    def decode(self, entry: bytes | memoryview) -> bytes:
        """The original payload, or a typed :class:`~objcache.errors.EntryError`."""
        codec, length, stored = self._check(memoryview(entry))
        if codec == CODEC_RAW:
            return bytes(stored)
        try:
            out = _decompressor().decompress(stored, max_output_size=length)
        except zstandard.ZstdError as exc:
            raise CorruptEntry(f"zstd: {exc}") from None
        if len(out) != length:
            raise CorruptEntry("decompressed length mismatch")
        return out

    def _check(self, view: memoryview) -> tuple[int, int, memoryview]:
        """Header, digest and signature checks: (codec, payload length, stored bytes)."""
        if len(view) < HEADER_SIZE:
            raise CorruptEntry(f"entry too short ({len(view)} bytes)")
        magic, version, codec, flags, reserved, length, digest = _HEAD.unpack_from(view)
        if magic != MAGIC:
            raise CorruptEntry("bad magic")
        if version != VERSION:
            raise UnsupportedVersion(f"entry format version {version}, this reader knows 1")
        if codec not in (CODEC_RAW, CODEC_ZSTD) or flags & ~FLAG_SIGNED or reserved:
            raise CorruptEntry("bad header fields")
        if length > MAX_PAYLOAD:
            raise CorruptEntry(f"declared length {length} exceeds the limit")
        signed = bool(flags & FLAG_SIGNED)
        start = HEADER_SIZE + (MAC_SIZE if signed else 0)
        if len(view) < start:
            raise CorruptEntry("entry truncated inside its signature")
        stored = view[start:]
        if not hmac.compare_digest(hashlib.blake2b(stored, digest_size=32).digest(), digest):
            raise CorruptEntry("payload digest mismatch")
        if self.signs:
            if not signed:
                raise UnsignedEntry("entry is not signed and a signing key is configured")
            header, mac = view[:HEADER_SIZE], view[HEADER_SIZE:start]
            if not any(
                hmac.compare_digest(_mac(k, header, stored), mac) for k in self.signing_keys
            ):
                raise BadSignature("entry signature matches no configured key")
        if codec == CODEC_RAW and len(stored) != length:
            raise CorruptEntry("raw payload length mismatch")
        if codec == CODEC_ZSTD:
            # Unsigned, the header's codec and length are outside the digest: the zstd frame
            # records its content size (inside the digest), so both are checked without
            # decompressing, and verify() refuses what decode() would.
            try:
                framed = zstandard.frame_content_size(stored)
            except zstandard.ZstdError:
                raise CorruptEntry("payload is not a zstd frame") from None
            if framed != length:
                raise CorruptEntry("declared length differs from the zstd frame's")
        return codec, length, stored


def _mac(key: bytes, header: bytes | memoryview, stored: bytes | memoryview) -> bytes:
    h = hmac.new(key, digestmod=hashlib.sha256)
    h.update(header)
    h.update(stored)
    return h.digest()


# zstd contexts are not thread-safe but are costly to build: keep one per thread.
_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache: dict[int, zstandard.ZstdCompressor] = _local.__dict__.setdefault("c", {})
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


def _decompressor() -> zstandard.ZstdDecompressor:
    d: zstandard.ZstdDecompressor | None = getattr(_local, "d", None)
    if d is None:
        d = _local.d = zstandard.ZstdDecompressor()
    return d
