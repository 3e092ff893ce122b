"""A decode simulator for the K policy: what ``--k auto`` earns at a given alpha and c.

Rounds at batch 1 where every drafted token is accepted with probability alpha on its own
(i.i.d., the assumption of Leviathan et al., arXiv 2211.17192, section 3.1) and stops at the
first rejection; time per round follows a cost model instead of a clock:

    T_draft = K c T_STEP,   T_target(K + 1) = T_STEP v(K),   plus T_OVERHEAD,

with v(K) = 1 + 0.05 K by default (a memory-bound verify) or any curve ``v`` given (a CPU whose
2-token forward costs two plain steps and longer ones little more), so a policy can be compared
with the best fixed K over thousands of rounds in a second, and a change to the policy with
what it replaces (``eval/benchmarks/probes/k_policy_sim.py``).
"""

from __future__ import annotations

import random
from typing import Callable

from draftkit import metrics
from draftkit.decode.k import AUTO, K_MAX
from draftkit.decode.policy import KPolicy
from draftkit.decode.stats import RoundStats

T_STEP, T_OVERHEAD = 0.010, 0.0002  # seconds: one target step, the per-round overhead
V_SLOPE = 0.05  # verify inflation per drafted token: T_target(K + 1) / T_target(1) = 1 + 0.05 K


def linear_v(k: int) -> float:
    """The default verify inflation T_target(K + 1) / T_target(1)."""
    return 1 + V_SLOPE * k


def simulate_speedup(alpha: float | Callable[[int], float], c: float, k: int | str = AUTO,
                     rounds: int = 2000, seed: int = 0, policy_class: type = KPolicy,
                     v: Callable[[int], float] = linear_v,
                     speed: Callable[[int], float] | None = None) -> tuple[float, list[int]]:
    """Decode ``rounds`` rounds at batch 1 with i.i.d. acceptance ``alpha`` (a rate, or a
    function of the round index), draft cost ratio ``c`` and verify inflation ``v(K)``; K fixed,
    or ``"auto"``: chosen each round by a fresh ``policy_class(k_max=K_MAX)`` fed the round's
    counts and modelled times. ``speed``: a factor on every time of round i (a shared machine
    whose speed drifts), by default 1.

    Returns the speedup over plain decoding (tokens per second against K = 0's at the same
    speeds) and the K of every round.
    """
    rng = random.Random(seed)
    policy = policy_class(k_max=K_MAX)
    # seconds: this run's; plain: what K = 0 would have spent on the same tokens
    seconds, plain, chosen = 0.0, 0.0, []
    for i in range(rounds):
        a = alpha(i) if callable(alpha) else alpha
        x = speed(i) if speed is not None else 1.0
        kk = policy.choose(1) if k == AUTO else int(k)
        chosen.append(kk)
        r = _sampled_round(rng, a, kk, 1, x * kk * c * T_STEP, x * T_STEP * v(kk), x * T_OVERHEAD)
        seconds += r.seconds_draft + r.seconds_verify + r.seconds_other
        plain += r.tokens * x * (T_STEP + T_OVERHEAD)  # the accepted drafts and the target's own
        policy.observe(r)
    return plain / seconds, chosen


def _sampled_round(rng: random.Random, alpha: float, k: int, rows: int, t_draft: float,
                   t_verify: float, t_other: float = T_OVERHEAD) -> RoundStats:
    """One round of ``rows`` rows at K = ``k``, every drafted token accepted with probability
    ``alpha`` on its own, positions tested until a row's first rejection; timed as given."""
    accepted, tested = [0] * k, [0] * k
    kept = rejections = bonus = 0
    for _row in range(rows):
        n = 0
        for j in range(k):
            tested[j] += 1
            if rng.random() >= alpha:
                rejections += 1
                break
            accepted[j] += 1
            n += 1
        bonus += n == k
        kept += n + 1
    return RoundStats(k=k, rows=rows, accepted_per_position=accepted, tested_per_position=tested,
                      beta_sum=0.0, rejections=rejections, bonus=bonus, tokens=kept,
                      seconds_draft=t_draft, seconds_verify=t_verify, seconds_other=t_other)


def best_fixed_k(alpha: float, c: float, k_max: int = K_MAX, v: Callable[[int], float] = linear_v
                 ) -> tuple[int, float]:
    """(K, speedup) of the best fixed K under the simulator's cost model, from the speedup
    model (:func:`draftkit.metrics.optimal_k`); K = 0 when speculation loses."""
    return metrics.optimal_k(alpha, c, k_max=k_max, v=v, overhead=T_OVERHEAD / T_STEP)


def served_target_seconds(batch: int, tokens: int) -> float:
    """A target forward over ``batch`` rows of ``tokens`` new tokens on a CPU-like device: the
    memory floor of a plain step plus arithmetic that grows with rows x tokens, so verifying
    costs more relative to a plain step the larger the batch (T(16, 2) / T(16, 1) = 1.59)."""
    work = batch * tokens
    return T_STEP if work <= 1 else T_STEP * (0.55 + 0.45 * work ** 0.75)


def simulate_load(alpha: float, c: float, k: int | str = AUTO, rounds: int = 3000,
                  seed: int = 0, max_batch: int = 16) -> tuple[float, list[tuple[int, int]]]:
    """A server's rounds: the live batch size walks between 1 and ``max_batch`` (requests
    come and go), every row's drafts accepted i.i.d. with probability ``alpha``, a draft step
    costing ``c`` of a plain step at that batch size (:func:`served_target_seconds`). K fixed,
    or ``"auto"``: one policy for the whole run, as the server keeps one. Returns the tokens
    per second against K = 0's over the same batch sizes, and (batch size, K) of every round."""
    rng, walk = random.Random(seed), random.Random(seed + 1)
    policy = KPolicy(k_max=K_MAX)
    # seconds: this run's; plain: what K = 0 would have spent on the same tokens
    batch, seconds, plain, chosen = max_batch // 4, 0.0, 0.0, []
    for _ in range(rounds):
        batch = max(1, min(max_batch, batch + walk.choice((-1, 0, 1))))
        kk = policy.choose(batch) if k == AUTO else int(k)
        chosen.append((batch, kk))
        r = _sampled_round(rng, alpha, kk, batch, kk * c * served_target_seconds(batch, 1),
                           served_target_seconds(batch, kk + 1))
        seconds += r.seconds_draft + r.seconds_verify + T_OVERHEAD
        plain += r.tokens * (served_target_seconds(batch, 1) + T_OVERHEAD) / batch
        policy.observe(r)
    return plain / seconds, chosen
