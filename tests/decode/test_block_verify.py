"""Block verification (Sun et al., arXiv 2403.10444): exact by enumeration, lossless by
chi-square at temperatures 0.7 and 1 (with a negative control), never fewer accepted tokens
than token verification, greedy as token verification, batched as alone."""

import itertools

import pytest
import torch

from draftkit.decode.choice import resolve_k
from draftkit.decode.engine import SpeculativeEngine
from draftkit.decode.sampling import SamplingParams, probabilities, row_probabilities, sample
from draftkit.decode.verify import (block_acceptance, block_verify, verify, verify_greedy,
                                    verify_sampled)
from tests.helpers import (broken_block_verify, chi_square_p, noisy_copy,
                           tiny_target_and_draft)

# --- a toy whose p and q depend on the position and the token before -------------------------
# Position t (0..K) draws from P[t, prev] (prev = START before the first token); the draft
# proposes from Q[t, prev]. Small enough to enumerate, rich enough that a rule reading p or q at
# the wrong position or prefix fails.


def markov_pair(vocab: int, k: int, params: SamplingParams, seed: int, noise: float = 1.5):
    """(P (K + 1, V + 1, V), Q (K, V + 1, V)): the target's and the draft's warped tables."""
    gen = torch.Generator().manual_seed(seed)
    lp = torch.randn(k + 1, vocab + 1, vocab, generator=gen) * 1.5
    lq = lp[:k] + torch.randn(k, vocab + 1, vocab, generator=gen) * noise
    return probabilities(lp, params), probabilities(lq, params)


def distributions(P, Q, drafted):
    """q (N, K, V) and p (N, K + 1, V) along drafted blocks (N, K)."""
    k, start = Q.shape[0], Q.shape[1] - 1
    prev = torch.cat([torch.full((len(drafted), 1), start), drafted], dim=1)  # (N, K + 1)
    q = torch.stack([Q[i, prev[:, i]] for i in range(k)], dim=1)
    p = torch.stack([P[i, prev[:, i]] for i in range(k + 1)], dim=1)
    return q, p


def every_block(Q):
    """Every drafted block (V^K, K) and its probability under the draft (V^K,)."""
    k, vocab = Q.shape[0], Q.shape[-1]
    blocks = torch.tensor(list(itertools.product(range(vocab), repeat=k)))
    q, _ = distributions(torch.zeros(k + 1, vocab + 1, vocab), Q, blocks)
    return blocks, q.gather(-1, blocks[..., None]).squeeze(-1).double().prod(-1)


def kept_at_least(h):
    """P(n >= i | block) for i = 1..K from block verification's h (N, K): some j >= i passes."""
    return 1 - (1 - h.double()).flip(1).cumprod(1).flip(1)


def target_joint(P):
    """The target's probability of every sequence of K + 1 tokens: (V,) * (K + 1)."""
    k1, start, vocab = P.shape[0], P.shape[1] - 1, P.shape[-1]
    joint = P[0, start].double()
    for t in range(1, k1):
        joint = joint[..., None] * P[t, :vocab].double()  # the last axis is the token before
    return joint


# --- exact ---------------------------------------------------------------------------------

@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_p=0.9)])
def test_block_verification_emits_the_target_joint_exactly(params):
    """Every drafted block, every n with its probability h_n prod_(j > n) (1 - h_j), every next
    token, the rest sampled from the target: the sequence of K + 1 tokens is the target's,
    to float32 precision."""
    vocab, k = 4, 3
    P, Q = markov_pair(vocab, k, params, seed=0)
    blocks, q_block = every_block(Q)
    q, p = distributions(P, Q, blocks)
    h, after = block_acceptance(blocks, q, p)  # (N, K), (N, K + 1, V)
    h = torch.cat([torch.ones(len(blocks), 1), h], dim=1).double()  # h_0 = 1
    after = after.double() / after.double().sum(-1, keepdim=True)
    out = torch.zeros((vocab,) * (k + 1), dtype=torch.float64)
    for n in range(k + 1):
        p_n = q_block * h[:, n] * (1 - h[:, n + 1:]).prod(-1)  # (N,)
        for b in range(len(blocks)):
            emitted = p_n[b] * after[b, n]  # (V,): x_1..x_n, then this token
            for t in range(n + 1, k + 1):  # the rest from the target
                emitted = emitted[..., None] * P[t, :vocab].double()
            out[tuple(blocks[b, :n].tolist())] += emitted
    torch.testing.assert_close(out, target_joint(P), atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("greedy_draft", [False, True])
def test_block_keeps_at_least_as_many_tokens_as_token_verification(seed, greedy_draft):
    """E[n] over every drafted block, computed exactly: block >= token (Sun et al., Theorem 2),
    strictly on these pairs with probabilistic drafts. With greedy drafts (q one-hot at the
    draft's argmax) the two are equal: no rule keeps the block x_1..x_i more often than the
    target's own prod_j p_j(x_j), which token verification already does."""
    vocab, k = 5, 3
    params = SamplingParams(1.0, draft_sample_method="greedy" if greedy_draft else
                            "probabilistic")
    P, Q = markov_pair(vocab, k, params, seed=seed, noise=1.0 + seed / 2)
    if greedy_draft:
        Q = torch.zeros_like(Q).scatter_(-1, Q.argmax(-1, keepdim=True), 1.0)
    blocks, q_block = every_block(Q)
    blocks, q_block = blocks[q_block > 0], q_block[q_block > 0]  # greedy drafts: one a prefix
    q, p = distributions(P, Q, blocks)
    idx = blocks[..., None]
    a = (p[:, :-1].gather(-1, idx) / q.gather(-1, idx)).clamp(max=1).squeeze(-1).double()
    token = (q_block * a.cumprod(1).sum(1)).sum()  # sum_i P(first i accepted)
    h, _ = block_acceptance(blocks, q, p)
    block = (q_block * kept_at_least(h).sum(1)).sum()
    if greedy_draft:
        torch.testing.assert_close(block, token, atol=1e-6, rtol=0)
    else:
        assert block > token + 1e-3, (block, token)
    # one drafted token: the rules are the same rule
    h1, _ = block_acceptance(blocks[:, :1], q[:, :1], p[:, :2])
    torch.testing.assert_close(h1[:, 0].double(), a[:, 0])


def test_on_one_hot_distributions_block_is_the_greedy_verdict():
    target = torch.tensor([[3, 1, 4, 2]])  # the target's argmax at positions 1..K + 1
    p = torch.zeros(1, 4, 6).scatter_(-1, target[..., None], 1.0)
    for draft, (n, nxt) in {(3, 1, 4): (3, 2), (3, 1, 0): (2, 4), (0, 1, 4): (0, 3),
                            (3, 5, 4): (1, 1)}.items():
        d = torch.tensor([draft])
        q = torch.zeros(1, 3, 6).scatter_(-1, d[..., None], 1.0)
        v = block_verify(d, q, p, torch.Generator().manual_seed(0))
        assert (v.num_accepted.item(), v.next_token.item()) == (n, nxt), draft
        g = verify_greedy(d, torch.log(p + 1e-9))
        assert (g.num_accepted.item(), g.next_token.item()) == (n, nxt)


def test_a_prefix_the_target_rules_out_is_never_kept():
    """p = 0 at the second drafted token: h_2 = 0 and, with u = 0, h_1 decides alone."""
    q = torch.tensor([[[0.5, 0.5], [0.5, 0.5]]])
    p = torch.tensor([[[0.5, 0.5], [1.0, 0.0], [0.5, 0.5]]])
    h, _ = block_acceptance(torch.tensor([[0, 1]]), q, p)
    assert h[0, 1].item() == 0.0


# --- sampled: chi-square ------------------------------------------------------------------

N_ROWS, VOCAB, K = 40_000, 12, 4


def emitted(rule, P, Q, gen):
    """N_ROWS rounds at once: each drafts K tokens from Q, verifies them with ``rule``, and
    fills the positions after the round's tokens from the target. Returns the K + 1 tokens
    (N, K + 1) and the verdict."""
    start = Q.shape[1] - 1
    prev, drafted = torch.full((N_ROWS,), start), []
    for i in range(K):
        prev = sample(Q[i, prev], gen)
        drafted.append(prev)
    drafted = torch.stack(drafted, dim=1)  # (N, K)
    q, p = distributions(P, Q, drafted)
    v = rule(drafted, q, p, gen)
    tokens, prev = [], torch.full((N_ROWS,), start)
    for t in range(K + 1):
        own = sample(P[t, prev], gen)  # the target's own draw, past the round's tokens
        tok = drafted[:, t] if t < K else own
        tok = torch.where(t < v.num_accepted, tok, torch.where(t == v.num_accepted,
                                                                v.next_token, own))
        tokens.append(tok)
        prev = tok
    return torch.stack(tokens, dim=1), v


def position_p_values(tokens, P):
    """Chi-square p-value of each position's tokens against the target's marginal there, and
    of the first two positions' pairs against their joint."""
    joint = target_joint(P)
    marginals = [joint.sum(tuple(d for d in range(K + 1) if d != t)) for t in range(K + 1)]
    out = [chi_square_p(torch.bincount(tokens[:, t], minlength=VOCAB), m)
           for t, m in enumerate(marginals)]
    pairs = tokens[:, 0] * VOCAB + tokens[:, 1]
    out.append(chi_square_p(torch.bincount(pairs, minlength=VOCAB ** 2),
                            joint.sum(tuple(range(2, K + 1))).reshape(-1)))
    return out


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7),
                                    SamplingParams(0.7, top_p=0.9)], ids=["t1", "t0.7",
                                                                          "t0.7-top-p"])
def test_block_output_matches_target_chi_square(params):
    """40,000 rounds of K = 4: every position's tokens (accepted drafts, the residual or bonus
    token, then the target's own) and the first two as pairs are distributed as the target's.
    Block keeps more than token verification on the same pair and the same draws."""
    P, Q = markov_pair(VOCAB, K, params, seed=1)
    tokens, v = emitted(block_verify, P, Q, torch.Generator().manual_seed(2))
    ps = position_p_values(tokens, P)
    print(f"block, temperature {params.temperature}, top-p {params.top_p}: p-values "
          f"{[round(x, 3) for x in ps]}")
    assert min(ps) > 0.01 / len(ps), ps  # Bonferroni over the positions
    assert 0 < v.num_accepted.float().mean() < K
    _, t = emitted(verify_sampled, P, Q, torch.Generator().manual_seed(2))
    assert v.num_accepted.float().mean() > t.num_accepted.float().mean()


def test_chi_square_catches_a_broken_block_rule():
    """Negative control: block verification drawing after a stop from the token rule's
    residual max(0, p - q) instead of max(0, w_n p - q) is caught."""
    P, Q = markov_pair(VOCAB, K, SamplingParams(1.0), seed=1)
    tokens, _ = emitted(broken_block_verify, P, Q, torch.Generator().manual_seed(2))
    ps = position_p_values(tokens, P)
    print(f"broken block: p-values {ps}")
    assert min(ps) < 1e-4, ps


# --- the batch: mixed rules, per-row generators, the engine --------------------------------

def test_a_mixed_batch_runs_each_rule_on_its_rows():
    """Rows naming block get block_verify, the others verify_sampled, greedy rows the greedy
    verdict; each row draws from its own generator, so it equals the row verified alone."""
    params = [SamplingParams(1.0, verify="block"), SamplingParams(1.0), SamplingParams(),
              SamplingParams(0.8, verify="block")]
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, K + 1, VOCAB, generator=gen) * 2  # (B, K + 1, V)
    q = row_probabilities(logits[:, :K] + torch.randn(4, K, VOCAB, generator=gen), params)
    drafted = sample(q, gen)  # (B, K)

    def gens():
        return [torch.Generator().manual_seed(10 + b) for b in range(4)]
    v = verify(drafted, q, logits, params, gens())
    p = row_probabilities(logits, params)
    for b, rule in ((0, block_verify), (1, verify_sampled), (3, block_verify)):
        alone = rule(drafted[b:b + 1], q[b:b + 1], p[b:b + 1], [gens()[b]])
        assert (v.num_accepted[b], v.next_token[b]) == (alone.num_accepted[0],
                                                        alone.next_token[0])
    g = verify_greedy(drafted[2:3], logits[2:3])
    assert (v.num_accepted[2], v.next_token[2]) == (g.num_accepted[0], g.next_token[0])


PROMPTS = [[5, 9, 22, 31, 7], [11, 12], [40, 41, 42, 43, 44, 45, 46, 47, 8, 50, 51]]


@pytest.fixture(scope="module")
def engine():
    target, _ = tiny_target_and_draft()
    return SpeculativeEngine(target, noisy_copy(target), eos_token_id=None)


def test_greedy_decoding_is_the_same_under_block(engine):
    kw = dict(k=3, max_new_tokens=12)
    assert [r.tokens for r in engine.generate(PROMPTS, verify="block", **kw)] == \
        [r.tokens for r in engine.generate(PROMPTS, **kw)]


def test_block_rows_decode_batched_as_alone_with_ragged_acceptance(engine, monkeypatch):
    """Seeded rows under block verification: each row's tokens are those it decodes alone,
    while the rows of one round keep different numbers of drafted tokens."""
    import draftkit.decode.verify as verify_module

    calls = []

    def spy(*args):
        calls.append(args[0].shape)  # draft_tokens: (b, K)
        return block_verify(*args)
    monkeypatch.setattr(verify_module, "block_verify", spy)
    params = SamplingParams(1.0, verify="block")

    def decode(prompts, seeds):
        with torch.inference_mode():
            batch = engine.open(len(prompts), resolve_k(3, has_draft=True), max_len=64)
            slots = batch.admit(prompts, params, 12, seeds)
            ragged = False
            while batch.live:
                r = batch.step()
                ragged |= any(0 < n < r.rows for n in r.accepted_per_position)
        return [batch.output(s).tokens for s in slots], ragged

    together, ragged = decode(PROMPTS, [1, 2, 3])
    assert ragged and calls and calls[0] == (3, 3)
    for prompt, seed, tokens in zip(PROMPTS, [1, 2, 3], together):
        assert decode([prompt], [seed])[0] == [tokens]
