"""Acceptance where the engine reported none: a recorded completion replayed through a draft.

A record without per-step counts (``rounds`` None: one completion of a request of n > 1, a
vLLM server started without ``--per-request-spec-decode-metrics detailed``, traffic imported
from request logs) still holds the prompt and what the target emitted. Replaying that
completion through the bundle's draft, teacher-forced on the target, gives what speculation
would have accepted on it at K = ``num_speculative_tokens`` under draftkit's lossless rule
(Leviathan et al., arXiv 2211.17192, Algorithm 1):

- greedy (temperature 0): a round that starts with L committed tokens drafts from the draft's
  own argmax tokens; while they equal the recorded ones the draft reads exactly what it read
  when serving, and acceptance looks no further. So with q_i(L), the draft's i-th proposal
  read along the recorded path, the round accepts n = the leading i with argmax q_i(L) =
  token L + i, and the next starts at L + n + 1: the exact rounds of a greedy decode of this
  completion (:func:`greedy_rounds`);
- sampled: the chance that draft position i is accepted once 1..i-1 were is beta_i =
  sum_x min(p, q) = 1 - TV(p, q) (Leviathan et al., Theorem 3.5), with the target's p and the
  draft's q warped as the request asked; where its engine drafted greedily (vLLM's default
  ``draft_sample_method``, as the record says), q is one-hot at the argmax and beta_i = p(d).
  A round starting at L then tests position i with expectation prod_(j<i) beta_j and accepts
  it with prod_(j<=i) beta_j: those expected counts
  are the record's acceptance (:func:`expected_rounds`). Where each round ends is drawn
  (u < beta_i, seeded by the record) so tau and the rounds per K follow one realisation. It is
  the teacher-forced estimate distillation scores drafts with: a token accepted from q is
  distributed as min(p, q) / beta, not as p, and the recorded token is a draw of p.

The draft's proposals along the path come from one pass: a standalone draft's forward over
the sequence (its proposal i at L is its next-token logits at L - 1 + i), an EAGLE-3 head
unrolled over its own outputs as training-time test unrolls it (:func:`draftkit.distill.ttt.
unroll`: step i at t scores token t + 2 + i) on the target's features.
"""

from __future__ import annotations

import random
import zlib

import torch

from draftkit.decode.sampling import draft_probabilities, probabilities
from draftkit.decode.sampling_params import PROBABILISTIC, SamplingParams
from draftkit.decode.verify import leading_accepts
from draftkit.distill.evaluate import model_logits
from draftkit.distill.features import target_forward
from draftkit.distill.ttt import unroll
from draftkit.models.eagle3 import is_eagle3
from draftkit.traffic.record import REPLAY, Counts, TrafficRecord, round_counts


def greedy_rounds(match: torch.Tensor, start: int, k: int) -> list[list[int]]:
    """Rounds of a greedy decode whose rounds start at committed length ``start`` (the prompt
    and the prefill's token). match: (K, T) bool, match[i, L]: the draft's proposal i at L is
    the recorded token L + i."""
    total, rounds, length = match.shape[1], [], start
    while length < total:
        kk = min(k, total - length)
        n = int(leading_accepts(match[:kk, length][None])[0])
        rounds.append([kk, n])
        length += n + 1
    return rounds


def rounds_before_end(rounds: list[list[int]], prompt_len: int, total: int,
                      k: int) -> list[list[int]]:
    """The rounds of a decode that start at least K + 1 tokens before its end (``total``
    tokens, the prompt's included): there it drafted K with every token it could accept still
    to come, so a greedy replay must give them exactly; the last rounds drafted past the
    completion, where no recorded token says what would have passed."""
    out, length = [], prompt_len + 1
    for kk, n in rounds:
        if length + k >= total:
            break
        out.append([kk, n])
        length += n + 1
    return out


def expected_rounds(beta: torch.Tensor, start: int, k: int, rng: random.Random
                    ) -> tuple[list[float], list[float], list[list[int]]]:
    """(accepted, tested) expected per position and one draw of the rounds, for rounds from
    committed length ``start``. beta: (K, T), beta[i, L]: the chance the proposal i at L is
    accepted once the ones before it were."""
    total, length = beta.shape[1], start
    accepted, tested, rounds = [0.0] * k, [0.0] * k, []
    host = beta.double().cpu().tolist()
    while length < total:
        kk, reach, n = min(k, total - length), 1.0, None
        for i in range(kk):
            b = host[i][length]
            tested[i] += reach
            reach *= b
            accepted[i] += reach
            if n is None and rng.random() >= b:
                n = i
        n = kk if n is None else n
        rounds.append([kk, n])
        length += n + 1
    return accepted, tested, rounds


class Replayer:
    """A bundle's target and draft, replaying records at K = ``k`` (module docstring)."""

    def __init__(self, target, draft, k: int):
        self.target, self.draft, self.k = target, draft, k
        self.device = next(target.parameters()).device
        self.eagle3 = is_eagle3(getattr(draft, "config", {}))
        self.draft_fn = None if self.eagle3 else model_logits(draft, str(self.device))
        self.target_fn = model_logits(target, str(self.device))

    @torch.no_grad()
    def counts(self, record: TrafficRecord) -> Counts:
        seq = record.prompt_ids + record.completion_ids
        start = len(record.prompt_ids) + 1  # the prefill emitted the first completion token
        if len(seq) <= start:  # one token or none: no round
            return Counts(REPLAY, [0.0] * self.k, [0.0] * self.k, [])
        s = record.sampling  # the rule its engine applied; not known: draftkit's
        params = SamplingParams(s.temperature, s.top_k, s.top_p,
                                s.draft_sample_method or PROBABILISTIC)
        ids = torch.tensor([seq], device=self.device)  # (1, T)
        size = ids.shape[1]
        proposals, p_logits = self._proposals(ids, need_target=not params.greedy)
        # what the test reads of the draft, once per logits tensor (a standalone draft's K
        # proposals are one): its argmax (T,), or its q (T, V)
        read = {}
        for rows, _ in proposals:
            if id(rows) not in read:
                read[id(rows)] = rows.argmax(-1) if params.greedy else \
                    draft_probabilities(rows, params)
        if params.greedy:
            match = torch.stack([_at(read[id(rows)], off, size) == _at(ids[0], i, size)
                                 for i, (rows, off) in enumerate(proposals)])  # (K, T)
            return round_counts(REPLAY, greedy_rounds(match, start, self.k), self.k)
        p = probabilities(p_logits, params)  # (T, V): row s scores token s + 1
        beta = torch.stack([torch.minimum(_at(p, i - 1, size), _at(read[id(rows)], off, size)
                                          ).sum(-1)
                            for i, (rows, off) in enumerate(proposals)])  # (K, T)
        rng = random.Random(zlib.crc32(repr((seq, record.time)).encode()))
        accepted, tested, rounds = expected_rounds(beta, start, self.k, rng)
        return Counts(REPLAY, accepted, tested, rounds)

    def _proposals(self, ids: torch.Tensor, need_target: bool
                   ) -> tuple[list[tuple[torch.Tensor, int]], torch.Tensor | None]:
        """Along ``ids`` (1, T): per draft position i, (logits (T, V), offset): proposal i of
        the round at committed length L is row L + offset; and the target's logits (T, V), row
        s scoring token s + 1 (None unless ``need_target``)."""
        pos = torch.arange(ids.shape[1], device=self.device)[None]  # (1, T)
        if not self.eagle3:
            p = self.target_fn(ids, pos)[0] if need_target else None
            q = self.draft_fn(ids, pos)[0]  # (T, V): row s scores token s + 1
            return [(q, i - 1) for i in range(self.k)], p
        p, aux = target_forward(self.target, self.draft.aux_layers, ids, pos)  # (1, T, V) ...
        head = self.draft.reduced_head
        # step i at t scores token t + 2 + i: proposal i of the round at L = t + 2
        steps = unroll(self.draft, aux, ids, pos, self.k)  # K x (1, T, H)
        return [(head.expand(self.draft.logits(h[0]).float()), -2) for h in steps], \
            (p[0].float() if need_target else None)


def _at(x: torch.Tensor, offset: int, size: int) -> torch.Tensor:
    """y (size, ...) with y[L] = x[L + offset], zero where L + offset falls outside x."""
    y = x.new_zeros((size,) + tuple(x.shape[1:]))
    lo, hi = max(0, -offset), min(size, x.shape[0] - offset)
    if hi > lo:
        y[lo:hi] = x[lo + offset:hi + offset]
    return y
