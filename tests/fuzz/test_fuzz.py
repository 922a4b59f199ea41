"""Fuzzing the three parsers that read untrusted input: the entry decoder (bytes from any
store), the manifest parser (bytes from any store) and the tier-URL parser (configuration).
Each may only fail with its own typed error.

    make fuzz      # 10,000 examples each; in `make test` they run with 200
"""

from __future__ import annotations

import contextlib

from hypothesis import given
from hypothesis import strategies as st

from objcache.config import registry
from objcache.config.urls import parse_tier_list, parse_tier_url
from objcache.core.manifest import Manifest, ManifestError
from objcache.entry.codec import HEADER_SIZE, MAGIC, Codec
from objcache.errors import ConfigError, EntryError

OKEY = "v1/0123456789abcdef/fx-graph/00/key"
CODECS = (Codec(), Codec(signing_keys=(b"fuzz-key".ljust(32, b"."),)))

# Mostly-valid entries with random damage reach deeper than random bytes alone.
damaged_entries = st.tuples(
    st.binary(max_size=2048),
    st.sampled_from(CODECS),
    st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), max_size=4),
    st.integers(min_value=0),
).map(lambda t: _damage(t[1].encode(t[0], OKEY), t[2], t[3]))


def _damage(entry: bytes, edits: list[tuple[int, int]], cut: int) -> bytes:
    b = bytearray(entry)
    for pos, val in edits:
        b[pos % len(b)] = val
    return bytes(b[: max(HEADER_SIZE // 2, cut % (len(b) + 1))])


@given(st.one_of(st.binary(max_size=512), damaged_entries, st.binary().map(lambda b: MAGIC + b)))
def test_entry_decoder(blob: bytes) -> None:
    for codec in CODECS:
        try:
            out = codec.decode(blob, OKEY)
        except EntryError:
            continue
        assert isinstance(out, bytes)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(
    st.one_of(
        st.binary(max_size=512),
        json_values.map(lambda v: __import__("json").dumps(v).encode()),
        st.fixed_dictionaries(
            {
                "format": st.just(1),
                "job": st.text(max_size=10),
                "created": json_values,
                "keys": json_values,
            }
        ).map(lambda v: __import__("json").dumps(v).encode()),
    )
)
def test_manifest_parser(blob: bytes) -> None:
    try:
        m = Manifest.from_bytes(blob)
    except ManifestError:
        return
    assert isinstance(m.keys, frozenset)


url_text = st.one_of(
    st.text(max_size=80),
    st.builds(
        lambda scheme, rest: f"{scheme}://{rest}",
        st.sampled_from([*registry.schemes(), "sx3", "http", ""]),
        st.text(alphabet=st.characters(codec="utf-8"), max_size=60),
    ),
)


@given(url_text)
def test_tier_url_parser(url: str) -> None:
    try:
        spec = parse_tier_url(url)
    except ConfigError as exc:
        assert "\n" not in str(exc), "errors are one line"
        return
    assert registry.scheme(spec.scheme) is not None
    assert spec.display  # redaction never crashes on what the parser accepted


@given(st.lists(url_text, max_size=4).map(",".join))
def test_tier_list_parser(value: str) -> None:
    with contextlib.suppress(ConfigError):
        parse_tier_list(value)
