"""``--k auto``: choose K per round from running estimates, with hysteresis.

Each round the engine reports what happened (:class:`~draftkit.decode.stats.RoundStats`). The
policy keeps exponential moving averages of the conditional acceptance alpha_i per draft
position and of the seconds per target call by tokens verified, per draft step and per round of
overhead, keyed by the active batch size (verification inflation v grows with it). It picks the
K in 0..K_max that maximises the general speedup model of REFERENCE.md section 1,

    S(K) = tau(alpha_1..K) * (T_target(1) + T_overhead)
           / (K T_draft + T_target(K + 1) + T_overhead),

and keeps the current K unless another is predicted to be better by a margin (hysteresis), so
noise in the clocks does not make it thrash. K = 0 (plain decoding) wins when speculation
loses; while at K = 0 it probes K = 1 now and then so its estimates stay current (SmartSpec /
TurboSpec, arXiv 2406.14066, choose K from measured goodput the same way). A probe that does
not bring speculation back doubles the gap to the next one (up to ``max_probe_every``
rounds), so a pair that never pays costs well under 1% against plain decoding.
"""

from __future__ import annotations

from draftkit import metrics
from draftkit.decode.stats import RoundStats


class KPolicy:
    def __init__(self, k_max: int = 8, hysteresis: float = 0.05, probe_every: int = 16,
                 decay: float = 0.8, prior_alpha: float = 0.5, prior_weight: float = 4.0,
                 prior_v_slope: float = 0.15, max_probe_every: int = 256):
        if k_max < 0:
            raise ValueError("k_max must be >= 0")
        self.k_max, self.hysteresis, self.probe_every = k_max, hysteresis, probe_every
        self.max_probe_every = max(probe_every, max_probe_every)
        self.probe_gap = probe_every  # rounds at K = 0 before the next probe
        self.decay = decay  # weight of the past in every moving average
        self.prior_slope = prior_v_slope  # v(K) ~ 1 + slope * K until measured
        # acceptance per position as decayed counts; a position with less evidence than
        # prior_weight takes the rate of the position before it (prior_alpha for the first)
        self.prior_alpha, self.prior_weight = prior_alpha, prior_weight
        self.acc = [0.0] * k_max
        self.tested = [0.0] * k_max
        self.t_target: dict[tuple[int, int], float] = {}  # (batch, tokens) -> seconds
        self.t_draft: dict[int, float] = {}  # batch -> seconds per draft step
        self.t_other: dict[int, float] = {}  # batch -> seconds per round outside forwards
        self.k = 0
        self.rounds = 0
        self.since_probe = 0
        self.last_positive = min(2, k_max)

    # --- estimates ----------------------------------------------------------------------------

    def observe(self, r: RoundStats) -> None:
        self.rounds += 1
        if r.rows == 0:
            return
        for i in range(r.k):
            self.acc[i] = self.decay * self.acc[i] + r.accepted_per_position[i]
            self.tested[i] = self.decay * self.tested[i] + r.tested_per_position[i]
        self._ema(self.t_target, (r.rows, r.k + 1), r.seconds_verify)
        if r.k:
            self._ema(self.t_draft, r.rows, r.seconds_draft / r.k)
        self._ema(self.t_other, r.rows, r.seconds_other)

    def _ema(self, table: dict, key, value: float) -> None:
        old = table.get(key)
        table[key] = value if old is None else self.decay * old + (1 - self.decay) * value

    def alphas(self) -> list[float]:
        """Conditional alpha_i; unmeasured deeper positions repeat the deepest measured one,
        so the policy is willing to try a larger K and then measures it."""
        out, last = [], self.prior_alpha
        for a, t in zip(self.acc, self.tested):
            w = min(t / self.prior_weight, 1.0)  # blend towards the previous position
            last = w * (a / t if t else 0.0) + (1 - w) * last
            out.append(last)
        return out

    def _nearest(self, table: dict, batch: int):
        if not table:
            return None
        key = min(table, key=lambda b: abs(b - batch))
        return table[key]

    def target_seconds(self, batch: int, tokens: int) -> float | None:
        """Measured, or interpolated linearly in tokens from the nearest batch's figures."""
        known = {t: s for (b, t), s in self.t_target.items() if b == batch}
        if not known:
            batches = {b for b, _ in self.t_target}
            if not batches:
                return None
            near = min(batches, key=lambda b: abs(b - batch))
            known = {t: s for (b, t), s in self.t_target.items() if b == near}
        if tokens in known:
            return known[tokens]
        if 1 in known and len(known) > 1:  # line through T = 1 and the farthest measured T
            far = max(known)
            slope = (known[far] - known[1]) / (far - 1)
            return known[1] + max(slope, 0.0) * (tokens - 1)
        t, s = next(iter(known.items()))
        base = s / (1 + self.prior_slope * (t - 1))
        return base * (1 + self.prior_slope * (tokens - 1))

    def predicted_speedup(self, k: int, batch: int) -> float | None:
        if k == 0:
            return 1.0
        t1 = self.target_seconds(batch, 1)
        tv = self.target_seconds(batch, k + 1)
        td = self._nearest(self.t_draft, batch)
        to = self._nearest(self.t_other, batch) or 0.0
        if t1 is None or tv is None or td is None:
            return None
        tau = metrics.tau(self.alphas()[:k], k)
        return metrics.speedup_from_times(tau, t1 + to, td, tv, to, k)

    # --- the choice ---------------------------------------------------------------------------

    def choose(self, batch: int) -> int:
        """K for the next round at this many active rows."""
        if self.k_max == 0:
            return 0
        if self.rounds == 0:  # measure the plain step first
            self.k = 0
            return 0
        if not self.t_draft:  # then one speculative round
            self.k = self.last_positive
            return self.k
        scores = {k: self.predicted_speedup(k, batch) for k in range(self.k_max + 1)}
        scores = {k: s for k, s in scores.items() if s is not None}
        best = max(scores, key=lambda k: scores[k])
        current = scores.get(self.k, 0.0)
        if scores[best] > current * (1 + self.hysteresis):
            self.k = best
        if self.k > 0:
            self.last_positive = self.k
            self.since_probe = 0
            self.probe_gap = self.probe_every
            return self.k
        self.since_probe += 1
        if self.since_probe >= self.probe_gap:  # refresh alpha and c at the cheapest K
            self.since_probe = 0
            self.probe_gap = min(2 * self.probe_gap, self.max_probe_every)
            return 1
        return 0
