"""The numbers of speculative decoding: acceptance, tokens per target call, predicted speedup.

Pure math on floats: no models, no I/O. The decoder, the K policy, the eval stage and the
reports all use these functions, so every figure draftkit prints means the same thing.

Notation (Leviathan et al., arXiv 2211.17192; see eval/README.md, "How speculation pays"):

- alpha: probability that a drafted token is accepted; ``alpha_i`` the conditional acceptance
  at draft position i given positions 1..i-1 were accepted (it falls with i in practice).
- K (``num_speculative_tokens``): tokens drafted per round.
- tau: mean tokens produced per target call, the bonus / residual token included.
- c: time of one draft step / time of one target step (1 token).
- v: verify inflation, T_target(K + 1 tokens) / T_target(1 token); the simple formula has v = 1.
- overhead: fixed per-round cost (sampling, bookkeeping, Python) in units of one target step.

Per-position figures take a sequence ``alphas = [alpha_1, ..., alpha_K]``; a float means the
same alpha at every position (the i.i.d. model of the paper).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence

AlphaLike = float | Sequence[float]
VLike = float | Sequence[float] | Callable[[int], float] | None


def _alphas(alpha: AlphaLike, k: int) -> list[float]:
    """Per-position conditional acceptance for positions 1..k (a float repeats)."""
    if isinstance(alpha, (int, float)):
        a = [float(alpha)] * k
    else:
        a = [float(x) for x in alpha]
        if len(a) < k:  # positions never measured keep the last measured rate
            a = a + [a[-1] if a else 0.0] * (k - len(a))
        a = a[:k]
    for x in a:
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"acceptance rates must lie in [0, 1], got {x}")
    return a


def tau(alpha: AlphaLike, k: int) -> float:
    """Expected tokens per target call with K drafted tokens.

    i.i.d.: tau = (1 - alpha^(K+1)) / (1 - alpha) (Leviathan et al., eq. 1). Per position:
    tau = 1 + sum_{i=1..K} prod_{j<=i} alpha_j (the bonus / residual token is the 1).
    """
    if k < 0:
        raise ValueError(f"K must be >= 0, got {k}")
    total, reach = 1.0, 1.0
    for a in _alphas(alpha, k):
        reach *= a  # probability that the first i drafted tokens are all accepted
        total += reach
    return total


def _v_at(v: VLike, k: int) -> float:
    if k == 0:
        return 1.0  # K = 0 is plain decoding: one token per target step by definition
    if v is None:
        return 1.0
    if callable(v):
        return float(v(k))
    if isinstance(v, (int, float)):
        return float(v)
    return float(v[min(k, len(v) - 1)])  # v[k] = inflation of a K+1-token verify


def v_between(measured: dict[int, float]) -> Callable[[int], float] | None:
    """v(K) from the verify inflations measured at a few K (``{K: v}``), for :func:`speedup`.

    v grows with K (a K + 1-token verify costs more than a 1-token step), so one v for every K
    misprices the others. At a measured K this is the measured v; between two measured K, the
    straight line through them; outside, the nearest measured v (no extrapolation: a line
    through two noisy points can run anywhere). None when nothing was measured.
    """
    pts = sorted((int(k), float(v)) for k, v in measured.items() if v is not None)
    if not pts:
        return None

    def v_of(k: int) -> float:
        if k <= pts[0][0]:
            return pts[0][1]
        for (k0, v0), (k1, v1) in zip(pts, pts[1:]):
            if k <= k1:
                return v0 + (k - k0) * (v1 - v0) / (k1 - k0)
        return pts[-1][1]

    return v_of


def speedup(alpha: AlphaLike, c: float, k: int, v: VLike = 1.0, overhead: float = 0.0,
            per_round: bool = False) -> float:
    """Predicted walltime speedup over plain decoding (K = 0 has speedup 1 by definition).

    S(K) = tau(K) / (F(K) c + v(K) + overhead), F(K) the draft forwards a round
    (:func:`draft_forwards`: K, or one with ``per_round``, a parallel head). With F(K) = K,
    v = 1 and no overhead this is (1 - alpha^(K+1)) / ((1 - alpha)(1 + cK)) (Leviathan et al.,
    Theorem 3.8). ``v`` is a float, a sequence indexed by K, or a function of K.
    """
    if k == 0:
        return 1.0
    return tau(alpha, k) / (draft_forwards(k, per_round) * c + _v_at(v, k) + overhead)


def draft_forwards(k: int, per_round: bool = False) -> int:
    """Draft forwards a round of K drafted tokens takes: K, one a token, or with ``per_round``
    one, as a parallel head (P-EAGLE, arXiv 2602.01469) drafts all K in one forward; c and
    T_draft are the cost of one such forward."""
    return min(k, 1) if per_round else k


def speedup_from_times(tau_value: float, t_target: float, t_draft: float, t_verify: float,
                       t_overhead: float, k: int, per_round: bool = False) -> float:
    """The general model (eval/README.md, "How speculation pays"), in seconds at one batch and
    context:

    S = tau * T_target / (F(K) T_draft + T_verify(K + 1) + T_overhead),

    F(K) the draft's forwards a round (:func:`draft_forwards`: K, or 1 with ``per_round``).
    """
    return tau_value * t_target / (draft_forwards(k, per_round) * t_draft + t_verify
                                   + t_overhead)


def optimal_k(alpha: AlphaLike, c: float, k_max: int = 16, v: VLike = 1.0,
              overhead: float = 0.0, per_round: bool = False) -> tuple[int, float]:
    """(K, speedup) maximising :func:`speedup` over integers 0..k_max.

    There is no closed form, so search. K = 0 wins when speculation loses.
    """
    best = (0, 1.0)
    for k in range(1, k_max + 1):
        s = speedup(alpha, c, k, v, overhead, per_round)
        if s > best[1] + 1e-12:
            best = (k, s)
    return best


def _bisect(f: Callable[[float], float], lo: float, hi: float, iters: int = 80) -> float:
    """Root of an increasing f on [lo, hi] (f(lo) < 0 < f(hi))."""
    for _ in range(iters):
        mid = (lo + hi) / 2
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def break_even_alpha(c: float, k: int = 1, v: VLike = 1.0, overhead: float = 0.0,
                     per_round: bool = False) -> float:
    """Smallest i.i.d. alpha at which K drafted tokens beat plain decoding (speedup = 1).

    Returns math.inf when even alpha = 1 does not pay. With v = 1 and K = 1 this is alpha = c:
    "if alpha <= c no K helps".
    """
    if k < 1:
        raise ValueError("break-even needs K >= 1")
    if speedup(1.0, c, k, v, overhead, per_round) <= 1.0:
        return math.inf
    if speedup(0.0, c, k, v, overhead, per_round) >= 1.0:
        return 0.0
    return _bisect(lambda a: speedup(a, c, k, v, overhead, per_round) - 1.0, 0.0, 1.0)


def break_even_alpha_any_k(c: float, k_max: int = 16, v: VLike = 1.0,
                           overhead: float = 0.0, per_round: bool = False) -> float:
    """Smallest alpha at which some K in 1..k_max beats plain decoding."""
    return min(break_even_alpha(c, k, v, overhead, per_round) for k in range(1, k_max + 1))


def max_draft_cost(alpha: AlphaLike, k: int, v: VLike = 1.0, overhead: float = 0.0,
                   per_round: bool = False) -> float:
    """Largest c at which K drafted tokens still break even (the crossover in draft cost)."""
    if k < 1:
        raise ValueError("crossover needs K >= 1")
    return max(0.0, (tau(alpha, k) - _v_at(v, k) - overhead) / draft_forwards(k, per_round))


def crossover(xs: Sequence[float], ys: Sequence[float | None], level: float = 1.0,
              log_x: bool = False) -> tuple[str, float | None]:
    """Where a measured curve y(x) falls below ``level`` (speedup 1.0 by default).

    Returns ``(kind, x)``:

    - ``"crosses"``: the curve ends below the level; x is its last downward crossing, linearly
      interpolated between the two points around it (in log2 x with ``log_x``, for batch
      sizes). Taking the last crossing means a noisy dip that recovers is not the crossover:
      past x, every measured point is below the level.
    - ``"rises"``: the curve ends at or above the level after being below it; x is its last
      upward crossing.
    - ``"below"`` / ``"above"``: every point is below / at or above; no crossover inside the
      range (x is None).
    - ``"empty"``: no points (None values are skipped).
    """
    pts = sorted((float(x), float(y)) for x, y in zip(xs, ys) if y is not None)
    if not pts:
        return "empty", None
    below = [y < level for _, y in pts]
    if all(below):
        return "below", None
    if not any(below):
        return "above", None
    ends_below = below[-1]
    # the last index on the other side of the level from the final point
    i = max(j for j, b in enumerate(below) if b != ends_below)
    (x0, y0), (x1, y1) = pts[i], pts[i + 1]
    if log_x:
        x0, x1 = math.log2(x0), math.log2(x1)
    x = x0 + (level - y0) * (x1 - x0) / (y1 - y0)  # y0 != y1: they lie on either side
    return ("crosses" if ends_below else "rises"), (2.0 ** x if log_x else x)


# --- estimators --------------------------------------------------------------------------------

def alpha_from_counts(accepted: int, rejected: int) -> float:
    """Acceptance rate with the truncation correction.

    A round stops drafting at its first rejection, so positions after it are never tested:
    accepted / drafted underestimates alpha. Each tested position is a Bernoulli(alpha) trial,
    and the tested positions are the accepted ones plus one per rejection.
    """
    tested = accepted + rejected
    return accepted / tested if tested else 0.0


def conditional_alphas(accepted_per_position: Sequence[float],
                       tested_per_position: Sequence[float]) -> list[float]:
    """alpha_i = accepted at position i / rounds that reached position i (0 where untested)."""
    return [a / t if t else 0.0 for a, t in zip(accepted_per_position, tested_per_position)]


def alpha_from_tau(tau_value: float, k: int) -> float:
    """The i.i.d. alpha that gives this tau at this K (inverts :func:`tau`)."""
    if k < 1:
        raise ValueError("alpha from tau needs K >= 1")
    if not 1.0 <= tau_value <= k + 1:
        raise ValueError(f"tau must lie in [1, K + 1] = [1, {k + 1}], got {tau_value}")
    return _bisect(lambda a: tau(a, k) - tau_value, 0.0, 1.0)


def bootstrap(statistic: Callable[[Sequence[int]], float], n: int, resamples: int = 10000,
              level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """``statistic`` over units 0..n-1, with a percentile interval from resampling whole units
    with replacement (Efron and Tibshirani 1993, ch. 13). ``statistic`` takes the indices of a
    resample (repeats included). Seeded, so a report's interval can be derived again. Returns
    (statistic over all units, low, high)."""
    if n < 1:
        raise ValueError("a bootstrap needs at least one unit")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    rng = random.Random(seed)
    draws = sorted(statistic(rng.choices(range(n), k=n)) for _ in range(resamples))
    tail = (1.0 - level) / 2
    lo = draws[min(resamples - 1, int(tail * resamples))]
    hi = draws[max(0, math.ceil((1.0 - tail) * resamples) - 1)]
    return statistic(range(n)), lo, hi


def paired_bootstrap(a: Sequence[float], b: Sequence[float], weights: Sequence[float],
                     resamples: int = 10000, level: float = 0.95, seed: int = 0
                     ) -> tuple[float, float, float]:
    """The difference of two weighted means over the same units, with a percentile interval.

    Unit i (a held-out row) contributes sums ``a[i]`` and ``b[i]`` (acceptance of two drafts
    summed over its ``weights[i]`` positions). The difference is
    sum(a) / sum(w) - sum(b) / sum(w); resampling whole units, both drafts together, keeps
    positions of one row, which are not independent, in one draw (:func:`bootstrap`). Returns
    (difference, low, high).
    """
    if not len(a) == len(b) == len(weights) or not len(a):
        raise ValueError("paired_bootstrap needs a, b and weights of one non-zero length")
    diff = [x - y for x, y in zip(a, b)]

    def delta(idx: Sequence[int]) -> float:
        w = sum(weights[i] for i in idx)
        return sum(diff[i] for i in idx) / w if w else 0.0

    return bootstrap(delta, len(diff), resamples, level, seed)


def median_ratio(num: Sequence[float], den: Sequence[float], resamples: int = 2000,
                 level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """median(num) / median(den) over rounds timed in pairs (``num[i]`` beside ``den[i]``),
    with a percentile interval from resampling whole rounds (:func:`bootstrap`): how much
    slower one way is than another on a machine whose speed drifts. Returns (ratio, low,
    high)."""
    if not len(num) == len(den) or not len(num):
        raise ValueError("median_ratio needs two sequences of one non-zero length")
    return bootstrap(lambda idx: statistics.median(num[i] for i in idx)
                     / statistics.median(den[i] for i in idx), len(num), resamples, level, seed)


def speedup_interval(plain_seconds: Sequence[float], spec_seconds: Sequence[float],
                     plain_tokens: Sequence[int], spec_tokens: Sequence[int],
                     resamples: int = 2000, level: float = 0.95, seed: int = 0
                     ) -> tuple[float, float, float]:
    """Measured speedup, tokens per second with speculation over tokens per second without,
    pooled over prompts, with a paired bootstrap interval over prompts.

    Prompt i was decoded both ways (``plain_seconds[i]`` for ``plain_tokens[i]`` tokens, and
    ``spec_*``), interleaved, so a resample keeps both halves of a pair together: the machine's
    drift and the prompt's difficulty cancel within a pair, and the interval measures how much
    the speedup depends on which prompts were drawn. Returns (speedup, low, high)."""
    n = len(plain_seconds)
    if not n or not n == len(spec_seconds) == len(plain_tokens) == len(spec_tokens):
        raise ValueError("speedup_interval needs four sequences of one non-zero length")

    def ratio(idx: Sequence[int]) -> float:
        plain = sum(plain_tokens[i] for i in idx) / max(sum(plain_seconds[i] for i in idx), 1e-12)
        spec = sum(spec_tokens[i] for i in idx) / max(sum(spec_seconds[i] for i in idx), 1e-12)
        return spec / plain if plain > 0 else 0.0

    return bootstrap(ratio, n, resamples, level, seed)


def units_to_decide(n: int, estimate: float, low: float, high: float,
                    level: float = 1.0) -> int | None:
    """About how many units (prompts) an interval from ``n`` would need to stop including
    ``level``: its half-width shrinks as 1 / sqrt(n), so n (half-width / distance)^2. None
    when the estimate sits on ``level`` (no number decides) or the interval already excludes
    it."""
    half, distance = (high - low) / 2, abs(estimate - level)
    if low > level or high < level:
        return None
    if distance <= 1e-9:
        return None
    return max(n + 1, math.ceil(n * (half / distance) ** 2))


# --- other stacks' figures (eval/README.md, "How speculation pays") --------------------------

def tau_from_acceptance_rate(rate: float, k: int) -> float:
    """vLLM "draft acceptance rate" / SGLang ``spec_accept_rate`` = (tau - 1) / K -> tau."""
    return 1.0 + rate * k


def acceptance_rate_from_tau(tau_value: float, k: int) -> float:
    """tau -> vLLM "draft acceptance rate" / SGLang ``spec_accept_rate`` (NOT alpha)."""
    return (tau_value - 1.0) / k


def tau_from_gpt_fast(mean_accepted: float) -> float:
    """gpt-fast's "mean accepted" excludes the bonus token: tau = mean accepted + 1."""
    return mean_accepted + 1.0


def conditional_alphas_from_vllm(num_drafts: float,
                                 accepted_per_position: Sequence[float]) -> list[float]:
    """vLLM per-position counters -> conditional alpha_i.

    ``..._num_accepted_tokens_per_pos_total{position=i}`` / ``..._num_drafts_total`` is
    r_i = P(first i + 1 drafts accepted); alpha_i = r_i / r_(i-1) with r_(-1) = 1.
    """
    out, prev = [], 1.0
    for count in accepted_per_position:
        r = count / num_drafts if num_drafts else 0.0
        out.append(r / prev if prev > 0 else 0.0)
        prev = r
    return out


def tau_from_vllm(num_drafts: float, num_accepted_tokens: float) -> float:
    """tau (mean acceptance length) from vLLM's counters: 1 + accepted / drafts."""
    return 1.0 + num_accepted_tokens / num_drafts if num_drafts else 1.0
