"""Static-shape decoding (decode/graphs.py) on CPU: buckets, padding, the static forward against
the eager one, the automatic fallback and what the figures report; the causal verify.

Capture itself needs CUDA: the one test of it is skipped without a GPU (the device script,
eval/benchmarks/gpu_check.sh, runs it there). Everything else runs the static forward eagerly
(``DecodeGraphs(capture=False, static=True)``), which is what a graph records."""

import pytest
import torch

from draftkit.decode import graphs, runners
from draftkit.labs.bench import format_report, run_bench
from draftkit.decode.engine import SpeculativeEngine
from draftkit.decode.graphs import DecodeGraphs, bucket, buckets, key_bucket, pad
from draftkit.decode.runners import LlamaRunner
from draftkit.decode.sampling import SamplingParams
from draftkit.decode.stats import DecodeStats
from tests.helpers import (chi_square_p, decodes_alone_as_batched, exact_marginals, hf_greedy,
                           noisy_copy, tiny_target_and_draft)

PROMPTS = [[5, 9, 22, 31, 7], [11, 12], [40, 41, 42, 43, 44, 45, 46, 47, 8, 50, 51]]
CPU_REASON = "the model is on cpu: CUDA graphs need a CUDA device"


@pytest.fixture(scope="module")
def models():
    target, draft = tiny_target_and_draft()
    return target, noisy_copy(target)


def static(runner) -> None:
    """Run ``runner``'s decoding shapes through its static forward (eagerly: no GPU)."""
    runner.graphs = DecodeGraphs(runner, capture=False, static=True)


def test_buckets_are_powers_of_two_then_the_whole_cache():
    assert buckets(1) == [1] and buckets(6) == [1, 2, 4, 6] and buckets(8) == [1, 2, 4, 8]
    assert [bucket(n, 6) for n in (1, 2, 3, 4, 5, 6)] == [1, 2, 4, 4, 6, 6]


def test_key_buckets_double_from_the_minimum_up_to_the_cache():
    assert [key_bucket(n, 4097) for n in (1, 256, 257, 3000, 4097)] == [256, 256, 512, 4096,
                                                                       4097]
    assert key_bucket(40, 33) == 33


def test_pad_places_rows_at_their_cache_rows():
    tokens = torch.tensor([[7, 8], [9, 10]])
    padded, starts, take = pad(tokens, [3, 5], [0, 2], 4, pad_position=99)
    assert padded.tolist() == [[7, 8], [0, 0], [9, 10], [0, 0]]
    assert starts.tolist() == [3, 99, 5, 99] and take.tolist() == [0, 2]


def test_a_padded_static_forward_equals_the_eager_one_and_leaves_padding_rows_alone(models):
    """Rows 0, 2, 3 of a 5-row cache at different positions: bucket 4, row 1 is padding."""
    target = models[0]
    eager, padded = LlamaRunner(target), LlamaRunner(target)
    static(padded)
    seq = torch.randint(4, 100, (5, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for r in (eager, padded):
            r.reset(5, 600)  # longer than the key bucket the static forward attends over
            r.forward(seq[:, :8], [0] * 5)  # prefill stays eager (8 > K_MAX + 1 tokens)
        row1_k = padded.cache.k[:, 1].clone()
        for t, start in ((1, [8, 6, 7]), (4, [8, 6, 7]), (3, [5, 5, 5])):
            x = torch.stack([seq[b, s:s + t] for b, s in zip([0, 2, 3], start)])
            want = eager.forward(x, start, rows=[0, 2, 3])
            got = padded.forward(x, start, rows=[0, 2, 3])
            assert padded.last_path == "eager" and padded.last_reason == "capture turned off"
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # bucket 4, 3 tokens a row, keys [0, 256) of the 601 (600 and the scratch position)
    assert (4, 3, False, None, 256) in padded.graphs.forwards
    # the padding row wrote only the scratch position, and kept its pointer
    pad_pos = padded.cache.pad_position
    assert torch.equal(padded.cache.k[:, 1, :, :pad_pos], row1_k[:, :, :pad_pos])
    assert padded.cache.lengths.tolist() == eager.cache.lengths.tolist()


@pytest.mark.parametrize("k", [0, 1, 3])
def test_static_decoding_is_greedy_equal_to_the_target_batched_and_alone(models, k):
    """Rows finish at different lengths and some finish early (EOS), so later rounds pad a
    batch of live rows that is not a prefix of the cache."""
    target, close = models
    reference = [hf_greedy(target, p, 16) for p in PROMPTS]
    engine = SpeculativeEngine(target, close, eos_token_id=None)
    static(engine.target)
    static(engine.draft.runner)
    stats = decodes_alone_as_batched(engine, PROMPTS, reference, k, 16)
    assert engine.target.graphs.forwards  # the decoding rounds did take the static forward
    if k:
        assert stats.accepted > 0 and engine.draft.runner.graphs.forwards
    eos = reference[1][3]
    engine_eos = SpeculativeEngine(target, close, eos_token_id=eos)
    static(engine_eos.target)
    plain_eos = SpeculativeEngine(target, close, eos_token_id=eos)
    assert ([r.tokens for r in engine_eos.generate(PROMPTS, k=k, max_new_tokens=16)]
            == [r.tokens for r in plain_eos.generate(PROMPTS, k=k, max_new_tokens=16)])


def test_static_decoding_keeps_the_target_distribution():
    """The chi-square test of test_engine.py, every decoding forward static: 20,000 rows."""
    target, draft = tiny_target_and_draft(vocab_size=10, target_layers=2, seed=3)
    with torch.no_grad():
        for m in (target, draft):
            m.model.norm.weight.mul_(0.3)
    engine = SpeculativeEngine(target, draft, eos_token_id=None)
    static(engine.target)
    static(engine.draft.runner)
    params, prompt = SamplingParams(1.0), [1, 4, 7]
    res = engine.generate([prompt] * 20_000, k=2, max_new_tokens=3, temperature=1.0, seed=11)
    toks = torch.tensor([r.tokens for r in res])  # (N, 3)
    exact = exact_marginals(target, prompt, params, steps=3)
    ps = [chi_square_p(torch.bincount(toks[:, i], minlength=10), exact[i]) for i in range(3)]
    assert min(ps) > 0.01, ps
    assert engine.target.graphs.forwards


def test_on_cpu_the_path_is_eager_and_the_figures_say_why(models, tmp_path):
    target, close = models
    engine = SpeculativeEngine(target, close, eos_token_id=None)
    assert engine.target.graphs.reason == CPU_REASON and not engine.target.graphs.static
    stats = DecodeStats()
    engine.generate(PROMPTS, k=2, max_new_tokens=8, stats=stats)
    path = stats.path()
    assert path["target"] == "eager" and path["draft"] == "eager"
    assert path["eager_reasons"] == [f"target: {CPU_REASON}", f"draft: {CPU_REASON}"]
    assert stats.path_text().startswith("target eager, draft eager (target: the model is on cpu")
    assert engine.target.graphs.forwards == {}  # nothing static ran
    r = run_bench(target, close, PROMPTS[:1], k=2, max_new_tokens=6, repeats=1,
                  methods=("ours_k0", "ours_spec"))
    assert r["decode_path"]["ours_spec"]["target"] == "eager"
    assert "decode path" in format_report(r)


def test_graphs_turned_off_by_the_environment(models, monkeypatch):
    monkeypatch.setenv(graphs.ENV, "0")
    runner = LlamaRunner(models[0])
    assert runner.graphs.reason == f"turned off ({graphs.ENV}=0)" and not runner.graphs.static


def test_uniform_verify_is_plain_causal_attention_equal_to_the_masked_path(models, monkeypatch):
    """A (K + 1)-token block at one shared start uses bottom-right causal attention (no mask
    built); its logits equal the masked static forward's and a full forward's."""
    target = models[0]
    used = []
    real = runners._causal
    monkeypatch.setattr(runners, "_causal", lambda q, k: used.append((q, k)) or real(q, k))
    causal, masked = LlamaRunner(target), LlamaRunner(target)
    static(masked)
    seq = torch.randint(4, 100, (2, 10), generator=torch.Generator().manual_seed(1))
    full = target(seq).logits
    with torch.inference_mode():
        for r in (causal, masked):
            r.reset(2, 16)
            r.forward(seq[:, :6], [0, 0])
        a = causal.forward(seq[:, 6:10], [6, 6])  # T = 4 at start 6: keys 0..9
        b = masked.forward(seq[:, 6:10], [6, 6])
    assert (4, 10) in used  # the causal path ran
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a, full[:, 6:10], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graphs_replay_the_eager_tokens():  # pragma: no cover - runs on a GPU only
    target, _ = tiny_target_and_draft()
    target = target.cuda()
    close = noisy_copy(target)
    engine = SpeculativeEngine(target, close, eos_token_id=None)
    eager = SpeculativeEngine(target, close, eos_token_id=None)
    for r in (eager.target, eager.draft.runner):
        r.graphs = DecodeGraphs(r, capture=False)
    for k in (0, 1, 3):
        stats = DecodeStats()
        for _ in range(2):  # the first call of each shape is eager; the second captures
            got = [r.tokens for r in engine.generate(PROMPTS, k=k, max_new_tokens=16,
                                                     stats=stats)]
        assert got == [r.tokens for r in eager.generate(PROMPTS, k=k, max_new_tokens=16)]
        assert stats.rounds_by_path.get("target cuda-graph", 0) > 0


def test_a_kernel_that_refuses_the_causal_bias_falls_back_to_the_mask(models, monkeypatch):
    import torch.nn.functional as F
    from torch.nn.attention.bias import CausalBias

    target = models[0]
    seq = torch.randint(4, 100, (2, 10), generator=torch.Generator().manual_seed(4))
    want = target(seq).logits[:, 6:10]
    real = F.scaled_dot_product_attention

    def refuse(*args, attn_mask=None, **kw):
        if isinstance(attn_mask, CausalBias):
            raise RuntimeError("no kernel for this causal bias")
        return real(*args, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", refuse)
    runner = LlamaRunner(target)
    with torch.inference_mode():
        runner.reset(2, 16)
        runner.forward(seq[:, :6], [0, 0])
        got = runner.forward(seq[:, 6:10], [6, 6])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
