"""Parallel EAGLE-3 heads (P-EAGLE, arXiv 2602.01469) in distillation: the recipe key, the
training pass against the decoding runner, the placeholder's gradient, a short run end to end
with the layout vLLM loads and its round trip, warm starts and resumes."""

import contextlib
import json

import pytest
import torch

from draftkit.decode.eagle3_runner import Eagle3Runner
from draftkit.distill.ttt import shift, unroll
from draftkit.errors import ConfigError, DraftkitError, ModelError
from draftkit.models.eagle3 import from_target, load_eagle3, save_eagle3
from draftkit.models.reduced_head import ReducedHead
from tests.helpers import distill_config, make_llama, make_tokenizer

PARALLEL = {"kind": "eagle3", "draft_vocab_size": 40, "ttt_steps": 3, "parallel": True}


def _cfg(tmp_path, tiny_dirs, out="run", draft=None, **over):
    return distill_config(tmp_path, tiny_dirs, out, draft=dict(draft or PARALLEL), **over)


def _metrics(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_recipe_key_and_what_it_needs(tmp_path, tiny_dirs):
    assert _cfg(tmp_path, tiny_dirs).draft.parallel is True
    plain = {**PARALLEL, "parallel": False}
    assert _cfg(tmp_path, tiny_dirs, draft=plain).draft.parallel is False
    for draft, said in (({"derive_layers": [0, 3], "parallel": True},
                         "draft.parallel is a setting of eagle3 heads"),
                        ({**PARALLEL, "ttt_steps": 1},
                         "set draft.ttt_steps to at least 2, got 1"),
                        ({**PARALLEL, "parallel": "sometimes"}, "draft.parallel")):
        with pytest.raises(ConfigError, match=said) as e:
            _cfg(tmp_path, tiny_dirs, draft=draft)
        assert len(str(e.value).splitlines()) == 1


@pytest.mark.parametrize("num_layers", [1, 2])
def test_the_training_pass_is_the_decoding_runners_and_trains_the_placeholder(num_layers):
    """Position 1 + i at t, from the training pass over the whole row, equals the runner's
    output there when it drafts a round after token t + 1 (its cache holding 0..t, then i
    placeholders), in every layer of a deeper head; the loss of positions 2..K reaches
    mask_hidden, which nothing else trains."""
    target = make_llama(len(make_tokenizer()), num_layers=6)
    v, h = target.config.vocab_size, target.config.hidden_size
    draft = from_target(target, ReducedHead(list(range(0, v, 2)), v), seed=1, parallel=True,
                        num_layers=num_layers)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, v, (2, 9), generator=gen)
    aux = torch.randn(2, 9, 3 * h, generator=gen)
    hs = unroll(draft, aux, ids, torch.arange(9).expand(2, 9), 4)  # the parallel pass
    assert len(hs) == 4 and all(x.shape == (2, 9, h) for x in hs)
    with torch.no_grad():
        _, first = draft(aux, shift(ids, 1))  # position 1: the head's plain causal pass
        torch.testing.assert_close(hs[0], first, rtol=1e-5, atol=1e-5)
        token, place = draft.placeholder()
        runner = Eagle3Runner(draft)
        for t in (0, 3, 7):
            runner.reset(2, 16)
            hidden = torch.cat([draft.fuse(aux[:, :t + 1]), place.expand(2, 3, -1)], 1)
            tokens = torch.cat([ids[:, 1:t + 2], torch.full((2, 3), token)], 1)
            _, out = runner.forward_span(hidden, tokens, [0, 0], [t, t], 4)  # (2, 4, H)
            for i in range(4):
                torch.testing.assert_close(out[:, i], hs[i][:, t], rtol=1e-4, atol=1e-4)
    sum(draft.logits(x).logsumexp(-1).sum() for x in hs[1:]).backward()
    assert draft.mask_hidden.grad is not None and draft.mask_hidden.grad.abs().sum() > 0
    draft.zero_grad(set_to_none=True)
    draft.logits(unroll(draft, aux, ids, torch.arange(9).expand(2, 9), 1)[0]).sum().backward()
    grad = draft.mask_hidden.grad
    assert grad is None or not grad.any()  # position 1 never reads it


def test_a_short_run_trains_the_placeholder_and_best_is_what_vllm_loads(tmp_path, tiny_dirs):
    from safetensors import safe_open

    from draftkit.distill.distributed import Dist
    from draftkit.distill.eagle3 import Eagle3
    from draftkit.distill.trainer import _load_target, recipe_rows, train

    cfg = _cfg(tmp_path, tiny_dirs)
    best = train(cfg, progress=False)
    lines = _metrics(tmp_path / "run")
    last = lines[-1]
    assert [x["step"] for x in lines] == [0, 2, 4] and last["loss"] > 0
    assert {"alpha_1", "alpha_2", "alpha_3", "alpha_3/code", "tau", "tau/math"} <= set(last)
    assert last["alpha_1"] > lines[0]["alpha_1"]
    config = json.loads((best / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["parallel_drafting"] is True and config["ptd_token_id"] == 137  # V - 1
    with safe_open(str(best / "model.safetensors"), "pt") as f:
        assert f.get_slice("mask_hidden").get_shape() == [1, 96]  # 3 Ht, as vLLM views it
        assert "embed_tokens.weight" not in f.keys()  # the placeholder token's is the target's
    ref, tok, target = _load_target(cfg, "cpu")
    head = load_eagle3(best, target)
    start = from_target(target, head.reduced_head, head.aux_layers, cfg.seed, parallel=True)
    assert head.parallel and not torch.equal(head.mask_hidden, start.mask_hidden)  # learned
    kind = Eagle3(cfg, target, tok, ref, "cpu")  # the held-out figures best.json recorded
    kind.draft, kind.head, kind.autocast = head, head.reduced_head, contextlib.nullcontext
    _, heldout = recipe_rows(cfg, tok, target, ref, Dist(), False)
    row = json.loads((best / "best.json").read_text())
    assert kind.evaluate(heldout)["tau"] == pytest.approx(row["tau"], abs=1e-5)
    save_eagle3(head, tmp_path / "again")  # and saved again, the same tensors
    again = load_eagle3(tmp_path / "again", target)
    for name, tensor in head.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name
    (tmp_path / "again" / "config.json").write_text(json.dumps({**config, "ptd_token_id": 500}))
    with pytest.raises(ModelError, match="ptd_token_id 500 is no id of the target's 138"):
        load_eagle3(tmp_path / "again", target)
    plain = {k: v for k, v in config.items() if k not in ("parallel_drafting", "ptd_token_id")}
    (tmp_path / "again" / "config.json").write_text(json.dumps(plain))
    with pytest.raises(ModelError, match="unknown tensor mask_hidden"):
        load_eagle3(tmp_path / "again", target)


def test_warm_starts_and_resumes_keep_the_kinds_apart(tmp_path, tiny_dirs):
    """An autoregressive head warm-starts a parallel one (its position 1 as it was, a new
    placeholder); a parallel head does not start an autoregressive recipe, nor does either's
    checkpoint resume the other."""
    from draftkit.distill.trainer import train

    plain = {**PARALLEL, "parallel": False}
    ar = train(_cfg(tmp_path, tiny_dirs, "ar", draft=plain), progress=False)
    with pytest.raises(DraftkitError, match="holds an eagle3 head over 40 tokens .* this recipe "
                                            "trains a parallel eagle3 head over 40 tokens"):
        train(_cfg(tmp_path, tiny_dirs, "ar"), progress=False)
    warm = {**PARALLEL, "draft_vocab_size": None, "model": str(ar)}
    best = train(_cfg(tmp_path, tiny_dirs, "warm", draft=warm, max_steps=1), progress=False)
    chose = json.loads((ar / "best.json").read_text())
    assert _metrics(tmp_path / "warm")[0]["alpha_1"] == pytest.approx(chose["alpha_1"],
                                                                      abs=1e-4)
    assert json.loads((best / "config.json").read_text())["parallel_drafting"] is True
    with pytest.raises(DraftkitError, match="is a parallel head: set draft.parallel: true"):
        train(_cfg(tmp_path, tiny_dirs, "back", draft={**warm, "parallel": False,
                                                        "model": str(best)}), progress=False)
