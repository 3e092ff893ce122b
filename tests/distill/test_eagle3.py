"""EAGLE-3 heads in distillation: training-time test's mask and loss against a decoder run one
branch at a time, training end to end on the tiny pair, exact resume, the feature cache."""

import contextlib
import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from draftkit.distill.teacher import TeacherOut
from draftkit.distill.ttt import (block_causal, shift, step_masks, teacher_rows, ttt_attention,
                                  ttt_loss, unroll)
from draftkit.errors import ConfigError, DraftkitError
from draftkit.models.eagle3 import from_target, load_eagle3
from draftkit.models.reduced_head import ReducedHead
from tests.helpers import distill_config, make_llama, make_tokenizer, tiny_recipe

EAGLE3 = {"kind": "eagle3", "draft_vocab_size": 40, "ttt_steps": 3}
# two packed examples (5 and 7 tokens), then one of 9 and its padding
POSITIONS = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6],
                          [0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2]])


def _cfg(tmp_path, tiny_dirs, out="run", **over):
    return distill_config(tmp_path, tiny_dirs, out, draft=dict(EAGLE3), **over)


def _metrics(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _head(layers=6, ids=(60, 1, 5, 9, 20, 33, 40, 41, 2, 7)):
    target = make_llama(len(make_tokenizer()), num_layers=layers)
    v = target.config.vocab_size
    return target, from_target(target, ReducedHead(list(ids), v), seed=1).eval()


# --- the mask ------------------------------------------------------------------------------------

def test_a_step_i_query_sees_its_own_earlier_steps_and_the_causal_step0_keys():
    """With q = 0 every key a query may read scores the same, so the output is the mean of the
    values it reads; values one-hot on (step, position) spell out exactly which those are."""
    pos = POSITIONS[:1]
    t = pos.shape[1]
    causal = block_causal(pos)[0]
    example = [0] * 5 + [1] * 7
    for a in range(t):
        for b in range(t):
            assert bool(causal[a, b]) == (b <= a and example[a] == example[b])
    for step in range(4):
        q = torch.zeros(1, 4, t, 8)  # 4 query heads over 2 key heads (grouped-query attention)
        keys = [torch.randn(1, 2, t, 8) for _ in range(step + 1)]
        values = [F.one_hot(torch.arange(j * t, (j + 1) * t), 4 * t).float()[None, None]
                  .expand(1, 2, t, 4 * t) for j in range(step + 1)]
        o = ttt_attention(q, keys, values, block_causal(pos))  # (1, 4, T, 4T)
        for a in range(t):
            seen = {(int(c) // t, int(c) % t) for c in o[0, 3, a].nonzero()}
            want = {(0, b) for b in range(t) if causal[a, b]} | {(j, a) for j in range(1, step + 1)}
            assert seen == want, (step, a)
            torch.testing.assert_close(o[0, 3, a][o[0, 3, a] > 0],
                                       torch.full((len(want),), 1 / len(want)))


def test_unrolled_steps_have_the_heads_shapes_and_step0_is_its_causal_pass():
    target, draft = _head()
    h = target.config.hidden_size
    ids = torch.randint(0, target.config.vocab_size, (2, 9))
    aux = torch.randn(2, 9, 3 * h)
    pos = torch.arange(9).expand(2, 9)
    with torch.no_grad():
        hs = unroll(draft, aux, ids, pos, 4)
        _, first = draft(aux, shift(ids, 1))  # models/eagle3's plain pass: tokens 1..T
    assert len(hs) == 4 and all(x.shape == (2, 9, h) for x in hs)
    torch.testing.assert_close(hs[0], first, rtol=1e-5, atol=1e-5)
    masks = step_masks(torch.ones(2, 9, dtype=torch.bool), pos, 4)
    assert [int(m[0].sum()) for m in masks] == [8, 7, 6, 5]  # step i reaches t + 1 + i < T


def test_a_deeper_heads_unrolled_steps_are_what_its_runner_drafts():
    """Step i at t of a two-layer head, unrolled, equals the decoding runner's output when it
    drafts after token t + 1: its cache of every layer holding positions 0..t, then its own
    outputs fed back at t + 1 .. t + i with the row's tokens."""
    from draftkit.decode.eagle3_runner import Eagle3Runner

    target = make_llama(len(make_tokenizer()), num_layers=6)
    v, h = target.config.vocab_size, target.config.hidden_size
    draft = from_target(target, ReducedHead(list(range(0, v, 2)), v), seed=1, num_layers=2)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, v, (2, 12), generator=gen)
    aux = torch.randn(2, 12, 3 * h, generator=gen)
    with torch.no_grad():
        hs = unroll(draft, aux, ids, torch.arange(12).expand(2, 12), 4)
        runner = Eagle3Runner(draft)
        for t in (0, 4, 7):
            runner.reset(2, 16)
            _, out = runner.forward(draft.fuse(aux[:, :t + 1]), ids[:, 1:t + 2], [0, 0], [t, t])
            torch.testing.assert_close(out, hs[0][:, t], rtol=1e-4, atol=1e-4)
            for i in range(1, 4):
                _, out = runner.forward(out[:, None], ids[:, t + 1 + i:t + 2 + i], [t + i] * 2,
                                        [0, 0])
                torch.testing.assert_close(out, hs[i][:, t], rtol=1e-4, atol=1e-4)


# --- the loss ------------------------------------------------------------------------------------

def _packed(v, seed=0):
    """Packed rows (POSITIONS), their trained positions (responses, never a row's last token of
    an example) and a target distribution at each, (n, V) log-probs."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, v, POSITIONS.shape, generator=g)
    nxt = torch.cat([POSITIONS[:, 1:] == POSITIONS[:, :-1] + 1,
                     torch.zeros(2, 1, dtype=torch.bool)], 1)  # token t + 1 is in t's example
    mask = nxt & (torch.rand(POSITIONS.shape, generator=g) > 0.25)
    mask[1, 9:] = False  # padding
    logp = torch.log_softmax(torch.randn(int(mask.sum()), v, generator=g) * 3, -1)
    return ids, mask, logp


def _decoded_loss(draft, aux, ids, pos, mask, logp, steps, decay, divergence):
    """The loss as a decoder would meet it: each position a draft of its own, drafted step by
    step with its own KV cache (its example's keys up to it, then each step's own key)."""
    head = draft.reduced_head
    trained = {(b, s): r for r, (b, s) in enumerate(mask.nonzero().tolist())}  # teacher rows
    f = draft.fuse(aux)
    q0, k0, v0 = draft.attention_inputs(shift(ids, 1), f, pos)  # (pointwise: any position)
    bsz, t = ids.shape
    total = torch.zeros(())
    for b in range(bsz):
        for a in range(t):
            start = a - int(pos[b, a])  # where a's example starts
            ks, vs = [k0[b:b + 1, :, start:a + 1]], [v0[b:b + 1, :, start:a + 1]]
            q, hidden = q0[b:b + 1, :, a:a + 1], f[b:b + 1, a:a + 1]
            for i in range(steps):
                if i:
                    tok = ids[b, a + 1 + i] if a + 1 + i < t else torch.tensor(0)
                    q, k, v = draft.attention_inputs(tok.view(1, 1), hidden,
                                                     pos[b:b + 1, a:a + 1] + i)
                    ks, vs = ks + [k], vs + [v]
                o = F.scaled_dot_product_attention(q, torch.cat(ks, 2), torch.cat(vs, 2),
                                                   enable_gqa=True)  # the cache: no mask
                hidden = draft.after_attention(o, hidden)
                s = a + 1 + i  # the target's position that scores this draft token
                if s >= t or pos[b, s] != pos[b, a] + 1 + i or (b, s) not in trained:
                    continue
                q_logp = torch.log_softmax(draft.logits(hidden)[0, 0], -1)  # (N,)
                if divergence == "ce":
                    label = int(ids[b, s + 1])
                    if label in head.ids.tolist():
                        total = total - decay ** i * q_logp[head.ids.tolist().index(label)]
                    continue
                p_logp = torch.log_softmax(logp[trained[(b, s)]][head.ids], -1)  # over H
                p = p_logp.exp()
                term = (p * (p_logp - q_logp)).sum() if divergence == "fkl" else \
                    0.5 * (p - q_logp.exp()).abs().sum()
                total = total + decay ** i * term
    return total / len(trained)


@pytest.mark.parametrize("divergence", ["fkl", "tvd", "ce"])
def test_the_loss_is_the_one_a_decoder_run_one_draft_at_a_time_gives(divergence):
    from draftkit.distill.eagle3 import Unrolled

    target, draft = _head()
    h, v = target.config.hidden_size, target.config.vocab_size
    ids, mask, logp = _packed(v)
    aux = torch.randn(*ids.shape, 3 * h, generator=torch.Generator().manual_seed(1))
    steps, decay = 3, 0.8
    loss = SimpleNamespace(divergence=divergence, temperature=1.0, beta=0.5)
    masks = step_masks(mask, POSITIONS, steps)
    with torch.no_grad():
        step_logits = Unrolled(draft)(aux, ids, POSITIONS, masks)
        n = int(mask.sum())
        got = ttt_loss(step_logits, teacher_rows(mask, masks), draft.reduced_head, loss, decay,
                       n, TeacherOut(logp, None, None), labels=ids.roll(-1, 1)[mask])
        want = _decoded_loss(draft, aux, ids, POSITIONS, mask, logp, steps, decay, divergence)
    assert want > 0
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


# --- training ------------------------------------------------------------------------------------

def test_a_few_steps_raise_heldout_alpha_and_best_holds_the_head_tau_chose(tmp_path, tiny_dirs):
    from draftkit.distill.eagle3 import Eagle3
    from draftkit.distill.trainer import _load_target, recipe_rows, train
    from draftkit.distill.distributed import Dist
    from draftkit.metrics import tau

    cfg = _cfg(tmp_path, tiny_dirs)
    best = train(cfg, progress=False)
    lines = _metrics(tmp_path / "run")
    assert [x["step"] for x in lines] == [0, 2, 4]
    first, last = lines[0], lines[-1]
    assert last["alpha_1"] > first["alpha_1"] + 0.02  # position 1 learns from the target
    assert {"alpha/code", "alpha_1/code", "alpha_2/math", "alpha_3/code", "tau/math",
            "loss"} <= set(last)
    assert last["alpha"] == last["alpha_1"]  # what every draft kind reports
    assert last["tau"] == pytest.approx(tau([last[f"alpha_{k}"] for k in (1, 2, 3)], 3))
    row = json.loads((best / "best.json").read_text())
    assert row["tau"] == max(x["tau"] for x in lines)  # best/ is chosen by tau
    assert sorted(p.name for p in best.iterdir()) == ["best.json", "config.json",
                                                      "model.safetensors", "target.json"]
    # best/ is the head as save_eagle3 writes it (and the target it reads: target.json),
    # loadable with its target, the one scored
    ref, tok, target = _load_target(cfg, "cpu")
    from draftkit.models.resolve import model_identity
    assert json.loads((best / "target.json").read_text())["identity"] == model_identity(ref)
    head = load_eagle3(best, target)
    assert head.aux_layers == [1, 2, 3] and len(head.reduced_head) == 40
    kind = Eagle3(cfg, target, tok, ref, "cpu")
    kind.draft, kind.head, kind.autocast = head, head.reduced_head, contextlib.nullcontext
    _, heldout = recipe_rows(cfg, tok, target, ref, Dist(), False)
    assert kind.evaluate(heldout)["tau"] == pytest.approx(row["tau"], abs=1e-5)


def test_resume_is_exact(tmp_path, tiny_dirs):
    from draftkit.distill.checkpoint import list_checkpoints, load_checkpoint
    from draftkit.distill.trainer import train

    def state(run):
        return load_checkpoint(list_checkpoints(run / "checkpoints")[-1])

    train(_cfg(tmp_path, tiny_dirs, "straight"), progress=False)
    cfg = _cfg(tmp_path, tiny_dirs, "resumed")
    train(cfg, stop_after=2, progress=False)  # killed right after the step-2 checkpoint
    train(cfg, progress=False)
    a, b = state(tmp_path / "straight"), state(tmp_path / "resumed")
    assert a["model"].keys() == b["model"].keys() and "fc.weight" in a["model"]
    assert "embed_tokens.weight" not in a["model"]  # frozen: the target's
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["best_tau"] == b["best_tau"] and "best_alpha" not in a
    assert [x["step"] for x in _metrics(tmp_path / "resumed")] == [0, 2, 4]


def test_a_checkpoint_of_another_head_or_kind_does_not_resume(tmp_path, tiny_dirs):
    """The checkpoint says which head it holds (layers, N; fc reads 3 Ht whichever layers are
    tapped, so weights alone would load), and another one is refused in one line."""
    from draftkit.distill.trainer import train

    train(_cfg(tmp_path, tiny_dirs), stop_after=2, progress=False)
    with pytest.raises(DraftkitError, match=r"step-0000002 holds an eagle3 head over 40 tokens "
                                            r"reading layers \[1, 2, 3\]; this recipe trains an "
                                            r"eagle3 head over 48 tokens reading layers \[1, 2, "
                                            r"3\]: use another out_dir"):
        train(_cfg(tmp_path, tiny_dirs, **{"draft.draft_vocab_size": 48}), progress=False)
    with pytest.raises(DraftkitError, match="holds an eagle3 head .* trains a standalone draft"):
        train(distill_config(tmp_path, tiny_dirs), progress=False)


def test_num_layers_trains_a_deeper_head_that_resumes_and_warm_starts_as_itself(tmp_path,
                                                                              tiny_dirs):
    """draft.num_layers: a head of that many layers, saved as such; its checkpoint does not
    resume a one-layer recipe, a warm start from it keeps its depth, and a depth under one is
    one line."""
    from draftkit.distill.trainer import train

    best = train(_cfg(tmp_path, tiny_dirs, max_steps=2, **{"draft.num_layers": 2}),
                 progress=False)
    assert json.loads((best / "config.json").read_text())["num_hidden_layers"] == 2
    with pytest.raises(DraftkitError, match=r"holds an eagle3 head of 2 layers over 40 tokens .*"
                                            r"this recipe trains an eagle3 head over 40"):
        train(_cfg(tmp_path, tiny_dirs, max_steps=3), progress=False)
    warm = {"draft.model": str(best), "draft.draft_vocab_size": None}
    again = train(_cfg(tmp_path, tiny_dirs, "warm", max_steps=1, **warm), progress=False)
    assert json.loads((again / "config.json").read_text())["num_hidden_layers"] == 2
    with pytest.raises(DraftkitError, match="draft.num_layers 3 differs from the 2 layers"):
        train(_cfg(tmp_path, tiny_dirs, "warm3", **warm, **{"draft.num_layers": 3}),
              progress=False)
    with pytest.raises(ConfigError, match="key 'draft.num_layers' must be >= 1, got 0") as e:
        _cfg(tmp_path, tiny_dirs, **{"draft.num_layers": 0})
    assert len(str(e.value).splitlines()) == 1


def test_the_ce_control_and_bf16_train(tmp_path, tiny_dirs):
    from draftkit.distill.trainer import train

    train(_cfg(tmp_path, tiny_dirs, max_steps=2, **{"loss.divergence": "ce",
                                                    "train.precision": "bf16"}), progress=False)
    last = _metrics(tmp_path / "run")[-1]
    assert last["step"] == 2 and 0 < last["loss"] < 20 and "alpha_3/code" in last


def test_an_eagle3_run_tracks_per_position_alpha_tau_and_the_caches_bytes_per_token(
        tmp_path, tiny_dirs, monkeypatch):
    """What W&B is given (offline here): the held-out alpha per position and domain, tau, and
    each cache's bytes per token, as the run's metrics.jsonl has them."""
    from draftkit.distill.trainer import train
    from draftkit.tracking import Tracker

    logged, summary = [], {}
    log, update = Tracker.log, Tracker.summary

    def record_log(self, metrics, step=None):
        if self.enabled:
            logged.append(dict(metrics))
        log(self, metrics, step)

    def record_summary(self, values):
        if self.enabled:
            summary.update(values)
        update(self, values)

    monkeypatch.setattr(Tracker, "log", record_log)
    monkeypatch.setattr(Tracker, "summary", record_summary)
    monkeypatch.setenv("WANDB_MODE", "offline")
    train(_cfg(tmp_path, tiny_dirs, **{"teacher.mode": "cache", "teacher.top_k": 8,
                                       "teacher.cache_dir": str(tmp_path / "cache"),
                                       "max_steps": 2}), progress=False)
    scored = [m for m in logged if "tau" in m]
    assert scored and {"alpha_1/code", "alpha_2/math", "alpha_3/code", "tau/code",
                       "tau/math"} <= set(scored[-1])
    assert scored[-1]["tau"] == _metrics(tmp_path / "run")[-1]["tau"]
    assert summary["feature_cache/bytes_per_token"] == 3 * 32 * 2
    assert summary["best_tau"] == max(m["tau"] for m in scored)
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*"))


# --- the feature cache ---------------------------------------------------------------------------

def test_the_feature_cache_is_built_once_shared_and_holds_the_online_features(tmp_path,
                                                                              tiny_dirs):
    from draftkit.distill.features import FeatureCache, target_forward
    from draftkit.distill.trainer import _load_target, recipe_rows, target_id, train
    from draftkit.distill.distributed import Dist
    from draftkit.data import positions

    cache = tmp_path / "cache"
    cached = {"teacher.mode": "cache", "teacher.top_k": 8, "teacher.cache_dir": str(cache),
              "max_steps": 2}
    train(_cfg(tmp_path, tiny_dirs, "c1", **cached), progress=False)
    metas = {d.name: json.loads((d / "meta.json").read_text()) for d in cache.iterdir()}
    (features,) = [d for d, m in metas.items() if "layers" in m]
    meta = metas[features]
    assert meta["layers"] == [1, 2, 3] and meta["filled_rows"] == meta["rows"]
    assert meta["bytes_per_token"] == 3 * 32 * 2  # three layers of 32, bf16
    assert len(metas) == 2  # beside the top-k teacher cache standalone drafts read too
    stamp = (cache / features / "aux.bf16").stat().st_mtime_ns
    train(_cfg(tmp_path, tiny_dirs, "c2", **cached), progress=False)
    assert (cache / features / "aux.bf16").stat().st_mtime_ns == stamp  # read, not rebuilt

    cfg = _cfg(tmp_path, tiny_dirs, **cached)
    ref, tok, target = _load_target(cfg, "cpu")
    rows, _ = recipe_rows(cfg, tok, target, ref, Dist(), False)
    built = FeatureCache(cache / features, rows, [1, 2, 3], 32, target_id(ref, target)).open()
    idx = torch.tensor([3, 0])
    ids, mask = rows.input_ids[idx], rows.loss_mask[idx]
    got = built(idx, ids)
    _, online = target_forward(target, [1, 2, 3], ids, positions(rows, idx))
    for r in range(2):  # every position up to the row's last trained one: what a head reads
        n = int(mask[r].nonzero().max())
        torch.testing.assert_close(got[r, :n].float(), online[r, :n], rtol=2e-2, atol=2e-2)
        assert not got[r, n:].any()


def test_a_feature_cache_of_another_target_layers_or_rows_is_one_clear_error(tmp_path,
                                                                             tiny_dirs,
                                                                             monkeypatch):
    from draftkit.data import build_rows
    from draftkit.distill.features import FeatureCache
    from draftkit.models import load_model, load_tokenizer

    target = load_model(str(tiny_dirs[0]), device="cpu", dtype="float32")
    rows, heldout = build_rows(_cfg(tmp_path, tiny_dirs).data, load_tokenizer(str(tiny_dirs[0])),
                               0)
    whole = FeatureCache(tmp_path / "whole", rows, [1, 2, 3], 32, "target-a")
    whole.build(target, rows, 2, progress=False)
    # a build killed after its first batch resumes from there, to the same bytes
    part = FeatureCache(tmp_path / "part", rows, [1, 2, 3], 32, "target-a")
    real, calls = FeatureCache.fill, []

    def killed(self, *a):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        real(self, *a)

    monkeypatch.setattr(FeatureCache, "fill", killed)
    with pytest.raises(KeyboardInterrupt):
        part.build(target, rows, 2, progress=False)
    assert part.filled_rows() == 2
    monkeypatch.undo()
    part.build(target, rows, 2, progress=False)
    assert (tmp_path / "part" / "aux.bf16").read_bytes() == \
        (tmp_path / "whole" / "aux.bf16").read_bytes()

    for other, said in ((FeatureCache(tmp_path / "whole", rows, [1, 2, 3], 32, "target-b"),
                         "target 'target-a'; this run's is 'target-b'"),
                        (FeatureCache(tmp_path / "whole", rows, [0, 1, 3], 32, "target-a"),
                         r"layers \[1, 2, 3\]; this head taps \[0, 1, 3\]"),
                        (FeatureCache(tmp_path / "whole", heldout, [1, 2, 3], 32, "target-a"),
                         "other rows")):
        with pytest.raises(DraftkitError, match=f"feature cache {tmp_path / 'whole'} holds the "
                                                f"features of {said}.*: delete it"):
            other.open()


# --- recipes -------------------------------------------------------------------------------------

def test_eagle3_recipe_keys_and_what_does_not_fit_a_kind(tmp_path, tiny_dirs):
    cfg = _cfg(tmp_path, tiny_dirs)
    assert (cfg.draft.steps, cfg.draft.decay, cfg.draft.aux_layers) == (3, 0.8, None)
    default = distill_config(tmp_path, tiny_dirs, draft={"kind": "eagle3",
                                                          "draft_vocab_size": 40})
    assert (default.draft.steps, default.draft.decay) == (7, 0.8)  # the references'
    refused = [
        ({"kind": "eagle3"}, {}, "set draft.draft_vocab_size"),
        ({**EAGLE3, "derive_layers": [0]}, {}, "draft.derive_layers is a setting of standalone"),
        ({**EAGLE3, "lora": {"enabled": True}}, {}, "draft.lora.enabled is a setting of stand"),
        ({**EAGLE3, "derive_layers": [0], "freeze": ["embeddings"]}, {},
         "draft.derive_layers, draft.freeze are settings of standalone drafts.*drop them"),
        ({"derive_layers": [0, 3], "ttt_steps": 3}, {}, "draft.ttt_steps is a setting of eagle3"),
        ({**EAGLE3, "ttt_steps": 0}, {}, "key 'draft.ttt_steps' must be >= 1, got 0"),
        ({**EAGLE3, "aux_layers": [3, 2, 1]}, {}, "draft.aux_layers \\[3, 2, 1\\]: give three"),
        (EAGLE3, {"loss.hidden_weight": 0.5}, "an eagle3 head reads the target's"),
        # on-policy steps draft with a trained head (distill/rollouts.py; test_rollouts.py)
        (EAGLE3, {"data.regime": "on_policy", "data.lmbda": 0.5,
                  "data.generate.max_new_tokens": 4}, "set draft.model to a trained head"),
        ({"derive_layers": [0, 3], "rejection_weight": 2.0}, {},
         "draft.rejection_weight is a setting of eagle3"),
    ]
    for draft, over, said in refused:
        with pytest.raises(ConfigError, match=said):
            distill_config(tmp_path, tiny_dirs, draft=draft, **over)
    with pytest.raises(ConfigError, match="did you mean 'draft.ttt_steps'"):
        distill_config(tmp_path, tiny_dirs, draft={**EAGLE3, "ttt_step": 3})


def test_dry_run_checks_the_target_and_prepare_builds_the_feature_cache(tmp_path, tiny_dirs,
                                                                        capsys):
    from transformers import GPT2Config

    from draftkit.cli import main
    from draftkit.distill.eagle3 import check_target

    recipe, _ = tiny_recipe(tmp_path, tiny_dirs[0])
    head = ["draft.kind=eagle3", "draft.derive_layers=null", "draft.draft_vocab_size=40"]
    assert main(["distill", str(recipe), *head, "--dry-run"]) == 0
    assert "an EAGLE-3 head over 40 tokens reading layers [2, L // 2, L - 3], 7 " \
           "training-time-test steps" in capsys.readouterr().out
    for bad, said in (("draft.draft_vocab_size=500", "draft.draft_vocab_size=500 is more than "
                                                     "the target's 138 tokens"),
                      ("draft.aux_layers=[1,2,4]", "within 1..3")):
        assert main(["distill", str(recipe), *head, bad, "--dry-run"]) == 2
        assert said in capsys.readouterr().err
    with pytest.raises(DraftkitError, match="Llama-family targets .* 'gpt2'"):
        check_target(_cfg(tmp_path, tiny_dirs), GPT2Config(vocab_size=138))

    out, cache = tmp_path / "run", tmp_path / "cache"
    over = [*head, f"out_dir={out}", "teacher.mode=cache", "teacher.top_k=8",
            f"teacher.cache_dir={cache}"]
    assert main(["distill", str(recipe), *over, "--prepare"]) == 0
    said = capsys.readouterr().out
    assert "teacher cache in" in said and "feature cache in" in said
    for built in cache.iterdir():
        meta = json.loads((built / "meta.json").read_text())
        assert meta["filled_rows"] == meta["rows"] > 0
    assert not out.exists()


def test_a_head_warm_starts_from_a_trained_one_keeping_its_layers_and_vocabulary(tmp_path,
                                                                                tiny_dirs):
    """draft.model on an eagle3 recipe: the run starts where the head is (its step-0 held-out
    tau is the one that chose it, not a new head's), over the head's own tokens and layers."""
    from draftkit.distill.trainer import train

    best = train(_cfg(tmp_path, tiny_dirs), progress=False)
    chose = json.loads((best / "best.json").read_text())["tau"]
    fresh = _metrics(tmp_path / "run")[0]["tau"]
    warm = {**EAGLE3, "draft_vocab_size": None, "model": str(best)}
    again = train(distill_config(tmp_path, tiny_dirs, "warm", draft=warm), progress=False)
    first = _metrics(tmp_path / "warm")[0]
    assert first["tau"] == pytest.approx(chose, abs=1e-4) and chose > fresh + 0.01
    assert json.loads((again / "best.json").read_text())["tau"] >= chose - 1e-4
    wider = train(distill_config(tmp_path, tiny_dirs, "w2", max_steps=1,
                                 draft={**warm, "draft_vocab_size": 48}), progress=False)
    assert json.loads((wider / "config.json").read_text())["draft_vocab_size"] == 48
    with pytest.raises(DraftkitError, match=r"draft.aux_layers \[1, 2, 4\] differ from the "
                                            r"layers \[1, 2, 3\]"):
        train(distill_config(tmp_path, tiny_dirs, "w3", draft={**warm, "aux_layers": [1, 2, 4]}),
              progress=False)
    with pytest.raises(DraftkitError, match="draft.model: .* is not an EAGLE-3 head"):
        train(distill_config(tmp_path, tiny_dirs, "w4", draft={**warm, "model": str(
            tiny_dirs[1])}), progress=False)


def test_the_command_checks_a_head_to_warm_start_from_without_a_tokenizer(tmp_path, tiny_dirs,
                                                                           capsys):
    """draftkit distill (--dry-run, and every run, which checks first) takes a head folder as
    draft.model, which holds no tokenizer: its config is checked against the target instead;
    a standalone model or a head of another target is one line and exit 2."""
    from draftkit.cli import main
    from draftkit.distill.trainer import train

    best = train(_cfg(tmp_path, tiny_dirs, max_steps=1), progress=False)
    assert not list(best.glob("tokenizer*"))
    (tmp_path / "cli").mkdir()
    recipe, _ = tiny_recipe(tmp_path / "cli", tiny_dirs[0])
    head = ["draft.kind=eagle3", "draft.derive_layers=null", "draft.draft_vocab_size=null"]
    assert main(["distill", str(recipe), *head, f"draft.model={best}", "draft.parallel=true",
                 "--dry-run"]) == 0
    assert f"a parallel (P-EAGLE) EAGLE-3 head started from {best}" in capsys.readouterr().out
    other = json.loads((best / "config.json").read_text())
    other["vocab_size"] = 999  # a head of another target
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps(other))
    for folder, said in ((tiny_dirs[1], "is not an EAGLE-3 head"),
                         (tmp_path / "other", "vocab_size 999 differs from the target's")):
        assert main(["distill", str(recipe), *head, f"draft.model={folder}", "--dry-run"]) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and len(err.splitlines()) == 1, err


def test_a_head_over_another_vocabulary_keeps_the_rows_of_the_tokens_it_had(tiny_dirs):
    """with_vocabulary: kept tokens keep their trained lm_head rows, new ones start from the
    target's head rows, and d2t / t2d describe the new vocabulary."""
    from draftkit.models.eagle3 import with_vocabulary
    from draftkit.models.load import load_model

    target = load_model(str(tiny_dirs[0]), device="cpu", dtype="float32")
    v = target.config.vocab_size
    draft = from_target(target, ReducedHead(range(10, 50), v))
    with torch.no_grad():
        draft.lm_head.weight.normal_()  # "trained": no longer the target's rows
    before = draft.lm_head.weight.clone()  # (40, H): tokens 10..49
    new = with_vocabulary(draft, ReducedHead([5, 12, 49, 60, 7], v), target)
    assert new.reduced_head.ids.tolist() == [5, 7, 12, 49, 60]
    assert int(new.t2d.sum()) == 5 and new.config.draft_vocab_size == 5
    w, out = new.lm_head.weight, target.get_output_embeddings().weight
    assert torch.equal(w[2], before[12 - 10]) and torch.equal(w[3], before[49 - 10])
    for row, token in ((0, 5), (1, 7), (4, 60)):
        assert torch.equal(w[row], out[token])
    assert new.logits(torch.zeros(1, w.shape[1])).shape == (1, 5)
