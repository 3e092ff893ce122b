"""EAGLE-3 heads of more than one layer (a fused first layer, plain Llama layers on it, as
P-EAGLE's drafters are) in the engine, autoregressive and parallel, on tiny random Llama
targets: the runner's cache of every layer equals the head's causal pass, the drafts are the
head's own, and decoding stays lossless (greedy equality batched and alone, the output
distribution at temperature 1)."""

import pytest
import torch

from draftkit.decode.eagle3_runner import Eagle3Runner
from draftkit.decode.engine import SpeculativeEngine
from draftkit.decode.sampling import SamplingParams
from tests.helpers import (decodes_alone_as_batched, drafts_are_the_heads_own,
                           eagle3_greedy_drafts, eagle3_models, head_marginals, hf_greedy,
                           parallel_greedy_drafts, small_vocab_eagle3)

PROMPTS = [[5, 9, 22, 31, 7], [11, 12], [40, 41, 42, 43, 44, 45, 46, 47, 8, 50, 51]]
N_NEW = 16
DEPTH = 2


@pytest.fixture(scope="module", params=["autoregressive", "parallel"])
def models(request):
    return eagle3_models(parallel=3 if request.param == "parallel" else 0, num_layers=DEPTH)


@pytest.fixture(scope="module")
def reference(models):
    return [hf_greedy(models[0], p, N_NEW) for p in PROMPTS]


def test_a_deeper_head_has_its_layers_and_the_runner_caches_each(models):
    """Fed in two pieces (a feed, then outputs at a span per row), the runner's outputs equal
    the head's causal pass through every layer; a one-layer head would differ (the second
    layer is not skipped)."""
    _, head, _ = models
    assert len(head.deeper) == DEPTH - 1 and head.config.num_hidden_layers == DEPTH
    gen = torch.Generator().manual_seed(0)
    fused = head.fuse(torch.randn(2, 9, 3 * head.config.target_hidden_size, generator=gen))
    tokens = torch.randint(0, head.config.vocab_size, (2, 9), generator=gen)
    with torch.inference_mode():
        h_all = head.causal(tokens, fused, torch.arange(9).expand(2, 9))
        want = head.logits(h_all)  # (2, 9, N)
        first_only = head.logits(head.after_attention(torch.nn.functional.scaled_dot_product_attention(
            *head.attention_inputs(tokens, fused, torch.arange(9).expand(2, 9)), is_causal=True,
            enable_gqa=True), fused))
        r = Eagle3Runner(head)
        r.reset(2, 16)
        r.feed(fused[:, :3], tokens[:, :3], [0, 0])
        logits, h = r.forward_span(fused[:, 3:], tokens[:, 3:], [3, 3], [1, 3], 3)
    torch.testing.assert_close(logits[0], want[0, 4:7], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits[1], want[1, 6:9], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(h[1], h_all[1, 6:9], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(first_only[1, 6:9], want[1, 6:9], atol=1e-3)


def test_greedy_equals_the_targets_batched_and_alone(models, reference):
    target, _, fitted = models
    for k in (1, 3):
        stats = decodes_alone_as_batched(SpeculativeEngine(target, fitted, eos_token_id=None),
                                         PROMPTS, reference, k, N_NEW)
        assert stats.accepted > 0 and stats.tau() > 1.1
        assert stats.draft_per_round == fitted.parallel


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hf-cache"])
def test_each_draft_is_the_heads_own_after_plain_rounds_and_changing_k(models, fast):
    """Every drafted block equals the head's greedy drafts computed without a cache (one causal
    pass through every layer per token, or over the placeholders), in a batch of unequal rows,
    after K = 0 rounds and with K changing per round."""
    target, random_head, fitted = models
    drafts = parallel_greedy_drafts if fitted.parallel else eagle3_greedy_drafts
    for head in (fitted, random_head):
        engine = SpeculativeEngine(target, head, eos_token_id=None, fast_path=fast)
        checked = drafts_are_the_heads_own(engine, PROMPTS, [0, 0, 3, 1, 0, 5, 2, 0, 4, 5, 3],
                                           drafts)
        assert len(checked) > 15 and {1, 2, 3, 4, 5} <= set(checked)


def test_output_distribution_equals_the_targets_at_temperature_1():
    """Sampled at temperature 1 with K = 3 from a deeper parallel head, the first three tokens'
    marginals are the target's (chi-square), many acceptances and rejections tested. (How a
    head computes q does not enter verification; the drafts tests above check the head.)"""
    ps, stats = head_marginals(*small_vocab_eagle3(parallel=True, num_layers=DEPTH),
                               SamplingParams(1.0), 3)
    assert stats.accepted > 1000 and stats.rejections > 1000
    assert min(ps) > 0.01, ps
