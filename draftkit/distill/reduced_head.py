"""Training over the reduced head the draft decodes with (``draft.train_reduced_head``).

A draft with ``draft.draft_vocab_size`` proposes from q renormalised over its N most frequent
tokens H (FR-Spec, Zhao et al. 2025, arXiv 2502.14856), so only q over H is ever served.
EAGLE-3 (Li et al. 2025, arXiv 2503.01840) trains its draft over such a vocabulary too: the
head's matrix product and the softmax then cost N / V of the whole head's, which on a small
draft with a 49k vocabulary is most of a training step.

The target p is restricted to H the same way: the draft cannot propose a token outside H, so
that mass is out of reach. Renormalised over H, p_H is the q_H that maximises acceptance,
sum over x in H of min(p(x), q_H(x)) = p(H) (Leviathan et al. 2023, arXiv 2211.17192), so
every divergence in draftkit/distill/losses.py keeps its meaning.

H is a :class:`draftkit.models.reduced_head.ReducedHead`, the object the decoder and export use
too; its ``index`` (V,) maps vocabulary ids to positions in H, -1 outside H.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from draftkit.models.reduced_head import ReducedHead

Tensor = torch.Tensor


def head_logits(model: Any, hidden: Tensor, head: ReducedHead | None) -> Tensor:
    """The draft's head over H only: hidden (N, D) -> logits (N, |H|), or (N, V) without H.

    Multiplies by H's rows of a plain linear head; a head it cannot read that way (LoRA on
    the head, a ZeRO-3 partitioned weight, which is only whole inside the head's own forward)
    runs whole and is sliced, the same logits at the whole head's cost.
    """
    lm_head = model.get_output_embeddings()
    if head is None:
        return lm_head(hidden)
    weight = getattr(lm_head, "weight", None)
    if type(lm_head) is not torch.nn.Linear or hasattr(weight, "ds_status"):
        return head.restrict(lm_head(hidden))
    bias = None if lm_head.bias is None else head.restrict(lm_head.bias)
    return F.linear(hidden, head.restrict(weight, dim=0), bias)  # H's rows: (N, D)


def restrict_dense(p_logp: Tensor, head: ReducedHead) -> Tensor:
    """The target over H, renormalised: (N, V) log-probs -> (N, |H|)."""
    p = head.restrict(p_logp)
    return p - torch.logsumexp(p, dim=-1, keepdim=True)


def restrict_sparse(p_logp_topk: Tensor, ids: Tensor, head: ReducedHead
                    ) -> tuple[Tensor, Tensor]:
    """A cached top-k teacher over H: (N, k) log p and ids -> (N, k) log p and positions in H.

    Ids outside H get log p = -inf (and position 0, unread: losses.sparse_logprobs leaves out
    entries where p is -inf). The rest is renormalised by Z = 1 - (top-k mass outside H), so
    that the tail bucket sparse_logprobs adds, 1 - (kept mass), is p_H's mass on H beyond the
    top k (all of the unseen tail is counted in H: the cache cannot say where it lies).
    """
    pos = head.index[ids.long()]  # (N, k)
    inside = pos >= 0
    p = p_logp_topk.float()
    outside_mass = torch.where(inside, 0.0, p.exp()).sum(-1, keepdim=True)  # (N, 1)
    log_z = torch.log1p(-outside_mass.clamp(max=1.0 - 1e-6))
    return torch.where(inside, p - log_z, float("-inf")), pos.clamp(min=0)


def restrict_teacher(p_logp: Tensor, p_ids: Tensor | None, head: ReducedHead | None
                     ) -> tuple[Tensor, Tensor | None]:
    """The target over H, as :func:`restrict_dense` (``p_ids`` None: (N, V) log-probs) or
    :func:`restrict_sparse` (a top-k teacher) makes it; without a head, as it is."""
    if head is None:
        return p_logp, p_ids
    if p_ids is None:
        return restrict_dense(p_logp, head), None
    return restrict_sparse(p_logp, p_ids, head)


def restrict_labels(labels: Tensor, head: ReducedHead) -> tuple[Tensor, Tensor]:
    """Next-token labels (N,) -> their positions in H and which are in H at all (N,) bool:
    the cross-entropy control cannot be asked for a token its head does not have."""
    pos = head.index[labels]
    return pos.clamp(min=0), pos >= 0
