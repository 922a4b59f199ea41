"""Where an entry lives inside a store: ``v1/<env>/<kind>/<shard>/<key>``.

The store's own prefix (the path of its URL) is prepended by the backend. ``<shard>`` is two
hex chars of a hash of the key, spreading load over S3 partitions; user keys are
percent-encoded so that any string (torch PGO keys contain job names) becomes one safe path
segment. A key whose encoded segment would be longer than :data:`MAX_PLAIN_SEGMENT` is
stored under a bounded name instead: a readable head of the encoded key, ``~``, and the
BLAKE2b-256 of the whole key (docs/architecture.md, "Long keys"), so every key the API
accepts fits every backend's name limits (255-byte path components, 1,024-byte S3 and GCS
object names) and no two keys share a name.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from urllib.parse import quote, unquote

LAYOUT_VERSION = "v1"
ENV_FILE = "ENV.json"
#: Longest key any backend accepts (S3 allows 1024 bytes including the prefix).
MAX_KEY_BYTES = 900

#: Every kind objcache itself stores (docs/torch.md, "Keys"; docs/architecture.md). The
#: modules that write them keep their own constants; tests/cli/test_cli.py checks each is here.
#: Client code may store kinds of its own (``client.put("blob", ...)``).
KINDS: tuple[str, ...] = (
    "aot-autograd",
    "aot-card",
    "autotune",
    "bundled-autotune",
    "fx-card",
    "fx-graph",
    "isa-probe",
    "kernel",
    "kernel-place",
    "manifest",
    "mega",
    "miss-cards",
    "pgo",
    "precompile",
    "run",
    "triton",
    "triton-host",
    "vllm-aot",
    "vllm-modelinfo",
)

_SAFE = "-_.:=+@~"
#: Ends the folder segment holding a key's guarded candidates. ``encode_key`` always
#: percent-encodes "!", so ``<encoded key>!`` can never be a single-value key segment.
CANDIDATES_MARK = "!"


def shard(key: str) -> str:
    return hashlib.blake2b(key.encode(), digest_size=1).hexdigest()


#: Longest encoded key stored under its own name. Longer ones are mapped (:func:`encode_key`)
#: to names of 183 to 185 bytes: always longer than this, so a mapped name is never the name
#: of a key stored as it is, and short enough that ``<name>!`` (a candidates folder) and a
#: node lease's file name beside it stay inside a 255-byte path component.
MAX_PLAIN_SEGMENT = 180
#: Bytes of the encoded key kept at the head of a mapped name, for people reading listings.
MAPPED_HEAD = 120
#: Separates the head of a mapped name from the hex digest of the whole key.
MAPPED_MARK = "~"


def encode_key(key: str) -> str:
    """One bounded path segment naming ``key``: the key percent-encoded (round-trips through
    :func:`decode_key`) or, when that is longer than :data:`MAX_PLAIN_SEGMENT` bytes, its
    first :data:`MAPPED_HEAD` bytes, ``~`` and the BLAKE2b-256 of the whole key."""
    seg = quote(key, safe=_SAFE)
    # "." and ".." are not valid segments; quote() leaves them alone.
    if seg in (".", ".."):
        return seg.replace(".", "%2E")
    if len(seg) <= MAX_PLAIN_SEGMENT:
        return seg
    head = seg[:MAPPED_HEAD]
    escape = head.rfind("%", MAPPED_HEAD - 2)
    if escape != -1:  # never cut a %XX escape in two
        head = head[:escape]
    digest = hashlib.blake2b(key.encode(), digest_size=32).hexdigest()
    return f"{head}{MAPPED_MARK}{digest}"


def decode_key(segment: str) -> str:
    """The key of a plain segment; for a mapped one, its readable head and digest."""
    return unquote(segment)


@dataclass(frozen=True)
class Namespace:
    """The key space of one environment."""

    env: str

    @property
    def root(self) -> str:
        return f"{LAYOUT_VERSION}/{self.env}"

    def object_key(self, kind: str, key: str) -> str:
        if not kind or not all(c.isalnum() or c == "-" for c in kind):
            raise ValueError(f"bad kind {kind!r}")
        return f"{self.root}/{kind}/{shard(key)}/{encode_key(key)}"

    def object_prefix(self, kind: str, key: str) -> str:
        """Folder of the content-addressed candidates of ``key``: ``.../<shard>/<key>!/``.

        One LIST of this prefix (a directory listing on disk and file://, a SCAN on Redis)
        finds every candidate; it never matches a single-value key or another key's folder.
        """
        single = self.object_key(kind, key)
        return f"{single}{CANDIDATES_MARK}/"

    def candidate_key(self, kind: str, key: str, digest: str) -> str:
        if not digest or not all(c in "0123456789abcdef" for c in digest):
            raise ValueError(f"bad candidate digest {digest!r}")
        return f"{self.object_prefix(kind, key)}{digest}"

    def kind_prefix(self, kind: str) -> str:
        return f"{self.root}/{kind}/"

    @property
    def env_file(self) -> str:
        return f"{self.root}/{ENV_FILE}"


def parse_object_key(object_key: str) -> tuple[str, str, str] | None:
    """``(env, kind, key)`` of an object key made by :meth:`Namespace.object_key`.

    A candidate (:meth:`Namespace.candidate_key`) parses as ``(env, kind, "<key>/<digest>")``.
    Anything with an empty, ``.`` or ``..`` segment is None: such a key names no entry and,
    used as a path, would leave the store (docs/security.md, "Local filesystem").
    """
    parts = object_key.split("/")
    if parts[0] != LAYOUT_VERSION or any(p in ("", ".", "..") for p in parts):
        return None
    if len(parts) == 6 and parts[4].endswith(CANDIDATES_MARK) and parts[5]:
        _, env, kind, _, seg, digest = parts
        return env, kind, f"{decode_key(seg[: -len(CANDIDATES_MARK)])}/{digest}"
    if len(parts) != 5:
        return None
    _, env, kind, _, seg = parts
    return env, kind, decode_key(seg)
