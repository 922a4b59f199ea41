"""Key material: HMAC secrets and their minimum length (docs/security.md, "Signing entries").

A key variable that is set but holds nothing (a secret that failed to mount) or a key too
short to resist guessing is a configuration error, never a silent switch-off of
verification. Errors name the variable and never echo a key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from objcache.errors import ConfigError

#: Shortest HMAC key accepted: 256 bits, SHA-256's output size (``openssl rand -hex 32``
#: gives 64 characters).
MIN_HMAC_KEY_BYTES = 32


def short_key_message(where: str) -> str:
    return f"{where}: every HMAC key must be at least {MIN_HMAC_KEY_BYTES} bytes"


def check_hmac_keys(keys: Iterable[bytes], where: str) -> tuple[bytes, ...]:
    """``keys`` as a tuple, or a :class:`ConfigError` naming ``where`` if one is short."""
    out = tuple(keys)
    if any(len(k) < MIN_HMAC_KEY_BYTES for k in out):
        raise ConfigError(short_key_message(where))
    return out


def parse_hmac_keys(raw: str, where: str, sep: str = ",") -> tuple[bytes, ...]:
    """Non-empty keys of a ``sep``-separated list; set but empty is an error."""
    keys = tuple(k.strip().encode() for k in raw.split(sep) if k.strip())
    if not keys:
        raise ConfigError(f"{where} is set but holds no key")
    return check_hmac_keys(keys, where)


def hmac_key_id(key: bytes) -> str:
    """A short name of an HMAC key for people (``objcache doctor``): ``hmac:<8 hex>``, a
    hash that tells keys apart and reveals nothing of the key."""
    return "hmac:" + hashlib.sha256(b"objcache key id\0" + key).hexdigest()[:8]
