"""Where the checkout is, for tests at any depth under tests/ (no ``parents[N]`` per file)."""

from __future__ import annotations

from pathlib import Path

#: The repository root: the folder holding objcache/, backends/, tests/ and docs/.
ROOT: Path = Path(__file__).resolve().parents[2]
