"""What a trace takes from this process's hash order: which seed is fixed, and which traced
codes iterate a set constant (docs/torch.md, "What a served entry depends on")."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from objcache.integrations.torch.precompile.unguarded import hash_order


def _fixed_seed_in_a_process(seed: str | None, later: str = "") -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    code = (
        "import os\n"
        f"{later}\n"
        "from objcache.integrations.torch.precompile.unguarded import hash_order\n"
        "print(hash_order.fixed_seed())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize(
    ("seed", "expected"), [(None, "None"), ("random", "None"), ("0", "0"), ("123", "123")]
)
def test_the_seed_is_what_the_interpreter_started_with(seed: str | None, expected: str) -> None:
    assert _fixed_seed_in_a_process(seed) == expected


def test_a_seed_set_after_start_is_not_taken_for_a_fixed_one() -> None:
    """A program that sets PYTHONHASHSEED for its children still hashes with its own salt."""
    later = "os.environ['PYTHONHASHSEED'] = '7'"
    assert _fixed_seed_in_a_process(None, later) == "None"


def _iterates(x: int) -> int:
    for name in {"relu", "gelu", "tanh"}:
        x = x * 2 + len(name)
    return x


def _tests_membership(name: str) -> bool:
    return name in {"relu", "gelu", "tanh"}


def _iterates_numbers(x: int) -> int:
    for k in {1, 2, 3}:
        x = x * 2 + k
    return x


def test_a_code_that_iterates_a_set_of_strings_is_found() -> None:
    assert hash_order.iterated_constant_sets([_iterates.__code__])
    assert not hash_order.iterated_constant_sets([_tests_membership.__code__])
    assert not hash_order.iterated_constant_sets([_iterates_numbers.__code__])
    both = [_tests_membership.__code__, _iterates.__code__]
    assert hash_order.iterated_constant_sets(both)


def test_id_is_the_programs_only_in_its_own_code() -> None:
    """``inspect.unwrap`` keys a memo by ``id()``: Python's and torch's code calling it
    never makes a frame unsaveable; the program's does, and so does code with no file."""
    import inspect

    def tx(code: Any) -> Any:
        return type("Tx", (), {"f_code": code})()

    assert not hash_order._programs_call(tx(inspect.unwrap.__code__))
    assert hash_order._programs_call(tx(test_id_is_the_programs_only_in_its_own_code.__code__))
    assert hash_order._programs_call(tx(None))


def test_values_whose_identity_is_their_history_are_told_from_singletons() -> None:
    """Two equal floats, long strings, big ints or tuples are one object or two as the
    program made them; None, booleans, small ints and empty strings are one object in every
    process."""
    for value in (1.5, 10**6, "eager", b"k", (1,), frozenset({1}), 1j):
        assert hash_order.identity_of_history(value), value
    for value in (None, True, False, 0, 256, -5, "", (), ..., NotImplemented):
        assert not hash_order.identity_of_history(value), value
