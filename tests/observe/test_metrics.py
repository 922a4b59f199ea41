"""Counters and log-once (objcache/observe/metrics.py): an integration failure is counted
every time and logged once."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from objcache.observe.metrics import FailureLog


def test_an_integration_failure_is_counted_every_time_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counters: Counter[str] = Counter()
    failed = FailureLog(logging.getLogger("objcache.test"), "test", counters, "errors:", "%s: %r")
    with caplog.at_level(logging.DEBUG, logger="objcache.test"):
        for _ in range(3):
            failed("store", RuntimeError("boom"))
    assert counters == Counter({"errors:store": 3})
    levels = [r.levelno for r in caplog.records if r.name == "objcache.test"]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]
