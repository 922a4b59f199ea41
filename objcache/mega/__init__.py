"""The documented name of :mod:`objcache.integrations.torch.mega.mega` (docs/torch.md, "Mega-Cache
bundles"): ``objcache.mega.save(name)`` / ``load(name)`` / ``list_bundles()``."""

import sys

from objcache.integrations.torch.mega import mega

sys.modules[__name__] = mega
