"""A round's statistics from its verdict, and the clock that times the round's laps."""

from types import SimpleNamespace

import pytest
import torch

from draftkit.decode import clock as clock_module
from draftkit.decode.clock import RoundClock
from draftkit.decode.stats import DecodeStats, RoundStats
from draftkit.decode.verify import Verdict

K = 3
# five rows: rejected at once, rejected at position 2, all accepted with the bonus kept, all
# accepted but cut by the budget before the bonus, and a row that was done (left out)
ACCEPTED = [0, 2, 3, 3, 1]
ACTIVE = [True, True, True, True, False]
KEPT = [1, 3, 4, 2, 0]


def verdict(accepted=ACCEPTED):
    bsz = len(accepted)
    beta = (torch.arange(bsz * K, dtype=torch.float32).reshape(bsz, K) + 1) / 16  # exact
    return Verdict(torch.tensor(accepted), torch.zeros(bsz, dtype=torch.long), beta)


def test_counts_per_position_rejections_and_bonus():
    v = verdict()
    r = RoundStats.from_verdict(v, accepted=ACCEPTED, active=ACTIVE, kept=KEPT)
    assert r.k == K and r.rows == 4 and r.tokens == 10
    # position i is tested by the rows that accepted i tokens or more, passed by those that
    # accepted more than i
    assert r.tested_per_position == [4, 3, 3]
    assert r.accepted_per_position == [3, 3, 2]
    assert r.rejections == 2  # rows 0 and 1
    assert r.bonus == 1  # row 2; row 3 accepted all K but the budget cut its bonus token
    # beta at every tested position of the active rows: row 0 at 0, rows 1-3 at 0..2
    beta = v.beta
    assert r.beta_sum == beta[0, 0].item() + beta[1:4].sum().item()
    assert (r.seconds_draft, r.seconds_verify, r.seconds_other, r.seconds_catchup) == (0,) * 4


def test_a_plain_step_has_no_positions():
    r = RoundStats.from_verdict(None, accepted=[0, 0, 0], active=[True, False, True],
                                kept=[1, 0, 1])
    assert r == RoundStats(k=0, rows=2, accepted_per_position=[], tested_per_position=[],
                           beta_sum=0.0, rejections=0, bonus=0, tokens=2)


def test_the_counts_add_up_to_alpha_and_tau():
    stats = DecodeStats()
    stats.add_round(RoundStats.from_verdict(verdict(), accepted=ACCEPTED, active=ACTIVE,
                                            kept=KEPT))
    assert stats.accepted == 8 and stats.rejections == 2
    assert stats.alpha() == pytest.approx(8 / 10)  # accepted / tested positions
    assert stats.alphas() == pytest.approx([3 / 4, 3 / 3, 2 / 3])
    assert stats.tau() == pytest.approx(10 / 4)


def test_empty_and_set_seconds():
    assert RoundStats.empty(2) == RoundStats(k=2, rows=0, accepted_per_position=[0, 0],
                                             tested_per_position=[0, 0], beta_sum=0.0,
                                             rejections=0, bonus=0, tokens=0)
    r = RoundStats.empty(2)
    r.set_seconds({"draft": 1.0, "verify": 2.0, "other": 0.5})
    assert (r.seconds_draft, r.seconds_verify, r.seconds_other, r.seconds_catchup) == (
        1.0, 2.0, 0.5, 0.0)
    with pytest.raises(TypeError):  # construction is by keyword
        RoundStats(2, 0, [0, 0], [0, 0], 0.0, 0, 0, 0)


def test_clock_laps_add_up_and_each_waits_for_the_device_once(monkeypatch):
    now, syncs = [10.0], []
    monkeypatch.setattr(clock_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(clock_module, "synchronize", syncs.append)
    clock = RoundClock(torch.device("cpu"))
    for name, seconds in (("other", 1.0), ("draft", 2.0), ("verify", 4.0), ("other", 0.5)):
        now[0] += seconds
        assert clock.lap(name) == seconds
    assert clock.laps == {"other": 1.5, "draft": 2.0, "verify": 4.0}
    assert len(syncs) == 4


def test_a_row_that_ends_at_its_first_token_has_tau_one():
    """No decoding round ran: its one token took one target call (tau is never below 1)."""
    from draftkit.decode.engine import SpeculativeEngine
    from tests.helpers import noisy_copy, tiny_target_and_draft

    target, _ = tiny_target_and_draft()
    engine = SpeculativeEngine(target, noisy_copy(target))
    one, more = engine.generate([[4, 5, 6], [4, 5, 6]], k=2, max_new_tokens=1)[0], \
        engine.generate([[4, 5, 6]], k=2, max_new_tokens=9)[0]
    assert (len(one.tokens), one.stats.target_calls, one.tau) == (1, 1, 1.0)
    assert more.tau >= 1.0 and more.stats.target_calls > 1
