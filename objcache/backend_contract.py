"""The documented name of :mod:`objcache.testing.backend_contract` (docs/architecture.md,
"Adding a backend"): ``from objcache.backend_contract import BackendContract``."""

import sys

from objcache.testing import backend_contract

sys.modules[__name__] = backend_contract
