"""Trust configuration and the entry's binding to its name (docs/security.md).

Keys that are set but empty or short are configuration errors, never a silent switch-off
of verification.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from objcache.codec import Codec
from objcache.config import Config
from objcache.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
GOOD_KEY = "k" * 32


# --- empty and short keys --------------------------------------------------------------


@pytest.mark.parametrize("raw", ["", " ", " , ", ",,"])
def test_set_but_empty_signing_key_is_a_config_error(raw: str) -> None:
    with pytest.raises(ConfigError, match="OBJCACHE_SIGNING_KEY is set but holds no key"):
        Config.from_env({"OBJCACHE_SIGNING_KEY": raw})


def test_short_signing_key_is_a_config_error_without_echoing_it() -> None:
    with pytest.raises(ConfigError, match=r"OBJCACHE_SIGNING_KEY: .*at least 32 bytes") as exc:
        Config.from_env({"OBJCACHE_SIGNING_KEY": f"{GOOD_KEY},shortsecret"})
    assert "shortsecret" not in str(exc.value)
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        Config(signing_keys=(b"x",))
    with pytest.raises(ValueError, match="at least 32 bytes"):
        Codec(signing_keys=(b"x",))


def test_key_file_set_but_empty_or_short(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="OBJCACHE_SIGNING_KEY_FILE is set but empty"):
        Config.from_env({"OBJCACHE_SIGNING_KEY_FILE": " "})
    blank = tmp_path / "blank"
    blank.write_text("\n \n")
    with pytest.raises(ConfigError, match="holds no key"):
        Config.from_env({"OBJCACHE_SIGNING_KEY_FILE": str(blank)})
    short = tmp_path / "short"
    short.write_text(f"{GOOD_KEY}\nshortsecret\n")
    with pytest.raises(ConfigError, match=r"OBJCACHE_SIGNING_KEY_FILE: .*at least 32") as exc:
        Config.from_env({"OBJCACHE_SIGNING_KEY_FILE": str(short)})
    assert "shortsecret" not in str(exc.value)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJCACHE_")}
    env.update(
        PYTHONPATH=str(ROOT),
        OBJCACHE_TIERS=f"file://{tmp_path}/store",
        OBJCACHE_LOCAL_DIR=str(tmp_path / "local"),
        OBJCACHE_STATS_FILE=str(tmp_path / "stats.json"),
        OBJCACHE_PREFETCH="0",
    )
    env.update(extra)
    return env


def test_doctor_reports_an_empty_key_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "objcache.cli", "doctor"],
        env=_env(tmp_path, OBJCACHE_SIGNING_KEY=" , "),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "OBJCACHE_SIGNING_KEY is set but holds no key" in lines[0]


TORCH_PROBE = """
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
import objcache
objcache.install()
import torch._inductor.config as c
from objcache.integrations.torch import hooks
print(hooks.installed(), c.fx_graph_remote_cache)
"""


def test_torch_integration_stays_off_on_a_config_error(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, "-c", TORCH_PROBE],
        env=_env(tmp_path, OBJCACHE_SIGNING_KEY=""),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[0] == "False", proc.stdout
    assert proc.stdout.split()[1] != "True", proc.stdout
    notes = [line for line in proc.stderr.splitlines() if "OBJCACHE_SIGNING_KEY" in line]
    assert len(notes) == 1, proc.stderr[-2000:]
    assert "stay off" in notes[0]
