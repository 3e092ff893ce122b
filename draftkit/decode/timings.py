"""What ``--k auto`` knows of cost: seconds per target call by tokens verified, per draft step
and per round of overhead, keyed by the active batch size (verify inflation v grows with it).

Clocks are noisy per round (one sample can be off by half) but drift only slowly, so each
table entry is the median of its last ``time_window`` samples; a speculative round's verify
and draft times are kept as ratios to the plain step timed just before them
(:meth:`Timings._record_paired`), as a shared machine's speed drifts by a third from one
stretch of rounds to the next. Lengths and batch sizes not timed yet are read off the nearest
ones (:meth:`Timings.target_seconds`, :meth:`Timings.draft_seconds`).
:class:`~draftkit.decode.policy.KPolicy` records every round here and prices each K with it.
"""

from __future__ import annotations

import statistics
from collections import deque


def _batch(name: str, key) -> int:
    """The batch size of a timing table's key: (batch, tokens) for the target, batch else."""
    return key[0] if name == "target" else key


class Timings:
    def __init__(self, time_window: int = 9, retime_every: int = 32,
                 prior_v_slope: float = 0.15, pair_timings: bool = True):
        self.time_window = time_window
        self.retime_every = retime_every  # speculative rounds between two timed plain ones
        self.prior_slope = prior_v_slope  # v(K) ~ 1 + slope * K until measured
        self.pair_timings = pair_timings  # False: every timing is its own median (unpaired)
        self._samples: dict[tuple, deque] = {}
        # paired timings (_record_paired): (name, key) -> (plain step's number, time / T(1));
        # batch -> (number, round, seconds) of the plain step timed last at that batch size
        self._ratios: dict[tuple, deque] = {}
        self._plain_ref: dict[int, tuple[int, int, float]] = {}
        self.target: dict[tuple[int, int], float] = {}  # (batch, tokens) -> seconds
        self.draft: dict[int, float] = {}  # batch -> seconds per draft step
        self.other: dict[int, float] = {}  # batch -> seconds per round outside forwards

    def samples(self, name: str, key) -> int:
        """How many times ``key`` of table ``name`` was timed (within the window)."""
        return len(self._samples.get((name, key), ()))

    def record(self, name: str, key, value: float, round_no: int) -> None:
        """Add a timing sample of table ``name`` ("target", "draft" or "other") taken in round
        ``round_no``; the entry becomes the median of the last ``time_window``, or for a
        speculative round's timing the paired estimate (:meth:`_record_paired`)."""
        table = getattr(self, name)
        samples = self._samples.setdefault((name, key), deque(maxlen=self.time_window))
        samples.append(value)
        table[key] = statistics.median(samples)
        batch = _batch(name, key)
        if name == "target" and key[1] == 1:
            self._plain_ref[batch] = (self._plain_ref.get(batch, (0,))[0] + 1, round_no, value)
            for name_, key_ in list(self._ratios):  # re-priced with the new T(1)
                if _batch(name_, key_) == batch:
                    self._price(name_, key_)
        elif name != "other" and self.pair_timings:
            self._record_paired(name, key, batch, value, round_no)

    def _record_paired(self, name: str, key, batch: int, value: float, round_no: int) -> None:
        """Keep a speculative timing as a ratio to the plain step timed last at its batch size.

        Every prediction compares the two (T(K + 1) / T(1), T_draft / T(1)), timed in
        different rounds, and a shared machine's speed drifts between them: on a 2-core CPU
        plain steps ran 22 ms for a stretch and 37 ms the next, so a T(1) taken in a slow
        stretch, retimed 1 round in 32 and kept as the median of 9, priced a K = 1 that lost 8%
        at batch 4 as a 1.3-1.5x gain for over a hundred rounds. A ratio to the plain step of a
        few rounds before drifts little; the median of those since the last three plain steps
        (one outlying plain step then moves a third of them) times T(1) is the estimate."""
        ref = self._plain_ref.get(batch)
        if ref is None or round_no - ref[1] > 2 * self.retime_every:
            return  # no plain step near it in time: the absolute median stands
        ratios = self._ratios.setdefault((name, key), deque(maxlen=4 * self.time_window))
        ratios.append((ref[0], value / ref[2]))
        self._price(name, key)

    def _price(self, name: str, key) -> None:
        """``key``'s time from its ratios (:meth:`_record_paired`) and its batch's T(1)."""
        ratios = self._ratios[(name, key)]
        batch = _batch(name, key)
        latest = self._plain_ref[batch][0]
        n = max(self.time_window, sum(1 for ref, _ in ratios if ref > latest - 3))
        ratio = statistics.median(r for _, r in list(ratios)[-n:])
        table = self.target if name == "target" else self.draft
        table[key] = ratio * self.target[(batch, 1)]

    # --- reading them -------------------------------------------------------------------------

    def other_seconds(self, batch: int) -> float | None:
        """Overhead per round at the nearest timed batch size."""
        if not self.other:
            return None
        return self.other[min(self.other, key=lambda b: abs(b - batch))]

    def draft_seconds(self, batch: int, t1: float | None) -> float | None:
        """Seconds a draft step takes at this batch size: timed, or the nearest timed batch
        size's c times this one's plain step (a draft's step grows with the batch as the
        target's does; its bare time from a smaller batch made speculation look cheap)."""
        if batch in self.draft or not self.draft:
            return self.draft.get(batch)
        near = min(self.draft, key=lambda b: abs(b - batch))
        t_near = self.target_seconds(near, 1)
        if t1 is None or not t_near:
            return self.draft[near]
        return self.draft[near] / t_near * t1

    def timed(self, batch: int) -> tuple[int, dict[int, float]]:
        """(the batch size used, its target seconds by tokens verified): this batch size's
        figures, else the nearest one's."""
        if self.target and batch not in {b for b, _ in self.target}:
            batch = min({b for b, _ in self.target}, key=lambda b: abs(b - batch))
        return batch, {t: s for (b, t), s in self.target.items() if b == batch}

    def target_seconds(self, batch: int, tokens: int) -> float | None:
        """Measured, or interpolated linearly in tokens from the nearest batch's figures."""
        _, known = self.timed(batch)
        if not known:
            return None
        if tokens in known:
            return known[tokens]
        if 1 in known and len(known) > 1:  # line through T = 1 and the farthest measured T
            far = max(known)
            slope = (known[far] - known[1]) / (far - 1)
            return known[1] + max(slope, 0.0) * (tokens - 1)
        t, s = next(iter(known.items()))
        base = s / (1 + self.prior_slope * (t - 1))
        return base * (1 + self.prior_slope * (tokens - 1))
