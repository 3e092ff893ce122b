"""--k auto: the choice follows the speedup model and does not thrash."""

import random

from draftkit import metrics
from draftkit.decode.policy import KPolicy
from draftkit.decode.stats import RoundStats


def simulate(policy, alpha, t1=0.05, slope=0.1, c=0.1, rows=8, rounds=200, noise=0.0, seed=0):
    """Feed the policy rounds whose counts follow i.i.d. alpha and whose times follow
    T_target(T) = t1 (1 + slope (T - 1)), T_draft = c t1 (with multiplicative noise)."""
    rng = random.Random(seed)
    chosen = []
    for _ in range(rounds):
        k = policy.choose(rows)
        chosen.append(k)
        reach = [rows * alpha ** (i + 1) for i in range(k)]  # rows accepting position i
        tested = [rows] + reach[:-1] if k else []

        def jitter(x):
            return x * (1 + noise * rng.uniform(-1, 1))
        policy.observe(RoundStats(k, rows, [round(a) for a in reach], [round(t) for t in tested],
                                  0.0, 0, 0, 0, jitter(c * t1 * k), jitter(t1 * (1 + slope * k)),
                                  jitter(0.001)))
    return chosen


def test_high_alpha_cheap_draft_picks_the_model_optimum():
    p = KPolicy(k_max=8)
    chosen = simulate(p, alpha=0.8)
    best, _ = metrics.optimal_k(0.8, 0.1 / 1.0, k_max=8, v=lambda k: 1 + 0.1 * k)
    assert abs(chosen[-1] - best) <= 1 and chosen[-1] >= 3


def test_low_alpha_returns_k0_and_probes_rarely():
    p = KPolicy(k_max=8, probe_every=16)
    chosen = simulate(p, alpha=0.05, c=0.3)
    tail = chosen[50:]
    assert tail.count(0) > 0.85 * len(tail)


def test_probes_back_off_when_speculation_keeps_losing():
    """A pair that never pays: probes at K = 1 with doubling gaps, so over 1000 rounds only a
    handful of rounds speculate (16, 32, 64, ... rounds apart, capped)."""
    p = KPolicy(k_max=8, probe_every=16, max_probe_every=256)
    chosen = simulate(p, alpha=0.0, c=0.3, rounds=1000)
    probes = [i for i, k in enumerate(chosen[10:], 10) if k > 0]
    assert all(chosen[i] == 1 for i in probes)
    assert 3 <= len(probes) <= 8, probes
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[-1] <= 257


def test_large_batch_verify_inflation_turns_speculation_off():
    p = KPolicy(k_max=8)
    chosen = simulate(p, alpha=0.6, slope=1.0, c=0.2)  # verify cost grows with every token
    assert chosen[-1] == 0


def test_hysteresis_avoids_thrashing_under_clock_noise():
    p = KPolicy(k_max=8, hysteresis=0.05)
    chosen = simulate(p, alpha=0.7, noise=0.1, rounds=300)
    switches = sum(a != b for a, b in zip(chosen[50:], chosen[51:]))
    assert switches < 15
