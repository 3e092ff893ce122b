"""CPU matmul layouts for decoding: every form computes x @ W^T, and tuning keeps the fastest."""

import types

import pytest
import torch
import torch.nn.functional as F

from draftkit.decode import cpu_linear
from draftkit.decode.cpu_linear import FORMS, MAX_ROWS, MEASURED_ROWS, DecodeLinear, bucket, tune
from draftkit.decode.engine import SpeculativeEngine
from tests.helpers import hf_greedy, tiny_target_and_draft


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (16, 16)])
def test_every_form_is_x_times_w_transposed(shape):
    torch.manual_seed(0)
    w, b = torch.randn(*shape), torch.randn(shape[0])
    lin = DecodeLinear(w, b)
    lin.pack()
    for form in lin.available():
        lin.forms = {rows: form for rows in MEASURED_ROWS}
        for rows in (1, 2, 5, MAX_ROWS, MAX_ROWS + 3, 70):  # past MAX_ROWS: a bucket's form
            x = torch.randn(1, rows, shape[1])  # (B, T, in)
            torch.testing.assert_close(lin(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert ("x@wt" in lin.available()) == (shape[0] >= shape[1])
    assert "onednn" in lin.available()  # the torch draftkit pins has the op


def test_tune_keeps_the_form_the_clock_finds_fastest(monkeypatch):
    """A clock on which every form but W @ x^T takes ten times as long: each shape and row
    count must choose it (the wide buckets, which time only the blocked products, keep
    F.linear), and the unused W^T copy is dropped. (A fake clock, not sleeps: on a
    loaded machine the real one is noisier than any sleep a test can afford.)"""
    apply = DecodeLinear._apply
    now = [0.0]

    def timed(self, form, x2):
        now[0] += 1.0 if form == "w@xt" else 10.0
        return apply(self, form, x2)

    monkeypatch.setattr(DecodeLinear, "_apply", timed)
    monkeypatch.setattr(cpu_linear, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(cpu_linear, "_tuned", {})
    linears = [DecodeLinear(torch.randn(64, 32)), DecodeLinear(torch.randn(32, 64))]
    assert linears[0].wt is not None
    assert tune(linears, reps=1, min_bytes=0)
    for lin in linears:
        assert lin.forms == {rows: "w@xt" if rows <= MAX_ROWS else "linear"
                             for rows in MEASURED_ROWS}
        assert lin.wt is None and lin.packed is None
    linears[0].forms[1] = "linear"
    assert tune(linears, reps=1, min_bytes=0)  # a second model of these shapes: remembered
    assert linears[0].forms[1] == "w@xt"


def test_a_wide_product_takes_its_buckets_form(monkeypatch):
    """Past MAX_ROWS a product takes the form measured for the smallest bucket it fits (the
    widest beyond them): each form here is recorded as it is applied."""
    assert [bucket(r) for r in (1, MAX_ROWS, MAX_ROWS + 1, 16, 17, 32, 500)] == \
        [1, MAX_ROWS, 16, 16, 32, 32, 32]
    lin = DecodeLinear(torch.randn(48, 16))
    assert all(lin.forms[r] == "linear" for r in MEASURED_ROWS if r > MAX_ROWS)  # fixed choice
    lin.pack()
    lin.set_forms({**lin.forms, 16: "onednn", 32: "w@xt"})
    used = []
    apply = DecodeLinear._apply
    monkeypatch.setattr(DecodeLinear, "_apply",
                        lambda self, form, x2: used.append(form) or apply(self, form, x2))
    for rows in (12, 40, 200):
        x = torch.randn(rows, 16)
        torch.testing.assert_close(lin(x), F.linear(x, lin.w), rtol=1e-5, atol=1e-5)
    assert used == ["onednn", "w@xt", "w@xt"]


def test_small_models_keep_the_fixed_choice():
    lin = DecodeLinear(torch.randn(64, 32))
    fixed = dict(lin.forms)
    assert not tune([lin])  # 8 KiB is far under MIN_TUNE_BYTES: in cache, nothing to measure
    assert lin.forms == fixed and set(fixed.values()) <= set(FORMS)


def test_tuned_fast_path_decodes_as_hf_generate(monkeypatch):
    """The engine with the layouts tuned (forced on a tiny model) is still exact greedy."""
    monkeypatch.setattr(cpu_linear, "MIN_TUNE_BYTES", 0)
    monkeypatch.setattr(cpu_linear, "_tuned", {})
    target, draft = tiny_target_and_draft()
    prompt = [5, 9, 22, 31, 7]
    engine = SpeculativeEngine(target, draft, eos_token_id=None, fast_path=True)
    assert cpu_linear._tuned  # the runners measured
    out = engine.generate([prompt], k=3, max_new_tokens=12)
    assert out[0].tokens == hf_greedy(target, prompt, 12)


def test_a_row_count_slower_than_a_wider_one_is_padded_to_it(monkeypatch):
    """A clock on which one row costs ten times what two rows cost (a wider product faster
    than a narrower one, as measured on a 2-core machine): one row is padded to two, and the
    padded product is still x @ W^T for the real row."""
    apply = DecodeLinear._apply
    now = [0.0]

    def timed(self, form, x2):
        now[0] += 10.0 if x2.shape[0] == 1 else float(x2.shape[0])
        return apply(self, form, x2)

    monkeypatch.setattr(DecodeLinear, "_apply", timed)
    monkeypatch.setattr(cpu_linear, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(cpu_linear, "_tuned", {})
    w, b = torch.randn(64, 32), torch.randn(64)
    lin = DecodeLinear(w, b)
    assert tune([lin], reps=1, min_bytes=0)
    assert lin.pad == {1: 2}  # 2 rows cost 2, wider ones more: only one row pads
    monkeypatch.setattr(DecodeLinear, "_apply", apply)
    x = torch.randn(1, 1, 32)
    torch.testing.assert_close(lin(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
