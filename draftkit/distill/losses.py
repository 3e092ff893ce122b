"""Divergences between the target p and the draft q, per token, as small pure functions.

Every divergence takes log-probabilities over the last dimension and returns one value per
position, so the same function serves a dense teacher (last dim V) and a top-k sparse teacher
(last dim k + 1: the k kept tokens and a tail bucket holding the rest of the mass).

- :func:`dense_logprobs`: both models at ``temperature`` over the full vocabulary.
- :func:`sparse_logprobs`: the draft collapsed onto the teacher's top-k ids plus a tail bucket.
- :func:`teacher_divergence`: a divergence against either kind of teacher.
- :func:`hidden_distance`: the draft's hidden states against the target's (loss.hidden_weight).
- :func:`masked_mean`: the loss over response tokens only.

DistillSpec (Zhou et al. 2023, arXiv 2310.08461) compares these divergences for draft
training: none wins everywhere, and TVD is the one whose minimum maximises acceptance, since
alpha = E[1 - TV(p, q)] (Leviathan et al. 2023, arXiv 2211.17192).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def forward_kl(p_logp: Tensor, q_logp: Tensor) -> Tensor:
    """KL(p || q) = sum_x p(x) (log p(x) - log q(x)): mode-covering (DistillSpec, 2310.08461).

    p_logp, q_logp: (..., V) log-probabilities -> (...,)
    """
    p = p_logp.exp()
    # 0 * log 0 is 0: where p has no mass the term vanishes. Masking the difference (not the
    # product) keeps -inf out of the backward pass, where 0 * inf would be nan.
    diff = torch.where(p > 0, p_logp - q_logp, torch.zeros_like(p_logp))
    return (p * diff).sum(-1)


def reverse_kl(p_logp: Tensor, q_logp: Tensor) -> Tensor:
    """KL(q || p): mode-seeking, the draft avoids tokens the target rejects (2310.08461)."""
    return forward_kl(q_logp, p_logp)


def jsd(p_logp: Tensor, q_logp: Tensor, beta: float = 0.5) -> Tensor:
    """Generalised Jensen-Shannon divergence (GKD, Agarwal et al. 2023, arXiv 2306.13649).

    JSD(beta) = beta * KL(p || m) + (1 - beta) * KL(q || m),  m = beta * p + (1 - beta) * q.
    beta = 0.5 is the symmetric JSD; it interpolates between forward KL (small beta) and
    reverse KL (beta near 1) up to scale. p_logp, q_logp: (..., V) -> (...,)
    """
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be strictly between 0 and 1, got {beta}")
    # log m computed in log space so tiny probabilities do not underflow. Where p = q = 0
    # (both masked to -inf) logaddexp's gradient is nan even though every term there is 0,
    # so such entries get a finite stand-in: m = 0 there either way.
    both = torch.isneginf(p_logp) & torch.isneginf(q_logp)
    m_logp = torch.logaddexp(torch.where(both, 0.0, p_logp) + math.log(beta),
                             torch.where(both, 0.0, q_logp) + math.log(1.0 - beta))
    m_logp = torch.where(both, float("-inf"), m_logp)
    return beta * forward_kl(p_logp, m_logp) + (1.0 - beta) * forward_kl(q_logp, m_logp)


def tvd(p_logp: Tensor, q_logp: Tensor) -> Tensor:
    """Total variation TV(p, q) = 1/2 sum_x |p(x) - q(x)|; 1 - TV is the acceptance rate.

    DistillSpec (2310.08461) distils with it directly. p_logp, q_logp: (..., V) -> (...,)
    """
    return 0.5 * (p_logp.exp() - q_logp.exp()).abs().sum(-1)


DIVERGENCES = {"fkl": forward_kl, "rkl": reverse_kl, "jsd": jsd, "tvd": tvd}


def divergence(name: str, p_logp: Tensor, q_logp: Tensor, beta: float = 0.5) -> Tensor:
    """The named divergence per position: (..., V) -> (...,)."""
    if name == "jsd":
        return jsd(p_logp, q_logp, beta)
    return DIVERGENCES[name](p_logp, q_logp)


def dense_logprobs(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """logits: (B, T, V) -> log-probabilities at ``temperature``, in float32 for stable sums."""
    return F.log_softmax(logits.float() / temperature, dim=-1)


def with_tail(logp_topk: Tensor) -> Tensor:
    """Append a tail bucket holding 1 - sum(top-k mass): (..., k) -> (..., k + 1)."""
    # log(1 - sum p) via log1p(-exp(logsumexp)); clamp so a top-k holding all the mass
    # (rounding can push it a hair above 1) gives a tiny tail instead of nan.
    kept = torch.logsumexp(logp_topk, dim=-1, keepdim=True).clamp(max=-1e-7)
    return torch.cat([logp_topk, torch.log(-torch.expm1(kept))], dim=-1)


def sparse_logprobs(student_logits: Tensor, teacher_logp_topk: Tensor, teacher_ids: Tensor,
                    temperature: float = 1.0, tail: bool = True) -> tuple[Tensor, Tensor]:
    """Both distributions on the teacher's top-k support, for a cached sparse teacher.

    student_logits: (B, T, V); teacher_logp_topk: (B, T, k) log p of the kept ids at
    ``temperature`` (normalised over the full vocabulary when cached); teacher_ids: (B, T, k).
    Returns (p_logp, q_logp), each (B, T, k + 1) with a tail bucket for the rest of the mass,
    or (B, T, k) renormalised over the kept ids when ``tail`` is False.
    """
    q_full = dense_logprobs(student_logits, temperature)  # (B, T, V)
    p_topk = teacher_logp_topk.float()
    # An entry without teacher mass (an id outside a reduced head, at a stand-in position:
    # reduced_head.py) is left out of q's kept mass too, so that it counts in neither.
    q_topk = q_full.gather(-1, teacher_ids.long()).masked_fill(torch.isneginf(p_topk),
                                                                float("-inf"))  # (B, T, k)
    if tail:
        return with_tail(p_topk), with_tail(q_topk)
    return (p_topk - torch.logsumexp(p_topk, -1, keepdim=True),
            q_topk - torch.logsumexp(q_topk, -1, keepdim=True))


def teacher_divergence(name: str, logits: Tensor, p_logp: Tensor, p_ids: Tensor | None,
                       temperature: float = 1.0, beta: float = 0.5) -> Tensor:
    """The named divergence per position between the target and the draft's ``logits`` (N, V).

    A dense teacher has ``p_ids`` None and ``p_logp`` (N, V) at ``temperature``; a top-k one
    ``p_logp`` and ``p_ids`` (N, k), compared on its support plus a tail bucket
    (:func:`sparse_logprobs`). Returns (N,).
    """
    if p_ids is None:
        q_logp = dense_logprobs(logits, temperature)
    else:
        p_logp, q_logp = sparse_logprobs(logits, p_logp, p_ids, temperature)
    return divergence(name, p_logp, q_logp, beta)


def next_token_ce(logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy on the data's next tokens: the hard-label control for distillation.

    logits: (N, V), labels: (N,) -> scalar. DistillSpec (2310.08461) compares against
    training on the same sequences without the teacher's distribution.
    """
    if labels.numel() == 0:
        return logits.sum() * 0.0
    return F.cross_entropy(logits.float(), labels)


def hidden_distance(draft_h: Tensor, target_h: Tensor) -> Tensor:
    """Squared error between the draft's and the target's hidden states, relative to the
    target's: sum_i (h_i - t_i)^2 / sum_i t_i^2 per stream (draftkit/distill/hidden.py).

    TinyBERT (Jiao et al. 2020, arXiv 1909.10351) fits the student's hidden states to the
    teacher's with a squared error; dividing by the target's size keeps the weight's meaning
    the same at any depth and width. draft_h, target_h: (..., H) -> (...,)
    """
    target_h = target_h.float()
    err = (draft_h.float() - target_h).pow(2).sum(-1)
    return err / target_h.pow(2).sum(-1).clamp(min=1e-12)


def masked_mean(per_token: Tensor, mask: Tensor) -> Tensor:
    """Mean of (B, T) values over positions where mask (B, T) is true; 0 if none are."""
    kept = torch.where(mask.bool(), per_token, 0.0)  # an inf or nan left out stays out
    return kept.sum() / mask.to(per_token.dtype).sum().clamp(min=1.0)
