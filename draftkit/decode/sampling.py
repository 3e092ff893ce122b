"""Turning logits into the distributions that speculative sampling compares.

Temperature, top-k and top-p must warp the target's p and the draft's q the same way before
the accept test (arXiv 2211.17192): speculative sampling is then lossless with respect
to the warped target distribution, which is what plain sampling would draw from.
Temperature 0 means greedy decoding and never reaches :func:`warp_logits`.

A batch may mix rows with different parameters (a server batches unrelated requests):
:func:`row_probabilities` warps each row by its own, and the random draws take either one
generator for the whole batch or one per row (``[gen_0, gen_1, ...]``), so a row with its own
seeded generator draws the same numbers whatever other rows share its batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

import torch

from draftkit.decode.sampling_params import SamplingParams

if TYPE_CHECKING:
    from draftkit.models.reduced_head import ReducedHead

# One generator for the batch, or one per row (None: the row needs no random numbers).
Generators = Union["torch.Generator", list["torch.Generator | None"], None]


def row_generator(seed: int | None, device=None) -> "torch.Generator":
    """A row's own generator: seeded with ``seed`` (the row's draws then depend on its seed
    alone), or at random when None."""
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


def warp_logits(logits: "torch.Tensor", params: SamplingParams) -> "torch.Tensor":
    """Temperature, then top-k, then top-p; removed tokens get -inf.

    logits: (..., V) -> (..., V) float32.
    """
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


def draft_probabilities(logits: "torch.Tensor", params: SamplingParams) -> "torch.Tensor":
    """q as the accept test reads it from a draft's logits (..., V): the warped distribution,
    or one-hot at the argmax under greedy draft sampling (:attr:`SamplingParams.greedy_draft`),
    so that sum_x min(p, q) is the chance the draft's token is kept either way."""
    if params.greedy_draft:
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(
            -1, logits.argmax(-1, keepdim=True), 1.0)
    return probabilities(logits, params)


def row_probabilities(logits: "torch.Tensor", params: list[SamplingParams]) -> "torch.Tensor":
    """Each row warped by its own parameters. logits: (B, ..., V) -> probs: (B, ..., V) float32.

    Greedy rows (temperature 0) get the one-hot distribution at their argmax: sampling it
    returns the argmax, and a draft and target that are both one-hot accept exactly when the
    argmaxes agree. Rows with equal parameters are warped together.
    """
    if all(p == params[0] for p in params) and not params[0].greedy:
        return probabilities(logits, params[0])
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    for p in set(params):
        idx = torch.tensor([b for b, q in enumerate(params) if q == p], device=logits.device)
        sub = logits.index_select(0, idx)
        if p.greedy:
            probs = torch.zeros_like(sub, dtype=torch.float32).scatter_(
                -1, sub.argmax(-1, keepdim=True), 1.0)
        else:
            probs = probabilities(sub, p)
        out.index_copy_(0, idx, probs)
    return out


def _draw(out: "torch.Tensor", generator: Generators) -> "torch.Tensor":
    """Fill out (B, ...) with U[0, 1) numbers: from one generator, or row b from generator[b]
    (a None entry gets ones: that row is greedy and its draws are never used)."""
    if not isinstance(generator, (list, tuple)):
        return out.uniform_(generator=generator)
    for b, g in enumerate(generator):
        if g is None:
            out[b].fill_(1.0)
        else:
            out[b].uniform_(generator=g)
    return out


def uniform(shape: tuple[int, ...], generator: Generators, device) -> "torch.Tensor":
    """U[0, 1) of ``shape`` (B, ...), per row when given one generator per row."""
    return _draw(torch.empty(shape, device=device), generator)


def sample(probs: "torch.Tensor", generator: Generators) -> "torch.Tensor":
    """One token per distribution by inverse transform sampling: the first x whose cumulative
    mass exceeds u * sum(probs), u ~ U[0, 1).

    P(x) = probs[x] / sum(probs), so probs need not be normalised; zero entries are never
    drawn (their cumulative mass equals the one before them). One uniform number a row, a
    cumulative sum and a binary search: at batch 1 on a CPU an order of magnitude cheaper than
    the exponential race argmax(probs / E), E ~ Exp(1), whose V exponential draws cost a sampled
    draft more than its forward (``eval/benchmarks/probes/sampler_cost.py``). No host sync.
    probs: (..., V) -> (...,). ``generator``: one for all, or one per row of dim 0.
    """
    # float64 keeps a token of tiny mass its own interval of the cumulative sum
    dtype = torch.float32 if probs.device.type == "mps" else torch.float64  # mps lacks float64
    cdf = probs.cumsum(-1, dtype=dtype)  # (..., V), cast as it sums: no float64 copy of probs
    total = cdf[..., -1:].contiguous()  # (..., 1)
    u = _draw(torch.empty(total.shape, dtype=dtype, device=probs.device), generator)
    drawn = torch.searchsorted(cdf, u * total, right=True)
    # u * total may round up to total (or u is 1, a greedy row's filler): the last token with
    # mass is then the draw, never a zero entry past it
    last = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(drawn, last).squeeze(-1)


def next_tokens(logits: "torch.Tensor", params: list[SamplingParams], generator: Generators
                ) -> tuple["torch.Tensor", "torch.Tensor | None"]:
    """One token per row (per position of a row), each row by its own parameters: the argmax
    for greedy rows, a sample of the warped distribution for the others. logits: (B, ..., V) ->
    tokens (B, ...) and the warped probabilities (B, ..., V), None when every row is greedy.

    A greedy row of a mixed batch takes the argmax itself rather than a draw from its one-hot
    distribution, so it never depends on random numbers.
    """
    greedy = [p.greedy for p in params]
    if all(greedy):
        return logits.argmax(-1), None
    probs = row_probabilities(logits, params)
    tokens = sample(probs, generator)
    if any(greedy):
        rows = torch.tensor(greedy, device=tokens.device).view(-1, *[1] * (tokens.dim() - 1))
        tokens = torch.where(rows, logits.argmax(-1), tokens)
    return tokens, probs


def next_tokens_among(logits: "torch.Tensor", params: list[SamplingParams],
                      generator: Generators, vocab: "ReducedHead | None"
                      ) -> tuple["torch.Tensor", "torch.Tensor | None"]:
    """:func:`next_tokens` for a draft whose logits (B, ..., N) cover a reduced head's N tokens
    (``vocab``; None: logits (B, ..., V) over them all): chosen among those N, returned as the
    target's ids (B, ...) with q (B, ..., V) zero outside the head (None when every row is
    greedy). The same tokens and q as choosing over V with -inf outside the head, where its ids
    are sorted, at a fraction of the cost (``eval/benchmarks/probes/sampler_cost.py``).

    A row of ``draft_sample_method`` greedy (:attr:`SamplingParams.greedy_draft`) proposes the
    argmax with q one-hot at it: the accept test min(1, p / q) then keeps it with probability
    p(d), and the residual is p without d, so the output is still the target's (any q is), at
    vLLM's default acceptance."""
    tokens, q = next_tokens(logits, params, generator)
    if q is not None and any(p.greedy_draft for p in params):
        rows = torch.tensor([p.greedy_draft for p in params], device=tokens.device)
        rows = rows.view(-1, *[1] * (tokens.dim() - 1))  # (B, 1, ...)
        tokens = torch.where(rows, logits.argmax(-1), tokens)
        one_hot = torch.zeros_like(q).scatter_(-1, tokens[..., None], 1.0)
        q = torch.where(rows[..., None], one_hot, q)
    if vocab is None:
        return tokens, q
    return vocab.ids[tokens], None if q is None else vocab.expand(q, fill=0.0)
