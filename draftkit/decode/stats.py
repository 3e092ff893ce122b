"""Per-round decoding statistics and the estimators built on them.

Counts are token-weighted over rows, server-style (eval/README.md, "How speculation pays"). From
them: alpha with the truncation correction (accepted / (accepted + rejections)), alpha as the mean
of 1 - TV(p, q) at the tested positions, conditional alpha_i per draft position, tau (tokens per
target call), c (draft step / target step time) and v(K) (verify inflation). Times are measured
after synchronising the device.

alpha counts every tested position, kept or not: each is one Bernoulli trial of the draft
against the target, whatever EOS or the token budget later cut. tau counts only the tokens kept,
so it is what a caller actually gets per target call.

Each round also records how its forwards ran (``cuda-graph`` or ``eager``, and why eager;
:mod:`draftkit.decode.graphs`): c and v timed in a launch-bound eager loop are not those of a
graph-replaying one, so a figure says which path it was measured on (:meth:`DecodeStats.path`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING

import torch

from draftkit import metrics

if TYPE_CHECKING:
    from draftkit.decode.verify import Verdict


@dataclass(kw_only=True)
class RoundStats:
    """What one decoding round did, over the rows that were still active."""

    k: int
    rows: int  # active rows
    accepted_per_position: list[int]  # rows whose drafted token i was accepted (i < K)
    tested_per_position: list[int]  # rows that reached the accept test at position i
    beta_sum: float  # sum over tested positions of sum_x min(p, q)
    rejections: int  # rows that stopped at a rejection (n < K)
    bonus: int  # rows that accepted all K and kept the bonus token (not cut at EOS / budget)
    tokens: int  # tokens kept (after EOS / length truncation)
    seconds_draft: float = 0.0  # the K drafting steps, catch-up excluded
    # the draft drafted the round in one forward (a parallel head), not one forward a token
    draft_per_round: bool = False
    seconds_verify: float = 0.0  # the target call (a plain step when K = 0)
    seconds_other: float = 0.0  # set-up (lengths, last tokens), sampling, acceptance, bookkeeping
    # the draft reading tokens decoded while it sat out (K = 0 rounds): no token is drafted,
    # so charging it to the K steps would inflate c by the length of the plain stretch
    seconds_catchup: float = 0.0
    # how the round's forwards ran (graphs.forward_path): the target's, and the draft's last
    # drafting step (None: no draft step); why each ran eagerly, where it did
    target_path: str | None = None
    draft_path: str | None = None
    eager_reasons: list[str] = field(default_factory=list)

    @classmethod
    def empty(cls, k: int) -> RoundStats:
        """A round with no live rows: nothing computed, nothing timed."""
        return cls(k=k, rows=0, accepted_per_position=[0] * k, tested_per_position=[0] * k,
                   beta_sum=0.0, rejections=0, bonus=0, tokens=0)

    @classmethod
    def from_verdict(cls, verdict: "Verdict | None", *, accepted: list[int], active: list[bool],
                     kept: list[int]) -> RoundStats:
        """The counts of a round from its verdict (None: a plain step, K = 0); times are zero
        until :meth:`set_seconds`.

        One entry per row of the round: ``accepted`` is the verdict's ``num_accepted`` on the
        host, ``active`` whether the row was still decoding (rows that were not are left out),
        ``kept`` the tokens it kept after EOS / budget truncation. A row that accepted n of K
        drafted tokens reached the accept test at positions 0..min(n, K - 1) and passed it at
        0..n - 1; it was rejected when n < K, and kept the bonus token when n = K and the
        whole block of K + 1 survived truncation.
        """
        if verdict is None:  # a plain step: nothing drafted, nothing tested
            return cls(k=0, rows=sum(active), accepted_per_position=[], tested_per_position=[],
                       beta_sum=0.0, rejections=0, bonus=0, tokens=sum(kept))
        k = verdict.beta.shape[1]
        by_n = [0] * (k + 1)  # active rows by accepted count n
        for n, a in zip(accepted, active):
            if a:
                by_n[n] += 1
        reached = list(accumulate(reversed(by_n)))[::-1]  # (K + 1,): rows with n >= i
        return cls(k=k, rows=sum(active), accepted_per_position=reached[1:],
                   tested_per_position=reached[:k], beta_sum=_tested_beta_sum(verdict, active),
                   rejections=reached[0] - by_n[k],
                   bonus=sum(1 for n, a, m in zip(accepted, active, kept)
                             if a and n == k and m == k + 1),
                   tokens=sum(kept))

    def set_paths(self, target: tuple[str, str | None],
                  draft: tuple[str, str | None] | None = None) -> None:
        """Record each model's forward path, (path, why eager), as graphs.forward_path gives."""
        self.target_path = target[0]
        self.draft_path = draft[0] if draft else None
        self.eager_reasons = [f"{role}: {why}" for role, p in (("target", target), ("draft", draft))
                              if p and (why := p[1])]

    def set_seconds(self, laps: dict[str, float]) -> None:
        """Fill in the times from the laps of the round's clock, named draft, catchup, verify
        and other (a lap not taken is zero)."""
        self.seconds_draft = laps.get("draft", 0.0)
        self.seconds_catchup = laps.get("catchup", 0.0)
        self.seconds_verify = laps.get("verify", 0.0)
        self.seconds_other = laps.get("other", 0.0)


@dataclass
class DecodeStats:
    """Accumulated over rounds (and over generate calls if the caller keeps it)."""

    rounds: int = 0
    row_steps: int = 0  # sum over rounds of active rows: target calls counted per row
    target_calls: int = 0  # target forwards, prefill included
    draft_steps: int = 0  # draft forwards
    draft_per_round: bool = False  # one draft forward a round (a parallel head), K not K
    drafted: int = 0  # drafted tokens over active rows
    accepted: int = 0
    rejections: int = 0
    bonus: int = 0
    tokens: int = 0  # new tokens emitted, the prefill's first token included
    decoded: int = 0  # tokens kept by decoding rounds (prefill's excluded): tau's numerator
    beta_sum: float = 0.0
    beta_count: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    tested_per_position: list[int] = field(default_factory=list)
    seconds_prefill: float = 0.0
    seconds_draft: float = 0.0
    seconds_verify: float = 0.0
    seconds_other: float = 0.0
    seconds_catchup: float = 0.0
    # time per target call by tokens per row (1 = plain step, K + 1 = verify), summed / counted
    target_seconds_by_tokens: dict[int, float] = field(default_factory=dict)
    target_calls_by_tokens: dict[int, int] = field(default_factory=dict)
    # decoding rounds by how each model's forwards ran ("target cuda-graph", "draft eager"),
    # and by why one ran eagerly ("target: the model is on cpu: ...")
    rounds_by_path: dict[str, int] = field(default_factory=dict)
    eager_reasons: dict[str, int] = field(default_factory=dict)

    def add_round(self, r: RoundStats) -> None:
        self.rounds += 1
        self.row_steps += r.rows
        self.target_calls += 1
        self.draft_steps += metrics.draft_forwards(r.k, r.draft_per_round)
        self.draft_per_round |= r.draft_per_round
        self.drafted += r.k * r.rows
        self.accepted += sum(r.accepted_per_position)
        self.rejections += r.rejections
        self.bonus += r.bonus
        self.tokens += r.tokens
        self.decoded += r.tokens
        self.beta_sum += r.beta_sum
        self.beta_count += sum(r.tested_per_position)
        for i in range(r.k):
            _grow(self.drafted_per_position, i)[i] += r.rows
            _grow(self.accepted_per_position, i)[i] += r.accepted_per_position[i]
            _grow(self.tested_per_position, i)[i] += r.tested_per_position[i]
        self.seconds_draft += r.seconds_draft
        self.seconds_verify += r.seconds_verify
        self.seconds_other += r.seconds_other
        self.seconds_catchup += r.seconds_catchup
        t = r.k + 1
        self.target_seconds_by_tokens[t] = self.target_seconds_by_tokens.get(t, 0.0) + \
            r.seconds_verify
        self.target_calls_by_tokens[t] = self.target_calls_by_tokens.get(t, 0) + 1
        for role, path in (("target", r.target_path), ("draft", r.draft_path)):
            if path:
                key = f"{role} {path}"
                self.rounds_by_path[key] = self.rounds_by_path.get(key, 0) + 1
        for why in r.eager_reasons:
            self.eager_reasons[why] = self.eager_reasons.get(why, 0) + 1

    def add_prefill(self, seconds: float, tokens: int) -> None:
        self.target_calls += 1
        self.tokens += tokens
        self.seconds_prefill += seconds

    # --- estimators ---------------------------------------------------------------------------

    @property
    def seconds(self) -> float:
        return (self.seconds_prefill + self.seconds_draft + self.seconds_catchup
                + self.seconds_verify + self.seconds_other)

    def merge(self, other: DecodeStats) -> None:
        """Add ``other``'s counts, times and per-position lists into these."""
        for name, value in vars(other).items():
            if isinstance(value, bool):
                setattr(self, name, getattr(self, name) or value)
            elif isinstance(value, (int, float)):
                setattr(self, name, getattr(self, name) + value)
            elif isinstance(value, list):
                mine = getattr(self, name)
                for i, x in enumerate(value):
                    if i < len(mine):
                        mine[i] += x
                    else:
                        mine.append(x)
            elif isinstance(value, dict):
                mine = getattr(self, name)
                for key, x in value.items():
                    mine[key] = mine.get(key, 0) + x

    def alpha(self) -> float:
        """accepted / tested positions (the truncation correction; see metrics)."""
        return metrics.alpha_from_counts(self.accepted, self.rejections)

    def alpha_tv(self) -> float:
        """Mean of 1 - TV(p, q) = sum_x min(p, q) over tested positions."""
        return self.beta_sum / self.beta_count if self.beta_count else 0.0

    def alphas(self) -> list[float]:
        """Conditional alpha_i per draft position."""
        return metrics.conditional_alphas(self.accepted_per_position, self.tested_per_position)

    def tau(self) -> float:
        """Tokens kept per target verification call per row, over decoding rounds (prefill
        excluded; K = 0 rounds count one token each).

        The measured counterpart of tau = (1 - alpha^(K+1)) / (1 - alpha) (Leviathan et al.,
        arXiv 2211.17192, eq. 1). A block cut at EOS or the token budget counts only the tokens
        kept, so on short outputs tau falls below that prediction from alpha_i.
        """
        rs = self.row_steps
        return self.decoded / rs if rs else 0.0

    def rounds_by_k(self) -> dict[int, int]:
        """Decoding rounds per K (K = 0: plain steps)."""
        return {t - 1: n for t, n in self.target_calls_by_tokens.items()}

    def target_step_seconds(self, tokens: int = 1) -> float | None:
        n = self.target_calls_by_tokens.get(tokens)
        return self.target_seconds_by_tokens[tokens] / n if n else None

    def draft_step_seconds(self) -> float | None:
        return self.seconds_draft / self.draft_steps if self.draft_steps else None

    def c(self, target_step: float | None = None) -> float | None:
        """Draft step / target step; ``target_step`` from a K = 0 run when this one had none.
        A draft step is a draft forward: for a parallel head (``draft_per_round``) a round's.

        Catch-up after K = 0 rounds is left out (``seconds_catchup``): c is the cost of one
        drafting step, the same figure whether K was fixed or chosen per round."""
        t = target_step or self.target_step_seconds(1)
        d = self.draft_step_seconds()
        return d / t if (d and t) else None

    def v(self, k: int, target_step: float | None = None) -> float | None:
        """Verify inflation T_target(K + 1) / T_target(1)."""
        t = target_step or self.target_step_seconds(1)
        tv = self.target_step_seconds(k + 1)
        return tv / t if (t and tv) else None

    def k_used(self) -> int:
        """The positive K the run used most (auto varies it per round and starts every decode
        with plain steps, so K = 0 counts only when the run never speculated)."""
        calls = self.rounds_by_k()
        calls = {k: n for k, n in calls.items() if k > 0} or calls
        if not calls:
            return 0
        return max(calls, key=lambda k: (calls[k], k))

    def predicted_speedup(self, target_step: float | None = None) -> float | None:
        """Speedup the model predicts for the rounds the run actually had, K by K.

        A round at K yields tau(alpha_1..alpha_K) tokens for K c + v(K) target steps
        (Leviathan et al., arXiv 2211.17192, Theorem 3.8, with the measured verify inflation
        v; c + v(K) for a parallel head, one forward a round); a K = 0 round yields one
        token for one step. Summing both over the rounds gives
        expected tokens over expected time, so under ``--k auto`` the prediction covers the
        same mix of K (plain stretches included) as the measured speedup; at a fixed K it is
        ``metrics.speedup``. None when c or some v(K) is unknown.
        """
        alphas = self.alphas() or self.alpha()
        c = self.c(target_step)
        tokens = steps = 0.0
        for k, n in self.rounds_by_k().items():
            v = self.v(k, target_step) if k else 1.0
            if k and (c is None or v is None):
                return None
            tokens += n * metrics.tau(alphas, k)
            steps += n * (metrics.draft_forwards(k, self.draft_per_round) * c + v if k else 1.0)
        return tokens / steps if steps else 1.0  # no round at all: plain decoding by definition

    def path(self) -> dict:
        """How the decoding rounds' forwards ran, per model: ``cuda-graph``, ``eager`` or
        ``mixed`` (some rounds each way), and why any ran eagerly, most rounds first."""
        out = {}
        for role in ("target", "draft"):
            ran = {p.split(" ", 1)[1] for p in self.rounds_by_path if p.startswith(role + " ")}
            if ran:
                out[role] = ran.pop() if len(ran) == 1 else "mixed"
        if self.eager_reasons:
            out["eager_reasons"] = sorted(self.eager_reasons, key=self.eager_reasons.get,
                                          reverse=True)
        return out

    def path_text(self) -> str:
        """:meth:`path` in one line (:func:`path_line`)."""
        return path_line(self.path())

    def overhead_per_round(self) -> float:
        """Seconds per round outside the draft and target forwards."""
        return self.seconds_other / self.rounds if self.rounds else 0.0


def path_line(path: dict) -> str:
    """A :meth:`DecodeStats.path` in one line: ``target cuda-graph, draft eager (draft: why)``."""
    ran = ", ".join(f"{role} {path[role]}" for role in ("target", "draft") if role in path)
    why = "; ".join(path.get("eager_reasons", []))
    return (ran or "no decoding round") + (f" ({why})" if why else "")


def _grow(values: list[int], i: int) -> list[int]:
    while len(values) <= i:
        values.append(0)
    return values


def _tested_beta_sum(verdict: "Verdict", active: list[bool]) -> float:
    """sum_x min(p, q) summed over the positions each active row tested (0..n)."""
    n = verdict.num_accepted  # (b,)
    k = verdict.beta.shape[1]
    act = torch.tensor(active, device=n.device)
    tested = (torch.arange(k, device=n.device)[None] <= n[:, None]) & act[:, None]  # (b, K)
    return float((verdict.beta * tested).sum())
