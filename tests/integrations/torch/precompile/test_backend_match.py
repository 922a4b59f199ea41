"""The compiler a call of a served code runs under, as its check learns it (no compile;
docs/torch.md, "What the entry was compiled with")."""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

import pytest

from objcache.integrations.torch.precompile import precompile_guards as bm


class _Torch:
    """torch's per-thread eval-frame callback, set from Python and from C."""

    def __init__(self) -> None:
        self.callback: Any = None

    def set(self, callback: Any) -> Any:
        prior, self.callback = self.callback, callback
        return prior


class _Backend:
    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Backend) and other.name == self.name

    __hash__ = None  # type: ignore[assignment]


def _callback(backend: Any) -> Any:
    def callback(*args: Any) -> None: ...

    callback._torchdynamo_orig_backend = backend  # type: ignore[attr-defined]
    return callback


def test_a_call_matches_the_backend_it_was_served_for_or_an_equal_one() -> None:
    torch = _Torch()
    set_eval_frame = bm.wrap_set_eval_frame(torch.set)
    served = _Backend("inductor")
    matches = bm.backend_matcher(served)
    set_eval_frame(_callback(served))
    assert matches() and matches()
    set_eval_frame(_callback(_Backend("inductor")))  # another wrapper, equal backend
    assert matches()
    set_eval_frame(_callback(_Backend("eager")))
    assert not matches()
    set_eval_frame(None)  # no callback known: fails
    assert not matches()
    set_eval_frame(False)  # run-only mode runs the code that ran before, as torch does
    assert matches()
    assert not bm.backend_matcher(served)()  # a variant that never ran: torch never compiled it
    seen: list[bool] = []
    thread = threading.Thread(target=lambda: seen.append(matches()))
    thread.start()
    thread.join()
    assert seen == [False]  # per thread, as torch's own callback


def test_the_callback_torch_restores_after_its_own_window_is_kept() -> None:
    """torch sets the callback to None around a compile (from C, unseen) and restores it;
    the disabled regions the compile runs through set None where it is None: the mirror
    keeps the wrapper's callback. A compiler's callback set and restored inside such a window
    leaves it None (unknown, the check fails), never that callback."""
    torch = _Torch()
    set_eval_frame = bm.wrap_set_eval_frame(torch.set)
    served, other = _Backend("inductor"), _Backend("eager")
    matches = bm.backend_matcher(served)
    prior = set_eval_frame(None)
    set_eval_frame(_callback(served))  # the wrapper's call
    window, torch.callback = torch.callback, None  # torch's compile, from C
    set_eval_frame(set_eval_frame(None))  # a disabled region inside it
    torch.callback = window  # torch restores it
    assert matches()
    torch.callback = None  # another compile, which calls another wrapper
    inner = set_eval_frame(None)
    set_eval_frame(_callback(other))
    set_eval_frame(inner)
    torch.callback = window
    assert not matches()  # unknown
    torch.callback = False  # a frame torch runs only, which calls another wrapper
    inner = set_eval_frame(None)
    set_eval_frame(_callback(other))
    set_eval_frame(inner)
    torch.callback = window
    assert not matches()  # unknown, never run-only
    set_eval_frame(prior)


def test_a_variant_runs_only_where_torch_alone_would_have_compiled_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``eager_then_compile`` or ``force_eager`` a served variant never runs (torch alone
    on a new machine ran those calls eagerly); under ``eager_on_recompile`` only one that ran
    before; and no more of a code's variants run than its recompile limit allows (torch alone,
    at its limit, runs the frame eagerly)."""

    torch = _Torch()
    set_eval_frame = bm.wrap_set_eval_frame(torch.set)
    served = _Backend("inductor")
    stance = types.SimpleNamespace(stance="eager_then_compile")
    frames = types.SimpleNamespace(_stance=stance)
    config = types.SimpleNamespace(recompile_limit=1)
    monkeypatch.setitem(sys.modules, "torch._dynamo.eval_frame", frames)
    monkeypatch.setitem(sys.modules, "torch._dynamo.config", config)
    used: list[int] = [0]
    first, second = bm.backend_matcher(served, used), bm.backend_matcher(served, used)
    set_eval_frame(_callback(served))
    assert not first()
    stance.stance = "force_eager"
    assert not first()
    stance.stance = "eager_on_recompile"
    assert not first()  # never ran
    stance.stance = "default"
    assert first() and used == [1]
    assert not second()  # one more than the recompile limit allows
    stance.stance = "eager_on_recompile"
    assert first() and not second()
    config.recompile_limit = 8
    stance.stance = "default"
    assert second() and used == [2]


def test_an_entry_with_more_variants_of_a_code_than_the_recompile_limit_is_not_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch counts no served variant toward its recompile limit: an entry holding more of a
    code's variants than this process allows is a miss (torch alone would run the extra
    inputs eagerly)."""
    from objcache.integrations.torch.precompile import precompile_serve

    entry = types.SimpleNamespace(
        dynamo=types.SimpleNamespace(codes=[types.SimpleNamespace(guarded_codes=[1, 2])])
    )
    monkeypatch.setitem(
        sys.modules, "torch._dynamo.config", types.SimpleNamespace(recompile_limit=1)
    )
    assert precompile_serve._over_the_recompile_limit(entry)
    monkeypatch.setitem(
        sys.modules, "torch._dynamo.config", types.SimpleNamespace(recompile_limit=2)
    )
    assert not precompile_serve._over_the_recompile_limit(entry)
