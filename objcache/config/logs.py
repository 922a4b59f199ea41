"""The ``objcache`` logger's level and handler, from ``OBJCACHE_LOG_LEVEL`` (see
docs/troubleshooting.md): set, the logger takes that level, and when the application has not
configured logging (the root logger has no handler) objcache adds one stderr handler."""

from __future__ import annotations

import logging

LOGGER = "objcache"
HANDLER_NAME = "objcache-stderr"
FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def configure(level: str | None) -> None:
    """Apply ``level`` (None or empty: leave logging to the application)."""
    if not level:
        return
    logger = logging.getLogger(LOGGER)
    logger.setLevel(level.upper())
    if logging.getLogger().handlers:
        return  # the application's handlers get the records, at this level
    if not any(h.get_name() == HANDLER_NAME for h in logger.handlers):
        handler = logging.StreamHandler()  # stderr
        handler.set_name(HANDLER_NAME)
        handler.setFormatter(logging.Formatter(FORMAT))
        logger.addHandler(handler)
