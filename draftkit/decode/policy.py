"""``--k auto``: choose K per round from running estimates of acceptance and cost.

Each round the engine reports what happened (:class:`~draftkit.decode.stats.RoundStats`). The
policy estimates the conditional acceptance alpha_i of every draft position and the seconds per
target call by tokens verified, per draft step and per round of overhead, keyed by the active
batch size (verify inflation v grows with it; the timing tables are
:class:`~draftkit.decode.timings.Timings`). It picks the K in 0..K_max that maximises the
speedup model of Leviathan et al. (arXiv 2211.17192) in its general form (README.md, "How
speculation pays"),

    S(K) = tau(alpha_1..K) * (T_target(1) + T_overhead)
           / (K T_draft + T_target(K + 1) + T_overhead),

with tau = 1 + sum_i prod_{j<=i} alpha_j (K T_draft is T_draft for a parallel head, P-EAGLE,
arXiv 2602.01469, which drafts the round in one forward: a longer K then costs only its
verify, and pays sooner), and moves off the current K only for a gain above a
small margin (hysteresis), so noise in the clocks does not make it thrash. T_target of a verify
length not yet timed is extrapolated along a line through T(1); since that line can overstate a
cost that is concave in length, a K whose length is not yet timed in ``timed_samples`` rounds
gets a round to time it when it would win at its lower bound (the longest length timed below
it). Every prediction divides by the plain step's time, so it is timed over the first
``plain_first`` rounds and again once every ``retime_every`` speculative rounds, more often the
closer the predicted gain is to break-even (a plain round costs (1 - 1/S) of a round; at most
``retime_share`` of the tokens go to it; every ``retime_first`` until ``time_window`` are in, as
a process's first rounds run slow). The plain step's time is the median of its last
``time_window`` samples, so one lucky clock does not set K for the rest of a decode; a
speculative round's verify and draft times are kept as ratios to the plain step timed just
before them, as a shared machine's speed drifts by a third from one stretch of rounds to the
next and a ratio of times taken apart in time measures the drift, not the cost.

alpha_i is a Beta posterior mean over the last ~``window`` tested trials at position i (the
weight of a trial decays per trial, not per round, so the memory means the same at any batch
size), with the posterior of position i - 1 as its prior, so unmeasured deeper positions repeat
the rate before them. A long window keeps one unlucky round from switching speculation off near
break-even; to still follow a real change (a new prompt, a new domain) a ``recent`` window runs
alongside, and when it departs from the long one by more than three standard errors the long
one restarts from it. A position beyond the K drafted is not tested at all, so its evidence
ages instead: its weight shrinks by 1 / ``stale_rounds`` a round, and the estimate drifts back
to the rate before it, so a K given up while the text was hard is tried again.

The first speculative round drafts K = 1, the cheapest K, and evidence raises it. K = 0 (plain
decoding) wins when speculation loses. Acceptance is then unobserved, so the policy probes: it
drafts K = 1 until ``probe_trials`` positions have been tested (8: one round at batch 8, eight
at batch 1), a fresh sample for the change test, once every ``probe_gap`` probe lengths of plain
rounds, so below the cap of ``max_probe_every`` rounds probing takes the same share of rounds at
any batch size. Whenever plain decoding takes over (after the first rounds, after speculation,
at the end of a probe) the last sample is judged: K = 1 goes on a round at a time, up to 4 x
``probe_trials`` positions, while the posterior's upper bound (mean + 2 standard deviations)
still predicts a gain or the sample leans above the estimate. So a short decode at alpha ~0
drafts only the few rounds that rule speculation out, and a pair near break-even is not dropped
for one unlucky run. The gap doubles only when even the upper bound predicts a loss, so a pair
that never pays costs one probe every ``max_probe_every`` rounds (about 1% against plain
decoding at batch 1 and c = 0.2, 2% at c = 0.6) while one near break-even is re-checked often
(SmartSpec / TurboSpec, arXiv 2406.14066, choose K from measured goodput the same way).
"""

from __future__ import annotations

import math

from draftkit import metrics
from draftkit.decode.k import K_MAX
from draftkit.decode.stats import RoundStats
from draftkit.decode.timings import Timings


class _Rate:
    """An acceptance rate over a window of trials: each trial's weight decays by
    (1 - 1 / window) per later trial, so ``weight`` (effective trials) tends to ``window``."""

    def __init__(self, window: float):
        self.window = window
        self.restart()

    def restart(self) -> None:
        self.rate, self.weight, self.trials = 0.0, 0.0, 0

    def add(self, accepted: int, tested: int) -> None:
        self.trials += tested
        keep = (1 - 1 / self.window) ** tested
        new = self.window * (1 - keep)  # the batch's trials count as if they came one by one
        self.weight = keep * self.weight + new
        self.rate += new / self.weight * (accepted / tested - self.rate)


class KPolicy:
    def __init__(self, k_max: int = K_MAX, hysteresis: float = 0.02, probe_every: int = 16,
                 max_probe_every: int = 256, probe_trials: int = 8, window: int = 128,
                 recent: int = 16, prior_alpha: float = 0.5, prior_weight: float = 2.0,
                 time_window: int = 9, prior_v_slope: float = 0.15, plain_first: int = 3,
                 retime_every: int = 32, retime_first: int = 8, retime_share: float = 0.01,
                 stale_rounds: int = 64, timed_samples: int = 3, pair_timings: bool = True):
        self.k_max, self.hysteresis = k_max, hysteresis
        self.probe_every, self.max_probe_every = probe_every, max(probe_every, max_probe_every)
        self.probe_trials = probe_trials
        self.probe_gap = probe_every  # plain rounds before the next probe, in probe lengths
        self.since_probe = 0
        self.probe_left = 0  # rounds the running probe still has to go
        self.sampling = True  # the recent window holds a sample still to judge (the first rounds)
        self.prior_alpha, self.prior_weight = prior_alpha, prior_weight
        self.long = [_Rate(window) for _ in range(k_max)]
        self.recent = [_Rate(recent) for _ in range(k_max)]
        # what a round costs, by batch size (verify inflation v grows with it)
        self.timings = Timings(time_window, retime_every, prior_v_slope, pair_timings)
        self.time_window = time_window
        self.k = 0
        self.rounds = 0
        self.plain_first = plain_first  # plain rounds timed before the first speculative one
        self.retime_every = retime_every  # speculative rounds between two timed plain ones
        self.retime_first = retime_first  # the same, until time_window plain rounds are timed
        self.plain_rounds, self.since_plain = 0, 0
        self.retime_share = retime_share  # of a round's tokens a retimed plain step may cost
        self.gain = math.inf  # the predicted speedup of the K now chosen
        self.stale_rounds = stale_rounds  # memory of an undrafted position, in rounds
        self.timed_samples = timed_samples  # rounds before a verify length's time is trusted
        # the draft's time is one forward a round whatever K (a parallel head), not one a
        # drafted token: known from the first speculative round (RoundStats.draft_per_round)
        self.per_round = False

    # --- estimates ----------------------------------------------------------------------------

    def observe(self, r: RoundStats) -> None:
        self.rounds += 1
        self.plain_rounds += r.k == 0
        self.since_plain = 0 if r.k == 0 else self.since_plain + 1
        if r.rows == 0:
            return
        for i in range(r.k):
            tested = r.tested_per_position[i]
            if tested == 0:
                continue
            self.long[i].add(r.accepted_per_position[i], tested)
            self.recent[i].add(r.accepted_per_position[i], tested)
            if abs(self._departure(i)) > 3:  # alpha moved: forget what came before it
                long, recent = self.long[i], self.recent[i]
                long.rate, long.weight = recent.rate, recent.weight
        # positions beyond this round's K (past the first, which probes keep fresh) were not
        # drafted: their evidence ages, so their estimate drifts back to the rate before them
        # and a K that looked bad while the text was hard is tried again once it may pay
        for est in self.long[max(r.k, 1):]:
            est.weight *= 1 - 1 / self.stale_rounds
        if r.k:  # per draft forward: one a token, or one a round for a parallel head
            self.per_round = r.draft_per_round
            self.timings.record("draft", r.rows, r.seconds_draft / metrics.draft_forwards(
                r.k, r.draft_per_round), self.rounds)
        self.timings.record("target", (r.rows, r.k + 1), r.seconds_verify, self.rounds)
        self.timings.record("other", r.rows, r.seconds_other, self.rounds)

    def _departure(self, i: int) -> float:
        """Recent minus long acceptance at position i, in standard errors of the recent window
        if alpha had not moved; 0 until the recent window holds ``probe_trials`` trials."""
        long, recent = self.long[i], self.recent[i]
        if recent.trials < self.probe_trials:
            return 0.0
        p = min(max(long.rate, 0.05), 0.95)  # the floor keeps a few trials from alarming
        return (recent.rate - long.rate) / math.sqrt(p * (1 - p) / recent.weight)

    def alphas(self, upper: float = 0.0) -> list[float]:
        """Posterior mean of the conditional alpha_i, or mean + ``upper`` standard deviations.
        Each position's prior is the mean before it (``prior_alpha`` for the first)."""
        out, prior = [], self.prior_alpha
        for est in self.long:
            n = est.weight + self.prior_weight
            mean = (est.rate * est.weight + prior * self.prior_weight) / n
            out.append(min(mean + upper * math.sqrt(mean * (1 - mean) / (n + 1)), 1.0))
            prior = mean
        return out

    def target_seconds(self, batch: int, tokens: int) -> float | None:
        return self.timings.target_seconds(batch, tokens)

    def predicted_speedup(self, k: int, batch: int, alphas: list[float] | None = None,
                          t_verify: float | None = None) -> float | None:
        if k == 0:
            return 1.0
        t1 = self.timings.target_seconds(batch, 1)
        tv = t_verify if t_verify is not None else self.timings.target_seconds(batch, k + 1)
        td = self.timings.draft_seconds(batch, t1)
        to = self.timings.other_seconds(batch) or 0.0
        if t1 is None or tv is None or td is None:
            return None
        tau = metrics.tau((alphas or self.alphas())[:k], k)
        return metrics.speedup_from_times(tau, t1 + to, td, tv, to, k, self.per_round)

    # --- the choice ---------------------------------------------------------------------------

    def _times_plain_step(self, batch: int) -> bool:
        """Whether the next round is plain to time the plain step, which every prediction
        divides by: over the first few rounds, at each batch size first, and again now and
        then while speculating."""
        # One noisy sample would skew every K's prediction for as long as speculation pays (a
        # plain round costs about (1 - 1/S) of a round, so 1 in 32 costs under 1%). Until the
        # window is full, retime 1 in 8: a process's first rounds run slow (a 2-core CPU's
        # opening plain steps took 53-57 ms, later ones 44-46), and at 1 in 32 those samples
        # held the median, inflating every K's predicted gain, for ~100 rounds of a losing K 1.
        retime = self.retime_every if self.plain_rounds >= self.time_window else self.retime_first
        # Speculative timings are priced against the plain step timed before them
        # (_record_paired), so the fresher it is the less the machine drifted in between. A
        # plain round in place of one at speedup S gives up (1 - 1/S) of a round: nearly
        # nothing near break-even, where a drift of a few percent decides. So retime as often
        # as ``retime_share`` of the tokens allows: every 2 rounds at S 1.02, every 10 at 1.1,
        # every ``retime_every`` from S 1.45.
        if self.retime_share > 0:  # 0: a fixed ``retime_every``
            lost = 1 - 1 / max(self.gain, 1.0)
            retime = min(retime, max(2, math.ceil(lost / self.retime_share)))
        if self.plain_rounds < self.plain_first:
            self.k = 0
            return True
        # A batch size whose plain step is not yet timed borrowed the nearest one's, and a
        # speculative round's cost grows faster with the batch than a plain one's: priced with
        # a smaller batch's T(1), speculation looked cheap where it lost (6% below K = 0 over a
        # server's batch sizes 1-16 in the simulator). A plain round costs nothing against
        # K = 0, so time it there first.
        return self.since_plain >= retime or \
            self.timings.samples("target", (batch, 1)) < self.plain_first

    def choose(self, batch: int) -> int:
        """K for the next round at this many active rows."""
        if self.k_max == 0 or self._times_plain_step(batch):
            return 0
        # then one speculative round, at the cheapest K: evidence raises it
        if not self.timings.draft:
            self.k = 1
            return 1
        alphas = self.alphas()
        scores = {k: self.predicted_speedup(k, batch, alphas) for k in range(self.k_max + 1)}
        scores = {k: s for k, s in scores.items() if s is not None}
        best = max(scores, key=lambda k: scores[k])
        # the margin keeps noise from switching K back and forth; but a K that its own batch
        # size's figures price as a loss is dropped at once (the batch size changes under a
        # server's load, and the K kept from the last one may not pay at this one)
        if scores[best] > scores.get(self.k, 0.0) * (1 + self.hysteresis) or \
                (best == 0 and scores.get(self.k, 0.0) < 1.0):
            self.k = best
        self.gain = scores.get(self.k, 1.0)
        untimed = self._untimed(batch, alphas, max(scores[best], 1.0))
        if untimed is not None:  # one round to time a verify length the line may overstate
            return untimed
        if self.k > 0:
            self.probe_gap, self.since_probe, self.probe_left = self.probe_every, 0, 0
            self.sampling = True  # judged below if plain decoding takes over
            return self.k
        # plain decoding: judge the last sample of alpha_1; probe K = 1 now and then for a new one
        if self.probe_left > 0:
            self.probe_left -= 1
            return 1
        if self.sampling:
            hope = max(s for s, _ in self._hopes(batch, self.alphas(upper=2.0)).values())
            unsettled = hope >= 1.0 or self._departure(0) > 1  # may pay, or leans above
            if unsettled and self.recent[0].trials < 4 * self.probe_trials:
                return 1  # look one round longer
            self.sampling = False
            # back off only when speculation surely loses; near break-even keep checking
            self.probe_gap = (min(2 * self.probe_gap, self.max_probe_every) if hope < 1.0
                              else self.probe_every)
        self.since_probe += 1
        if self.since_probe < min(self.probe_gap * self._probe_rounds(batch),
                                  self.max_probe_every):
            return 0
        self.since_probe, self.sampling = 0, True
        self.probe_left = self._probe_rounds(batch) - 1  # this round is one
        for est in self.recent:
            est.restart()
        return 1

    def _hopes(self, batch: int, alphas: list[float]) -> dict[int, tuple[float, bool]]:
        """(predicted speedup, timed) per K >= 1, where a verify length timed in fewer than
        ``timed_samples`` rounds is priced at its lower bound: the longest length timed below
        it, as a forward's cost never falls with its length (one slow round must not keep a K
        out for good). Otherwise T_target(K + 1) of an untimed K is extrapolated along a line
        through T(1), which overstates it where cost is concave in length: on a 2-core CPU a
        2-token forward once cost 2.1 plain steps and a 7-token one 2.6, so the line through
        T(1) and T(2) priced every K out while K 4 to 6 paid 1.12x."""
        used, known = self.timings.timed(batch)
        hopes = {}
        for k in range(1, self.k_max + 1):
            below = [s for t, s in known.items() if t < k + 1]
            samples = self.timings.samples("target", (used, k + 1))
            timed = samples >= self.timed_samples or not below
            floor = None if timed else max(below)
            hopes[k] = (self.predicted_speedup(k, batch, alphas, t_verify=floor) or 0.0, timed)
        return hopes

    def _untimed(self, batch: int, alphas: list[float], to_beat: float) -> int | None:
        """The K whose verify length is not yet timed at this batch (:meth:`_hopes`) and that
        would beat ``to_beat`` (by the hysteresis) at its lower bound: worth a round to time
        it. Each K costs at most ``timed_samples`` such rounds per batch size."""
        if self.timings.timed(batch)[0] != batch:
            return None  # nothing timed here yet: the nearest batch's figures stand in
        hopes = {k: s for k, (s, timed) in self._hopes(batch, alphas).items() if not timed}
        if not hopes:
            return None
        k = max(hopes, key=hopes.get)
        return k if hopes[k] > to_beat * (1 + self.hysteresis) else None

    def _probe_rounds(self, batch: int) -> int:
        """Rounds of K = 1 that test ``probe_trials`` positions (rows test one each)."""
        return math.ceil(self.probe_trials / max(batch, 1))
