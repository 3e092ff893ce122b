"""Training-time test: an EAGLE-3 head trained on its own outputs, as it drafts (arXiv 2503.01840).

When it drafts, an EAGLE-3 head (draftkit/models/eagle3.py) reads the target's features for its
first token only; the next K - 1 it drafts from its own previous output h. Trained on target
features alone it would never see an h, and its acceptance would fall with every position.
Training-time test unrolls the head over its own outputs during training, ``steps`` times (7 in
EAGLE-3's references):

    step 0:  h_0[t] = layer(f_t,        token t + 1,     RoPE at p_t)
    step i:  h_i[t] = layer(h_(i-1)[t], token t + 1 + i, RoPE at p_t + i)

with f_t the fused target feature after token t and p_t the position of t in its example.
Step i's logits at t are scored against the target's distribution at t + 1 + i (which predicts
token t + 2 + i): position t is a draft whose first i tokens were accepted.

Attention simulates decoding. When the head drafts token t + 2 + i, its KV cache holds the keys
it wrote from target features (step 0, positions up to t of the same example) and the keys it
wrote itself for this draft (steps 1..i, all at t). So a step-i query at t attends causally to
step-0 keys and, of each later step, to its own key only, a diagonal (:func:`ttt_attention`):
every position is a draft of its own, and all of them train in one pass. A deeper head
(draftkit/models/eagle3_layer.py) does so in every layer, each over its own keys, as each layer
of its decoding cache holds them.

Packed examples never see each other: positions restart at each example (draftkit/data/pack.py),
step 0's causal mask stops at the example's start (:func:`block_causal`), and step i trains t
only where t + 1 + i is a trained position of the same example (:func:`step_masks`).

The loss (:func:`ttt_loss`) is the references' (EAGLE's and SpecForge's training loops): step
i's divergence against the target restricted to the draft vocabulary and renormalised, weighted
decay^i (0.8), summed over positions and divided by the batch's trained positions.

A parallel head (P-EAGLE, arXiv 2602.01469; draftkit/models/eagle3.py) trains on the same
positions, masks and loss, but its steps i >= 1 read the learned placeholder (token and
feature) instead of token t + 1 + i and h_(i-1)[t]: no step waits for another's output, so all
K run as one forward over K x T inputs (:func:`parallel_pass`), the attention the same as above
(a step-i query at t reads the causal step-0 keys and the placeholders 1..i at t: the keys its
one drafting forward has in front of it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from draftkit.distill.losses import teacher_divergence
from draftkit.distill.reduced_head import restrict_labels, restrict_teacher
from draftkit.models.reduced_head import ReducedHead

Tensor = torch.Tensor


def shift(x: Tensor, d: int) -> Tensor:
    """x[:, t + d] at t, zero past the end: (B, T, ...) -> (B, T, ...)."""
    out = torch.zeros_like(x)
    if d < x.shape[1]:
        out[:, :x.shape[1] - d] = x[:, d:]
    return out


def block_causal(position_ids: Tensor) -> Tensor:
    """Which step-0 keys each query reads: position_ids (B, T), restarting at each packed
    example -> (B, T, T) bool, true where key u lies at or before query t in t's example."""
    t = position_ids.shape[1]
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    example = starts.cumsum(-1)  # (B, T): which example each position belongs to
    idx = torch.arange(t, device=position_ids.device)
    return (example[:, :, None] == example[:, None, :]) & (idx[:, None] >= idx[None, :])


def ttt_attention(q: Tensor, keys: list[Tensor], values: list[Tensor], causal: Tensor) -> Tensor:
    """Step i's attention, i = len(keys) - 1: causal over step 0's keys, and of each later step
    j = 1..i the query's own key only, in one softmax (a decoding step's KV cache).

    q (B, nh, T, hd); keys, values: steps 0..i, each (B, nkv, T, hd); causal (B, T, T) from
    :func:`block_causal`. Returns o (B, nh, T, hd).
    """
    t, rep = q.shape[2], q.shape[1] // keys[0].shape[1]  # grouped-query: nh // nkv per key head
    k = [x.repeat_interleave(rep, dim=1) for x in keys]
    v = [x.repeat_interleave(rep, dim=1) for x in values]
    scale = q.shape[-1] ** -0.5
    first = (q @ k[0].transpose(-1, -2)) * scale  # (B, nh, T, T)
    first = first.masked_fill(~causal[:, None], float("-inf"))
    own = [(q * kj).sum(-1, keepdim=True) * scale for kj in k[1:]]  # (B, nh, T, 1) each
    w = torch.cat([first, *own], dim=-1).float().softmax(-1).to(q.dtype)  # (B, nh, T, T + i)
    o = w[..., :t] @ v[0]
    for j, vj in enumerate(v[1:]):
        o = o + w[..., t + j:t + j + 1] * vj
    return o


def unroll(draft: Any, aux: Tensor, input_ids: Tensor, position_ids: Tensor,
           steps: int) -> list[Tensor]:
    """The head's layer outputs h_0..h_(steps-1), each (B, T, H), unrolled over its own
    outputs. aux (B, T, 3 Ht): the target's tapped hidden states after tokens 0..T-1;
    input_ids (B, T): the row (step i reads token t + 1 + i at t); position_ids (B, T).
    A parallel head's steps read its placeholder instead (:func:`parallel_pass`)."""
    if draft.parallel:
        return parallel_pass(draft, aux, input_ids, position_ids, steps)
    causal = block_causal(position_ids)
    hidden = draft.fuse(aux)  # (B, T, H): f_t
    layers = [None, *draft.deeper]  # None: the fused first layer
    keys, values = [[] for _ in layers], [[] for _ in layers]  # per layer, steps 0..i
    out = []
    for i in range(steps):
        h = hidden
        for j, layer in enumerate(layers):
            q, k, v = (draft.attention_inputs(shift(input_ids, 1 + i), hidden, position_ids + i)
                       if layer is None else draft.deeper_inputs(layer, h, position_ids + i))
            keys[j].append(k)
            values[j].append(v)
            o = ttt_attention(q, keys[j], values[j], causal)
            h = draft.after_attention(o, hidden) if layer is None else layer.finish(o, h)
        hidden = h
        out.append(hidden)
    return out


def parallel_pass(draft: Any, aux: Tensor, input_ids: Tensor, position_ids: Tensor,
                  steps: int) -> list[Tensor]:
    """A parallel head's layer outputs at draft positions 1..K (K = ``steps``), each (B, T, H),
    from one forward: position 1 at t reads (f_t, token t + 1), position 1 + i the placeholder
    at p_t + i (module docstring). Arguments as :func:`unroll`'s."""
    b, t = input_ids.shape
    causal = block_causal(position_ids)
    token, place = draft.placeholder()  # the placeholder's token id, its feature (H,)
    ids = torch.cat([shift(input_ids, 1), input_ids.new_full((b, (steps - 1) * t), token)], 1)
    hidden = torch.cat([draft.fuse(aux), place.expand(b, (steps - 1) * t, -1)], 1)  # (B, KT, H)
    pos = torch.cat([position_ids + i for i in range(steps)], 1)  # (B, K T)

    def attend(q, k, v):  # (B, nh | nkv, K T, hd) -> o (B, nh, K T, hd)
        qs, ks, vs = q.split(t, 2), list(k.split(t, 2)), list(v.split(t, 2))
        return torch.cat([ttt_attention(qs[i], ks[:i + 1], vs[:i + 1], causal)
                          for i in range(steps)], 2)

    h = draft.after_attention(attend(*draft.attention_inputs(ids, hidden, pos)), hidden)
    for layer in draft.deeper:  # a deeper head's: the same mask in every layer
        h = layer.finish(attend(*draft.deeper_inputs(layer, h, pos)), h)
    return list(h.split(t, 1))


def step_masks(loss_mask: Tensor, position_ids: Tensor, steps: int) -> list[Tensor]:
    """Where each step trains, (B, T) bool each: at t for step i when the prediction at
    t + 1 + i is trained (``loss_mask``, data/pack.py's: the logits at s predict token s + 1)
    and t + 1 + i lies in t's example."""
    out = []
    for i in range(steps):
        d = 1 + i
        out.append(shift(loss_mask, d) & (shift(position_ids, d) == position_ids + d))
    return out


def teacher_rows(loss_mask: Tensor, masks: list[Tensor]) -> list[Tensor]:
    """For each step, the teacher's row for each of its positions, (N_i,) each: a teacher gives
    one row per trained position (``loss_mask``, row-major), and step i at t is scored by the
    row of t + 1 + i."""
    flat = loss_mask.flatten().long().cumsum(0).view_as(loss_mask) - 1  # (B, T)
    return [shift(flat, 1 + i)[m] for i, m in enumerate(masks)]


def ttt_loss(step_logits: list[Tensor], rows: list[Tensor], head: ReducedHead, loss: Any,
             decay: float, n: int, target: Any = None, labels: Tensor | None = None,
             weights: list[Tensor] | None = None) -> Tensor:
    """sum_i decay^i * sum_t w_i(t) D(p_(t+1+i) || q_i(t)) / n: the training-time-test loss.

    step_logits: (N_i, |H|) the head's logits at step i's positions; rows: (N_i,) their
    teacher rows (:func:`teacher_rows`); head: the draft vocabulary H; loss: the recipe's loss
    section (divergence, temperature, beta); n: the batch's trained positions. ``target``: the
    teacher at those positions (a TeacherOut over the whole vocabulary, dense or top-k),
    restricted to H and renormalised (distill/reduced_head.py); for the ``ce`` control
    ``labels`` (n,), the next tokens there, instead (a token outside H is left out).
    ``weights``: per step, each entry's weight w_i(t) (N_i,) (1 where not given: the drafts
    rejected while decoding weigh more on an on-policy step, :mod:`draftkit.distill.rollouts`).
    """
    total = step_logits[0].sum() * 0.0  # stays in the graph when nothing is trained
    if loss.divergence == "ce":
        for i, (logits, r) in enumerate(zip(step_logits, rows)):
            ids, inside = restrict_labels(labels[r], head)
            ce = F.cross_entropy(logits[inside].float(), ids[inside], reduction="none")
            w = 1.0 if weights is None else weights[i][inside]
            total = total + decay ** i * (w * ce).sum()
        return total / max(n, 1)
    p_logp, p_ids = restrict_teacher(target.logp, target.ids, head)  # (n, |H|) or (n, k)
    for i, (logits, r) in enumerate(zip(step_logits, rows)):
        per = teacher_divergence(loss.divergence, logits, p_logp[r],
                                 None if p_ids is None else p_ids[r], loss.temperature,
                                 loss.beta)  # (N_i,)
        w = 1.0 if weights is None else weights[i]
        total = total + decay ** i * (w * per).sum()
    return total / max(n, 1)
