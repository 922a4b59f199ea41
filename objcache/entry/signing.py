"""Ed25519 keys through ``cryptography`` (docs/security.md, "Signing entries").

Writers (CI) hold a private key in ``OBJCACHE_SIGNING_KEY_FILE`` (PKCS#8 PEM, as
``objcache keygen`` writes it); the fleet holds only public keys in
``OBJCACHE_VERIFY_KEYS`` (``ed25519:<base64 of the 32 raw bytes>``, comma-separated: several
give a rotation window). A key file that starts with a PEM line is an Ed25519 private key;
any other key file keeps its old meaning, HMAC keys one per line.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from objcache.errors import ConfigError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

# ``cryptography`` (about 9 ms to import) is imported where a key is used: every compile
# process imports the codec, and only a fleet with keys set signs or verifies.

PUBLIC_PREFIX = "ed25519:"
SIGNATURE_SIZE = 64
_PEM = b"-----BEGIN"
_RAW_SIZE = 32

__all__ = [
    "Ed25519PrivateKey",
    "Ed25519PublicKey",
    "generate_key_file",
    "is_pem",
    "load_private_key",
    "parse_verify_keys",
    "public_line",
    "verifies",
]


def __getattr__(name: str) -> Any:
    """``Ed25519PrivateKey`` and ``Ed25519PublicKey``, imported at first use."""
    if name in ("Ed25519PrivateKey", "Ed25519PublicKey"):
        from cryptography.hazmat.primitives.asymmetric import ed25519

        return getattr(ed25519, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_pem(data: bytes) -> bool:
    """Whether a key file holds a PEM block (an Ed25519 private key), not HMAC lines."""
    return data.lstrip().startswith(_PEM)


def load_private_key(data: bytes, where: str) -> Ed25519PrivateKey:
    """The Ed25519 private key in PEM ``data``; a :class:`ConfigError` naming ``where``."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise ConfigError(f"{where}: not a readable unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{where}: the PEM key is not an Ed25519 key")
    return key


def public_line(key: Ed25519PublicKey) -> str:
    """The one-line form of a public key that ``OBJCACHE_VERIFY_KEYS`` takes."""
    from cryptography.hazmat.primitives import serialization

    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PUBLIC_PREFIX + base64.b64encode(raw).decode("ascii")


def key_id(key: Ed25519PublicKey) -> str:
    """A short name of a public key for people (``objcache doctor``): ``ed25519:<8 hex>``."""
    from cryptography.hazmat.primitives import serialization

    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:8]


def parse_verify_keys(raw: str, where: str) -> tuple[Ed25519PublicKey, ...]:
    """Comma-separated ``ed25519:<base64>`` public keys; set but empty is an error."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    keys = []
    for item in (p.strip() for p in raw.split(",")):
        if not item:
            continue
        try:
            if not item.startswith(PUBLIC_PREFIX):
                raise ValueError
            data = base64.b64decode(item[len(PUBLIC_PREFIX) :], validate=True)
            if len(data) != _RAW_SIZE:
                raise ValueError
            keys.append(Ed25519PublicKey.from_public_bytes(data))
        except (ValueError, binascii.Error):
            raise ConfigError(
                f"{where}: expected ed25519:<base64 of 32 bytes> (from objcache keygen)"
            ) from None
    if not keys:
        raise ConfigError(f"{where} is set but holds no key")
    return tuple(keys)


def verifies(keys: tuple[Ed25519PublicKey, ...], signature: bytes, message: bytes) -> bool:
    """Whether any of ``keys`` made ``signature`` over ``message``."""
    from cryptography.exceptions import InvalidSignature

    for key in keys:
        try:
            key.verify(signature, message)
            return True
        except InvalidSignature:
            continue
    return False


def generate_key_file(path: Path) -> str:
    """Write a new private key to ``path`` (mode 0600, never overwriting); its public line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return public_line(key.public_key())
