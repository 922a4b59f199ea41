"""Configuration: one typed object, from ``OBJCACHE_*`` environment variables or keywords.

Every field carries its environment variable and help text in its metadata; the
configuration reference in ``docs/configuration.md`` is generated from them
(:mod:`objcache.config.reference`, ``python -m objcache.cli.docgen``) and a test keeps it
current.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from objcache.config import registry
from objcache.config.logs import LEVELS
from objcache.config.urls import TierSpec, parse_tier_list
from objcache.entry.caps import SizeCaps, parse_size
from objcache.entry.codec import Codec
from objcache.entry.hmac_keys import check_hmac_keys, hmac_key_id, parse_hmac_keys
from objcache.entry.signing import is_pem, key_id, load_private_key, parse_verify_keys
from objcache.errors import ConfigError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")
log = logging.getLogger("objcache")

#: Fields that take a byte count: digits with an optional k/m/g/t suffix, from the
#: environment or as a keyword string (one parser: :func:`objcache.entry.caps.parse_size`).
SIZE_FIELDS = ("local_max_bytes", "write_behind_max_bytes")

#: ``OBJCACHE_*`` variables that are not options but that objcache's own tools, tests and
#: benchmarks read: never reported as unknown.
INTERNAL_VARIABLES = frozenset(
    {
        "OBJCACHE_RUN_GROUP",  # objcache/observe/process_stats.py: the start a process is of
        "OBJCACHE_PROGRESS",  # the CLI's progress bar without a terminal
        "OBJCACHE_HYPOTHESIS_PROFILE",  # tests/support/hypothesis_profiles.py
        "OBJCACHE_TEST_SITE_DIR",  # tests/support/torch_runs.py
        "OBJCACHE_REPORT_SAMPLE",  # tests/cli/test_report.py
        "OBJCACHE_BENCH_AWS",  # bench/fleet.py
        "OBJCACHE_BENCH_S5CMD",  # bench/bulk.py
        "OBJCACHE_BENCH_PYSPY",  # bench/bulk.py --profile
    }
)

#: Words of the options that decide what is trusted or written (docs/security.md): a
#: variable near one of them that is no option is a configuration error, not a warning.
SECURITY_WORDS = ("VERIF", "SIGN", "READ_ONLY", "READONLY")


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "objcache"


def _opt(env: str, help: str, default: Any = None, **kw: Any) -> Any:
    # Runs only at import, while Config's class body is executed: mutmut switches mutants
    # per call after import and could never run one of these. The metadata is pinned by
    # test_configuration_reference_is_current instead.
    # pragma: no mutate block
    if "default_factory" in kw:
        return field(metadata={"env": env, "help": help}, **kw)
    return field(default=default, metadata={"env": env, "help": help}, **kw)


@dataclass(frozen=True)
class Config:
    """Everything objcache can be told. Unset fields take the documented defaults."""

    tiers: tuple[TierSpec, ...] = _opt(
        "OBJCACHE_TIERS",
        "Comma-separated remote tier URLs, nearest first: "
        + ", ".join(f"{name}://" for name in registry.schemes() if name != "disk")
        + " (s3://bucket/prefix, gs://bucket/prefix, file:///abs/dir). Per-tier options go in "
        "the query, e.g. ?read_only=1 (see Tier URL options below). "
        "Empty: a file:// store under the user cache dir (the embedded default).",
        default=(),
    )
    enable: bool = _opt(
        "OBJCACHE_ENABLE",
        "Route torch's remote caches through objcache in every process that imports torch, "
        "even with OBJCACHE_TIERS unset (then the embedded default store is used).",
        default=False,
    )
    triton: bool = _opt(
        "OBJCACHE_TRITON",
        "Also serve Triton's kernel cache from objcache (RemoteCacheManager); see docs/triton.md.",
        default=False,
    )
    local_dir: Path = _opt(
        "OBJCACHE_LOCAL_DIR",
        "The machine-local tier: verified entries, written through on every remote hit.",
        default_factory=lambda: user_cache_dir() / "local",
    )
    local_max_bytes: int = _opt(
        "OBJCACHE_LOCAL_MAX_BYTES",
        "Evict least-recently-used local entries above this many bytes (0: no limit). A byte "
        "count with an optional k/m/g/t (binary) suffix: `10G`, `512M`, `10GiB`, `1048576`.",
        default=10 << 30,
    )
    write_to: str = _opt(
        "OBJCACHE_WRITE_TO",
        "Which remote tiers new entries go to: 'all' writable tiers, or 'nearest' (the first "
        "healthy writable tier plus every tier marked ?home=1). Hits in far tiers are always "
        "back-filled into nearer ones.",
        default="all",
    )
    read_only: bool = _opt(
        "OBJCACHE_READ_ONLY",
        "Never write to remote tiers (fleet consumers of a CI-seeded store).",
        default=False,
    )
    signing_keys: tuple[bytes, ...] = _opt(
        "OBJCACHE_SIGNING_KEY",
        "HMAC key of at least 32 bytes (comma-separated list for rotation: the first signs, "
        "all verify). When set, unsigned or wrongly signed entries are refused before anything "
        "is unpickled. Set but empty (a secret that failed to mount) is an error.",
        default=(),
        repr=False,
    )
    signing_key_file: Path | None = _opt(
        "OBJCACHE_SIGNING_KEY_FILE",
        "Writers' key file. A PEM file (`objcache keygen`) is an Ed25519 private key: entries "
        "are signed with it. Any other file holds HMAC keys, one per line (first signs). "
        "Preferred over OBJCACHE_SIGNING_KEY. Set but empty, unreadable, or holding no key "
        "is an error.",
        default=None,
    )
    verify_keys: tuple[str, ...] = _opt(
        "OBJCACHE_VERIFY_KEYS",
        "Ed25519 public keys (`ed25519:<base64>` as `objcache keygen` prints them), "
        "comma-separated; several give a rotation window. Entries from remote tiers must be "
        "signed by one of them. Without a signing key as well, the process is read-only: the "
        "fleet verifies and writes nothing remote.",
        default=(),
    )
    max_entry_bytes: SizeCaps = _opt(
        "OBJCACHE_MAX_ENTRY_BYTES",
        "Largest entry accepted from a remote tier, per kind: `N[,kind=N...]` with k/m/g "
        "suffixes (`512M,pgo=1M`). Remote reads fetch at most cap+1 bytes (file:// checks the "
        "size first; Redis, S3 and GCS read a range) and the payload a zstd frame claims is "
        "checked before decompression. An entry over its cap is a `too_large` miss.",
        default=SizeCaps(),
    )
    timeout_ms: int = _opt(
        "OBJCACHE_TIMEOUT_MS",
        "Deadline of one remote call, retries included. A tier that misses it is a miss.",
        default=3000,
    )
    retries: int = _opt(
        "OBJCACHE_RETRIES",
        "Retries of a transient remote error (jittered exponential backoff, within the deadline).",
        default=2,
    )
    breaker_failures: int = _opt(
        "OBJCACHE_BREAKER_FAILURES",
        "Consecutive failures after which a tier is skipped (circuit breaker opens).",
        default=5,
    )
    breaker_cooldown_s: float = _opt(
        "OBJCACHE_BREAKER_COOLDOWN_S",
        "Seconds an open breaker waits before letting one probe call through.",
        default=30.0,
    )
    flush_timeout_s: float = _opt(
        "OBJCACHE_FLUSH_TIMEOUT_S",
        "At exit, wait at most this long for pending remote writes.",
        default=30.0,
    )
    write_behind_max_bytes: int = _opt(
        "OBJCACHE_WRITE_BEHIND_MAX_BYTES",
        "Bytes of pending remote writes kept in memory; beyond this writes are dropped "
        "(counted, logged once). A byte count with an optional k/m/g/t suffix (`512M`).",
        default=256 << 20,
    )
    compression_level: int = _opt(
        "OBJCACHE_COMPRESSION_LEVEL", "zstd level for new entries.", default=3
    )
    job: str | None = _opt(
        "OBJCACHE_JOB",
        "Job name for prefetch manifests (default: derived from the entry script).",
        default=None,
    )
    prefetch: bool = _opt(
        "OBJCACHE_PREFETCH",
        "At start-up, fetch the entries the last run of this job used into the local tier.",
        default=True,
    )
    bulk_processes: int = _opt(
        "OBJCACHE_BULK_PROCESSES",
        "Processes `objcache push`, `pull` and `pull --job` copy with, each a shard of the "
        'entries; 0: one per core, at most 4. See docs/architecture.md, "A bulk copy over '
        'processes".',
        default=0,
    )
    prefetch_process: bool = _opt(
        "OBJCACHE_PREFETCH_PROCESS",
        "Run the start-up prefetch from a network store (S3, GCS, Redis) in a child process, "
        "on another core, so that its requests, decoding and writes never take the "
        "interpreter from the compile it overlaps; lookups wait for the entries it brings. "
        'See docs/architecture.md, "The prefetch in its own process".',
        default=True,
    )
    node_single_flight: bool = _opt(
        "OBJCACHE_NODE_SINGLE_FLIGHT",
        "Processes sharing the local dir (the ranks of a node) fetch each missing entry once: "
        "the first takes a lease file beside the entry, the others wait for it to land "
        "(at most one deadline) and read it locally. See docs/architecture.md.",
        default=True,
    )
    guarded_candidates: bool = _opt(
        "OBJCACHE_GUARDED_CANDIDATES",
        "Store every guard variant of torch's FX graph and AOTAutograd entries as its own "
        "content-addressed candidate, and hand torch all of a key's candidates on a lookup "
        "(one LIST per tier, then concurrent GETs). 0: torch's one value per key.",
        default=True,
    )
    key_cards: bool = _opt(
        "OBJCACHE_KEY_CARDS",
        "Keep a key card (the components of torch's FX graph key, values redacted) of every "
        "lookup that missed everywhere and store one beside every entry published, for "
        "`objcache explain` (docs/troubleshooting.md). 0: none.",
        default=True,
    )
    triton_host: bool = _opt(
        "OBJCACHE_TRITON_HOST",
        "Carry the C extension modules Triton builds before its first kernel runs (the "
        "driver's utilities, kernel launchers): a new machine loads them instead of running "
        "the C compiler (docs/triton.md). 0: Triton builds them as without objcache.",
        default=True,
    )
    precompile: bool = _opt(
        "OBJCACHE_PRECOMPILE",
        "Turn on torch's caching precompile and carry its entries (Dynamo's bytecode, guards "
        "and compiled graphs per torch.compile'd function) through objcache, signed and keyed "
        "by the function's source: a new machine skips Dynamo's tracing. Off by default on "
        "every torch release: a served entry is checked against what torch guards and what "
        "objcache adds, and a program can depend on facts neither checks (a hook, a patched "
        'method, the world size; docs/torch.md, "Precompile entries", "Why it is opt-in").',
        default=False,
    )
    stats_file: Path | None = _opt(
        "OBJCACHE_STATS_FILE",
        "Where a process leaves its stats at exit for `objcache stats` "
        "(default: ~/.cache/objcache/last-stats.json).",
        default=None,
    )
    run_summary: bool = _opt(
        "OBJCACHE_RUN_SUMMARY",
        "At exit, write this run's summary (host, rank, hits and misses per kind and tier, "
        "bytes, lookup time) to the remote tiers for `objcache report --job`. Read-only "
        "configurations write none, unless OBJCACHE_SUMMARIES_URL is set. See "
        "docs/operations.md.",
        default=True,
    )
    summaries_url: TierSpec | None = _opt(
        "OBJCACHE_SUMMARIES_URL",
        "A tier URL that receives run summaries and nothing else, at exit (never read by "
        "lookups; it needs only create access). Set, each run's summary goes there instead "
        "of the remote tiers, under OBJCACHE_READ_ONLY too: a read-only fleet still reports, "
        "and its tiers still get no entry, record or manifest. `objcache report` reads it "
        "when no --tier is given. Unset: no separate location (read-only runs write no "
        "summary). See docs/operations.md.",
        default=None,
    )
    prometheus_textfile: Path | None = _opt(
        "OBJCACHE_PROMETHEUS_TEXTFILE",
        "Write this process's counters in the Prometheus text format to this file (for the "
        "node_exporter textfile collector) every OBJCACHE_PROMETHEUS_INTERVAL_S and at exit. "
        "Needs prometheus_client (the `metrics` extra). See docs/operations.md.",
        default=None,
    )
    prometheus_interval_s: float = _opt(
        "OBJCACHE_PROMETHEUS_INTERVAL_S",
        "Seconds between two writes of OBJCACHE_PROMETHEUS_TEXTFILE (0: only at exit).",
        default=15.0,
    )
    fingerprint_cache: bool = _opt(
        "OBJCACHE_FINGERPRINT_CACHE",
        "Cache torch's answers for the environment fingerprint per machine, so CLI runs skip "
        "`import torch` (re-asked whenever the torch install, CPU, GPUs or the variables torch "
        "reads change). Read from the environment only.",
        default=True,
    )
    log_level: str | None = _opt(
        "OBJCACHE_LOG_LEVEL",
        "Level of the `objcache` logger (DEBUG, INFO, WARNING, ERROR). Set, objcache logs to "
        "stderr unless the application has configured logging. Unset: the application's "
        "logging decides (Python's default shows WARNING and above).",
        default=None,
    )

    def __new__(cls, *args: Any, **kwargs: Any) -> Config:
        _check_keywords(kwargs)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if isinstance(self.tiers, str):
            object.__setattr__(self, "tiers", tuple(parse_tier_list(self.tiers, "tiers")))
        if isinstance(self.summaries_url, str):
            spec = _one_tier(self.summaries_url, "summaries_url")
            object.__setattr__(self, "summaries_url", spec)
        if isinstance(self.max_entry_bytes, str):
            caps = SizeCaps.parse(self.max_entry_bytes, "max_entry_bytes")
            object.__setattr__(self, "max_entry_bytes", caps)
        for name in ("local_dir", "stats_file", "signing_key_file", "prometheus_textfile"):
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, Path(getattr(self, name)))
        for name in SIZE_FIELDS:
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, parse_size(getattr(self, name), name))
        for name in (
            "timeout_ms",
            "local_max_bytes",
            "write_behind_max_bytes",
            "retries",
            "bulk_processes",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")
        if self.prometheus_interval_s < 0:
            raise ConfigError("prometheus_interval_s must be >= 0")
        if self.write_to not in ("all", "nearest"):
            raise ConfigError(f"write_to must be 'all' or 'nearest', got {self.write_to!r}")
        if self.log_level and self.log_level.upper() not in LEVELS:
            raise ConfigError(
                f"log_level must be one of {', '.join(LEVELS)}, got {self.log_level!r}"
            )
        if not 1 <= self.compression_level <= 22:
            raise ConfigError("compression_level must be in 1..22")
        check_hmac_keys(self.signing_keys, "OBJCACHE_SIGNING_KEY")
        if isinstance(self.verify_keys, str):
            object.__setattr__(self, "verify_keys", (self.verify_keys,))
        if self.verify_keys:
            parse_verify_keys(",".join(self.verify_keys), "OBJCACHE_VERIFY_KEYS")
            if not self.signing_keys and self.signing_key_file is None:
                object.__setattr__(self, "read_only", True)  # verify-only: the fleet

    # --- construction ------------------------------------------------------------------

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        """Read ``OBJCACHE_*`` variables; keyword overrides win. Errors name the variable."""
        environ = os.environ if environ is None else environ
        check_variables(environ)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            var = f.metadata["env"]
            if var in environ and f.name not in overrides:
                values[f.name] = _parse(f, environ[var], var)
        _check_keywords(overrides)
        values.update(overrides)
        config = cls(**values)
        if config.signing_key_file is not None and not config.signs_with_ed25519():
            config = dataclasses.replace(config, signing_keys=_read_keys(config.signing_key_file))
        return config

    def signs_with_ed25519(self) -> bool:
        """Whether the key file is an Ed25519 private key (PEM); checks it loads."""
        if self.signing_key_file is None:
            return False
        data = _read_key_file(self.signing_key_file)
        if not is_pem(data):
            return False
        load_private_key(data, "OBJCACHE_SIGNING_KEY_FILE")
        return True

    def codec(self) -> Codec:
        """The entry codec with this configuration's keys (docs/security.md)."""
        signer = None
        if self.signs_with_ed25519():
            assert self.signing_key_file is not None
            signer = load_private_key(
                _read_key_file(self.signing_key_file), "OBJCACHE_SIGNING_KEY_FILE"
            )
        verify = (
            parse_verify_keys(",".join(self.verify_keys), "OBJCACHE_VERIFY_KEYS")
            if self.verify_keys
            else ()
        )
        return Codec(
            level=self.compression_level,
            signing_keys=self.signing_keys,
            signer=signer,
            verify_keys=verify,
        )

    def trust(self) -> dict[str, Any]:
        """What is signed and verified, and whether remote writes happen: schemes and key ids
        only, never key material (``objcache doctor``; docs/security.md)."""
        codec = self.codec()
        signing: dict[str, Any] = {"scheme": "none", "key_ids": []}
        if codec.signer is not None:
            signing = {"scheme": "ed25519", "key_ids": [key_id(codec.signer.public_key())]}
        elif self.signing_keys:
            signing = {"scheme": "hmac", "key_ids": [hmac_key_id(self.signing_keys[0])]}
        ids = [key_id(k) for k in codec.verify_keys]
        if codec.signer is not None:
            ids.append(key_id(codec.signer.public_key()))
        ids += [hmac_key_id(k) for k in self.signing_keys]
        verification = {
            "key_ids": list(dict.fromkeys(ids)),
            "unsigned_refused": codec.verifies,
        }
        return {"signing": signing, "verification": verification, "read_only": self.read_only}

    @property
    def enabled(self) -> bool:
        """Whether the zero-code path should activate: tiers configured or explicit enable."""
        return self.enable or bool(self.tiers)

    def effective_tiers(self) -> tuple[TierSpec, ...]:
        """Configured remote tiers, or the embedded default file:// store."""
        if self.tiers:
            return self.tiers
        return tuple(parse_tier_list(f"file://{user_cache_dir() / 'store'}"))


def _check_keywords(given: Mapping[str, Any]) -> None:
    """An unknown keyword is a ConfigError naming it, with the closest field when one is."""
    names = [f.name for f in dataclasses.fields(Config)]
    for name in given:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"Config: unknown option {name!r}{hint}")


def option_variables() -> tuple[str, ...]:
    """Every ``OBJCACHE_*`` variable that is an option."""
    return tuple(f.metadata["env"] for f in dataclasses.fields(Config))


def unknown_variables(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """``OBJCACHE_*`` variables set in ``environ`` that are no option -> the closest option
    (None when none is close). objcache's internal variables are not reported."""
    environ = os.environ if environ is None else environ
    known = option_variables()
    found: dict[str, str | None] = {}
    for var in sorted(environ):
        if var.startswith("OBJCACHE_") and var not in known and var not in INTERNAL_VARIABLES:
            close = difflib.get_close_matches(var, known, n=1, cutoff=0.75)
            found[var] = close[0] if close else None
    return found


def _security_related(var: str, close: str | None) -> bool:
    """Whether ``var`` looks meant for an option that decides trust or writes."""
    words = (var.removeprefix("OBJCACHE_"), (close or "").removeprefix("OBJCACHE_"))
    return any(w in part for part in words if part for w in SECURITY_WORDS)


_warned: set[str] = set()


def check_variables(environ: Mapping[str, str]) -> None:
    """An ``OBJCACHE_*`` variable that is no option: a one-line warning with the closest
    option, once per process; a :class:`ConfigError` when it looks meant for a signing,
    verification or read-only option, so a misspelt guarantee never silently runs without
    it (docs/security.md, "Configuration that fails closed")."""
    for var, close in unknown_variables(environ).items():
        if _security_related(var, close):
            name = f"{var} is not an objcache option; did you mean {close}?" if close else var
            raise ConfigError(
                f"{name} (refusing to run without the signing, verification or read-only "
                "setting it looks meant for)"
            )
        if var in _warned:
            continue
        _warned.add(var)
        if close:
            log.warning(
                "objcache: %s is not an objcache option and is ignored; did you mean %s?",
                var,
                close,
            )
        else:
            log.warning("objcache: %s is not an objcache option and is ignored", var)


def _parse(f: dataclasses.Field[Any], raw: str, var: str) -> Any:
    kind = str(f.type)
    try:
        if f.name == "tiers":
            return tuple(parse_tier_list(raw, var))
        if f.name == "summaries_url":
            return _one_tier(raw, var)
        if f.name == "signing_keys":
            return parse_hmac_keys(raw, var)
        if f.name == "max_entry_bytes":
            return SizeCaps.parse(raw, var)
        if f.name in SIZE_FIELDS:
            return parse_size(raw, var)
        if f.name == "verify_keys":
            parse_verify_keys(raw, var)
            return tuple(k.strip() for k in raw.split(",") if k.strip())
        if f.name == "signing_key_file" and not raw.strip():
            raise ConfigError(f"{var} is set but empty")
        if kind == "bool":
            low = raw.strip().lower()
            if low not in _TRUE + _FALSE:
                raise ValueError(f"expected one of {'/'.join(_TRUE[:2] + _FALSE[:2])}")
            return low in _TRUE
        if kind == "int":
            return int(raw.strip())
        if kind == "float":
            return float(raw.strip())
        if "Path" in kind:
            if not raw.strip():
                return None if "None" in kind else Path(".")
            return Path(raw).expanduser()
        return raw or None if "None" in kind else raw
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"{var}={raw!r}: {exc}") from None


def _one_tier(raw: str, var: str) -> TierSpec | None:
    """One tier URL (empty: None)."""
    specs = parse_tier_list(raw, var)
    if len(specs) > 1:
        raise ConfigError(f"{var}: one tier URL, not {len(specs)}")
    return specs[0] if specs else None


def _read_key_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"OBJCACHE_SIGNING_KEY_FILE: cannot read {path}: {exc.strerror}"
        ) from None


def _read_keys(path: Path) -> tuple[bytes, ...]:
    lines = _read_key_file(path).decode(errors="replace").splitlines()
    if not any(line.strip() for line in lines):
        raise ConfigError(f"OBJCACHE_SIGNING_KEY_FILE: {path} holds no key")
    return parse_hmac_keys("\n".join(lines), "OBJCACHE_SIGNING_KEY_FILE", sep="\n")
