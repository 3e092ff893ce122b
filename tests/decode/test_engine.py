"""The engine on tiny random models: greedy equality, batching, rollback, sampling."""

import pytest
import torch

from draftkit.decode.batch import Batch
from draftkit.decode.choice import resolve_k
from draftkit.decode.cache import StaticKVCache, WriteIndex
from draftkit.decode.engine import SpeculativeEngine
from draftkit.decode.runners import HFRunner, LlamaRunner
from draftkit.decode.sampling import SamplingParams
from draftkit.decode.stats import DecodeStats
from draftkit.errors import DraftkitError
from tests.helpers import (ScriptedK, broken_verify, chi_square_p, decodes_alone_as_batched,
                           exact_marginals, hf_greedy, make_mistral, noisy_copy,
                           tiny_target_and_draft)

PROMPTS = [[5, 9, 22, 31, 7], [11, 12], [40, 41, 42, 43, 44, 45, 46, 47, 8, 50, 51]]
N_NEW = 16


@pytest.fixture(scope="module")
def models():
    target, draft = tiny_target_and_draft()
    return target, draft, noisy_copy(target)


@pytest.fixture(scope="module")
def reference(models):
    return [hf_greedy(models[0], p, N_NEW) for p in PROMPTS]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hf-cache"])
@pytest.mark.parametrize("k", [0, 1, 3])
@pytest.mark.parametrize("which", ["unrelated", "close"])
def test_greedy_equals_hf_generate_batched_and_alone(models, reference, fast, k, which):
    target, far, close = models
    engine = SpeculativeEngine(target, close if which == "close" else far, eos_token_id=None,
                               fast_path=fast)
    stats = decodes_alone_as_batched(engine, PROMPTS, reference, k, N_NEW)
    if which == "close" and k:  # the bonus token and the draft's catch-up were exercised
        assert stats.bonus > 0 and stats.accepted > 0
        assert stats.tau() > 1.3


def test_rows_finish_at_different_times(models):
    target, _, close = models
    engine = SpeculativeEngine(target, close, eos_token_id=None)
    ref = hf_greedy(target, PROMPTS[0], 12)
    eos = ref[5]  # this row stops at its first occurrence of that token
    engine_eos = SpeculativeEngine(target, close, eos_token_id=eos)
    res = engine_eos.generate(PROMPTS, k=3, max_new_tokens=12)
    assert res[0].tokens == ref[:ref.index(eos) + 1] and res[0].finish_reason == "eos"
    for p, r in zip(PROMPTS, res):
        alone = engine_eos.generate([p], k=3, max_new_tokens=12)[0]
        assert r.tokens == alone.tokens and r.finish_reason == alone.finish_reason
    budgets = engine.generate(PROMPTS, k=3, max_new_tokens=7)
    assert all(len(r.tokens) == 7 and r.finish_reason == "length" for r in budgets)


def test_sampling_is_seeded(models):
    target, draft, _ = models
    engine = SpeculativeEngine(target, draft, eos_token_id=None)
    kw = dict(k=2, max_new_tokens=10, temperature=0.9, top_p=0.95, seed=5)
    a = [r.tokens for r in engine.generate(PROMPTS, **kw)]
    b = [r.tokens for r in engine.generate(PROMPTS, **kw)]
    c = [r.tokens for r in engine.generate(PROMPTS, **{**kw, "seed": 6})]
    assert a == b and a != c


def test_stats_are_consistent(models):
    target, _, close = models
    engine = SpeculativeEngine(target, close, eos_token_id=None)
    stats = DecodeStats()
    res = engine.generate(PROMPTS, k=3, max_new_tokens=N_NEW, stats=stats)
    assert stats.tokens == sum(len(r.tokens) for r in res)
    assert stats.accepted == sum(r.stats.accepted for r in res)
    assert stats.drafted == sum(r.stats.drafted for r in res) == sum(stats.drafted_per_position)
    assert all(t <= d for t, d in zip(stats.tested_per_position, stats.drafted_per_position))
    assert stats.tested_per_position[0] == stats.drafted_per_position[0]
    assert 0 < stats.alpha() <= 1 and len(stats.alphas()) == 3
    # greedy: 1 - TV of one-hot distributions is the match indicator, so both estimates agree
    assert stats.alpha_tv() == pytest.approx(stats.alpha())
    assert stats.seconds_draft > 0 and stats.seconds_verify > 0


def test_k_auto_runs_and_matches_greedy(models, reference):
    target, _, close = models
    engine = SpeculativeEngine(target, close, eos_token_id=None)
    res = engine.generate(PROMPTS, k="auto", k_max=4, max_new_tokens=N_NEW)
    assert [r.tokens for r in res] == reference


# --- cache rollback invariants ---------------------------------------------------------------

def test_static_cache_rollback_moves_pointer_only():
    cache = StaticKVCache(2, 2, 1, 8, 4, torch.float32, "cpu")
    ptr = cache.k.data_ptr()
    k = torch.randn(2, 1, 3, 4)
    cache.write(0, k, k, WriteIndex(torch.tensor([0, 2]), 3, None))
    assert torch.equal(cache.k[0, 0, :, 0:3], k[0]) and torch.equal(cache.k[0, 1, :, 2:5], k[1])
    before = cache.k.clone()
    cache.rollback(torch.tensor([1, 4]))
    assert cache.lengths.tolist() == [1, 4]
    assert cache.k.data_ptr() == ptr and torch.equal(cache.k, before)  # nothing copied or wiped


@pytest.mark.parametrize("runner_cls", [LlamaRunner, HFRunner])
def test_runner_rollback_then_rewrite_equals_fresh(models, runner_cls):
    """Write junk past a row's pointer, roll back by continuing from an earlier position per
    row, and the logits equal a fresh forward of the true sequence."""
    target = models[0]
    seq = torch.tensor([[5, 9, 22, 31, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18]])
    fresh = target(seq).logits
    r = runner_cls(target)
    r.reset(2, 16)
    with torch.inference_mode():
        r.forward(seq[:, :4], [0, 0])
        r.forward(torch.tensor([[60, 61, 62], [63, 64, 65]]), [4, 4])  # junk, rejected
        out0 = r.forward(torch.stack([seq[0, 4:7], seq[1, 4:7]]), [4, 4])
    torch.testing.assert_close(out0, fresh[:, 4:7], rtol=1e-4, atol=1e-4)
    with torch.inference_mode():  # per-row pointers: row 0 back to 5, row 1 stays at 7
        out1 = r.forward(torch.stack([seq[0, 5:6], seq[1, 7:8]]), [5, 7])
    torch.testing.assert_close(out1[0, 0], fresh[0, 5], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out1[1, 0], fresh[1, 7], rtol=1e-4, atol=1e-4)


# --- the output distribution ----------------------------------------------------------------

VOCAB = 10
N_ROWS = 20_000


@pytest.fixture(scope="module")
def small_vocab():
    target, draft = tiny_target_and_draft(vocab_size=VOCAB, target_layers=2, seed=3)
    with torch.no_grad():  # flatter distributions: many tokens carry probability
        for m in (target, draft):
            m.lm_head.weight.mul_(0.3) if not m.config.tie_word_embeddings else \
                m.model.norm.weight.mul_(0.3)
    return target, draft


def _spec_marginals(target, draft, params, k, seed, verify=None, monkeypatch=None):
    engine = SpeculativeEngine(target, draft, eos_token_id=None)
    if verify is not None:
        monkeypatch.setattr("draftkit.decode.verify.verify_sampled", verify)
    prompt = [1, 4, 7]
    stats = DecodeStats()
    res = engine.generate([prompt] * N_ROWS, k=k, max_new_tokens=3, temperature=params.temperature,
                          top_k=params.top_k, top_p=params.top_p, seed=seed, stats=stats,
                          draft_sample_method=params.draft_sample_method)
    toks = torch.tensor([r.tokens for r in res])  # (N, 3)
    exact = exact_marginals(target, prompt, params, steps=3)
    return [chi_square_p(torch.bincount(toks[:, i], minlength=VOCAB), exact[i])
            for i in range(3)], stats


@pytest.mark.parametrize("params,k", [(SamplingParams(1.0), 2),
                                      (SamplingParams(0.7, top_p=0.9), 1),
                                      (SamplingParams(1.5, top_k=6), 2),
                                      (SamplingParams(1.0, draft_sample_method="greedy"), 2)])
def test_output_distribution_equals_target(small_vocab, params, k):
    """20,000 rows in one batch; tokens 2 and 3 come from verified rounds (accepted drafts,
    residual samples and bonus tokens)."""
    ps, stats = _spec_marginals(*small_vocab, params, k, seed=11)
    assert stats.accepted > 1000 and stats.rejections > 1000
    # K = 1 keeps its bonus token as token 3; at K = 2 it would be a 4th, past the budget
    assert stats.bonus > 1000 if k == 1 else stats.bonus == 0
    assert min(ps) > 0.01, ps


def test_a_greedy_draft_proposes_its_argmax_and_is_kept_with_p_of_it(small_vocab):
    """vLLM's default draft_sample_method: each round's first draft is the draft's argmax
    after the prompt's first token, kept with probability p(d) (beta records it)."""
    target, draft = small_vocab
    engine = SpeculativeEngine(target, draft, eos_token_id=None)
    prompt = [1, 4, 7]
    (first,) = engine.generate([prompt], k=0, max_new_tokens=1)  # the target's greedy first
    ctx = torch.tensor([prompt + first.tokens])
    with torch.no_grad():
        d = int(draft(ctx).logits[0, -1].argmax())
        p = torch.softmax(target(ctx).logits[0, -1].float(), -1)
    stats = DecodeStats()
    res = engine.generate([prompt] * 4000, k=1, max_new_tokens=2, temperature=1.0, seed=5,
                          stats=stats, draft_sample_method="greedy")
    rows = [r for r in res if r.tokens[0] == first.tokens[0]]
    kept = sum(r.stats.accepted for r in rows) / len(rows)
    assert len(rows) > 100 and abs(kept - float(p[d])) < 4 * (float(p[d]) / len(rows)) ** 0.5


def test_chi_square_catches_broken_engine(small_vocab, monkeypatch):

    ps, _ = _spec_marginals(*small_vocab, SamplingParams(1.0), 2, seed=11,
                            verify=broken_verify, monkeypatch=monkeypatch)
    assert ps[1] < 0.01  # token 2 is the first verified token


# --- bad input ------------------------------------------------------------------------------

def test_bad_input_is_a_draftkit_error(models):
    from tests.helpers import make_llama

    target, draft, _ = models
    engine = SpeculativeEngine(target, draft)
    with pytest.raises(DraftkitError, match="vocab"):
        SpeculativeEngine(target, make_llama(target.config.vocab_size + 1, num_layers=1))
    with pytest.raises(DraftkitError, match="K"):
        engine.generate([[1, 2]], k=-1)
    with pytest.raises(DraftkitError, match="temperature"):
        engine.generate([[1, 2]], k=1, temperature=-1.0)
    with pytest.raises(DraftkitError, match="top-p"):
        engine.generate([[1, 2]], k=1, temperature=1.0, top_p=1.5)
    with pytest.raises(DraftkitError, match="empty"):
        engine.generate([[]], k=1)
    with pytest.raises(DraftkitError, match="context window"):
        engine.generate([[5] * 300], k=1)


def test_step_api_draft_catches_up_after_plain_rounds(models, reference):
    """Drive the engine round by round (as a server would): plain rounds first, then
    speculative ones; the draft must be fed every token decoded meanwhile, so a draft that
    agrees with the target keeps accepting, and the output stays the greedy one."""
    target, _, close = models
    engine = SpeculativeEngine(target, close, eos_token_id=None)
    with torch.inference_mode():
        script = ScriptedK(3, 0)
        state = engine.start(PROMPTS, SamplingParams(), N_NEW, k=script.choice)
        for _ in range(5):
            state.step()
        script.play(3)
        rounds = []
        while not state.finished:
            rounds.append(state.step())
    assert [r.tokens for r in state.results()] == reference
    first = rounds[0]
    assert first.k == 3 and sum(first.accepted_per_position) >= 2 * first.rows


# --- a reduced draft vocabulary (FR-Spec) -----------------------------------------------------

def _with_vocab(draft, ids):
    import copy

    from draftkit.models.reduced_head import ReducedHead, attach

    d = copy.deepcopy(draft)
    attach(d, ReducedHead(ids, d.config.vocab_size))
    return d


def test_reduced_draft_vocab_keeps_the_target_distribution(small_vocab):
    """The draft proposes only half the vocabulary; the output is still the target's."""
    target, draft = small_vocab
    sub = _with_vocab(draft, list(range(0, VOCAB, 2)))
    ps, stats = _spec_marginals(target, sub, SamplingParams(1.0), 2, seed=7)
    assert stats.accepted > 500 and stats.rejections > 500
    assert min(ps) > 0.01, ps


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hf-cache"])
def test_reduced_draft_vocab_proposes_only_its_tokens(models, reference, fast, monkeypatch):
    target, _, close = models
    ids = sorted(set(t for ref in reference for t in ref[::2]))  # half the tokens it will need
    sub = _with_vocab(close, ids)
    engine = SpeculativeEngine(target, sub, eos_token_id=None, fast_path=fast)
    drafted = []
    real_draft = Batch._draft

    def spy(*a, **k):
        out = real_draft(*a, **k)
        drafted.extend(out[0].flatten().tolist())
        return out
    monkeypatch.setattr(Batch, "_draft", spy)
    res = engine.generate(PROMPTS, k=3, max_new_tokens=N_NEW)
    assert [r.tokens for r in res] == reference  # lossless under greedy too
    assert drafted and set(drafted) <= set(ids)


@pytest.mark.parametrize("params", [SamplingParams(0.0), SamplingParams(1.0),
                                    SamplingParams(0.8, top_k=7, top_p=0.9)],
                         ids=["greedy", "t1", "top-k-p"])
def test_drafts_sampled_among_the_heads_tokens_are_those_of_the_whole_vocabulary(
        models, params, monkeypatch):
    """The engine samples a reduced head's drafts among its N tokens and maps them to the
    target's ids: seeded alike, the same drafts, q and output as sampling over V with -inf
    outside the head (the draws agree where the head's ids are sorted, as draftkit's are)."""
    from draftkit.decode.drafters import _Drafter

    target, _, close = models
    sub = _with_vocab(close, list(range(3, close.config.vocab_size, 3)))
    runs, real = [], Batch._draft
    for whole in (False, True):
        engine = SpeculativeEngine(target, sub, eos_token_id=None)
        d = engine.draft
        if whole:  # the drafter hands out logits over V, -inf outside the head
            head = d.vocab
            monkeypatch.setattr(_Drafter, "vocab", None)
            first, nxt = d.first_logits, d.next_logits
            monkeypatch.setattr(d, "first_logits", lambda *a: head.expand(first(*a)))
            monkeypatch.setattr(d, "next_logits", lambda *a: head.expand(nxt(*a)))
        drafts = []

        def spy(*a, drafts=drafts):
            out = real(*a)
            drafts.append(out)
            return out
        monkeypatch.setattr(Batch, "_draft", spy)
        res = engine.generate(PROMPTS, k=3, max_new_tokens=N_NEW, temperature=params.temperature,
                              top_k=params.top_k, top_p=params.top_p, seed=5)
        runs.append(([r.tokens for r in res], drafts))
    (out, drafts), (out_v, drafts_v) = runs
    assert out == out_v and len(drafts) == len(drafts_v) > 3
    for (t, q), (t_v, q_v) in zip(drafts, drafts_v):
        assert torch.equal(t, t_v)
        assert (q is None) == params.greedy == (q_v is None)
        if q is not None:
            assert q.shape == q_v.shape and q.shape[-1] == close.config.vocab_size
            torch.testing.assert_close(q, q_v)


@pytest.mark.parametrize("k", [0, 3])
def test_a_sliding_window_caps_the_context_so_decoding_stays_exact(k):
    """Mistral-style windowed attention: the decoder runs sequences that fit the window, where
    every layer sees everything, and says so for a prompt that does not fit."""
    target, draft = make_mistral(2, 0, 16), make_mistral(1, 1, 16)
    engine = SpeculativeEngine(target, draft, eos_token_id=None)
    assert engine.context == 16
    prompts = [[5, 9, 22, 31, 7], [11, 12, 13]]
    for p, r in zip(prompts, engine.generate(prompts, k=k, max_new_tokens=30)):
        assert len(r.tokens) == 16 - len(p) - (k + 2) and r.finish_reason == "length"
        assert r.tokens == hf_greedy(target, p, 30)[:len(r.tokens)]
    with pytest.raises(DraftkitError, match="the context window is 16"):
        engine.generate([list(range(5, 20))], k=k, max_new_tokens=4)


@pytest.mark.parametrize("k", [0, 2])
def test_a_sliding_window_batch_of_unequal_prompts_stays_exact(k):
    """transformers counts the window in cache columns; a batched general cache holds padding
    and rolled-back holes besides a row's tokens, so a short row lost its early context at
    K = 0 and cropping raised at K = 2. Such a pair decodes one row at a time, exactly."""
    target, draft = make_mistral(2, 0, 32), make_mistral(1, 1, 32)
    engine = SpeculativeEngine(target, draft, eos_token_id=None)
    assert engine.one_row_cohorts
    prompts = [[5, 9], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]]
    results = engine.generate(prompts, k=k, max_new_tokens=100)
    for p, r in zip(prompts, results):
        assert len(r.tokens) == 32 - len(p) - (k + 2)
        assert r.tokens == hf_greedy(target, p, 100)[:len(r.tokens)]
    batch = engine.open(2, resolve_k(k, has_draft=True))
    with pytest.raises(DraftkitError, match="one row at a time"):
        batch.admit(prompts, SamplingParams(), 8)
    with pytest.raises(DraftkitError, match="prompt 1 has 40 tokens"):  # before any decodes
        engine.generate([[5, 9], list(range(40))], k=k, max_new_tokens=4)


@pytest.mark.parametrize("fast", [True, False])
def test_the_step_api_builds_no_graph_outside_inference_mode(fast):
    """decode/__init__.py shows start() and step() bare; under autograd every round's cache
    would hang on the last one's graph."""
    from tests.helpers import make_llama

    target = make_llama(100, num_layers=2)
    engine = SpeculativeEngine(target, noisy_copy(target), eos_token_id=None, fast_path=fast)
    state = engine.start([[5, 9, 22], [11, 12]], SamplingParams(), 8,
                         k=resolve_k(2, has_draft=True))
    while not state.finished:
        state.step()
    caches = [r.cache for r in (engine.target, engine.draft)]
    tensors = [t for c in caches for t in ([c.k, c.v] if fast else [
        x for layer in c.layers for x in (layer.keys, layer.values)])]
    assert tensors and not any(t.requires_grad for t in tensors)
