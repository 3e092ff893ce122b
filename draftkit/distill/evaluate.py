"""Held-out acceptance per domain: alpha = mean over response tokens of 1 - TV(p, q).

For one position, the probability that speculative sampling accepts the draft's token is
sum_x min(p(x), q(x)) = 1 - TV(p, q) (Leviathan et al. 2023, arXiv 2211.17192; DistillSpec,
arXiv 2310.08461). Averaged over the held-out rows' response tokens this is the alpha the
draft will see on the same kind of traffic, so the best checkpoint is picked by it, not by the
training loss.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from draftkit.data import Rows, positions
from draftkit.distill.losses import dense_logprobs
from draftkit.models.reduced_head import ReducedHead, head_of


def model_logits(model, device: str, autocast: Callable = contextlib.nullcontext,
                 head: "ReducedHead | None" = None) -> Callable:
    """``fn(input_ids, position_ids) -> logits`` for the functions below: (B, T), (B, T) ->
    (B, T, V) float32; packed rows stay apart because ``use_cache=False`` lets transformers
    build the mask from ``position_ids``.

    A draft with a reduced head (``head``, else the one a loaded draft carries:
    draftkit/models/reduced_head.py) proposes from q renormalised over it, as the decoder
    does, so its logits are -inf outside it: alpha is then the served draft's.
    """
    head = head if head is not None else head_of(model)
    if head is not None:
        head = head.to(device)

    def fn(ids, pos):
        with autocast():
            logits = model(input_ids=ids.to(device), position_ids=pos.to(device),
                           use_cache=False).logits.float()  # (B, T, V)
        return logits if head is None else head.expand(head.restrict(logits))
    return fn


@torch.no_grad()
def position_acceptance(draft_logits: Callable, target_logits: Callable, rows: Rows,
                        batch_size: int = 8, temperature: float = 1.0
                        ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                            torch.Tensor]]:
    """Per batch of ``rows``: (domain_ids (B,), mask (B, T), accept (B, T), target logp
    (B, T, V)), with accept = 1 - TV(p, q) at every position (masked ones included)."""
    for start in range(0, len(rows), batch_size):
        sel = slice(start, start + batch_size)
        ids, mask, pos = rows.input_ids[sel], rows.loss_mask[sel], positions(rows, sel)  # (B, T)
        width = int(mask.nonzero()[:, 1].max()) + 2 if mask.any() else 1  # skip trailing pads
        ids, mask, pos = ids[:, :width], mask[:, :width], pos[:, :width]
        p_logp = dense_logprobs(target_logits(ids, pos), temperature)  # (B, T, V)
        q_logp = dense_logprobs(draft_logits(ids, pos), temperature)
        # sum_x min(p, q) equals 1 - TV(p, q) and, unlike 1 - TV in float32, never dips
        # below 0 by rounding.
        accept = torch.minimum(p_logp.exp(), q_logp.exp()).sum(-1)  # (B, T)
        yield rows.domain_ids[sel], mask, accept, p_logp


def heldout_alpha(draft_logits: Callable, target_logits: Callable, rows: Rows,
                  batch_size: int = 8, temperature: float = 1.0) -> dict[str, float]:
    """``{"alpha/<domain>": value, ..., "alpha": token-weighted mean}`` over ``rows``.

    draft_logits / target_logits: input_ids (B, T), position_ids (B, T) -> logits (B, T, V).
    """
    sums = torch.zeros(len(rows.domains), dtype=torch.float64)
    counts = torch.zeros(len(rows.domains), dtype=torch.float64)
    for dom, mask, accept, _ in position_acceptance(draft_logits, target_logits, rows,
                                                    batch_size, temperature):
        sums.index_add_(0, dom, (accept.double() * mask).sum(1).cpu())
        counts.index_add_(0, dom, mask.sum(1).double().cpu())
    out = {f"alpha/{d}": float(sums[i] / counts[i]) for i, d in enumerate(rows.domains)
           if counts[i] > 0}
    out["alpha"] = float(sums.sum() / counts.sum().clamp(min=1))
    return out
