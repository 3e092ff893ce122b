"""Verify-and-accept: the step that makes speculative decoding lossless.

Pure functions over tensors, one per mode, each checkable against the papers:
Leviathan et al., "Fast Inference from Transformers via Speculative Decoding" (arXiv
2211.17192), Algorithm 1; Chen et al., "Accelerating Large Language Model Decoding with
Speculative Sampling" (arXiv 2302.01318), Algorithm 2 (token verification); Sun et al., "Block
Verification Accelerates Speculative Decoding" (ICLR 2025, arXiv 2403.10444), Algorithm 2
(block verification). Letters follow Leviathan: p = target, q = draft.

Each returns a :class:`Verdict`: how many drafted tokens each row accepted, the one token the
target adds after them (the residual sample at the first rejection, or the bonus token when all
K were accepted), and beta = sum_x min(p, q) = 1 - TV(p, q) per drafted position, so alpha and
tau fall out of the counts. :func:`verify` is the decision for a batch that mixes the modes
row by row, and :func:`committed_block` the tokens a round then commits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftkit.decode.sampling import Generators, row_probabilities, sample, uniform
from draftkit.decode.sampling_params import BLOCK, SamplingParams


@dataclass
class Verdict:
    num_accepted: "torch.Tensor"  # (B,) int64 in 0..K: leading drafted tokens accepted
    next_token: "torch.Tensor"  # (B,) int64: residual sample (n < K) or bonus token (n = K)
    beta: "torch.Tensor"  # (B, K) float32: sum_x min(p, q) per drafted position (1 - TV)

    def where(self, rows: "torch.Tensor", other: Verdict) -> Verdict:
        """This verdict on ``rows`` (B,) bool, ``other``'s elsewhere."""
        return Verdict(self.num_accepted.where(rows, other.num_accepted),
                       self.next_token.where(rows, other.next_token),
                       self.beta.where(rows[:, None], other.beta))


def leading_accepts(accepted: "torch.Tensor") -> "torch.Tensor":
    """Length of the run of True from the start of each row. accepted: (B, K) -> (B,)."""
    return accepted.long().cumprod(-1).sum(-1)


def verify_greedy(draft_tokens: "torch.Tensor", target_logits: "torch.Tensor") -> Verdict:
    """Temperature 0: accept while the drafted token equals the target's argmax, then append
    the target's argmax at the first mismatch (or after the last drafted token).

    draft_tokens: (B, K); target_logits: (B, K + 1, V), position i scores draft_tokens[:, i].
    The output equals plain greedy decoding of the target token for token.
    """
    best = target_logits.argmax(-1)  # (B, K + 1)
    match = draft_tokens == best[:, :-1]  # (B, K)
    n = leading_accepts(match)
    next_token = best.gather(1, n[:, None]).squeeze(1)
    return Verdict(n, next_token, match.float())


def accept_test(draft_tokens: "torch.Tensor", q: "torch.Tensor", p: "torch.Tensor",
                uniform: "torch.Tensor") -> "torch.Tensor":
    """Accept x_i when u_i < p_i(x_i) / q_i(x_i), i.e. with probability min(1, p/q).

    draft_tokens: (B, K); q: (B, K, V); p: (B, K + 1, V) (only the first K are used here);
    uniform: (B, K) in [0, 1). Returns accepted: (B, K) bool. q(x) > 0 since x was drawn from q;
    the test is written as u * q < p to avoid dividing. Strict, because u is exactly 0 about
    once in 2^24 float32 draws: ``<=`` would then accept a token the target gives p = 0 (one
    its top-k or top-p cut), which plain sampling never emits; for u in [0, 1) the strict test
    accepts with probability min(1, p/q) all the same.
    """
    idx = draft_tokens[..., None]
    q_x = q.gather(-1, idx).squeeze(-1)
    p_x = p[:, :-1].gather(-1, idx).squeeze(-1)
    return uniform * q_x < p_x


def residual(p_n: "torch.Tensor", q_n: "torch.Tensor") -> "torch.Tensor":
    """norm(max(0, p - q)): what to sample from after a rejection. (B, V) -> (B, V).

    A rejection only happens where p(x) < q(x), so the residual has positive mass then; a row
    whose residual is all zero (p == q, or the bonus position where q_n = 0 gives p itself)
    falls back to p.
    """
    r = (p_n - q_n).clamp_min(0.0)
    mass = r.sum(-1, keepdim=True)
    return (r / mass.clamp_min(1e-30)).where(mass > 0, p_n)


def verify_sampled(draft_tokens: "torch.Tensor", q: "torch.Tensor", p: "torch.Tensor",
                   generator: Generators = None) -> Verdict:
    """Speculative sampling (Leviathan et al. Algorithm 1; Chen et al. Algorithm 2).

    draft_tokens: (B, K) drawn from q; q: (B, K, V) warped draft distributions; p: (B, K + 1, V)
    warped target distributions at the same positions plus one. Accept x_i with probability
    min(1, p_i(x_i) / q_i(x_i)); at the first rejection n sample from norm(max(0, p_n - q_n));
    if all K are accepted sample the bonus token from p_(K+1). The emitted tokens are then
    distributed exactly as sampling from p. ``generator``: one for the batch or one per row.
    """
    bsz, k = draft_tokens.shape
    u = uniform((bsz, k), generator, p.device)
    n = leading_accepts(accept_test(draft_tokens, q, p, u))
    rows = torch.arange(bsz, device=p.device)
    # Padding q with zeros at position K makes the bonus case the residual of p_(K+1) and 0.
    q_pad = torch.cat([q, q.new_zeros(bsz, 1, q.shape[-1])], dim=1)
    next_token = sample(residual(p[rows, n], q_pad[rows, n]), generator)
    beta = torch.minimum(p[:, :-1], q).sum(-1)
    return Verdict(n, next_token, beta)


def block_acceptance(draft_tokens: "torch.Tensor", q: "torch.Tensor", p: "torch.Tensor"
                     ) -> tuple["torch.Tensor", "torch.Tensor"]:
    """The quantities of block verification (Sun et al., arXiv 2403.10444, Algorithm 2) for a
    drafted block. draft_tokens: (B, K) drawn from q; q: (B, K, V); p: (B, K + 1, V), as in
    :func:`verify_sampled`. With w_0 = 1 and, for i = 1..K,

        w_i = min(1, w_(i-1) p_i(x_i) / q_i(x_i))             (the weight of the prefix x_1..x_i)
        r_i = max(0, w_i p_(i+1) - q_(i+1))                 (the residual after i, i < K)
        h_i = |r_i| / (|r_i| + 1 - w_i) for i < K,  h_K = w_K  (|r| = sum_x r(x))

    returns h: (B, K), h_1..h_K, and after: (B, K + 1, V), what the next token is drawn from
    once n tokens are kept, r_0..r_(K-1) then p_(K+1) (not normalised). r_0 is the token
    rule's residual max(0, p_1 - q_1). Where w_i = 1 and r_i is empty (p_(i+1) = q_(i+1)),
    h_i is taken as 1 and r_i as p_(i+1): h_(i+1) is then 1 too, so neither decides n.
    """
    bsz, k = draft_tokens.shape
    idx = draft_tokens[..., None]
    ratio = (p[:, :-1].gather(-1, idx) / q.gather(-1, idx).clamp_min(1e-30)).squeeze(-1)
    weights = [p.new_ones(bsz)]  # w_0..w_K, each (B,)
    for i in range(k):
        weights.append(torch.minimum(weights[-1] * ratio[:, i], p.new_ones(())))
    w = torch.stack(weights, dim=1)  # (B, K + 1)
    r = (w[:, :k, None] * p[:, :k] - q).clamp_min(0.0)  # (B, K, V): r_0..r_(K-1)
    mass = r.sum(-1)  # (B, K)
    denom = mass[:, 1:] + 1.0 - w[:, 1:k]  # (B, K - 1)
    h_inner = (mass[:, 1:] / denom.clamp_min(1e-30)).where(denom > 0, p.new_ones(()))
    h = torch.cat([h_inner, w[:, k:]], dim=1)  # (B, K)
    after = torch.cat([r, p[:, k:]], dim=1)  # (B, K + 1, V)
    return h, after.where(after.sum(-1, keepdim=True) > 0, p)


def block_verify(draft_tokens: "torch.Tensor", q: "torch.Tensor", p: "torch.Tensor",
                 generator: Generators = None) -> Verdict:
    """Block verification (Sun et al., arXiv 2403.10444, Algorithm 2): the drafted block is
    judged as a whole, so a prefix may be kept past a token that the token-by-token test would
    have rejected. Exactly the target's distribution, and never fewer accepted tokens in
    expectation than :func:`verify_sampled` (the paper's Theorems 1 and 2); as many under a
    greedy draft (q one-hot), whose block no rule keeps more often than prod_i p_i(x_i).

    Arguments as :func:`verify_sampled`'s. n is the largest i with eta_i < h_i (0 if none),
    eta_i ~ U[0, 1), and the next token is drawn from norm(r_n), or from p_(K+1) when n = K
    (:func:`block_acceptance`). The test is strict for the reason :func:`accept_test` gives:
    h_i = 0 once a drafted token has p = 0, and u is exactly 0 about once in 2^24 draws.
    """
    bsz, k = draft_tokens.shape
    h, after = block_acceptance(draft_tokens, q, p)  # (B, K), (B, K + 1, V)
    eta = uniform((bsz, k), generator, p.device)
    steps = torch.arange(1, k + 1, device=p.device)
    n = torch.where(eta < h, steps, 0).amax(-1)  # (B,)
    next_token = sample(after[torch.arange(bsz, device=p.device), n], generator)
    return Verdict(n, next_token, torch.minimum(p[:, :-1], q).sum(-1))


def verify(draft_tokens: "torch.Tensor", q: "torch.Tensor | None", target_logits: "torch.Tensor",
           params: list[SamplingParams], generator: Generators = None) -> Verdict:
    """The accept decision for a batch whose rows each decode greedily or by sampling.

    draft_tokens: (B, K); q: (B, K, V) the draft's warped distributions (None when every row
    is greedy); target_logits: (B, K + 1, V); params: one per row. Sampled rows get
    :func:`verify_sampled` (or :func:`block_verify`, by their ``verify``) on p warped by their
    own parameters; greedy rows keep the exact :func:`verify_greedy` verdict, whichever rule
    they name (on one-hot p and q the rules agree, for u < 1; a greedy row without a generator
    of its own draws u = 1). Every row's random numbers are drawn either way, so a sampled
    row's draws do not depend on which other rows are greedy.
    """
    greedy = [x.greedy for x in params]
    if all(greedy):
        return verify_greedy(draft_tokens, target_logits)
    p = row_probabilities(target_logits, params)  # (B, K + 1, V)
    sampled = _verify_by_rule(draft_tokens, q, p, [x.verify == BLOCK for x in params],
                              generator)
    if not any(greedy):
        return sampled
    rows = torch.tensor(greedy, device=target_logits.device)
    return verify_greedy(draft_tokens, target_logits).where(rows, sampled)


def _verify_by_rule(draft_tokens: "torch.Tensor", q: "torch.Tensor", p: "torch.Tensor",
                    block: list[bool], generator: Generators) -> Verdict:
    """Each row by its rule: :func:`block_verify` where ``block`` (one bool a row), else
    :func:`verify_sampled`. A batch that mixes them (requests of different settings) runs each
    rule on its own rows, each row with its own generator where it has one."""
    if not any(block):
        return verify_sampled(draft_tokens, q, p, generator)
    if all(block):
        return block_verify(draft_tokens, q, p, generator)
    bsz = len(block)
    out = Verdict(draft_tokens.new_zeros(bsz), draft_tokens.new_zeros(bsz),
                  p.new_zeros(draft_tokens.shape))
    rows = torch.tensor(block, device=p.device)
    for rule, pick in ((block_verify, rows), (verify_sampled, ~rows)):
        idx = pick.nonzero().squeeze(1)  # (b,)
        gens = [generator[i] for i in idx.tolist()] if isinstance(generator, (list, tuple)) \
            else generator
        part = rule(draft_tokens[idx], q[idx], p[idx], gens)
        out.num_accepted[idx], out.next_token[idx], out.beta[idx] = (
            part.num_accepted, part.next_token, part.beta)
    return out


def committed_block(draft_tokens: "torch.Tensor", verdict: Verdict) -> "torch.Tensor":
    """The tokens a round commits, per row d_1..d_n then the verdict's next token (the
    residual sample or the bonus token): n + 1 of them. draft_tokens: (B, K) -> (B, K + 1);
    the entries past n + 1 are filler that the commit does not keep."""
    block = torch.cat([draft_tokens, draft_tokens[:, :1]], dim=1)
    return block.scatter_(1, verdict.num_accepted[:, None], verdict.next_token[:, None])
