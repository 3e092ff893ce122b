"""draft.train_reduced_head: the draft trains over the head it decodes with, the target and the
control's labels restricted to it (draftkit/distill/reduced_head.py, over the ReducedHead of
draftkit/models/reduced_head.py)."""

import contextlib
import json

import pytest
import torch

from draftkit.distill.losses import dense_logprobs, divergence, sparse_logprobs
from draftkit.distill.reduced_head import head_logits, restrict_labels, restrict_sparse
from draftkit.errors import ConfigError, DraftkitError
from draftkit.models.reduced_head import ReducedHead
from tests.helpers import distill_config, distill_loaded


def _setup(tmp_path, tiny_dirs, **over):
    from draftkit.distill.trainer import batch_rows

    cfg, target, draft, rows = distill_loaded(tmp_path, tiny_dirs, **over)
    v = target.config.vocab_size
    head = ReducedHead(torch.arange(0, v, 2), v)  # half the vocabulary: labels on both sides
    return cfg, target, draft, rows, head, batch_rows(0, len(rows), 3, 0)


def _reference(draft, target, rows, idx, head, name="fkl"):
    """The loss written out on whole-vocabulary logits: both sliced to H and renormalised."""
    from draftkit.data import positions

    ids, mask, pos = rows.input_ids[idx], rows.loss_mask[idx], positions(rows, idx)
    with torch.no_grad():
        q, p = (m(input_ids=ids, position_ids=pos, use_cache=False).logits[mask][:, head.ids]
                for m in (draft, target))  # (N, |H|) each
    return divergence(name, dense_logprobs(p), dense_logprobs(q)).mean().item()


def test_the_head_over_h_is_the_whole_heads_logits_at_h(tiny_dirs):
    from draftkit.models import load_model

    draft = load_model(str(tiny_dirs[1]), device="cpu", dtype="float32")
    v = draft.config.vocab_size
    head = ReducedHead([3, 1, 7, v - 1], v)
    hidden = torch.randn(5, draft.config.hidden_size)
    whole = head_logits(draft, hidden, None)  # (5, V)
    torch.testing.assert_close(head_logits(draft, hidden, head), whole[:, head.ids])
    assert head.index[7].item() == 2 and head.index[2].item() == -1


@pytest.mark.parametrize("name", ["fkl", "tvd", "jsd"])
def test_online_teacher_loss_is_the_divergence_over_h(tmp_path, tiny_dirs, name):
    from draftkit.distill.teacher import MaskedLM, OnlineTeacher
    from draftkit.distill.standalone import micro_loss

    cfg, target, draft, rows, head, idx = _setup(tmp_path, tiny_dirs,
                                                 **{"loss.divergence": name})
    got, n = micro_loss(MaskedLM(draft, head=head), OnlineTeacher(target, 1.0), rows, idx, cfg,
                        contextlib.nullcontext, head)
    assert n == int(rows.loss_mask[idx].sum())
    assert got.item() == pytest.approx(_reference(draft, target, rows, idx, head, name),
                                       rel=1e-5)


def test_a_full_top_k_cache_gives_the_online_loss_over_h(tmp_path, tiny_dirs):
    """With top_k = V the restricted cache is the restricted online teacher: ids outside H
    are left out of both sides, their mass out of the renormalisation."""
    from draftkit.distill.teacher import MaskedLM, TopKCache
    from draftkit.distill.standalone import micro_loss

    cfg, target, draft, rows, head, idx = _setup(tmp_path, tiny_dirs)
    cache = TopKCache(tmp_path / "c", rows, target.config.vocab_size, 1.0, "k")
    cache.build(target, rows, 4, progress=False)
    cache.open()
    got, _ = micro_loss(MaskedLM(draft, head=head), cache, rows, idx, cfg,
                        contextlib.nullcontext, head)
    assert got.item() == pytest.approx(_reference(draft, target, rows, idx, head), rel=2e-3)


def test_restricting_a_top_k_teacher_keeps_its_tail_inside_h():
    v = 10
    head = ReducedHead([0, 1, 2, 3, 4], v)
    p = torch.tensor([[0.4, 0.2, 0.1, 0.2]])  # ids 0, 6, 1, 8: 0.1 beyond the top 4
    ids = torch.tensor([[0, 6, 1, 8]])
    logp, pos = restrict_sparse(p.log(), ids, head)
    assert pos.tolist() == [[0, 0, 1, 0]]
    # 0.4 of the top 4's mass is outside H: what is left is renormalised by 0.6
    torch.testing.assert_close(logp.exp(), torch.tensor([[0.4, 0.0, 0.1, 0.0]]) / 0.6)
    q_logits = torch.zeros(1, 5)  # uniform over H
    p_kt, q_kt = sparse_logprobs(q_logits, logp, pos)
    torch.testing.assert_close(p_kt.exp().sum(-1), torch.ones(1))
    # q: 0.2 on each of the two kept ids, the rest (0.6) in the tail; the stand-in position
    # of ids 6 and 8 (H's first token) is not counted again
    torch.testing.assert_close(q_kt.exp(), torch.tensor([[0.2, 0.0, 0.2, 0.0, 0.6]]))


def test_the_control_drops_labels_outside_h(tmp_path, tiny_dirs):
    from draftkit.data import positions
    from draftkit.distill.teacher import MaskedLM
    from draftkit.distill.standalone import micro_loss

    cfg, _, draft, rows, head, idx = _setup(tmp_path, tiny_dirs, **{"loss.divergence": "ce"})
    got, n = micro_loss(MaskedLM(draft, head=head), None, rows, idx, cfg,
                        contextlib.nullcontext, head)
    ids, mask = rows.input_ids[idx], rows.loss_mask[idx]
    labels = ids.roll(-1, dims=1)[mask]
    pos, inside = restrict_labels(labels, head)
    assert 0 < int(inside.sum()) < len(labels)  # the test has labels on both sides
    with torch.no_grad():
        logits = draft(input_ids=ids, position_ids=positions(rows, idx),
                       use_cache=False).logits[mask]
    want = torch.nn.functional.cross_entropy(logits[inside][:, head.ids], pos[inside])
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    assert n == int(mask.sum())


def test_a_run_trains_over_h_and_needs_a_reduced_head(tmp_path, tiny_dirs):
    from draftkit.distill.trainer import train

    best = train(distill_config(tmp_path, tiny_dirs, **{"draft.draft_vocab_size": 40,
                                                        "max_steps": 4,
                                                        "draft.train_reduced_head": True}),
                 progress=False)
    assert (best / "draft_vocab.json").exists()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    first, last = json.loads(lines[0]), json.loads(lines[-1])
    assert last["alpha"] > first["alpha"]
    with pytest.raises(ConfigError, match="draft.train_reduced_head.*draft.draft_vocab_size"):
        distill_config(tmp_path, tiny_dirs, **{"draft.train_reduced_head": True})
    # a draft.model that has no reduced head of its own: said when the run starts
    cfg = distill_config(tmp_path, tiny_dirs, "again", draft={"model": str(tiny_dirs[1])},
                         **{"draft.train_reduced_head": True})
    with pytest.raises(DraftkitError,
                       match="has none .no draft_vocab.json.: set draft.draft_vocab_size"):
        train(cfg, progress=False)


def test_on_policy_answers_stay_inside_the_reduced_head():
    from draftkit.data.generate import answers_in_memory
    from tests.helpers import make_llama, make_tokenizer

    tok = make_tokenizer()
    draft = make_llama(len(tok), num_layers=1, seed=3)
    prompt = tok("<|im_start|>user write python code <|im_end|> <|im_start|>assistant ")
    allowed = list(range(5, 25))
    head = ReducedHead(allowed, len(tok))
    for temperature in (0.0, 1.0):
        (answer,) = answers_in_memory(draft, [prompt["input_ids"]], 16, temperature,
                                      [tok.eos_token_id], [7], head)
        assert answer and set(answer) <= set(allowed)
        assert getattr(draft, "reduced_head", None) is None  # the draft is left as it was
        (free,) = answers_in_memory(draft, [prompt["input_ids"]], 16, temperature,
                                    [tok.eos_token_id], [7])
        assert not set(free) <= set(allowed)  # without it, the draft leaves H
