"""draftkit.metrics: the closed forms (arXiv 2211.17192) and eval/README.md's optimal-K table."""

import math
import random

import pytest

from draftkit import metrics as m

# (alpha, c) -> (K, speedup) from the table in eval/README.md, "How speculation pays"
TABLE = {(0.5, 0.05): (3, 1.63), (0.5, 0.1): (2, 1.46), (0.5, 0.2): (1, 1.25),
         (0.5, 0.3): (1, 1.15), (0.5, 0.5): (0, 1.0), (0.6, 0.5): (1, 1.07),
         (0.7, 0.1): (4, 1.98), (0.8, 0.1): (6, 2.47), (0.8, 0.3): (3, 1.55),
         (0.9, 0.05): (13, 4.67), (0.9, 0.2): (7, 2.37), (0.9, 0.5): (3, 1.38)}


@pytest.mark.parametrize("alpha,c", list(TABLE))
def test_optimal_k_matches_reference_table(alpha, c):
    k, s = m.optimal_k(alpha, c, k_max=20)
    assert (k, round(s, 2)) == TABLE[(alpha, c)]


def test_tau_closed_form_and_per_position():
    for a in (0.0, 0.3, 0.8):
        for k in range(6):
            assert m.tau(a, k) == pytest.approx((1 - a ** (k + 1)) / (1 - a))
    assert m.tau(1.0, 4) == 5
    assert m.tau([0.9, 0.5, 0.2], 3) == pytest.approx(1 + 0.9 + 0.45 + 0.09)
    assert m.tau([0.9], 3) == pytest.approx(m.tau(0.9, 3))  # missing positions repeat the last
    with pytest.raises(ValueError):
        m.tau(1.2, 2)


def test_speedup_general_model():
    assert m.speedup(0.8, 0.1, 0) == 1.0
    assert m.speedup(0.8, 0.1, 3) == pytest.approx(m.tau(0.8, 3) / 1.3)
    # verify inflation and overhead lower the speedup; v may be a function or a table of K
    assert m.speedup(0.8, 0.1, 3, v=1.5) == pytest.approx(m.tau(0.8, 3) / 1.8)
    assert m.speedup(0.8, 0.1, 3, v=lambda k: 1 + 0.1 * k, overhead=0.2) == \
        pytest.approx(m.tau(0.8, 3) / (0.3 + 1.3 + 0.2))
    assert m.speedup(0.8, 0.1, 2, v=[1.0, 1.1, 1.2]) == pytest.approx(m.tau(0.8, 2) / 1.4)
    assert m.speedup_from_times(2.0, 0.05, 0.01, 0.06, 0.0, 3) == pytest.approx(0.1 / 0.09)
    # inflation large enough makes K = 0 optimal
    assert m.optimal_k(0.6, 0.2, v=2.0)[0] == 0


def test_a_parallel_heads_draft_is_priced_once_a_round():
    # one forward drafts the round: K = 5 costs c, not 5c, so a longer K pays and breaks even
    # lower, and the largest c that still pays is K times as large
    assert m.speedup(0.8, 0.1, 5, per_round=True) == pytest.approx(m.tau(0.8, 5) / 1.1)
    assert m.speedup(0.8, 0.1, 5, per_round=True) > m.speedup(0.8, 0.1, 5)
    assert m.optimal_k(0.8, 0.1, k_max=8, per_round=True)[0] > m.optimal_k(0.8, 0.1, k_max=8)[0]
    assert m.break_even_alpha(0.1, 5, per_round=True) < m.break_even_alpha(0.1, 5)
    assert m.max_draft_cost(0.7, 3, per_round=True) == pytest.approx(3 * m.max_draft_cost(0.7, 3))
    assert m.speedup(0.8, 0.1, 0, per_round=True) == 1.0


def test_break_even_and_crossovers():
    assert m.break_even_alpha(0.2, k=1) == pytest.approx(0.2)  # alpha <= c: no K helps
    assert m.break_even_alpha_any_k(0.2) == pytest.approx(0.2, abs=1e-6)
    assert m.break_even_alpha(0.6, k=1, v=1.5) == math.inf or \
        m.speedup(m.break_even_alpha(0.6, k=1, v=1.5), 0.6, 1, v=1.5) == pytest.approx(1.0)
    a = m.break_even_alpha(0.19, k=3, v=1.15)
    assert m.speedup(a, 0.19, 3, v=1.15) == pytest.approx(1.0)
    assert m.break_even_alpha(1.0, k=2, v=2.0) == math.inf
    c = m.max_draft_cost(0.7, 3)
    assert m.speedup(0.7, c, 3) == pytest.approx(1.0)
    assert m.crossover([1, 2, 4, 8, 16], [1.8, 1.4, 1.05, 0.9, 0.7])[0] == "crosses"
    assert m.crossover([1, 2], [1.2, 1.1]) == ("above", None)


def test_v_between_measured_k():
    """v measured at K = 1 and 3 (and 6): measured there, on the line between, held outside."""
    v = m.v_between({3: 1.6, 1: 1.1, 6: None})
    assert [v(k) for k in (1, 2, 3, 5)] == pytest.approx([1.1, 1.35, 1.6, 1.6])
    assert m.v_between({}) is None and m.v_between({2: None}) is None
    # The run at K = 3 measured v = 1.6; K = 1 must not be priced with it.
    assert m.speedup(0.6, 0.1, 1, v) == pytest.approx(m.tau(0.6, 1) / (0.1 + 1.1))


def test_estimators_and_conversions():
    assert m.alpha_from_counts(30, 10) == 0.75
    assert m.conditional_alphas([8, 4, 0], [10, 8, 0]) == [0.8, 0.5, 0.0]
    assert m.alpha_from_tau(m.tau(0.65, 4), 4) == pytest.approx(0.65, abs=1e-9)
    # vLLM / SGLang acceptance rate = (tau - 1) / K, not alpha
    assert m.tau_from_acceptance_rate(0.5, 4) == 3.0
    assert m.acceptance_rate_from_tau(3.0, 4) == 0.5
    assert m.tau_from_gpt_fast(1.28) == pytest.approx(2.28)
    # per-position r_i = P(first i+1 accepted): 80/100, 40/100 -> alpha_1 = 0.8, alpha_2 = 0.5
    assert m.conditional_alphas_from_vllm(100, [80, 40, 10]) == pytest.approx([0.8, 0.5, 0.25])
    assert m.tau_from_vllm(100, 130) == pytest.approx(2.3)


def test_paired_bootstrap_interval():
    # Every row gains exactly 0.1 per position: no spread, so the interval is the point.
    w = [100, 50, 80, 120]
    b = [0.4 * n for n in w]
    a = [x + 0.1 * n for x, n in zip(b, w)]
    d, lo, hi = m.paired_bootstrap(a, b, w, resamples=500)
    assert d == pytest.approx(0.1) and lo == pytest.approx(0.1) and hi == pytest.approx(0.1)
    # Rows that disagree: the interval holds the point, widens with spread, shrinks with rows.
    rows = [(0.3, 0.2), (0.5, 0.6), (0.45, 0.3), (0.2, 0.25), (0.7, 0.5), (0.4, 0.4)]
    a, b, w = [x for x, _ in rows], [y for _, y in rows], [1.0] * len(rows)
    d, lo, hi = m.paired_bootstrap(a, b, w)
    assert d == pytest.approx(sum(a) / 6 - sum(b) / 6) and lo < d < hi
    assert lo < 0 < hi  # one row in three goes the other way: not a clear gain
    d4, lo4, hi4 = m.paired_bootstrap(a * 4, b * 4, w * 4)
    assert d4 == pytest.approx(d) and hi4 - lo4 < hi - lo
    assert m.paired_bootstrap(a, b, w) == (d, lo, hi)  # seeded: a report can be re-derived
    with pytest.raises(ValueError, match="length"):
        m.paired_bootstrap(a, b[:-1], w)


def test_speedup_interval_pairs_prompts_and_narrows_with_more():
    # ten prompts, each decoded both ways: speculation ~1.2x faster, prompt to prompt noise
    rng = random.Random(1)
    plain = [rng.uniform(0.8, 1.6) for _ in range(10)]
    spec = [p / 1.2 * rng.uniform(0.9, 1.1) for p in plain]
    tokens = [32] * 10
    est, lo, hi = m.speedup_interval(plain, spec, tokens, tokens)
    assert est == pytest.approx(sum(plain) / sum(spec)) and lo < est < hi
    assert 1.0 < lo and hi < 1.4
    # the pair cancels what both halves share: slow prompts are slow both ways
    scaled = [p * s for p, s in zip(plain, (1, 5) * 5)], [q * s for q, s in zip(spec, (1, 5) * 5)]
    assert m.speedup_interval(*scaled, tokens, tokens)[1] > 1.0
    # four times the prompts, half the width
    est4, lo4, hi4 = m.speedup_interval(plain * 4, spec * 4, tokens * 4, tokens * 4)
    assert (hi4 - lo4) == pytest.approx((hi - lo) / 2, rel=0.3)
    with pytest.raises(ValueError):
        m.speedup_interval(plain, spec[:-1], tokens, tokens)


def test_units_to_decide():
    # half-width 0.09 at distance 0.06 from 1.0 over 12 prompts: 12 * 1.5^2 = 27
    assert m.units_to_decide(12, 1.06, 0.97, 1.15) == 27
    assert m.units_to_decide(12, 1.2, 1.05, 1.35) is None  # already clear of 1.0
    assert m.units_to_decide(12, 1.0, 0.9, 1.1) is None  # no number decides
    assert m.units_to_decide(4, 1.5, 0.5, 2.5) > 4


def test_median_ratio_of_rounds_timed_in_pairs():
    """The ratio of the medians, its interval from resampling whole rounds: it holds the
    true ratio of two ways timed with noise, and a constant ratio has no spread."""
    rng = random.Random(0)
    slow = [2.0 * (1 + 0.1 * rng.random()) for _ in range(200)]
    fast = [1.0 * (1 + 0.1 * rng.random()) for _ in range(200)]
    ratio, lo, hi = m.median_ratio(slow, fast)
    assert lo < ratio < hi and lo < 2.0 < hi and hi - lo < 0.2
    assert m.median_ratio([3.0] * 5, [1.5] * 5) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError, match="one non-zero length"):
        m.median_ratio([1.0], [1.0, 2.0])


def test_interleaved_ms_times_every_way_each_round_in_alternating_order():
    import torch

    from draftkit.decode.clock import interleaved_ms

    calls = []
    times = interleaved_ms({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                           rounds=3, reps=2, device=torch.device("cpu"), warm=1)
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    assert all(t >= 0 for v in times.values() for t in v)
    # warm-up round 0 reversed, then a, b / b, a / a, b: two calls a way each round
    assert calls == list("bbaa" "aabb" "bbaa" "aabb")
    calls.clear()  # ``before`` ahead of each way's calls, untimed
    interleaved_ms({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=1,
                   reps=2, device=torch.device("cpu"), warm=1, before=lambda: calls.append("v"))
    assert calls == list("vbbvaa" "vaavbb")
