"""Recompile reasons: a guard's structure is kept, only secret-looking literals are hidden."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from objcache.integrations.torch.timing import phase_times
from objcache.observe.recompile_reasons import looks_like_credential, redact_reason

#: torch 2.13's form of a guard failure: ``L['x']`` written as ``x``, the user's source line
#: as a comment, then the user stack trace (seen from a real recompile, torch 2.13.0).
TORCH_213 = (
    "0/0: cfg['db']['pw'] == 'hunter2-prod'                        "
    "# if cfg['db']['pw'] == 'hunter2-prod':  # mp/serve.py:6 in f\n"
    'User stack trace:\n  File "/home/alice/serve.py", line 6, in f\n'
    "    if cfg['db']['pw'] == 'hunter2-prod':"
)


@pytest.mark.parametrize(
    ("reason", "shown"),
    [
        # structural guards are kept whole, whatever the names along the path
        (
            "0/0: tensor 'x' size mismatch at index 0. expected 2, actual 3",
            "0/0: tensor 'x' size mismatch at index 0. expected 2, actual 3",
        ),
        ("0/1: L['n'] == 3", "0/1: L['n'] == 3"),
        ("0/2: len(L['past_key_values']) == 2", "0/2: len(L['past_key_values']) == 2"),
        ("len(past_key_values) == 2", "len(past_key_values) == 2"),
        (
            "0/3: ___check_obj_id(L['self'].fn, 140312345678912)",
            "0/3: ___check_obj_id(L['self'].fn, 140312345678912)",
        ),
        (
            "___check_type_id(L['self'].auth_layer, 94011223344)",
            "___check_type_id(L['self'].auth_layer, 94011223344)",
        ),
        ("L['past_key_values'] is None", "L['past_key_values'] is None"),
        ("L['x'].size()[0] == 3", "L['x'].size()[0] == 3"),
        ("2 <= L['token_ids'].size()[0]", "2 <= L['token_ids'].size()[0]"),
        ("len(L['cfg']['api_keys']) == 2", "len(L['cfg']['api_keys']) == 2"),
        ("L['self'].act == 'relu'", "L['self'].act == 'relu'"),
        (
            "L['cfg']['model'] == 'meta-llama/Llama-3.1-8B'",
            "L['cfg']['model'] == 'meta-llama/Llama-3.1-8B'",
        ),
        # a literal compared with a secret-looking path: only the literal goes
        ("0/0: L['cfg']['db']['pw'] == 'hunter2-prod'", "0/0: L['cfg']['db']['pw'] == <redacted>"),
        ("0/4: G['API_TOKEN'] == 'abc'", "0/4: G['API_TOKEN'] == <redacted>"),
        ("L['self'].Password != 'x'", "L['self'].Password != <redacted>"),
        ("L['req'].headers['Cookie'] == 'sid=1'", "L['req'].headers['Cookie'] == <redacted>"),
        ("L['cfg'].dbPasswd == 'p'", "L['cfg'].dbPasswd == <redacted>"),
        ("L['creds'].user == 'bob'", "L['creds'].user == <redacted>"),
        ("L['self'].session.user_id == 42", "L['self'].session.user_id == <redacted>"),
        ("'abc' == G['SECRET']", "<redacted> == G['SECRET']"),
        ("L['cfg']['tokens'] == ('a', 'b')", "L['cfg']['tokens'] == (<redacted>, <redacted>)"),
        ("L['cfg']['mode'] in ['a', 'b']", "L['cfg']['mode'] in ['a', 'b']"),
        ("G['OPENAI_API_KEY'] == 123456", "G['OPENAI_API_KEY'] == <redacted>"),
        # a literal that is a credential by itself, whatever the path
        ("L['self'].mode == 'AKIAIOSFODNN7EXAMPLE'", "L['self'].mode == <redacted>"),
        (
            "L['hdr'] == 'ghp_abcdefghijklmnopqrstuvwxyz0123456789'",
            "L['hdr'] == <redacted>",
        ),
        ("L['h'] == 'Bearer abcdefgh12345'", "L['h'] == <redacted>"),
        ("L['x'] == 'aZ3kL9pQ2xW7mN4bV8cX'", "L['x'] == <redacted>"),
        # inside a kept literal: URL credentials and paths
        ("x == 'redis://:pw@host/0'", "x == 'redis://<redacted>@host/0'"),
        ("a == '/home/me/data'", "a == '<path>'"),
        # torch 2.13's form: the source line and the stack trace go, the place stays
        (TORCH_213, "0/0: cfg['db']['pw'] == <redacted>  # serve.py:6 in f"),
        (
            "0/3: len(pkv) == 3          # return x * n + len(pkv)  # m/model.py:10 in forward"
            '\nUser stack trace:\n  File "/tmp/model.py", line 10, in forward',
            "0/3: len(pkv) == 3  # model.py:10 in forward",
        ),
        ("L['s'] == 'a # b'", "L['s'] == 'a # b'"),
    ],
)
def test_a_guards_structure_is_kept_and_only_secret_literals_are_hidden(
    reason: str, shown: str
) -> None:
    assert redact_reason(reason) == shown


@pytest.mark.parametrize(
    ("value", "credential"),
    [
        ("hunter2-prod", False),
        ("float32", False),
        ("resnet50_imagenet_v2_final", False),
        ("Qwen2.5-0.5B-Instruct", False),
        ("some_very_long_descriptive_config_value_name", False),
        ("deadbeef" * 5, True),
        ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", True),
        ("xoxb-1234567890-abcdefghij", True),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig", True),
        ("-----BEGIN PRIVATE KEY-----", True),
        ("token abcdef123456", True),
    ],
)
def test_credentials_are_told_by_their_looks(value: str, credential: bool) -> None:
    assert looks_like_credential(value) is credential


def test_a_long_reason_is_cut_and_a_binary_one_is_not_kept() -> None:
    assert redact_reason("L['n'] == 3 and " * 40).endswith("…")
    assert len(redact_reason("L['n'] == 3 and " * 40)) == 300
    assert redact_reason("L['n'] == '\x1b[31m'") == "<binary>"


def test_a_run_keeps_torchs_recompile_reasons_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """What :func:`phase_times.recompiles` keeps of torch's own metrics (the forms torch
    2.13 to 2.15 writes): structural guards whole, a password's literal hidden."""
    reasons = [
        None,
        "0/1: len(L['past_key_values']) == 2",
        TORCH_213,
        "0/3: G['API_TOKEN'] == 'abc'",
        "0/4: tensor 'x' size mismatch at index 0. expected 2, actual 3",
    ]

    def metric(reason: str | None) -> Any:
        return types.SimpleNamespace(
            recompile_reason=reason,
            co_name="forward",
            co_filename="/home/alice/model.py",
            co_firstlineno=7,
            entire_frame_compile_time_s=0.5,
        )

    utils = types.ModuleType("torch._dynamo.utils")
    utils.get_compilation_metrics = lambda: [metric(r) for r in reasons]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", utils)
    assert phase_times.recompiles() == [
        ("forward (model.py:7)", "0/1: len(L['past_key_values']) == 2", 0.5),
        ("forward (model.py:7)", "0/0: cfg['db']['pw'] == <redacted>  # serve.py:6 in f", 0.5),
        ("forward (model.py:7)", "0/3: G['API_TOKEN'] == <redacted>", 0.5),
        (
            "forward (model.py:7)",
            "0/4: tensor 'x' size mismatch at index 0. expected 2, actual 3",
            0.5,
        ),
    ]
