"""EAGLE-3 heads in the engine, on tiny random Llama targets: the target's features captured on
the way, the head's own cache, greedy equality, the drafts themselves, batching, slots, the
output distribution, loading and the commands."""

import json

import pytest
import torch

from draftkit.decode.choice import resolve_k
from draftkit.decode.engine import SpeculativeEngine
from draftkit.decode.eagle3_runner import Eagle3Runner
from draftkit.decode.runners import HFRunner, LlamaRunner
from draftkit.decode.sampling import SamplingParams
from draftkit.decode.stats import DecodeStats
from draftkit.errors import DraftkitError
from tests.helpers import (ScriptedK, broken_verify, decodes_alone_as_batched,
                           drafts_are_the_heads_own, eagle3_greedy_drafts, eagle3_models,
                           head_marginals, hf_greedy, make_llama, make_tokenizer, save_head,
                           slots_decode_as_the_target, small_vocab_eagle3)

PROMPTS = [[5, 9, 22, 31, 7], [11, 12], [40, 41, 42, 43, 44, 45, 46, 47, 8, 50, 51]]
N_NEW = 16


@pytest.fixture(scope="module")
def models():
    return eagle3_models()


@pytest.fixture(scope="module")
def reference(models):
    return [hf_greedy(models[0], p, N_NEW) for p in PROMPTS]


# --- the target's features, captured on the way ------------------------------------------------

@pytest.mark.parametrize("runner_cls", [LlamaRunner, HFRunner])
def test_runners_capture_the_hidden_states_entering_the_tapped_layers(models, runner_cls):
    """runner.aux is HF's output_hidden_states at the layer ids, low to high, for a padded
    prefill (every position) and for a step at per-row positions; logits are unchanged."""
    target = models[0]
    seq = torch.tensor([[5, 9, 22, 31, 7, 8, 9], [11, 12, 13, 14, 15, 16, 17]])
    with torch.inference_mode():
        out = target(seq, output_hidden_states=True)
    want = torch.cat([out.hidden_states[i] for i in (1, 2, 3)], -1)  # (2, 7, 96)
    r = runner_cls(target)
    r.capture = [1, 2, 3]
    r.reset(2, 16)
    with torch.inference_mode():
        logits = r.forward(seq[:, :5], [0, 0], last=[4, 2])  # row 1 is a 3-token prompt
        torch.testing.assert_close(r.aux[0], want[0, :5], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(r.aux[1, :3], want[1, :3], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(logits[0], out.logits[0, 4], rtol=1e-4, atol=1e-4)
        r.forward(torch.stack([seq[0, 5:7], seq[1, 3:5]]), [5, 3])
    torch.testing.assert_close(r.aux[0], want[0, 5:7], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(r.aux[1], want[1, 3:5], rtol=1e-4, atol=1e-4)
    r.capture = None
    with torch.inference_mode():
        r.forward(seq[:, 5:6], [5, 5])
    assert r.aux is None


@pytest.mark.parametrize("layouts", ["fixed", "timed"])
def test_the_heads_runner_equals_its_causal_pass_and_rolls_back(models, layouts, monkeypatch):
    """Eagle3Runner over its static cache: the output at each position equals
    Eagle3Draft.forward over the whole sequence, written in pieces at per-row positions,
    after junk was written past a row's pointer and rolled back; with the fixed matmul layouts
    and with the ones timed on this machine (which heads of real size get)."""
    from draftkit.decode import eagle3_runner

    if layouts == "timed":
        monkeypatch.setattr(eagle3_runner, "TUNE_BYTES", 0)
    _, head, _ = models
    gen = torch.Generator().manual_seed(0)
    aux = torch.randn(2, 8, 3 * head.config.target_hidden_size, generator=gen)
    tokens = torch.randint(0, head.config.vocab_size, (2, 8), generator=gen)
    with torch.inference_mode():
        want, want_h = head(aux, tokens)  # (2, 8, N), (2, 8, H)
        r = Eagle3Runner(head)
        r.reset(2, 16)
        fused = head.fuse(aux)
        torch.testing.assert_close(r.fuse(aux), fused, rtol=1e-4, atol=1e-4)
        r.feed(fused[:, :3], tokens[:, :3], [0, 0])
        r.feed(fused[:, 3:6] + 5, tokens[:, 3:6], [3, 3])  # junk, rolled back
        logits, h = r.forward(fused[:, 3:6], tokens[:, 3:6], [3, 3], last=[2, 1])
        assert logits.shape == (2, len(head.reduced_head))  # over the draft vocabulary
        torch.testing.assert_close(logits[0], want[0, 5], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(logits[1], want[1, 4], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(h[0], want_h[0, 5], rtol=1e-4, atol=1e-4)
        # row 1 only (a subset of the cache's rows), continuing from its own position
        logits, h = r.forward(fused[1:, 5:8], tokens[1:, 5:8], [5], last=[2], rows=[1])
    torch.testing.assert_close(logits[0], want[1, 7], rtol=1e-4, atol=1e-4)


# --- decoding -----------------------------------------------------------------------------------

@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hf-cache"])
@pytest.mark.parametrize("k", [0, 1, 3])
@pytest.mark.parametrize("which", ["random", "fitted"])
def test_greedy_equals_the_targets_batched_and_alone(models, reference, fast, k, which):
    target, random_head, fitted = models
    engine = SpeculativeEngine(target, fitted if which == "fitted" else random_head,
                               eos_token_id=None, fast_path=fast)
    assert engine.slotted == fast  # the head's cache takes any rows; the target's decides
    stats = decodes_alone_as_batched(engine, PROMPTS, reference, k, N_NEW)
    if which == "fitted" and k:  # accepted drafts, the bonus token and catch-up all ran
        assert stats.bonus > 0 and stats.accepted > 0 and stats.tau() > 1.1
        assert stats.seconds_catchup > 0  # the prompts' features, before the first round


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "hf-cache"])
def test_each_draft_is_the_heads_own_after_plain_rounds_and_changing_k(models, fast):
    """Every drafted block equals the head's greedy drafts computed without a cache from the
    committed tokens (target features of the committed positions, then its own outputs), in
    a batch of unequal rows, after K = 0 rounds (catch-up) and with K changing per round."""
    target, _, fitted = models
    engine = SpeculativeEngine(target, fitted, eos_token_id=None, fast_path=fast)
    checked = drafts_are_the_heads_own(engine, PROMPTS, [0, 0, 3, 1, 0, 4, 2, 0, 0, 0, 3, 4, 4,
                                                         2, 1], eagle3_greedy_drafts)
    assert len(checked) > 20 and {1, 2, 3, 4} <= set(checked)


def test_k_auto_and_stats_as_for_standalone_drafts(models, reference):
    target, _, fitted = models
    engine = SpeculativeEngine(target, fitted, eos_token_id=None)
    res = engine.generate(PROMPTS, k="auto", k_max=4, max_new_tokens=N_NEW)
    assert [r.tokens for r in res] == reference
    stats = DecodeStats()
    res = engine.generate(PROMPTS, k=3, max_new_tokens=N_NEW, stats=stats)
    assert stats.tokens == sum(len(r.tokens) for r in res)
    assert stats.drafted == sum(r.stats.drafted for r in res) == sum(stats.drafted_per_position)
    assert len(stats.alphas()) == 3 and 0 < stats.alpha() <= 1
    assert stats.alpha_tv() == pytest.approx(stats.alpha())
    assert stats.tau() > 1 and stats.c() is None  # c and v need a K = 0 run's step time
    plain = DecodeStats()
    engine.generate(PROMPTS, k=0, max_new_tokens=N_NEW, stats=plain)
    t1 = plain.target_step_seconds(1)
    assert stats.c(t1) > 0 and stats.v(3, t1) > 0
    assert all(r.stats.alpha >= 0 for r in res) and res[0].tau >= 1


def test_slots_admit_and_release_with_an_eagle3_head(models):
    """Rows join a running batch (their prompts' features wait while the others draft) and
    leave it; each greedy row produces exactly the target's own tokens."""
    target, _, fitted = models
    slots_decode_as_the_target(SpeculativeEngine(target, fitted, eos_token_id=None), PROMPTS, 3)


def test_a_rows_pending_features_are_what_the_target_read(models):
    """Bookkeeping: a row's pending features cover positions draft_length..L - 2, and a K = 0
    round adds one; a finished row keeps none."""
    target, _, fitted = models
    engine = SpeculativeEngine(target, fitted, eos_token_id=None)
    with torch.inference_mode():
        state = engine.start(PROMPTS, SamplingParams(), 6,
                             k=ScriptedK(2, (0, 0, 2, 0, 2, 2, 2, 2, 2, 2)).choice)
        for _ in range(10):
            state.step()
            for b in range(3):
                pending = sum(f.shape[0] for f in engine.draft.features[b])
                out, committed = state.output(b), len(PROMPTS[b]) + len(state.output(b).tokens)
                assert pending == (0 if out.done else
                                   committed - 1 - engine.draft.lengths[b])


# --- the output distribution ----------------------------------------------------------------

@pytest.fixture(scope="module")
def small_vocab():
    return small_vocab_eagle3()


@pytest.mark.parametrize("params,k", [(SamplingParams(1.0), 2),
                                      (SamplingParams(0.7, top_p=0.9), 1)])
def test_output_distribution_equals_the_targets(small_vocab, params, k):
    ps, stats = head_marginals(*small_vocab, params, k)
    assert stats.accepted > 1000 and stats.rejections > 1000
    assert min(ps) > 0.01, ps


def test_chi_square_catches_a_broken_verify_with_an_eagle3_head(small_vocab, monkeypatch):
    monkeypatch.setattr("draftkit.decode.verify.verify_sampled", broken_verify)
    ps, _ = head_marginals(*small_vocab, SamplingParams(1.0), 2)
    assert ps[1] < 0.01


# --- bad input --------------------------------------------------------------------------------

def test_a_head_for_another_target_is_refused(models):
    target, random_head, _ = models
    shallow = make_llama(target.config.vocab_size, num_layers=3)
    with pytest.raises(DraftkitError, match=r"entering layers \[1, 2, 3\]; the target has 3 "
                                            r"layers \(ids 1..2\); pass the target it was "
                                            r"trained on"):
        SpeculativeEngine(shallow, random_head)
    wide = make_llama(target.config.vocab_size, num_layers=4, hidden_size=48)
    with pytest.raises(DraftkitError, match="hidden states of size 32; the target's are 48"):
        SpeculativeEngine(wide, random_head)
    with pytest.raises(DraftkitError, match="vocab"):
        SpeculativeEngine(make_llama(target.config.vocab_size + 1, num_layers=4), random_head)


def test_a_target_outside_the_llama_family_is_refused_even_with_matching_shapes(models):
    """A GPT-2 of the head's vocabulary, width and depth: the shapes match, the layers a head
    reads do not; said by family, not left to a shape error inside a forward."""
    from transformers import GPT2Config, GPT2LMHeadModel

    target, random_head, _ = models
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=target.config.vocab_size, n_embd=32,
                                      n_layer=4, n_head=4)).eval()
    with pytest.raises(DraftkitError, match="Llama-family targets .* this target is 'gpt2'"):
        SpeculativeEngine(gpt2, random_head)


# --- loading and the commands -----------------------------------------------------------------

@pytest.fixture(scope="module")
def saved(models, tmp_path_factory):
    """(target folder, head folder, a 3-layer target's folder): the fitted head saved as
    vLLM and SGLang load it, beside its target (tokenizer files only there)."""
    from tests.helpers import save_model

    root = tmp_path_factory.mktemp("eagle3")
    target, _, fitted = models
    tok = make_tokenizer()
    target_dir = save_model(target, tok, root / "target")
    save_head(fitted, root / "head", target_dir)
    shallow = make_llama(target.config.vocab_size, num_layers=3)
    return (target_dir, root / "head",
            save_model(shallow, tok, root / "shallow"))


def test_load_pair_loads_a_head_on_its_target(saved, models, reference):
    from draftkit.models import load_model, load_pair
    from draftkit.models.eagle3 import Eagle3Draft

    target_dir, head_dir, shallow_dir = saved
    pair = load_pair(str(target_dir), str(head_dir), device="cpu", dtype="float32")
    assert isinstance(pair.draft, Eagle3Draft) and pair.draft_ref.path == head_dir.resolve()
    assert torch.equal(pair.draft.embed_tokens.weight, pair.target.model.embed_tokens.weight)
    assert pair.tokenizer.get_vocab() == make_tokenizer().get_vocab()  # the target's
    engine = SpeculativeEngine(pair.target, pair.draft, eos_token_id=None)
    assert [r.tokens for r in engine.generate(PROMPTS, k=2, max_new_tokens=N_NEW)] == reference
    with pytest.raises(DraftkitError, match=r"entering layers \[1, 2, 3\]; the target has 3 "
                                            r"layers"):
        load_pair(str(shallow_dir), str(head_dir), device="cpu")
    with pytest.raises(DraftkitError, match="holds an EAGLE-3 head, which loads with its "
                                            "target"):
        load_model(str(head_dir), "draft", device="cpu")


def run_cli(args, capsys):
    from draftkit.cli import main

    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_with_an_eagle3_head(saved, capsys):
    target_dir, head_dir, shallow_dir = saved
    base = ["generate", "--target", str(target_dir), "--draft", str(head_dir), "--prompt",
            "hello world", "--max-new-tokens", "8", "--json"]
    code, out, _ = run_cli(base + ["--k", "2"], capsys)
    spec = json.loads(out)
    assert code == 0 and spec["stats"]["drafted"] > 0 and spec["new_tokens"] == 8
    code, out, _ = run_cli(base[:-1] + ["--k", "0", "--json"], capsys)
    assert code == 0 and json.loads(out)["text"] == spec["text"]  # greedy: the target's own
    code, out, _ = run_cli(base + ["--k", "auto", "--temperature", "0.8"], capsys)
    assert code == 0 and json.loads(out)["new_tokens"] >= 1
    code, _, err = run_cli(["generate", "--target", str(shallow_dir), "--draft", str(head_dir),
                            "--prompt", "hello"], capsys)
    assert code == 2 and "pass the target it was trained on" in err
    assert len(err.strip().splitlines()) == 1


def test_bench_skips_hf_assisted_generation_for_an_eagle3_head(saved, tmp_path, capsys):
    target_dir, head_dir, _ = saved
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"hello world"\n"the sum of two"\n')
    args = ["bench", "--target", str(target_dir), "--draft", str(head_dir), "--prompts",
            str(prompts), "--k", "2", "--max-new-tokens", "6", "--repeats", "1"]
    code, out, _ = run_cli(args + ["--json"], capsys)
    r = json.loads(out)
    assert code == 0 and set(r["tokens_per_s"]) == {"ours_k0", "ours_spec", "hf_generate"}
    assert "cannot run an EAGLE-3 head" in r["skipped"]["hf_assisted"]
    for key in ("measured_speedup", "predicted_speedup", "alpha", "tau", "c", "v"):
        assert r[key] is not None, key
    code, out, err = run_cli(args, capsys)
    assert code == 0 and "hf_assisted  skipped: HF assisted generation cannot" in out
    assert "hf_assisted skipped" in err


def test_eval_and_regimes_measure_an_eagle3_head(saved, tmp_path):
    from draftkit.evaluate.args import EvalArgs, RegimesArgs
    from draftkit.evaluate.command import run_eval, run_regimes

    target_dir, head_dir, _ = saved
    suite = tmp_path / "suite.jsonl"
    suite.write_text('{"domain": "code", "prompt": "write python code for the sum"}\n'
                     '{"domain": "chat", "prompt": "what is the answer"}\n')
    report = run_eval(EvalArgs(target=str(target_dir), draft=str(head_dir), suite=str(suite),
                               out=str(tmp_path / "eval"), k=2, max_new_tokens=8,
                               batch_sizes=[1], k_sweep=[], repeats=1,
                               baseline_draft=str(head_dir)))
    fig = report.overall
    assert fig.k == 2 and len(fig.alpha_per_position) == 2 and fig.tau >= 1
    assert 0 <= fig.alpha_after <= 1 and fig.alpha_before == fig.alpha_after  # teacher-forced
    assert fig.c is not None and fig.v is not None
    regimes = run_regimes(RegimesArgs(
        target=str(target_dir), draft=str(head_dir), suite=str(suite),
        out=str(tmp_path / "regimes"), k=2, max_new_tokens=6, layer_sizes=[1],
        temperatures=[0.0], batch_sizes=[], prompts_per_domain=1,
        drafts_by_domain=[f"code={head_dir}"]))
    assert regimes.draft == "head" and any(d.home == "code" for d in regimes.drafts)
    entropy = regimes.entropy  # the head's own figures, as eval reports them
    assert entropy.draft == "head" and entropy.c is not None and entropy.v is not None
    for point in entropy.domains.values():
        assert point.k == 2 and len(point.alpha_per_position) == 2 and point.tau >= 1
        assert point.c is not None and point.c > 0 and point.v is not None


def test_the_general_runner_admits_cohorts_with_an_eagle3_head(models):
    """On the general runner, rows join only an empty batch (a cohort): the head's cache,
    sized to the cohort, is reset with the target's."""
    target, _, fitted = models
    engine = SpeculativeEngine(target, fitted, eos_token_id=None, fast_path=False)
    assert not engine.slotted
    a, b, c = PROMPTS
    with torch.inference_mode():
        state = engine.open(3, resolve_k(2, has_draft=True), max_len=96)
        slots = state.admit([a, b], SamplingParams(), 10)
        while state.live:
            state.step()
        first = [state.output(s).tokens for s in slots]
        for s in slots:
            state.release(s)
        (sc,) = state.admit([c], SamplingParams(), 12)  # a new cohort
        while state.live:
            state.step()
    assert first == [hf_greedy(target, a, 10), hf_greedy(target, b, 10)]
    assert state.output(sc).tokens == hf_greedy(target, c, 12)
