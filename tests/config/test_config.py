"""Configuration and tier URLs: clear one-line errors naming the bad part."""

from __future__ import annotations

from pathlib import Path

import pytest

from objcache.config.reference import reference_markdown
from objcache.config.settings import Config, user_cache_dir
from objcache.config.urls import flag, parse_tier_list, parse_tier_url, redact
from objcache.entry.signing import generate_key_file
from objcache.errors import ConfigError
from tests.support.paths import ROOT

NEW = "k-new-0123456789abcdef0123456789abcdef"
OLD = "k-old-0123456789abcdef0123456789abcdef"


def test_unknown_scheme_names_the_index() -> None:
    with pytest.raises(ConfigError, match=r"^unknown scheme 'sx3' in OBJCACHE_TIERS\[1\]$"):
        Config.from_env({"OBJCACHE_TIERS": "redis://h:6379/0,sx3://bucket/p"})


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("file://relative/dir", "file:// path must be absolute"),
        ("s3://", "needs a bucket name"),
        ("s3://Bad_Bucket/p", "invalid bucket name"),
        ("redis://:6379/0", "needs a host"),
        ("redis://h:notaport/0", "cannot parse"),
        ("s3://bucket/p?timeout_ms=soon", "timeout_ms must be a non-negative integer"),
        ("bucket/prefix", "is not a URL"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_tier_list(url)


def test_good_urls_parse() -> None:
    tiers = parse_tier_list(
        "redis://cache:6379/0, s3://bucket/prefix/x?region=us-east-1&read_only=1,"
        " gs://gbucket/p, file:///mnt/efs/objcache"
    )
    assert [t.scheme for t in tiers] == ["redis", "s3", "gs", "file"]
    s3 = tiers[1]
    assert (s3.location, s3.path, s3.options["region"]) == ("bucket", "prefix/x", "us-east-1")
    assert tiers[3].path == "/mnt/efs/objcache"


def test_secrets_never_in_display() -> None:
    spec = parse_tier_url("redis://user:hunter2@cache:6379/0?ttl=5")
    assert "hunter2" not in spec.display and "ttl=5" in spec.display
    shown = redact("redis://user:hunter2@cache:6379/0?token=abc&ttl=5")
    assert "hunter2" not in shown and "abc" not in shown and "ttl=5" in shown
    assert redact("rediss://:pw@h:1/0") == "rediss://:***@h:1/0"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("file:///c?read_onyl=1", "unknown option 'read_onyl'; did you mean 'read_only'?"),
        (
            "s3://bucket/p?endpointurl=http://127.0.0.1:1",
            "unknown option 'endpointurl'; did you mean 'endpoint_url'?",
        ),
        ("s3://bucket/p?regoin=us-east-1", "unknown option 'regoin'; did you mean 'region'?"),
        ("redis://h:6379/0?timeout=5000", "unknown option 'timeout'; did you mean 'timeout_ms'?"),
        ("gs://bucket/p?zzz=1", "unknown option 'zzz' (known: project, endpoint,"),
        ("s3://bucket/p?read_only=yes please", "read_only must be 0/1/true/false"),
        ("redis://h:6379/0?ttl=soon", "ttl must be a non-negative integer"),
        ("s3://bucket/p?connect_timeout=0", "connect_timeout must be > 0"),
        ("redis://:hunt@er/zz@cache:6379/0", "percent-encode special characters"),
        ("redis://:hunt#er@w@cache:6379/0", "cannot parse the URL; percent-encode"),
    ],
)
def test_unknown_or_mistyped_tier_options_are_refused(url: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_tier_list(url)
    assert str(raised.value).startswith("OBJCACHE_TIERS[0]: ")
    assert message in str(raised.value)
    assert "hunt" not in str(raised.value), "no part of a password"


def test_unknown_config_keywords_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^Config: unknown option 'read_onyl'; did you mean"):
        Config(read_onyl=True)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"unknown option 'timout_ms'; did you mean 'timeout_ms'"):
        Config.from_env({}, timout_ms=5)
    with pytest.raises(ConfigError, match=r"^Config: unknown option 'zzz'$"):
        Config.from_env({}, zzz=1)


def test_tier_flags_parse_as_they_are_checked() -> None:
    """What validation accepts as true is true for the tier too (read_only=yes is read-only)."""
    from objcache.config.urls import flag

    for raw in ("1", "true", "yes", "", "TRUE"):
        assert flag(parse_tier_url(f"file:///c?read_only={raw}"), "read_only"), raw
    assert not flag(parse_tier_url("file:///c?read_only=0"), "read_only")
    assert not flag(parse_tier_url("file:///c"), "read_only")


def test_password_inside_an_endpoint_url_is_redacted() -> None:
    config = Config(tiers="s3://bucket/p?endpoint_url=http://minio:hunter2@127.0.0.1:9000")
    assert "hunter2" not in repr(config) and "hunter2" not in config.tiers[0].display
    assert "endpoint_url=http://***@127.0.0.1:9000" in config.tiers[0].display


def test_env_parsing_and_errors() -> None:
    c = Config.from_env(
        {
            "OBJCACHE_READ_ONLY": "yes",
            "OBJCACHE_TIMEOUT_MS": "250",
            "OBJCACHE_SIGNING_KEY": f"{NEW},{OLD}",
            "OBJCACHE_LOCAL_DIR": "/tmp/x",
        }
    )
    assert c.read_only and c.timeout_ms == 250
    assert c.signing_keys == (NEW.encode(), OLD.encode())
    assert c.local_dir == Path("/tmp/x")
    assert NEW not in repr(c)
    with pytest.raises(ConfigError, match="OBJCACHE_TIMEOUT_MS='soon'"):
        Config.from_env({"OBJCACHE_TIMEOUT_MS": "soon"})
    with pytest.raises(ConfigError, match="OBJCACHE_READ_ONLY"):
        Config.from_env({"OBJCACHE_READ_ONLY": "maybe"})


def test_keyword_tiers_and_default_store(tmp_path: Path) -> None:
    assert Config(tiers="s3://bk1/p").tiers[0].location == "bk1"  # type: ignore[arg-type]
    default = Config.from_env({}).effective_tiers()
    assert [t.scheme for t in default] == ["file"]
    assert not Config.from_env({}).enabled
    assert Config.from_env({"OBJCACHE_ENABLE": "1"}).enabled


def test_signing_key_file(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text(f"{NEW}\n{OLD}\n")
    c = Config.from_env({"OBJCACHE_SIGNING_KEY_FILE": str(f)})
    assert c.signing_keys == (NEW.encode(), OLD.encode())
    with pytest.raises(ConfigError, match="cannot read"):
        Config.from_env({"OBJCACHE_SIGNING_KEY_FILE": str(tmp_path / "missing")})


def test_configuration_reference_is_current() -> None:
    doc = ROOT / "docs" / "configuration.md"
    assert doc.read_text() == reference_markdown(), "run: make docs"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", False),
        ("?read_only", True),
        ("?read_only=1", True),
        ("?read_only=TRUE", True),
        ("?read_only=true", True),
        ("?read_only=0", False),
        ("?read_only=false", False),
        ("?home=1", False),
    ],
)
def test_boolean_tier_options(query: str, expected: bool) -> None:
    assert flag(parse_tier_url(f"file:///srv/cache{query}"), "read_only") is expected


def test_a_tier_list_accepts_schemes_registered_by_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    from objcache.config import registry
    from objcache.config.locations import anything

    plugin = registry.Scheme("myco", "myco_cache:Backend", "", anything, None)
    monkeypatch.setattr(registry, "_entry_points", lambda: {"myco": plugin})
    [spec] = parse_tier_list("myco://bucket/prefix")
    assert (spec.scheme, spec.location) == ("myco", "bucket")
    # its own options are its business; the options every tier takes are still checked
    [spec] = parse_tier_list("myco://bucket/prefix?flavour=x&read_only=1")
    assert spec.options == {"flavour": "x", "read_only": "1"}
    with pytest.raises(ConfigError, match=r"OBJCACHE_TIERS\[0\]"):
        parse_tier_list("myco://bucket/prefix?read_only=maybe")
    with pytest.raises(ConfigError, match="unknown scheme 'other'"):
        parse_tier_list("other://bucket")


def test_the_scheme_is_what_precedes_the_first_separator() -> None:
    spec = parse_tier_url("s3://bucket/p?endpoint_url=http://127.0.0.1:9000")
    assert (spec.scheme, spec.options["endpoint_url"]) == ("s3", "http://127.0.0.1:9000")
    assert parse_tier_url("  S3://bucket/p ").scheme == "s3"


@pytest.mark.parametrize(
    ("url", "location", "path"),
    [
        ("disk://localhost/srv/c", "", "/srv/c"),
        ("file://localhost/srv/c", "", "/srv/c"),
        ("disk:///srv/c", "", "/srv/c"),
        ("unix:///run/cache.sock", "", "/run/cache.sock"),
        ("s3://bucket/a/b/", "bucket", "a/b"),
        ("gs://bucket//a/", "bucket", "a"),
        ("s3://bucket/XX/", "bucket", "XX"),
    ],
)
def test_tier_url_location_and_path(url: str, location: str, path: str) -> None:
    spec = parse_tier_url(url)
    assert (spec.location, spec.path) == (location, path)


@pytest.mark.parametrize(
    "url",
    [
        "disk://host/srv/c",
        "file://host/srv/c",
        "unix://host",
        "unix://",
        "s3://",
        "gs://",
        "gs://Bad_Bucket",
        "redis:///0",
        "rediss:///0",
    ],
)
def test_tier_urls_without_a_usable_location_are_refused(url: str) -> None:
    with pytest.raises(ConfigError):
        parse_tier_url(url)


@pytest.mark.parametrize("option", ["read_only", "write_only", "home"])
def test_boolean_tier_options_are_validated(option: str) -> None:
    assert parse_tier_url(f"file:///c?{option}=FALSE").options[option] == "FALSE"
    with pytest.raises(ConfigError, match=option):
        parse_tier_url(f"file:///c?{option}=maybe")


@pytest.mark.parametrize("option", ["timeout_ms", "max_size", "retries"])
def test_numeric_tier_options_are_validated(option: str) -> None:
    assert parse_tier_url(f"file:///c?{option}=12").options[option] == "12"
    for bad in ("-1", "1.5", "ten"):  # an empty value means the default
        with pytest.raises(ConfigError, match=option):
            parse_tier_url(f"file:///c?{option}={bad}")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:pw@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://user@host/0", "redis://user@host/0"),
        ("redis://u:p@ss@host/0", "redis://u:***@host/0"),
        ("redis://u:p:ss@host/0", "redis://u:***@host/0"),
        ("rediss://:tok@h:1/0?prefix=a", "rediss://:***@h:1/0?prefix=a"),
        (
            "s3://b/p?read_only&secret_key=abc&region=x",
            "s3://b/p?read_only&secret_key=***&region=x",
        ),
        ("disk:///srv/c?max_bytes=1G", "disk:///srv/c?max_bytes=1G"),
        # a password with an unencoded / ? # or @ is hidden whole
        ("redis://u:p/w@host:1/0", "redis://u:***@host:1/0"),
        ("redis://u:p?w@host:1/0", "redis://u:***@host:1/0"),
        ("redis://u:p#w@host:1/0", "redis://u:***@host:1/0"),
        ("redis://u:p/w@x@host:1/0", "redis://u:***@host:1/0"),
        # an @ after host:port, or in a path, is not userinfo
        ("redis://host:6379/0?x=a@b", "redis://host:6379/0?x=a@b"),
        ("redis://host:1/a@b/c", "redis://host:1/a@b/c"),
        ("s3://bucket/pre@fix", "s3://bucket/pre@fix"),
        ("file:///data/a@b:1/c", "file:///data/a@b:1/c"),
        # other schemes hide the whole userinfo (an access key pasted into the URL)
        ("s3://AKIA:secret@host/b", "s3://***@host/b"),
        ("S3://AKIA:secret@host/b", "S3://***@host/b"),
        ("REDIS://u:pw@host/0", "REDIS://u:***@host/0"),
        # a URL inside a query value is redacted in turn
        (
            "s3://b/p?endpoint_url=http://u:pw@h:9000",
            "s3://b/p?endpoint_url=http://***@h:9000",
        ),
        ("s3://[bad/p", "<unparseable url>"),
        # a second "://" later in the URL does not move where the userinfo is looked for
        (
            "redis://u:secret@h:6379/0?next=http://example.org",
            "redis://u:***@h:6379/0?next=http://example.org",
        ),
        ("redis://Xu:pXw@h:6379/0", "redis://Xu:***@h:6379/0"),  # any letter anywhere
        # an IPv6 host and port, then an "@" in the query: no userinfo to hide
        ("redis://[::1]:6379/0?note=a@b", "redis://[::1]:6379/0?note=a@b"),
    ],
)
def test_redact_hides_passwords_and_secret_options_and_keeps_the_rest(url: str, shown: str) -> None:
    assert redact(url) == shown


# --- every field checked as documented -----------------------------------------------------


def test_string_paths_become_paths() -> None:
    c = Config(
        local_dir="/l",  # type: ignore[arg-type]
        stats_file="/s",  # type: ignore[arg-type]
        prometheus_textfile="/p",  # type: ignore[arg-type]
    )
    assert (c.local_dir, c.stats_file, c.prometheus_textfile) == (
        Path("/l"),
        Path("/s"),
        Path("/p"),
    )
    assert c.signing_key_file is None


@pytest.mark.parametrize(
    "name", ["timeout_ms", "local_max_bytes", "write_behind_max_bytes", "retries"]
)
def test_counts_may_be_zero_not_negative(name: str) -> None:
    assert getattr(Config(**{name: 0}), name) == 0
    with pytest.raises(ConfigError, match=name):
        Config(**{name: -1})


def test_bounds_of_the_other_numbers_and_choices() -> None:
    assert Config(prometheus_interval_s=0).prometheus_interval_s == 0
    with pytest.raises(ConfigError, match="prometheus_interval_s"):
        Config(prometheus_interval_s=-0.5)
    for level in (1, 22):
        assert Config(compression_level=level).compression_level == level
    for level in (0, 23):
        with pytest.raises(ConfigError, match="compression_level"):
            Config(compression_level=level)
    assert Config(write_to="nearest").write_to == "nearest"
    with pytest.raises(ConfigError, match="write_to"):
        Config(write_to="far")
    assert Config(log_level="debug").log_level == "debug"  # any case
    with pytest.raises(ConfigError, match="log_level must be one of DEBUG, INFO"):
        Config(log_level="loud")


def test_bad_keyword_values_name_the_option() -> None:
    with pytest.raises(ConfigError, match=r" in tiers\[0\]$"):
        Config(tiers="ftp://x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^max_entry_bytes: "):
        Config(max_entry_bytes="lots")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^OBJCACHE_SIGNING_KEY: "):
        Config(signing_keys=(b"short",))
    with pytest.raises(ConfigError, match=r"^OBJCACHE_VERIFY_KEYS: "):
        Config(verify_keys=("not-a-key",))
    with pytest.raises(ConfigError, match=r"got ''$"):  # set but empty is not unset
        Config.from_env({"OBJCACHE_WRITE_TO": ""})


def test_verify_keys_alone_make_a_read_only_fleet(tmp_path: Path) -> None:
    public = generate_key_file(tmp_path / "ci.pem")
    fleet = Config(verify_keys=public)  # type: ignore[arg-type]
    assert fleet.verify_keys == (public,) and fleet.read_only
    assert fleet.codec().verify_keys and not fleet.codec().signer
    signer = Config(verify_keys=(public,), signing_key_file=tmp_path / "ci.pem")
    assert not signer.read_only and signer.codec().signer is not None
    assert signer.signs_with_ed25519() and not fleet.signs_with_ed25519()
    second = generate_key_file(tmp_path / "next.pem")
    assert len(Config(verify_keys=(public, second)).codec().verify_keys) == 2
    assert Config(compression_level=19).codec().level == 19
    hmac = Config(verify_keys=(public,), signing_keys=(NEW.encode(),))
    assert not hmac.read_only and not hmac.signs_with_ed25519()
    with pytest.raises(ConfigError, match="OBJCACHE_SIGNING_KEY_FILE"):
        Config(signing_key_file=tmp_path / "missing.pem").codec()
    bad = tmp_path / "bad.pem"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ConfigError, match=r"^OBJCACHE_SIGNING_KEY_FILE"):
        Config(signing_key_file=bad).signs_with_ed25519()


def test_the_user_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "objcache"
    assert Config().local_dir == tmp_path / "xdg" / "objcache" / "local"
    assert Config().effective_tiers()[0].path == str(tmp_path / "xdg" / "objcache" / "store")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache_dir() == tmp_path / "home" / ".cache" / "objcache"


def test_each_kind_of_variable_parses(tmp_path: Path) -> None:
    public = generate_key_file(tmp_path / "ci.pem")
    c = Config.from_env(
        {
            "OBJCACHE_BREAKER_COOLDOWN_S": " 2.5 ",
            "OBJCACHE_STATS_FILE": "",
            "OBJCACHE_JOB": "",
            "OBJCACHE_LOG_LEVEL": "INFO",
            "OBJCACHE_VERIFY_KEYS": f" {public} , {public},",
            "OBJCACHE_TIERS": "file:///srv/a,file:///srv/b",
        }
    )
    assert c.breaker_cooldown_s == 2.5 and isinstance(c.breaker_cooldown_s, float)
    assert c.stats_file is None and c.job is None and c.log_level == "INFO"
    assert c.verify_keys == (public, public)
    assert [t.path for t in c.tiers] == ["/srv/a", "/srv/b"]
    assert Config.from_env({"OBJCACHE_LOCAL_DIR": " "}).local_dir == Path(".")
    assert Config.from_env({"OBJCACHE_STATS_FILE": "~/s"}).stats_file == Path.home() / "s"
    with pytest.raises(ConfigError, match=r" in OBJCACHE_TIERS\[0\]$"):
        Config.from_env({"OBJCACHE_TIERS": "ftp://x"})
    with pytest.raises(ConfigError, match="OBJCACHE_SIGNING_KEY_FILE is set but empty"):
        Config.from_env({"OBJCACHE_SIGNING_KEY_FILE": " "})


def test_a_key_file_holds_one_key_per_line(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text(f"{NEW} {OLD}\n")  # a key may contain a space
    assert Config.from_env({"OBJCACHE_SIGNING_KEY_FILE": str(f)}).signing_keys == (
        f"{NEW} {OLD}".encode(),
    )
    f.write_bytes(NEW.encode() + b"\n\xff\xfe\n" + OLD.encode() + b"\n")
    f.write_bytes(NEW.encode() + b"\n\xff\xfe\n" + OLD.encode() + b"\n")
    with pytest.raises(ConfigError, match="OBJCACHE_SIGNING_KEY"):
        Config.from_env({"OBJCACHE_SIGNING_KEY_FILE": str(f)})  # the bad line is refused
    f.write_bytes(b"\n \n")
    with pytest.raises(ConfigError, match="holds no key"):
        Config.from_env({"OBJCACHE_SIGNING_KEY_FILE": str(f)})


# --- sizes and misspelt variables (docs/configuration.md) -------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("10G", 10 << 30), ("512M", 512 << 20), ("64k", 64 << 10), ("10 GiB", 10 << 30), ("7", 7)],
)
def test_every_size_option_takes_suffixes_from_env_and_keywords(raw: str, expected: int) -> None:
    env = {"OBJCACHE_LOCAL_MAX_BYTES": raw, "OBJCACHE_WRITE_BEHIND_MAX_BYTES": raw}
    config = Config.from_env(env)
    assert (config.local_max_bytes, config.write_behind_max_bytes) == (expected, expected)
    keywords = Config(local_max_bytes=raw, write_behind_max_bytes=raw)  # type: ignore[arg-type]
    assert (keywords.local_max_bytes, keywords.write_behind_max_bytes) == (expected, expected)
    spec = parse_tier_list(f"disk:///x?max_bytes={raw.replace(' ', '')}")[0]
    from objcache.config.options import lookup
    from objcache.config.registry import scheme

    entry = scheme("disk")
    assert entry is not None
    table = entry.options
    assert table is not None
    assert lookup(table, "max_bytes").parse(spec.options["max_bytes"], "disk") == expected


@pytest.mark.parametrize("where", ["env", "keyword"])
def test_a_bad_size_is_one_line_naming_the_option(where: str) -> None:
    with pytest.raises(ConfigError) as exc:
        if where == "env":
            Config.from_env({"OBJCACHE_LOCAL_MAX_BYTES": "ten gigs"})
        else:
            Config(local_max_bytes="ten gigs")  # type: ignore[arg-type]
    name = "OBJCACHE_LOCAL_MAX_BYTES" if where == "env" else "local_max_bytes"
    assert (
        str(exc.value) == f"{name}: must be a byte count like 10G, 512M or 1048576, got 'ten gigs'"
    )


@pytest.mark.parametrize(
    ("var", "meant"),
    [
        ("OBJCACHE_VERIFY_KEY", "OBJCACHE_VERIFY_KEYS"),
        ("OBJCACHE_SIGNING_KEYS", "OBJCACHE_SIGNING_KEY"),
        ("OBJCACHE_SIGNING_KEYFILE", "OBJCACHE_SIGNING_KEY_FILE"),
        ("OBJCACHE_READONLY", "OBJCACHE_READ_ONLY"),
    ],
)
def test_a_misspelt_security_variable_is_a_configuration_error(var: str, meant: str) -> None:
    """A fleet that meant to verify (or not to write) never runs without it."""
    with pytest.raises(
        ConfigError, match=f"^{var} is not an objcache option; did you mean {meant}"
    ):
        Config.from_env({var: "ed25519:AAAA"})


def test_a_misspelt_variable_is_one_warning_with_the_closest_option(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {"OBJCACHE_TIER": "file:///x", "OBJCACHE_PREFECH": "0"}
    with caplog.at_level("WARNING", logger="objcache"):
        config = Config.from_env(env)
        Config.from_env(env)  # at first use only
    assert config.tiers == ()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "objcache: OBJCACHE_PREFECH is not an objcache option and is ignored; "
        "did you mean OBJCACHE_PREFETCH?",
        "objcache: OBJCACHE_TIER is not an objcache option and is ignored; "
        "did you mean OBJCACHE_TIERS?",
    ]


def test_variables_objcache_itself_sets_are_not_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from objcache.config.settings import INTERNAL_VARIABLES, unknown_variables

    internal = dict.fromkeys(INTERNAL_VARIABLES, "1")
    with caplog.at_level("WARNING", logger="objcache"):
        Config.from_env(internal)
    assert unknown_variables(internal) == {} and not caplog.records
    # every OBJCACHE_ name the repository's code, tests and benchmarks read is known (this
    # misspellings of this file and test_cli.py, and the demo's output tag, aside)
    import re

    from objcache.config.settings import option_variables

    used: set[str] = set()
    for folder in ("objcache", "backends", "tests", "bench", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name not in ("test_config.py", "test_cli.py"):
                used |= set(re.findall(r"OBJCACHE_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    # mutation testing runs this in a copy whose mutants wrap strings in "XX" (make mutation)
    used = {name for name in used if "XX" not in name}
    assert used - set(option_variables()) - INTERNAL_VARIABLES == {"OBJCACHE_RESULT"}


def test_summaries_url_is_one_tier_url_or_unset() -> None:
    assert Config.from_env({}).summaries_url is None
    assert Config.from_env({"OBJCACHE_SUMMARIES_URL": ""}).summaries_url is None
    spec = Config.from_env({"OBJCACHE_SUMMARIES_URL": "file:///tmp/summaries"}).summaries_url
    assert spec is not None and spec.scheme == "file"
    with pytest.raises(ConfigError, match="OBJCACHE_SUMMARIES_URL: one tier URL"):
        Config.from_env({"OBJCACHE_SUMMARIES_URL": "file:///a,file:///b"})


# --- the registry: each backend's folder describes it (docs/architecture.md, "Adding a backend")


def test_the_registry_lists_each_backend_folder_s_schemes() -> None:
    """The schemes come from the ``spec`` of each folder of objcache.backends, folders in
    name order; each names the ``store`` of its own folder."""
    import importlib

    from objcache.config import registry

    # The folders on disk, not the registry's own package walk: a folder with a spec.py that
    # the registry missed, or a scheme it found elsewhere, fails here.
    source = ROOT / "backends" / "objcache" / "backends"
    folders = sorted(p.parent.name for p in source.glob("*/spec.py"))
    assert folders, source
    expected: dict[str, str] = {}
    for folder in folders:
        spec = importlib.import_module(f"objcache.backends.{folder}.spec")
        expected.update((entry.name, folder) for entry in spec.SCHEMES)
    schemes = registry.builtin_schemes()
    assert list(schemes) == list(expected)
    for name, entry in schemes.items():
        folder = expected[name]
        assert entry.name == name
        assert entry.target.partition(":")[0] == f"objcache.backends.{folder}.store"
        assert entry.options is not None
        # a backend that needs a client library installs it with the extra named after
        # its folder; one that needs none has no extra
        assert entry.extra == (folder if entry.sdk else ""), entry


def test_describing_the_backends_imports_no_sdk_and_no_store() -> None:
    """Checking a URL reads every backend's description and must stay light: no cloud SDK,
    no backend code. The SDK each description names is a module (installed here)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from objcache.config import registry\n"
        "from objcache.config.urls import parse_tier_url\n"
        "schemes = registry.builtin_schemes()\n"
        "parse_tier_url('s3://bucket/p?region=x'); parse_tier_url('redis://h:1/0')\n"
        "sdks = {e.sdk for e in schemes.values() if e.sdk}\n"
        "assert sdks == {'aiobotocore', 'redis', 'google.cloud.storage'}, sdks\n"
        "print([m for m in sys.modules if m in sdks or m.split('.')[0] in ('aioboto3', "
        "'aiobotocore', 'botocore', 'redis', 'google') or m.endswith('.store')])\n"
        "import importlib.util\n"
        "from objcache.backends import backend_class\n"
        "for e in schemes.values():\n"
        "    backend_class(e.name)\n"
        "    assert not e.sdk or importlib.util.find_spec(e.sdk), e\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"


def test_a_new_folder_with_a_spec_is_a_new_scheme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adding a backend adds a folder: the registry finds it with no table to edit, and its
    location check and option table apply to its URLs."""
    import sys

    import objcache.backends
    from objcache.config import registry

    folder = tmp_path / "planted"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "spec.py").write_text(
        "from objcache.config.locations import bucket\n"
        "from objcache.config.options import Option\n"
        "from objcache.config.registry import Scheme\n"
        "OPTIONS = (Option('depth', 'int', 1, 'How deep.'),)\n"
        "SCHEMES = (Scheme('planted', 'objcache.backends.planted.store:P', '', bucket, OPTIONS),)\n"
    )
    monkeypatch.setattr(objcache.backends, "__path__", [*objcache.backends.__path__, str(tmp_path)])
    for name in ("objcache.backends.planted", "objcache.backends.planted.spec"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    registry._builtin.cache_clear()
    try:
        assert list(registry.builtin_schemes())[3] == "planted"  # folders in name order
        spec = parse_tier_url("planted://my-bucket/p?depth=3")
        assert (spec.location, spec.path, spec.options) == ("my-bucket", "p", {"depth": "3"})
        with pytest.raises(ConfigError, match="unknown option 'width'"):
            parse_tier_url("planted://my-bucket/p?width=3")
        with pytest.raises(ConfigError, match="invalid bucket name"):
            parse_tier_url("planted://B/p")
    finally:
        registry._builtin.cache_clear()
