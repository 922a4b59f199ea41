"""The entry format every tier stores (docs/architecture.md, "Entry format").

::

    offset size
    0      4    magic b"OBJC"
    4      1    format version (2)
    5      1    codec (0 raw, 1 zstd)
    6      1    signature scheme (0 none, 1 HMAC-SHA256, 2 Ed25519)
    7      1    reserved (0)
    8      8    uncompressed payload length, big endian
    16     32   BLAKE2b-256 of the object key (length-prefixed) and the stored payload bytes
    48     N    signature over bytes 0..48 (N = 0 unsigned, 32 HMAC-SHA256, 64 Ed25519)
    48+N   ...  stored payload

The digest covers the *stored* bytes so that nothing unverified ever reaches the zstd
decoder, let alone pickle, and the object key (``v1/<env>/<kind>/<shard>/<key>``: kind, key
and environment), so an entry copied under another name is refused. The signature covers
the whole header, digest included, hence the key and the payload too: a signed entry can
be neither re-labelled nor moved without the key. Version-1 entries (digest and HMAC
without the key) are refused as ``version``: they cannot show which name they belong to.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import zstandard

from objcache.entry.hmac_keys import MIN_HMAC_KEY_BYTES, short_key_message
from objcache.entry.signing import SIGNATURE_SIZE
from objcache.entry.signing import verifies as ed25519_verifies
from objcache.errors import (
    BadSignature,
    CorruptEntry,
    OversizedEntry,
    UnsignedEntry,
    UnsupportedVersion,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

MAGIC = b"OBJC"
VERSION = 2
CODEC_RAW = 0
CODEC_ZSTD = 1
SIG_NONE = 0
SIG_HMAC = 1
SIG_ED25519 = 2
_HEAD = struct.Struct(">4sBBBBQ32s")
HEADER_SIZE = _HEAD.size  # 48
MAC_SIZE = 32
#: Payloads shorter than this are stored raw: zstd's frame overhead would not pay off.
MIN_COMPRESS = 256
#: Refuse to allocate more than this for one entry, whatever the header claims.
MAX_PAYLOAD = 8 << 30
#: The most bytes a zstd frame's header takes (its content size is read from them).
_FRAME_HEAD = 18


@dataclass(frozen=True)
class Codec:
    """Encoder/decoder bound to a compression level and keys (docs/security.md).

    ``signer`` (an Ed25519 private key) signs if set, else ``signing_keys[0]`` (HMAC).
    Ed25519 entries verify against ``verify_keys`` and the signer's own public key; HMAC
    entries against every key in ``signing_keys`` (key rotation window). With any key at
    all, unsigned entries and entries of a scheme no configured key can check are refused.
    With no keys, entries are unsigned, and signed entries are still accepted if their
    digest checks out (the signature is not verifiable without a key).
    """

    level: int = 3
    signing_keys: Sequence[bytes] = ()
    signer: Ed25519PrivateKey | None = field(default=None, repr=False)
    verify_keys: tuple[Ed25519PublicKey, ...] = field(default=(), repr=False)
    _public: tuple[Ed25519PublicKey, ...] = field(init=False, default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if any(len(k) < MIN_HMAC_KEY_BYTES for k in self.signing_keys):
            raise ValueError(short_key_message("signing_keys"))
        own = (self.signer.public_key(),) if self.signer is not None else ()
        object.__setattr__(self, "_public", tuple(self.verify_keys) + own)

    @property
    def signs(self) -> bool:
        """Whether new entries are signed."""
        return self.signer is not None or bool(self.signing_keys)

    @property
    def verifies(self) -> bool:
        """Whether any key is configured: then unsigned entries are refused."""
        return bool(self.signing_keys or self._public)

    def encode(self, payload: bytes, okey: str) -> bytes:
        """The entry storing ``payload`` under object key ``okey`` (and only there)."""
        codec, stored = CODEC_RAW, payload
        if len(payload) >= MIN_COMPRESS:
            compressed = _compressor(self.level).compress(payload)
            if len(compressed) < len(payload):
                codec, stored = CODEC_ZSTD, compressed
        if self.signer is not None:
            scheme = SIG_ED25519
        else:
            scheme = SIG_HMAC if self.signing_keys else SIG_NONE
        digest = _digest(okey, stored)
        header = _HEAD.pack(MAGIC, VERSION, codec, scheme, 0, len(payload), digest)
        if scheme == SIG_NONE:
            return header + stored
        if self.signer is not None:
            signature = self.signer.sign(header)
        else:
            signature = _mac(self.signing_keys[0], header)
        return b"".join((header, signature, stored))

    def verify(self, entry: bytes | memoryview, okey: str, max_payload: int = MAX_PAYLOAD) -> None:
        """Check an entry without decoding it (bulk copies store the verified bytes as they
        are): raises the :class:`~objcache.errors.EntryError` that :meth:`decode` would,
        ``max_payload`` (its kind's cap) included."""
        self._check(memoryview(entry), okey, max_payload)

    def decode(
        self,
        entry: bytes | memoryview,
        okey: str,
        max_payload: int = MAX_PAYLOAD,
        *,
        signature: bool = True,
    ) -> bytes:
        """The payload stored under object key ``okey``, or a typed
        :class:`~objcache.errors.EntryError`.

        A payload longer than ``max_payload`` (its kind's cap, docs/security.md) is refused
        before anything is decompressed. ``signature=False`` skips the signature check (and
        the refusal of unsigned entries) but never the digest and its binding to ``okey``:
        local-tier hits, whose entries were verified when they entered the machine
        (docs/security.md, "What each read checks")."""
        codec, length, stored = self._check(memoryview(entry), okey, max_payload, signature)
        if codec == CODEC_RAW:
            return bytes(stored)
        try:
            out = _decompressor().decompress(stored, max_output_size=length)
        except zstandard.ZstdError as exc:
            raise CorruptEntry(f"zstd: {exc}") from None
        if len(out) != length:
            raise CorruptEntry("decompressed length mismatch")
        return out

    def _signature_ok(self, scheme: int, header: memoryview, signature: memoryview) -> bool:
        if scheme == SIG_HMAC:
            return any(hmac.compare_digest(_mac(k, header), signature) for k in self.signing_keys)
        return ed25519_verifies(self._public, bytes(signature), bytes(header))

    def _check(
        self,
        view: memoryview,
        okey: str,
        max_payload: int = MAX_PAYLOAD,
        signature: bool = True,
    ) -> tuple[int, int, memoryview]:
        """Header, digest and signature checks: (codec, payload length, stored bytes)."""
        head = self._header(view, max_payload)
        if len(view) < head.start:
            raise CorruptEntry("entry truncated inside its signature")
        stored = view[head.start :]
        self._settle(
            head, view, _digest(okey, stored), len(stored), stored[:_FRAME_HEAD], signature
        )
        return head.codec, head.length, stored

    def stream_check(self, okey: str, max_payload: int = MAX_PAYLOAD) -> StreamCheck:
        """:meth:`verify` of an entry handed over in pieces (:class:`StreamCheck`)."""
        return StreamCheck(self, okey, max_payload)

    def _header(self, view: memoryview, max_payload: int) -> _Header:
        """The fixed header's fields, checked (``view`` holds at least its first bytes)."""
        if len(view) < HEADER_SIZE:
            raise CorruptEntry(f"entry too short ({len(view)} bytes)")
        magic, version, codec, scheme, reserved, length, digest = _HEAD.unpack_from(view)
        if magic != MAGIC:
            raise CorruptEntry("bad magic")
        if version != VERSION:
            raise UnsupportedVersion(f"entry format version {version}, this reader knows 2")
        if codec not in (CODEC_RAW, CODEC_ZSTD) or scheme not in _SIG_SIZE or reserved:
            raise CorruptEntry("bad header fields")
        if length > MAX_PAYLOAD:
            raise CorruptEntry(f"declared length {length} exceeds the limit")
        if length > max_payload:
            raise OversizedEntry(f"payload of {length} bytes is over the {max_payload} cap")
        return _Header(codec, scheme, length, digest, HEADER_SIZE + _SIG_SIZE[scheme])

    def _settle(
        self,
        head: _Header,
        view: memoryview,
        digest: bytes,
        stored_size: int,
        first: memoryview | bytes,
        signature: bool,
    ) -> None:
        """The checks after the header: the stored bytes' ``digest`` (bound to the key), the
        signature over ``view``'s header and signature bytes, and the payload length against
        the stored bytes (``stored_size``; ``first``: their first bytes, a zstd frame's
        header)."""
        if not hmac.compare_digest(digest, head.digest):
            # Either damaged bytes or a valid entry of another name (substituted).
            raise CorruptEntry("digest mismatch: damaged, or stored under another key")
        if signature and self.verifies:
            if head.scheme == SIG_NONE:
                raise UnsignedEntry("entry is not signed and a signing key is configured")
            if not self._signature_ok(
                head.scheme, view[:HEADER_SIZE], view[HEADER_SIZE : head.start]
            ):
                raise BadSignature("entry signature matches no configured key")
        if head.codec == CODEC_RAW and stored_size != head.length:
            raise CorruptEntry("raw payload length mismatch")
        if head.codec == CODEC_ZSTD:
            # Unsigned, the header's codec and length are outside the digest: the zstd frame
            # records its content size (inside the digest), so both are checked without
            # decompressing, and verify() refuses what decode() would.
            try:
                framed = zstandard.frame_content_size(first)
            except zstandard.ZstdError:
                raise CorruptEntry("payload is not a zstd frame") from None
            if framed != head.length:
                raise CorruptEntry("declared length differs from the zstd frame's")


@dataclass(frozen=True)
class _Header:
    codec: int
    scheme: int
    length: int
    digest: bytes
    start: int  # where the stored bytes begin (after the signature)


class StreamCheck:
    """:meth:`Codec.verify` of an entry that arrives in pieces (a large entry written to its
    local file as it is received, docs/architecture.md, "Streamed entries"): :meth:`feed`
    each piece in order, then :meth:`finish`, which raises what ``verify`` raises for the
    whole. The header is checked as soon as it is in (a declared length over the cap stops
    the transfer at its first piece); the stored bytes are hashed as they pass, never held.
    Not thread-safe: one thread at a time (pieces may be fed from a worker thread)."""

    def __init__(self, codec: Codec, okey: str, max_payload: int) -> None:
        self._codec, self._max_payload = codec, max_payload
        self._head = bytearray()
        self._parsed: _Header | None = None
        self._hash = _digest_start(okey)
        self._first = bytearray()
        self._stored = 0

    def feed(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view and self._in_header():
            want = HEADER_SIZE if self._parsed is None else self._parsed.start
            take = want - len(self._head)
            self._head += view[:take]
            view = view[take:]
            if self._parsed is None and len(self._head) == HEADER_SIZE:
                self._parsed = self._codec._header(memoryview(self._head), self._max_payload)
        if view:
            if len(self._first) < _FRAME_HEAD:
                self._first += view[: _FRAME_HEAD - len(self._first)]
            self._hash.update(view)
            self._stored += len(view)

    @property
    def length(self) -> int | None:
        """The payload's length the header declares (None before the header is in)."""
        return None if self._parsed is None else self._parsed.length

    def _in_header(self) -> bool:
        return self._parsed is None or len(self._head) < self._parsed.start

    def finish(self, *, signature: bool = True) -> None:
        """The checks that need the whole entry (digest, signature, lengths)."""
        head = self._parsed
        if head is None:
            raise CorruptEntry(f"entry too short ({len(self._head)} bytes)")
        if len(self._head) < head.start:
            raise CorruptEntry("entry truncated inside its signature")
        view = memoryview(bytes(self._head))
        self._codec._settle(
            head, view, self._hash.digest(), self._stored, bytes(self._first), signature
        )


#: Signature bytes after the header, per scheme.
_SIG_SIZE = {SIG_NONE: 0, SIG_HMAC: MAC_SIZE, SIG_ED25519: SIGNATURE_SIZE}


def _digest(okey: str, stored: bytes | memoryview) -> bytes:
    """BLAKE2b-256 binding the stored bytes to their object key (length-prefixed, so no
    key/payload split is ambiguous)."""
    h = _digest_start(okey)
    h.update(stored)
    return h.digest()


def _digest_start(okey: str) -> hashlib.blake2b:
    """:func:`_digest`'s hash with the key in, waiting for the stored bytes."""
    name = okey.encode()
    h = hashlib.blake2b(len(name).to_bytes(2, "big"), digest_size=32)
    h.update(name)
    return h


def _mac(key: bytes, header: bytes | memoryview) -> bytes:
    """HMAC-SHA256 of the header: its digest already covers the key and payload."""
    return hmac.new(key, header, hashlib.sha256).digest()


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
