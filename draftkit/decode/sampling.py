"""Turning logits into the distributions that speculative sampling compares.

Temperature, top-k and top-p must warp the target's p and the draft's q the same way before
the accept test (REFERENCE.md section 1): speculative sampling is then lossless with respect
to the warped target distribution, which is what plain sampling would draw from.
Temperature 0 means greedy decoding and never reaches these functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from draftkit.errors import DraftkitError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen; the same for target and draft."""

    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise DraftkitError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise DraftkitError(f"top-p must lie in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise DraftkitError(f"top-k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def warp_logits(logits: "torch.Tensor", params: SamplingParams) -> "torch.Tensor":
    """Temperature, then top-k, then top-p; removed tokens get -inf.

    logits: (..., V) -> (..., V) float32.
    """
    import torch

    logits = logits.float() / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before
        # it already does. The most likely token always stays.
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probabilities(logits: "torch.Tensor", params: SamplingParams) -> "torch.Tensor":
    """Warped distribution. logits: (..., V) -> probs: (..., V) float32."""
    return warp_logits(logits, params).softmax(-1)


def sample(probs: "torch.Tensor", generator: "torch.Generator | None") -> "torch.Tensor":
    """One token per distribution: argmax(probs / E) with E ~ Exp(1) (as gpt-fast does).

    P(argmax = x) = probs[x] / sum(probs), so probs need not be normalised; zero entries are
    never drawn. Works on any leading shape without a host sync. probs: (..., V) -> (...,).
    """
    import torch

    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / noise).argmax(-1)
