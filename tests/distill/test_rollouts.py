"""An EAGLE-3 head's on-policy steps (distill/rollouts.py): where the engine rejected its drafts,
the loss that weighs them, and a warm-started run that trains on them."""

import json

import pytest
import torch

from draftkit.data import Rows
from draftkit.distill.rollouts import NOT_REJECTED, Rollouts, RolloutTeacher, rejections
from draftkit.distill.teacher import TeacherOut
from draftkit.distill.ttt import step_masks, teacher_rows, ttt_loss
from draftkit.errors import ConfigError
from draftkit.models.reduced_head import ReducedHead
from tests.helpers import distill_config, eagle3_greedy_drafts, eagle3_models

EAGLE3 = {"kind": "eagle3", "draft_vocab_size": 40, "ttt_steps": 3}


def test_rounds_mark_the_anchor_and_step_of_each_rejected_draft():
    # prompt of 5; the prefill commits token 5; rounds [K, accepted]
    rounds = [[3, 1], [3, 3], [0, 0], [2, 0]]
    out = rejections(5, rounds, 14)
    # [3, 1]: drafts 6..8 from the feature after token 4, the second (step 1) rejected
    # [3, 3]: all kept; [0, 0]: a plain step; [2, 0]: anchored at 11, its first rejected
    assert {t: int(s) for t, s in enumerate(out) if s != NOT_REJECTED} == {4: 1, 11: 0}
    # the target's token at a rejection past the kept tokens trains nothing: no mark
    assert int(rejections(5, rounds, 13)[11]) == NOT_REJECTED


def _rows(prompts):
    n = len(prompts)
    return Rows(torch.zeros(n, 4, dtype=torch.long), torch.zeros(n, 4, dtype=torch.bool),
                torch.zeros(n, dtype=torch.long), ["code"], prompts=prompts,
                prompt_domains=[0] * n)


def test_a_marked_draft_is_the_one_the_head_proposes_there_and_the_target_refused():
    """Greedy rollouts of a fitted head: at each marked anchor t with step n, the head drafting
    after tokens 0..t + 1 agrees with the decoded tokens for n tokens and not at the n + 1-th."""
    target, _, head = eagle3_models()
    rollouts = Rollouts(target, head.aux_layers, 1.0, k=3, weight=4.0)
    prompts = [[5, 9, 13, 20], [7, 7, 30, 11, 4], [40, 2, 9]]
    rows, teacher = rollouts.draw(head, _rows(prompts), n=6, seed=0, micro_step=0, rank=0,
                                  max_new_tokens=24, temperature=0.0, seq_len=40, pad_id=0)
    assert isinstance(teacher, RolloutTeacher) and teacher.rejected.shape == rows.input_ids.shape
    marked = 0
    for b in range(len(rows)):
        length = int(rows.loss_mask[b].nonzero().max()) + 2
        seq = rows.input_ids[b, :length].tolist()
        for t in (teacher.rejected[b] != NOT_REJECTED).nonzero().flatten().tolist():
            n = int(teacher.rejected[b, t])
            drafts = eagle3_greedy_drafts(head, target, seq[:t + 2], n + 1)
            assert drafts[:n] == seq[t + 2:t + 2 + n] and drafts[n] != seq[t + 2 + n]
            marked += 1
    assert marked >= 3  # the fitted head is rejected now and then: the check saw some
    # drawn again at the same step, the same rows (a resumed run draws what the killed one did)
    again, _ = rollouts.draw(head, _rows(prompts), n=6, seed=0, micro_step=0, rank=0,
                             max_new_tokens=24, temperature=0.0, seq_len=40, pad_id=0)
    assert torch.equal(again.input_ids, rows.input_ids)


def test_the_loss_weighs_the_rejected_entries_and_nothing_else():
    torch.manual_seed(0)
    b, t, v, steps = 2, 9, 12, 3
    mask = torch.zeros(b, t, dtype=torch.bool)
    mask[:, 2:7] = True
    pos = torch.arange(t).expand(b, t)
    masks = step_masks(mask, pos, steps)
    rows = teacher_rows(mask, masks)
    head = ReducedHead(list(range(v)), v)
    logits = [torch.randn(int(m.sum()), v) for m in masks]
    target = TeacherOut(torch.randn(int(mask.sum()), v).log_softmax(-1), None, None)
    loss = type("Loss", (), {"divergence": "fkl", "temperature": 1.0, "beta": 0.5})()
    n = int(mask.sum())
    plain = ttt_loss(logits, rows, head, loss, 0.8, n, target)
    rejected = torch.full((b, t), NOT_REJECTED)
    teacher = RolloutTeacher(None, rejected, 4.0)
    same = ttt_loss(logits, rows, head, loss, 0.8, n, target,
                    weights=teacher.step_weights(torch.arange(b), masks))
    assert same == pytest.approx(float(plain))  # nothing rejected: training-time test as is
    anchor = int(masks[1][1].nonzero()[0])  # a trained step-1 entry of row 1
    rejected[1, anchor] = 1
    weights = teacher.step_weights(torch.arange(b), masks)
    assert [int((w != 1).sum()) for w in weights] == [0, 1, 0]
    entry = int(masks[1][0].sum())  # row-major: row 1's first step-1 entry follows row 0's
    only = [x[:0] for x in logits], [r[:0] for r in rows]  # that entry alone
    only[0][1], only[1][1] = logits[1][entry:entry + 1], rows[1][entry:entry + 1]
    single = ttt_loss(*only, head, loss, 0.8, n, target)  # 0.8 * D(entry) / n
    weighted = ttt_loss(logits, rows, head, loss, 0.8, n, target, weights=weights)
    assert float(single) > 0 and float(weighted) == pytest.approx(float(plain) + 3 * float(single))


def test_a_trained_head_warm_starts_on_its_rollouts(tmp_path, tiny_dirs, monkeypatch):
    """An on-policy eagle3 recipe from a trained head: every step its rollouts, sampled at
    their own temperature while the target's answers stay greedy, trained, and held-out tau
    measured as for any head; the recipe refuses what cannot work."""
    from draftkit.distill.trainer import train

    drawn = []
    draw = Rollouts.draw
    monkeypatch.setattr(Rollouts, "draw", lambda self, *a, **kw: drawn.append(a[7]) or draw(
        self, *a, **kw))
    best = train(distill_config(tmp_path, tiny_dirs, draft=dict(EAGLE3)), progress=False)
    warm = {**EAGLE3, "draft_vocab_size": None, "model": str(best)}
    onpolicy = {"data.regime": "on_policy", "data.lmbda": 1.0,
                "data.generate.on_policy_temperature": 1.0, "data.generate.max_new_tokens": 12}
    again = train(distill_config(tmp_path, tiny_dirs, "rollouts", max_steps=2, draft=warm,
                                 **onpolicy), progress=False)
    lines = [json.loads(x) for x in (tmp_path / "rollouts" / "metrics.jsonl").read_text()
             .splitlines()]
    assert [x["step"] for x in lines] == [0, 2] and lines[-1]["loss"] > 0
    assert drawn == [1.0] * 4  # 2 steps x grad_accum 2, each on rollouts at their temperature
    assert json.loads((again / "best.json").read_text())["tau"] >= lines[0]["tau"] - 1e-4
    with pytest.raises(ConfigError, match="set draft.model to a trained head"):
        distill_config(tmp_path, tiny_dirs, "x", draft=dict(EAGLE3), **onpolicy).validate()
    with pytest.raises(ConfigError, match="data.generate.engine: draftkit"):
        distill_config(tmp_path, tiny_dirs, "x", draft=warm, **onpolicy,
                       **{"data.generate.engine": "vllm"}).validate()
    with pytest.raises(ConfigError, match="key 'draft.rejection_weight' must be >= 1, got 0.5"):
        distill_config(tmp_path, tiny_dirs, "x", draft={**warm, "rejection_weight": 0.5},
                       **onpolicy).validate()
