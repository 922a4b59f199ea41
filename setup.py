"""Build hook only (metadata lives in pyproject.toml): ship ``objcache-autoload.pth``.

A ``.pth`` file must sit at the top of site-packages, which package data cannot reach, so
``build_py`` writes it into the build root (wheels install it into purelib) and, for editable
installs, into the editable wheel. Its one line imports nothing unless ``OBJCACHE_TIERS`` or
``OBJCACHE_ENABLE`` is set, and then calls ``objcache.integrations.install.autoload.activate()``
(importing that module alone does nothing).
"""

from __future__ import annotations

import os
from typing import Any

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_NAME = "objcache-autoload.pth"
PTH_LINE = (
    "import os; (os.environ.get('OBJCACHE_TIERS') or os.environ.get('OBJCACHE_ENABLE')) "
    "and __import__('objcache.integrations.install.autoload')"
    ".integrations.install.autoload.activate()\n"
)


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        target = self.build_lib
        if getattr(self, "editable_mode", False):
            # editable_wheel points install_lib at the unpacked editable wheel.
            target = self.get_finalized_command("install").install_lib
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, PTH_NAME), "w") as f:
            f.write(PTH_LINE)

    def get_outputs(self, *args: Any, **kwargs: Any) -> list[str]:
        outputs = list(super().get_outputs(*args, **kwargs))
        if not getattr(self, "editable_mode", False):
            outputs.append(os.path.join(self.build_lib, PTH_NAME))
        return outputs


setup(cmdclass={"build_py": BuildPyWithPth})
