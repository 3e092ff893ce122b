"""DecodeStats accounting on tiny random models: tau counts kept tokens, c counts drafting."""

import copy
from types import SimpleNamespace

import pytest
import torch

from draftkit.decode import clock as clock_module
from draftkit.decode.engine import SpeculativeEngine
from draftkit.decode.sampling import SamplingParams
from draftkit.decode.stats import DecodeStats
from tests.helpers import ScriptedK, hf_greedy, noisy_copy, tiny_target_and_draft

PROMPT = [5, 9, 22]
PROMPTS = [[5, 9, 22, 31, 7], [11, 12], [40, 41, 42, 43, 44, 45, 46, 47, 8, 50, 51]]


@pytest.fixture(scope="module")
def models():
    target, _ = tiny_target_and_draft()
    return target, copy.deepcopy(target), noisy_copy(target)


def test_tau_counts_the_tokens_the_budget_keeps(models):
    """A perfect draft at K = 7 with 10 new tokens: the prefill emits 1, round 1 keeps 8,
    round 2 accepts all 7 but the budget keeps 1. tau is 9 tokens / 2 rounds, not 8."""
    target, perfect, _ = models
    stats = DecodeStats()
    res = SpeculativeEngine(target, perfect, eos_token_id=None).generate(
        [PROMPT], k=7, max_new_tokens=10, stats=stats)[0]
    assert len(res.tokens) == 10 and stats.rounds == 2
    assert stats.tau() == pytest.approx(4.5)
    assert res.tau == pytest.approx(stats.tau())  # one convention: decoding rounds only
    assert stats.bonus == 1  # round 2's bonus token was cut by the budget
    assert stats.accepted == 14 and stats.alpha() == 1.0  # every tested position counts


def test_tau_counts_the_tokens_eos_keeps(models):
    target, perfect, _ = models
    eos = hf_greedy(target, PROMPT, 20)[2]
    stats = DecodeStats()
    res = SpeculativeEngine(target, perfect, eos_token_id=eos).generate(
        [PROMPT], k=7, max_new_tokens=20, stats=stats)[0]
    assert res.finish_reason == "eos"
    assert stats.tau() == pytest.approx((len(res.tokens) - 1) / stats.row_steps)
    assert res.tau == pytest.approx(stats.tau())
    assert stats.bonus == 0 and stats.alpha() == 1.0


def test_batched_tau_is_the_rows_kept_tokens_per_round(models):
    target, _, close = models
    stats = DecodeStats()
    res = SpeculativeEngine(target, close, eos_token_id=None).generate(
        PROMPTS, k=3, max_new_tokens=7, stats=stats)
    decoded = sum(len(r.tokens) - 1 for r in res)
    assert stats.tau() == pytest.approx(decoded / stats.row_steps)
    assert stats.tau() == pytest.approx(decoded / sum(r.stats.target_calls - 1 for r in res))


def test_c_leaves_out_the_catch_up_after_plain_rounds(models, monkeypatch):
    """On a clock that advances only in forwards (a draft forward costs its width, a target
    forward 10), c after six plain rounds equals c at a fixed K: (2 + 1) / 2 / 10 at K = 2
    (the first drafting step feeds two tokens). The draft missed the prefill's token and six
    plain ones; all but the last two of those are catch-up time."""
    target, _, close = models
    engine = SpeculativeEngine(target, close, eos_token_id=None)
    clock = [0.0]

    def costing(forward, cost):
        def run(tokens, *args, **kw):
            clock[0] += cost(tokens)
            return forward(tokens, *args, **kw)
        return run

    monkeypatch.setattr(clock_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    drafts = engine.draft.runner  # the standalone draft's model runner
    monkeypatch.setattr(drafts, "forward", costing(drafts.forward, lambda t: t.shape[1]))
    monkeypatch.setattr(engine.target, "forward", costing(engine.target.forward, lambda t: 10))

    def c_after(plain_rounds: int) -> DecodeStats:
        stats, script = DecodeStats(), ScriptedK(2, 0)
        with torch.inference_mode():
            state = engine.start([PROMPT], SamplingParams(), 16, k=script.choice, stats=stats)
            for _ in range(plain_rounds):
                state.step()
            script.play(2)
            while not state.finished:
                state.step()
        return stats

    fixed, mixed = c_after(0), c_after(6)
    assert fixed.c(10.0) == pytest.approx(0.15) and fixed.seconds_catchup == 0
    assert mixed.c() == pytest.approx(0.15)  # target step from its own K = 0 rounds
    assert mixed.seconds_catchup == pytest.approx(5)


def test_the_round_set_up_is_timed_as_neither_forward(models, monkeypatch):
    """A round first gathers its rows' lengths and last tokens. On a clock where making a
    tensor costs 100 and a target forward its width, a plain step times 1 and a verify at
    K = 2 times 3: v(2) = 3, and the set-up counts as round overhead. (Timed inside the plain
    step, it read v = 3 / 201.)"""
    target, _, close = models
    engine = SpeculativeEngine(target, close, eos_token_id=None)
    clock, inside = [0.0], [False]
    make = torch.tensor

    def tensor(*args, **kw):
        clock[0] += 0 if inside[0] else 100  # the forward's own tensors are its cost
        return make(*args, **kw)

    def forward(tokens, *args, **kw):
        clock[0] += tokens.shape[1]
        inside[0] = True
        try:
            return real(tokens, *args, **kw)
        finally:
            inside[0] = False

    real = engine.target.forward
    monkeypatch.setattr(clock_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(engine.target, "forward", forward)
    stats, script = DecodeStats(), ScriptedK(2, 0)
    with torch.inference_mode():
        state = engine.start([PROMPT], SamplingParams(), 12, k=script.choice, stats=stats)
        monkeypatch.setattr(torch, "tensor", tensor)
        for _ in range(2):
            state.step()
        script.play(2)
        while not state.finished:
            state.step()
    monkeypatch.setattr(torch, "tensor", make)
    assert stats.target_step_seconds(1) == 1.0 and stats.target_step_seconds(3) == 3.0
    assert stats.v(2) == 3.0
    assert stats.overhead_per_round() >= 200  # two tensors of set-up a round, at least
