"""--dtype auto on a CPU: float32, or bfloat16 where measured faster (decode/dtype_choice.py)."""

from __future__ import annotations

import pytest

from draftkit.decode import dtype_choice
from draftkit.decode.dtype_choice import load_decoding_pair, time_steps
from draftkit.models import dtype_name, load_pair
from tests.helpers import parallel_head


def _no_timing(pairs):
    raise AssertionError("timed where nothing was to be measured")


@pytest.fixture
def measuring(monkeypatch):
    """A CPU with native bfloat16 on which even the tiny models are worth timing, with no
    choice remembered from another test; ``calls`` counts the measurements."""
    monkeypatch.setattr(dtype_choice, "native_bf16", lambda: True)
    monkeypatch.setattr(dtype_choice, "MIN_TUNE_BYTES", 0)
    monkeypatch.setattr(dtype_choice, "_chosen", {})
    calls = []

    def measured(ms):
        monkeypatch.setattr(dtype_choice, "time_steps", lambda pairs: calls.append(
            sorted(pairs)) or dict(ms))
    return measured, calls


def test_an_asked_dtype_is_not_measured(tiny_dirs, monkeypatch):
    monkeypatch.setattr(dtype_choice, "time_steps", _no_timing)
    target, draft = tiny_dirs
    pair, chosen = load_decoding_pair(str(target), str(draft), "cpu", "bf16")
    assert (chosen.dtype, chosen.describe()) == ("bfloat16", None)
    assert dtype_name(pair.target) == dtype_name(pair.draft) == "bfloat16"


def test_auto_stays_float32_where_the_cpu_lacks_bfloat16_or_the_model_fits_in_cache(
        tiny_dirs, monkeypatch):
    monkeypatch.setattr(dtype_choice, "time_steps", _no_timing)
    target, draft = map(str, tiny_dirs)
    monkeypatch.setattr(dtype_choice, "native_bf16", lambda: False)
    pair, chosen = load_decoding_pair(target, draft, "cpu", "auto")
    assert chosen.describe() == "float32 (auto: this CPU has no native bfloat16)"
    assert dtype_name(pair.target) == "float32"
    monkeypatch.setattr(dtype_choice, "native_bf16", lambda: True)
    pair, chosen = load_decoding_pair(target, draft, "cpu", "auto")
    assert chosen.describe() == "float32 (auto: the model fits in cache)"
    assert dtype_name(pair.target) == "float32"


@pytest.mark.parametrize("ms, expected", [({"float32": 10.0, "bfloat16": 8.0}, "bfloat16"),
                                          # within the margin: float32, the reference, stays
                                          ({"float32": 10.0, "bfloat16": 9.7}, "float32"),
                                          ({"float32": 8.0, "bfloat16": 10.0}, "float32")])
def test_auto_takes_the_dtype_measured_clearly_faster_once(tiny_dirs, measuring, ms, expected):
    measured, calls = measuring
    measured(ms)
    target, draft = map(str, tiny_dirs)
    pair, chosen = load_decoding_pair(target, draft, "cpu", "auto")
    assert calls == [["bfloat16", "float32"]]  # both dtypes, timed side by side
    assert chosen.dtype == expected
    assert dtype_name(pair.target) == dtype_name(pair.draft) == expected
    other = "float32" if expected == "bfloat16" else "bfloat16"
    assert chosen.describe() == (f"{expected} (auto: a target + draft step "
                                 f"{ms[expected]:.1f} ms against {other}'s {ms[other]:.1f} ms)")
    again, chosen_again = load_decoding_pair(target, draft, "cpu", "auto")
    assert len(calls) == 1 and chosen_again == chosen  # kept for the process
    assert dtype_name(again.target) == expected


def test_the_steps_timed_run_in_both_dtypes_for_either_kind_of_draft(tiny_dirs, tmp_path):
    _, target_dir, head_dir = parallel_head(tmp_path)
    for target, draft in [tiny_dirs, (target_dir, head_dir), (tiny_dirs[0], None)]:
        pairs = {d: load_pair(str(target), draft and str(draft), "cpu", d)
                 for d in ("float32", "bfloat16")}
        ms = time_steps(pairs)
        assert sorted(ms) == ["bfloat16", "float32"] and all(v > 0 for v in ms.values())
