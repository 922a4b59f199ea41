"""A third-party backend runs objcache's backend contract suite by subclassing it.

The suite is run the way another project would: from a folder outside this repository's
pytest configuration, pytest-asyncio in strict mode, with a backend defined there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT

DICT_BACKEND = '''
import time
from collections.abc import AsyncIterator

from objcache.backends.base import Backend, ObjectInfo, PutMode, TierSpec, validate_key


class DictBackend(Backend):
    """A third party's store: a dict, keeping the contract."""

    def __init__(self, name: str) -> None:
        super().__init__(TierSpec(url=name, scheme="dict", location="", path="", options={}))
        self.data: dict[str, tuple[bytes, float]] = {}

    async def get(self, key: str) -> bytes | None:
        found = self.data.get(validate_key(key))
        return None if found is None else found[0]

    async def put(self, key: str, data: bytes, mode: PutMode = PutMode.CREATE) -> bool:
        if mode is PutMode.CREATE and validate_key(key) in self.data:
            return False
        self.data[validate_key(key)] = (bytes(data), time.time())
        return True

    async def exists(self, key: str) -> bool:
        return validate_key(key) in self.data

    async def delete(self, key: str) -> bool:
        return self.data.pop(validate_key(key), None) is not None

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        for key, (value, mtime) in list(self.data.items()):
            if key.startswith(prefix):
                yield ObjectInfo(key, len(value), mtime)
'''

SUITE = """
from objcache.testing.backend_contract import BackendContract
from {module} import {cls}


class TestThirdParty(BackendContract):
    async def make_backend(self, request, unique):
        return {cls}(f"store://{{unique}}")
"""


def run_suite(tmp_path: Path, module: str, cls: str) -> tuple[int, int]:
    (tmp_path / "test_store.py").write_text(SUITE.format(module=module, cls=cls))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
         "--rootdir", str(tmp_path), "-o", "asyncio_mode=strict", "test_store.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    passed = re.search(r"(\d+) passed", out.stdout)
    failed = re.search(r"(\d+) failed", out.stdout)
    assert passed or failed, out.stdout[-3000:] + out.stderr[-3000:]
    return int(passed[1]) if passed else 0, int(failed[1]) if failed else 0


def test_a_backend_that_keeps_the_contract_passes_it(tmp_path: Path) -> None:
    (tmp_path / "dict_store.py").write_text(DICT_BACKEND)
    passed, failed = run_suite(tmp_path, "dict_store", "DictBackend")
    # every test of the contract that is not about records (the dict store keeps none)
    assert failed == 0 and passed >= 39, (passed, failed)


def test_a_backend_that_breaks_the_contract_fails_it(tmp_path: Path) -> None:
    """The in-process test double checks keys only on get and put: the suite says so."""
    passed, failed = run_suite(tmp_path, "tests.support.memory_backend", "MemoryBackend")
    assert failed > 0 and passed > 0
