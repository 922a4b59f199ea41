"""Whether the zero-code path is on: the one reading of ``OBJCACHE_ENABLE`` and
``OBJCACHE_TIERS`` (docs/architecture.md, module table).

:mod:`.autoload` asks it before watching torch's imports, :mod:`.features` before reporting a
part as in force. It lives below both, importing nothing of objcache, so that
:mod:`.features` (which :mod:`.hooks` imports) never reaches :mod:`.autoload` (which imports
:mod:`.hooks` when a part applies).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the zero-code path is on: ``OBJCACHE_TIERS`` set, or ``OBJCACHE_ENABLE`` true.

    An explicit false ``OBJCACHE_ENABLE`` wins over ``OBJCACHE_TIERS``.
    """
    env = os.environ if environ is None else environ
    flag = env.get("OBJCACHE_ENABLE", "").strip().lower()
    if flag in _FALSE:
        return False
    return flag in _TRUE or bool(env.get("OBJCACHE_TIERS", "").strip())
