"""Parallel EAGLE-3 heads (P-EAGLE, arXiv 2602.01469) in the engine, on tiny random Llama
targets: one forward drafts a round, the drafts are the head's own, decoding stays lossless
(greedy equality batched, alone and in slots; the output distribution at temperature 1), and
the K policy prices the head's draft per round."""

import pytest
import torch

from draftkit import metrics
from draftkit.decode.choice import resolve_k
from draftkit.decode.eagle3_runner import Eagle3Runner
from draftkit.decode.engine import SpeculativeEngine
from draftkit.decode.policy import KPolicy
from draftkit.decode.sampling import SamplingParams
from draftkit.decode.stats import DecodeStats, RoundStats
from tests.helpers import (broken_verify, decodes_alone_as_batched, drafts_are_the_heads_own,
                           eagle3_models, head_marginals, hf_greedy, parallel_greedy_drafts,
                           slots_decode_as_the_target, small_vocab_eagle3)

PROMPTS = [[5, 9, 22, 31, 7], [11, 12], [40, 41, 42, 43, 44, 45, 46, 47, 8, 50, 51]]
N_NEW = 16


@pytest.fixture(scope="module")
def models():
    return eagle3_models(parallel=3)


@pytest.fixture(scope="module")
def reference(models):
    return [hf_greedy(models[0], p, N_NEW) for p in PROMPTS]


def test_the_runners_span_equals_the_heads_causal_pass(models):
    """Eagle3Runner.forward_span: the outputs at a span of positions per row, each attending
    causally, equal one causal pass over the whole sequence, for rows at their own positions."""
    _, head, _ = models
    gen = torch.Generator().manual_seed(0)
    fused = head.fuse(torch.randn(2, 9, 3 * head.config.target_hidden_size, generator=gen))
    tokens = torch.randint(0, head.config.vocab_size, (2, 9), generator=gen)
    with torch.inference_mode():
        q, k, v = head.attention_inputs(tokens, fused, torch.arange(9).expand(2, 9))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                             enable_gqa=True)
        want = head.logits(head.after_attention(o, fused))  # (2, 9, N)
        r = Eagle3Runner(head)
        r.reset(2, 16)
        r.feed(fused[:, :3], tokens[:, :3], [0, 0])
        logits, h = r.forward_span(fused[:, 3:], tokens[:, 3:], [3, 3], [1, 3], 3)
    assert logits.shape == (2, 3, len(head.reduced_head)) and h.shape[:2] == (2, 3)
    torch.testing.assert_close(logits[0], want[0, 4:7], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits[1], want[1, 6:9], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("counts", [[3, 2], [3, 3]], ids=["unequal", "equal"])
def test_a_round_computes_fc_and_qkv_for_the_targets_features_alone(models, counts):
    """Eagle3Runner.forward_parallel takes the placeholder's q/k/v, the same at every position
    before RoPE, as computed once: fc and the q/k/v product read the target's features only,
    and the round's logits are those of feeding the placeholders as inputs (forward_span), for
    rows of unequal pending counts and of equal ones (no row padded, as at batch 1)."""
    _, head, _ = models
    gen = torch.Generator().manual_seed(1)
    aux = torch.randn(2, 7, 3 * head.config.target_hidden_size, generator=gen)
    tokens = torch.randint(0, head.config.vocab_size, (2, 7), generator=gen)
    token, place = head.placeholder()
    k = 4
    with torch.inference_mode():
        fused = head.fuse(aux)
        spans = []
        for parallel in (True, False):
            r = Eagle3Runner(head)
            r.reset(2, 24)
            r.feed(fused[:, :4], tokens[:, :4], [0, 0])
            rows_read = []
            qkv = r.w_qkv
            r.w_qkv = lambda x, qkv=qkv: rows_read.append(x.shape[:2]) or qkv(x)
            if parallel:
                spans.append(r.forward_parallel(fused[:, 4:], tokens[:, 4:], [4, 4], counts, k))
                assert rows_read == [(2, 3)]  # the pending features, no placeholder row
            else:  # each row's pending features, then K - 1 placeholders, as inputs
                h = torch.stack([torch.cat([fused[b, 4:4 + n], place.expand(k - 1 + 3 - n, -1)])
                                 for b, n in enumerate(counts)])
                t = torch.stack([torch.cat([tokens[b, 4:4 + n],
                                            torch.full((k - 1 + 3 - n,), token)])
                                 for b, n in enumerate(counts)])
                spans.append(r.forward_span(h, t, [4, 4], [n - 1 for n in counts], k)[0])
    assert spans[0].shape == (2, k, len(head.reduced_head))
    torch.testing.assert_close(spans[0], spans[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hf-cache"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_equals_the_targets_batched_and_alone_in_one_forward_a_round(models, reference,
                                                                            fast, k):
    target, _, fitted = models
    engine = SpeculativeEngine(target, fitted, eos_token_id=None, fast_path=fast)
    stats = decodes_alone_as_batched(engine, PROMPTS, reference, k, N_NEW)
    assert stats.draft_per_round and stats.draft_steps == stats.rounds  # one forward a round
    assert stats.drafted == k * stats.row_steps and stats.accepted > 0 and stats.tau() > 1.1
    if k > 1:  # the placeholders' drafts were accepted too, not only the first
        assert stats.accepted_per_position[1] > 0


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hf-cache"])
def test_each_draft_is_the_heads_own_after_plain_rounds_and_changing_k(models, fast):
    """Every drafted block equals the head's greedy drafts computed without a cache from the
    committed tokens (target features, then K - 1 placeholders, one causal pass), in a batch
    of unequal rows, after K = 0 rounds (catch-up) and with K changing per round."""
    target, random_head, fitted = models
    for head in (fitted, random_head):
        engine = SpeculativeEngine(target, head, eos_token_id=None, fast_path=fast)
        checked = drafts_are_the_heads_own(engine, PROMPTS, [0, 0, 3, 1, 0, 5, 2, 0, 4, 5, 3],
                                           parallel_greedy_drafts)
        assert len(checked) > 15 and {1, 2, 3, 4, 5} <= set(checked)


def test_slots_admit_and_release_with_a_parallel_head(models):
    target, _, fitted = models
    slots_decode_as_the_target(SpeculativeEngine(target, fitted, eos_token_id=None), PROMPTS, 5)


# --- the output distribution ----------------------------------------------------------------

@pytest.fixture(scope="module")
def small_vocab():
    return small_vocab_eagle3(parallel=True)


def test_output_distribution_equals_the_targets_at_temperature_1(small_vocab):
    """Sampled at temperature 1 with K = 3 drafted in one forward, the first three tokens'
    marginals are the target's (chi-square), many acceptances and rejections tested."""
    ps, stats = head_marginals(*small_vocab, SamplingParams(1.0), 3)
    assert stats.accepted > 1000 and stats.rejections > 1000 and stats.draft_per_round
    assert min(ps) > 0.01, ps


def test_chi_square_catches_a_broken_verify_with_a_parallel_head(small_vocab, monkeypatch):
    monkeypatch.setattr("draftkit.decode.verify.verify_sampled", broken_verify)
    ps, _ = head_marginals(*small_vocab, SamplingParams(1.0), 3)
    assert ps[1] < 0.01


# --- the K policy -----------------------------------------------------------------------------

def _round(k: int, per_round: bool, draft: float, alpha: float = 0.9) -> RoundStats:
    """A round of 100 rows: the target's call 1 s whatever it verifies, the draft ``draft`` s a
    forward, acceptance about ``alpha`` at every position."""
    reached = [100]
    for _ in range(k):
        reached.append(round(reached[-1] * alpha))
    return RoundStats(k=k, rows=100, accepted_per_position=reached[1:],
                      tested_per_position=reached[:k], beta_sum=0.0, rejections=0, bonus=0,
                      tokens=100, seconds_verify=1.0,
                      seconds_draft=draft * (min(k, 1) if per_round else k),
                      draft_per_round=per_round and k > 0)


def test_the_policy_prices_a_parallel_heads_draft_per_round_and_drafts_longer():
    """The same forward time (0.3 target steps): per drafted token for an autoregressive
    head, per round for a parallel one. The policy records it per forward, prices K by the
    forwards it takes (K or one) and so picks a longer K for the parallel head."""
    chosen, alphas = {}, [0.9] * 8
    for per_round in (False, True):
        policy = KPolicy(k_max=8, pair_timings=False)
        for k in [0, 0, 0] + [1, 2, 4, 8] * 3:
            policy.observe(_round(k, per_round, 0.3))
        assert policy.per_round == per_round
        assert policy.timings.draft[100] == pytest.approx(0.3)  # a forward's time either way
        forwards = 1 if per_round else 8
        assert policy.predicted_speedup(8, 100, alphas) == pytest.approx(
            metrics.tau(alphas, 8) / (forwards * 0.3 + 1.0), rel=1e-6)
        scores = {k: policy.predicted_speedup(k, 100, alphas) for k in range(9)}
        chosen[per_round] = max(scores, key=scores.get)
    assert chosen[True] == 8 and chosen[False] < 8, chosen


def test_decode_stats_count_a_forward_a_round_for_a_parallel_head(models):
    """c is a draft forward's time, a round's for a parallel head, and the predicted speedup
    charges one such forward a round; under K auto the policy knows it drafts so."""
    stats = DecodeStats()
    for r in (_round(0, True, 0.3), _round(4, True, 0.3), _round(4, True, 0.3)):
        stats.add_round(r)
    assert stats.draft_per_round and stats.draft_steps == 2 and stats.c() == pytest.approx(0.3)
    tau4 = metrics.tau(stats.alphas(), 4)
    assert stats.predicted_speedup() == pytest.approx((1 + 2 * tau4) / (1 + 2 * (0.3 + 1.0)))
    target, _, fitted = models
    engine = SpeculativeEngine(target, fitted, eos_token_id=None)
    choice, auto = resolve_k("auto", 6, has_draft=True), DecodeStats()
    res = engine.generate(PROMPTS, k=choice, max_new_tokens=N_NEW, stats=auto)
    assert [r.tokens for r in res] == [hf_greedy(target, p, N_NEW) for p in PROMPTS]
    assert choice.policy.per_round and auto.draft_per_round
    assert auto.draft_steps == sum(n for k, n in auto.rounds_by_k().items() if k)
