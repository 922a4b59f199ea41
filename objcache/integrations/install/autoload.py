"""Zero-code activation: cover every Python process that imports torch.

The package ships ``objcache-autoload.pth`` into site-packages. Its one line checks
``os.environ`` and, only when ``OBJCACHE_TIERS`` or ``OBJCACHE_ENABLE`` is set, imports this
module and calls :func:`activate`; with neither set nothing is imported at all. Importing
this module does nothing by itself. It never imports torch: :func:`activate` starts the
import watcher (:mod:`.import_watch`), which notices when each torch module objcache patches
is imported (:data:`.watched.WATCHED`) and applies that part of the install right after the
module has run. So ``import torch`` costs nothing extra,
and a process that never compiles never imports torch's compiler stack because of objcache.
Inductor's compile workers are Python processes too: they load the same ``.pth``.

``OBJCACHE_ENABLE=0`` (or false/no/off) switches the zero-code path off even when
``OBJCACHE_TIERS`` is set: a one-variable kill switch (:func:`.zero_code_switch.enabled`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from objcache.integrations.install import import_watch
from objcache.integrations.install.import_watch import disable
from objcache.integrations.install.watched import WATCHED
from objcache.integrations.install.zero_code_switch import enabled

__all__ = ["activate", "disable", "enabled"]


def activate(environ: Mapping[str, str] | None = None) -> bool:
    """Watch for torch's modules (or hook the ones already imported). Never raises."""
    try:
        if not enabled(environ):
            return False
        import_watch.watch()
        for name in WATCHED:
            if name in sys.modules:
                import_watch.apply(name)
        return True
    except Exception:
        import_watch.warn("objcache: zero-code activation failed")
        return False
