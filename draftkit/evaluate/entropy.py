"""Acceptance by the target's entropy: which positions of the traffic a draft wins or loses.

Speculative sampling accepts a drafted token with probability sum_x min(p(x), q(x)) =
1 - TV(p, q) (Leviathan et al., arXiv 2211.17192, section 3); greedy decoding accepts when the
argmaxes agree. Bucketed by the target's entropy H(p) at the position, acceptance separates
positions where the target is near-certain (a draft that learnt the greedy token is enough)
from those where it is unsure (only a draft that learnt the target's spread keeps up there,
which is what soft-label distillation adds over next-token cross-entropy; DistillSpec,
arXiv 2310.08461). Each bucket's share of positions says how much of a domain is which.
"""

from __future__ import annotations

import math

import torch

from draftkit.figures import EntropyTable

EDGES = (0.0, 0.1, 0.5, 1.0, 2.0, math.inf)  # nats


def bucket_index(entropy: torch.Tensor) -> torch.Tensor:
    """The bucket of each entropy, 0 .. len(EDGES) - 2 (same shape, int64)."""
    inner = torch.tensor(EDGES[1:-1], dtype=entropy.dtype, device=entropy.device)
    return torch.bucketize(entropy, inner, right=True)


def label(b: int) -> str:
    lo, hi = EDGES[b], EDGES[b + 1]
    return f"[{lo:g}, {hi:g})" if hi != math.inf else f">= {lo:g}"


class EntropyBuckets:
    """Sums acceptance per entropy bucket for several drafts over the same positions."""

    def __init__(self, names: list[str]):
        n = len(EDGES) - 1
        self.counts = torch.zeros(n, dtype=torch.float64)
        self.entropy_sum = 0.0
        self.sums = {name: torch.zeros(n, dtype=torch.float64) for name in names}

    def add(self, entropy: torch.Tensor, accept: dict[str, torch.Tensor]) -> None:
        """entropy: (N,) nats at N positions; accept: name -> (N,) acceptance there."""
        entropy = entropy.double().cpu()
        self.entropy_sum += float(entropy.sum())
        b = bucket_index(entropy)
        self.counts.index_add_(0, b, torch.ones_like(b, dtype=torch.float64))
        for name, a in accept.items():
            self.sums[name].index_add_(0, b, a.double().cpu())

    def result(self) -> EntropyTable:
        """Each bucket's label and positions, and each draft's mean acceptance there (None
        where a bucket is empty)."""
        return EntropyTable(
            buckets=[label(b) for b in range(len(self.counts))],
            positions=[int(c) for c in self.counts],
            acceptance={name: [float(x / c) if c else None for x, c in zip(s, self.counts)]
                        for name, s in self.sums.items()})


def merge(results: list[EntropyTable]) -> EntropyTable:
    """One :meth:`EntropyBuckets.result` from several over disjoint positions (the domains)."""
    positions = [sum(col) for col in zip(*(r.positions for r in results))]
    acceptance = {}
    for name in results[0].acceptance:
        sums = [sum(r.acceptance[name][b] * r.positions[b] for r in results
                    if r.acceptance[name][b] is not None) for b in range(len(positions))]
        acceptance[name] = [s / n if n else None for s, n in zip(sums, positions)]
    return EntropyTable(buckets=results[0].buckets, positions=positions, acceptance=acceptance)
