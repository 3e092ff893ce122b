"""Engine slots: admit and release rows between rounds, per-row sampling parameters and seeds."""

import itertools

import pytest
import torch

from draftkit.decode.choice import resolve_k
from draftkit.decode.engine import SpeculativeEngine
from draftkit.decode.sampling import SamplingParams, row_probabilities
from draftkit.errors import DraftkitError
from tests.helpers import ScriptedK

A, B, C, D = [5, 9, 22, 31, 7], [11, 12], [40, 41, 42, 43, 44, 45, 46, 8], [60, 61, 62]
GREEDY, WARM = SamplingParams(), SamplingParams(0.9, top_p=0.95)


@pytest.fixture(scope="module")
def engines(tiny_models):
    _, target, draft = tiny_models
    return (SpeculativeEngine(target, draft, eos_token_id=None),
            SpeculativeEngine(target, draft, eos_token_id=None, fast_path=False))


def alone(engine, prompt, n):
    return engine.generate([prompt], k=0, max_new_tokens=n)[0].tokens


def up_to(k_max):
    return resolve_k(k_max, has_draft=True)


def run(batch, rounds=None):
    i = 0
    while batch.live and (rounds is None or i < rounds):
        batch.step()
        i += 1


def test_admitted_rows_equal_decoding_alone(engines):
    """Rows join and leave a running batch (mixed greedy and sampled rows); every greedy row
    still produces exactly the tokens it would alone."""
    engine = engines[0]
    assert engine.slotted
    script = ScriptedK(3, 3)
    with torch.inference_mode():
        batch = engine.open(4, script.choice, max_len=128)
        (sa,) = batch.admit([A], GREEDY, 20)
        (sb,) = batch.admit([B], WARM, 30, [1])
        run(batch, rounds=3)
        (sc,) = batch.admit([C], GREEDY, 12)  # joins mid-flight
        script.play(2)
        run(batch, rounds=2)
        batch.release(sb)  # a client went away
        assert batch.output(sb).finish_reason == "abort" and batch.free_slots() == 2
        (sd,) = batch.admit([D], GREEDY, 15)  # reuses the freed slot
        assert sd == sb
        script.play(itertools.cycle(range(4)))  # K changes between rounds, as under --k auto
        run(batch)
    for slot, prompt, n in ((sa, A, 20), (sc, C, 12), (sd, D, 15)):
        assert batch.output(slot).tokens == alone(engine, prompt, n)
        assert batch.output(slot).finish_reason == "length"
    assert batch.output(sa).stats.drafted > 0 and batch.output(sa).stats.accepted > 0


def test_seeded_row_does_not_depend_on_its_batch(engines):
    engine = engines[0]

    def sampled(others):
        with torch.inference_mode():
            batch = engine.open(4, up_to(2), max_len=128)
            if others:
                batch.admit([B, C], [WARM, GREEDY], 25)
            (s,) = batch.admit([A], SamplingParams(1.0), 18, [7])
            run(batch)
        return batch.output(s).tokens

    solo = sampled(False)
    assert sampled(True) == solo
    assert len(solo) == 18


def test_row_probabilities_per_row():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 0.0, 2.0]])
    p = row_probabilities(logits, [GREEDY, SamplingParams(1.0), SamplingParams(1.0, top_k=1)])
    assert p[0].tolist() == [1.0, 0.0, 0.0]  # greedy: one-hot at the argmax
    torch.testing.assert_close(p[1], logits[1].softmax(-1))
    assert p[2].tolist() == [0.0, 0.0, 1.0]


def test_general_runner_admits_cohorts(engines):
    engine = engines[1]
    assert not engine.slotted
    with torch.inference_mode():
        batch = engine.open(3, up_to(2), max_len=128)
        slots = batch.admit([A, B], GREEDY, 10)
        with pytest.raises(DraftkitError, match="empty batch"):
            batch.admit([C], GREEDY, 10)
        run(batch)
        first = [batch.output(s).tokens for s in slots]
        for s in slots:
            batch.release(s)
        (sc,) = batch.admit([C], GREEDY, 10)  # a new cohort
        run(batch)
    assert first == [alone(engine, A, 10), alone(engine, B, 10)]
    assert batch.output(sc).tokens == alone(engine, C, 10)


def test_admit_checks_room(engines):
    engine = engines[0]
    batch = engine.open(1, up_to(2), max_len=16)
    with pytest.raises(DraftkitError, match="context window"):
        batch.admit([[5] * 13], GREEDY, 4)
    with torch.inference_mode():
        batch.admit([[5] * 4], GREEDY, 100)  # the budget is capped to the room
        run(batch)
    assert len(batch.output(0).tokens) == 16 - 4 - 4
    with pytest.raises(DraftkitError, match="slots are free"):
        batch.admit([A], GREEDY, 4)
