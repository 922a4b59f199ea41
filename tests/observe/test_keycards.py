"""Key cards: capture from torch's debug lines, redaction, serialisation, diff."""

from __future__ import annotations

import json

import pytest

from objcache.integrations.torch.remote import keycard_capture as capture
from objcache.observe import keycards
from objcache.observe.keycards import Card, CardError

GRAPH_CODE = (
    "GraphModule()\n\n\n\ndef forward(self, primals_1):\n"
    "    relu = torch.ops.aten.relu.default(primals_1);  primals_1 = None\n    return (relu,)\n"
)


def tensor(shape: str, stride: str) -> str:
    return (
        f"TensorMetadata(dtype=torch.float32, shape=torch.Size([{shape}]), stride=({stride}), "
        "device=device(type='cpu'), layout=torch.strided, memory_format=None)"
    )


def lines(**over: str) -> list[str]:
    """torch-shaped ``debug_lines`` (one ``[hash] name: value`` per component)."""
    values = {
        "gm": ("mhuckhjjky7qkrmhqimycpqnfvs6awtvu33nlkmrxkjn4cipojh", GRAPH_CODE),
        "example_inputs[0]": ("kq7p7dkbfdsecnlogqimb35at", tensor("4, 8", "8, 1")),
        "fx_kwargs[is_backward]": ("esstihe2nyydk4mhzpvox3qkajyu5y5t23hk3fi2me7jn75xi3o", "False"),
        "fx_kwargs[get_decomp_fn]": ("fdx5cz4ggwvfj", "<function select_decomp_table at 0x7f86c6>"),
        "torch_version": ("sjldm5hyfytkdkxlfj3", "\x8bM\x9f\x04+"),
        "system_info[hash]": ("ou2myrupfm7jqj7", "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe"),
        "inductor_config[max_autotune]": ("esstihe2nyydk4mh", "False"),
        "inductor_config[cuda.cutlass_dir]": ("abc", "/home/alice/cutlass"),
        "inductor_config[some_token]": ("abd", "hunter2"),
        "user_defined_triton_source": ("cde", "def kernel(): secret code"),
    }  # fmt: skip
    for name, value in over.items():
        values[name] = value  # type: ignore[assignment]
    return [f"[{h}] {name}: {v}" for name, (h, v) in values.items()]


def card(env: dict[str, str] | None = None, **over: tuple[str, str]) -> Card:
    return keycards.from_debug_lines(
        "fx-graph", "fkey", lines(**over), env if env is not None else {"cpu_isa": "avx512"}
    )


def test_components_names_hashes_and_readable_values() -> None:
    c = card()
    comps = c.components
    assert c.graph == "mhuckhjjky7qk"
    assert comps["gm"] == ("mhuckhjjky7qk", None)  # never the graph's code
    assert comps["example_inputs[0]"][1] == "float32 shape [4, 8] stride (8, 1) cpu"
    assert comps["fx_kwargs.is_backward"][1] == "False"
    assert comps["fx_kwargs.get_decomp_fn"][1] == "<function select_decomp_table>"
    assert comps["inductor_config.max_autotune"][1] == "False"
    assert comps["torch_version"][1] is None  # bytes, not a version
    assert comps["system_info.hash"][1] == "44136fa355b3…"
    assert comps["env:cpu_isa"][1] == "avx512"


def test_values_that_are_code_paths_or_secrets_are_never_kept() -> None:
    c = card()
    encoded = c.encode().decode()
    assert "alice" not in encoded and "hunter2" not in encoded and "kernel()" not in encoded
    assert "primals_1" not in encoded
    assert c.components["inductor_config.cuda.cutlass_dir"][1] == "<redacted path>"
    assert c.components["inductor_config.some_token"][1] == "<redacted>"
    assert c.components["user_defined_triton_source"][1] is None
    assert keycards.redact("inductor_config.x", "A" * 40) == "<redacted>"
    assert keycards.redact("inductor_config.x", "x y " * 100).endswith("…")


@pytest.mark.parametrize(
    ("name", "value", "kept"),
    [
        # a secret-looking name wins over the "hex hash: keep its head" rule
        ("inductor_config.api_key", "deadbeef" * 5, "<redacted>"),
        ("inductor_config.key", "short", "<redacted>"),
        ("inductor_config.auth_header", "Bearer x", "<redacted>"),
        ("inductor_config.db_password", "hunter2", "<redacted>"),
        ("inductor_config.aws_secret", "x", "<redacted>"),
        ("inductor_config.refresh_token", "x", "<redacted>"),
        ("inductor_config.credentials_file", "x", "<redacted>"),
        # credentials inside a URL value are removed, the rest kept
        ("inductor_config.url", "redis://:password@host:6379/0", "redis://<redacted>@host:6379/0"),
        ("inductor_config.url", "https://u:p@example.com/a", "https://<redacted>@example.com/a"),
        # paths are cut wherever they are, not only under a home
        ("inductor_config.dir", "/workspace/team/cache", "<path>"),
        ("inductor_config.flags", "-I/opt/build/include -O3", "-I<path> -O3"),
        ("inductor_config.h", "deadbeef" * 5, "deadbeefdead…"),
        ("inductor_config.max_autotune", "True", "True"),
    ],
)
def test_hostile_values_are_redacted_as_the_docs_say(name: str, value: str, kept: str) -> None:
    assert keycards.redact(name, value) == kept


def test_lines_that_do_not_parse_are_skipped() -> None:
    c = keycards.from_debug_lines("fx-graph", "k", ["garbage", 3, "[UPPER] x: 1", *lines()], {})
    assert "gm" in c.components and len(c.components) == len(lines())


def test_a_card_round_trips_through_its_bytes() -> None:
    c = card()
    assert keycards.parse(c.encode()) == c
    written = keycards.parse_written(keycards.encode_written(c, "job", "run-1-2-ab", "h"))
    assert (written.card, written.job, written.run, written.host) == (c, "job", "run-1-2-ab", "h")
    misses = keycards.parse_misses(keycards.encode_misses("job", "r", "h", [c, c], 3))
    assert misses.cards == [c, c] and misses.dropped == 3 and misses.invalid == 0


@pytest.mark.parametrize(
    "body",
    [
        {"format": 2, "kind": "fx-graph", "key": "k", "c": []},
        {"format": 1, "kind": "pgo", "key": "k", "c": []},
        {"format": 1, "kind": "fx-graph", "key": "", "c": []},
        {"format": 1, "kind": "fx-graph", "key": "k\x1b]0;x\x07", "c": []},
        {"format": 1, "kind": "fx-graph", "key": "k", "c": {"gm": 1}},
        {"format": 1, "kind": "fx-graph", "key": "k", "c": [["gm", "abc"]]},
        {"format": 1, "kind": "fx-graph", "key": "k", "c": [["g m\x1b", "abc", None]]},
        {"format": 1, "kind": "fx-graph", "key": "k", "c": [["gm", "ABC!", None]]},
        {"format": 1, "kind": "fx-graph", "key": "k", "c": [["gm", "abc", 7]]},
        {"format": 1, "kind": "fx-graph", "key": "k", "c": [["gm", "abc", "v" * 1000]]},
        {"format": 1, "kind": "fx-graph", "key": "k", "c": [["gm", "a", None], ["gm", "b", None]]},
        ["not", "a", "card"],
    ],
)
def test_strict_parsing_refuses_bad_cards(body: object) -> None:
    with pytest.raises(CardError):
        keycards.parse(json.dumps(body).encode())


def test_parsing_is_capped_before_json() -> None:
    with pytest.raises(CardError, match="more than"):
        keycards.parse(b" " * (keycards.MAX_CARD_BYTES + 1))
    with pytest.raises(CardError):
        keycards.parse(b"\xff\xfe")


def test_diff_names_exactly_the_differing_components() -> None:
    a = card()
    b = card(**{"inductor_config[max_autotune]": ("cev5uo2jlwdhw", "True")})
    (d,) = keycards.diff(a, b)
    assert d.describe() == "inductor_config.max_autotune: False → True"
    assert keycards.equal_components(a, b) == len(a.components) - 1


def test_diff_of_a_shape_shows_the_shape_only() -> None:
    a = card()
    b = card(**{"example_inputs[0]": ("zzzz", tensor("6, 8", "8, 1"))})
    (d,) = keycards.diff(a, b)
    assert d.describe() == "example_inputs[0]: shape [4, 8] → [6, 8]"
    c = card(**{"example_inputs[0]": ("yyyy", tensor("4, 8", "1, 4"))})
    assert keycards.diff(a, c)[0].describe() == "example_inputs[0]: stride (8, 1) → (1, 4)"


def test_diff_of_the_environment_and_of_hidden_values() -> None:
    a, b = card({"cpu_isa": "avx512"}), card({"cpu_isa": "avx2"})
    assert [d.describe() for d in keycards.diff(a, b)] == ["env: cpu_isa avx512 → avx2"]
    c = card(gm=("othergraphhash", GRAPH_CODE))
    assert keycards.diff(a, c)[0].describe() == "gm: <hash mhuckhjjky7qk> → <hash othergraphhas>"
    d = card({})
    assert keycards.diff(a, d)[0].describe() == "env: cpu_isa avx512 → (absent)"


def test_a_run_keeps_at_most_its_cap_of_cards_and_counts_the_rest() -> None:
    keycards.reset()
    try:
        for i in range(keycards.MAX_RUN_CARDS + 5):
            keycards.record_miss(Card("fx-graph", f"k{i}", {}))
        keycards.record_miss(Card("fx-graph", "k0", {}))  # the same key again: once
        cards, dropped = keycards.missed()
        assert len(cards) == keycards.MAX_RUN_CARDS and dropped == 5
        assert keycards.take_pending("fx-graph", "k68") is not None
        assert keycards.take_pending("fx-graph", "k68") is None
    finally:
        keycards.reset()


def test_cards_can_be_switched_off() -> None:
    from objcache.config.settings import Config

    assert Config.from_env({}).key_cards
    assert not Config.from_env({"OBJCACHE_KEY_CARDS": "0"}).key_cards


def test_the_client_hands_observe_its_key_card_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """observe asks the switch the client layer handed in, never the client itself
    (docs/architecture.md, "Layers"); a switch that fails keeps no cards and is counted."""
    from objcache import client
    from objcache.config.settings import Config

    class Fake:
        config = Config.from_env({"OBJCACHE_KEY_CARDS": "0"})

    monkeypatch.setattr(client, "get_client", lambda: Fake())
    assert keycards.enabled() is False
    Fake.config = Config.from_env({})
    assert keycards.enabled() is True
    saved = keycards._switch[0]
    keycards.reset()
    try:
        keycards.configure(lambda: 1 / 0 > 0)
        assert keycards.enabled() is False
        assert keycards.counters["errors:config"] == 1
    finally:
        keycards.configure(saved)
        keycards.reset()


class ObjcacheFx:
    objcache_kind = "fx-graph"


def test_only_a_miss_through_objcache_keeps_a_card(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "_env_fields", lambda: {"cpu_isa": "avx2"})
    monkeypatch.setattr(capture, "enabled", lambda: True)
    outcome: list[object] = [None]

    def original(key: str, debug_lines: list[str], *args: object, **kwargs: object) -> object:
        return (outcome[0], {"cache_state": "x"})

    wrapped = capture._wrap_load_with_key(original)
    keycards.reset()
    try:
        # a hit, a miss through torch's own (or no) remote cache: no card
        outcome[0] = object()
        wrapped("fhit", lines(), [], True, ObjcacheFx())
        outcome[0] = None
        wrapped("fnoremote", lines(), [], True, None)
        wrapped("fother", lines(), [], True, object())
        assert keycards.missed() == ([], 0)
        # a miss everywhere, remote_cache passed by position or by name
        wrapped("fmiss", lines(), [], True, ObjcacheFx(), False)
        wrapped("fmiss2", lines(), example_inputs=[], local=True, remote_cache=ObjcacheFx())
        cards, _ = keycards.missed()
        assert [c.key for c in cards] == ["fmiss", "fmiss2"]
        assert cards[0].components["env:cpu_isa"][1] == "avx2"
        # torch's result is returned unchanged, whatever the card capture does
        monkeypatch.setattr(capture, "from_debug_lines", lambda *a: 1 / 0)
        assert wrapped("fboom", lines(), [], True, ObjcacheFx()) == (None, {"cache_state": "x"})
        assert keycards.counters["errors:capture"] == 1
        monkeypatch.setattr(capture, "enabled", lambda: False)  # OBJCACHE_KEY_CARDS=0
        keycards.reset()
        wrapped("foff", lines(), [], True, ObjcacheFx())
        assert keycards.missed() == ([], 0)
    finally:
        keycards.reset()


def test_the_part_is_feature_detected_and_undone() -> None:
    torch = pytest.importorskip("torch")
    from torch._inductor import codecache

    from objcache.integrations.install import features

    assert features.missing("key cards") == []
    before = codecache.FxGraphCache.__dict__["load_with_key"]
    capture.apply_fx(codecache)
    capture.apply_fx(codecache)  # idempotent
    try:
        patched = codecache.FxGraphCache.load_with_key
        assert patched.__objcache__ and patched.__wrapped__ is before.__func__
    finally:
        capture.uninstall()
    assert codecache.FxGraphCache.__dict__["load_with_key"] is before
    assert torch is not None


def test_a_forked_child_starts_with_no_missed_cards() -> None:
    import os

    keycards.reset()
    try:
        keycards.record_miss(Card("fx-graph", "kparent", {}))
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.write(write, str(len(keycards.missed()[0])).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(read, 16) == b"0"
        assert len(keycards.missed()[0]) == 1
    finally:
        keycards.reset()
