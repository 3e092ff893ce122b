"""Held-out alpha per domain against hand-computed acceptance, with fixed logits."""

import math

import pytest
import torch

from draftkit.data import Rows
from draftkit.distill.evaluate import heldout_alpha
from draftkit.distill.schedule import lr_factor
from draftkit.distill.trainer import batch_rows


def _rows():
    ids = torch.tensor([[1, 2, 3, 0], [1, 2, 0, 0], [3, 3, 3, 3]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    return Rows(ids, mask, torch.tensor([0, 0, 1]), ["code", "math"])


def test_alpha_is_one_minus_tv_per_domain():
    p = torch.log(torch.tensor([0.7, 0.2, 0.1]))
    q = torch.log(torch.tensor([0.4, 0.4, 0.2]))
    target = lambda ids, pos: p.expand(*ids.shape, 3).clone()  # noqa: E731
    draft = lambda ids, pos: q.expand(*ids.shape, 3).clone()  # noqa: E731
    out = heldout_alpha(draft, target, _rows(), batch_size=2)
    beta = sum(min(a, b) for a, b in zip([0.7, 0.2, 0.1], [0.4, 0.4, 0.2]))  # 0.7
    assert out["alpha/code"] == pytest.approx(beta) and out["alpha/math"] == pytest.approx(beta)
    assert out["alpha"] == pytest.approx(beta)
    same = heldout_alpha(target, target, _rows())
    assert same["alpha/code"] == pytest.approx(1.0)


def test_a_reduced_head_is_scored_as_it_decodes():
    """A draft with a reduced head vocabulary proposes from q renormalised over it: q = (0.4,
    0.4, 0.2) on tokens {0, 2} is (2/3, 0, 1/3), and 1 - TV against p = (0.7, 0.2, 0.1) is
    2/3 + 0.1, not the whole head's 0.7."""
    from types import SimpleNamespace

    from draftkit.distill.evaluate import model_logits
    from draftkit.models.reduced_head import ReducedHead

    class Draft(torch.nn.Module):
        reduced_head = ReducedHead([0, 2], 3)  # what load_model attaches from draft_vocab.json

        def forward(self, input_ids, position_ids, use_cache):
            q = torch.log(torch.tensor([0.4, 0.4, 0.2]))
            return SimpleNamespace(logits=q.expand(*input_ids.shape, 3).clone())

    p = torch.log(torch.tensor([0.7, 0.2, 0.1]))
    target = lambda ids, pos: p.expand(*ids.shape, 3).clone()  # noqa: E731
    out = heldout_alpha(model_logits(Draft(), "cpu"), target, _rows())
    assert out["alpha"] == pytest.approx(2 / 3 + 0.1)
    whole = model_logits(Draft(), "cpu", head=ReducedHead(range(3), 3))
    assert heldout_alpha(whole, target, _rows())["alpha"] == pytest.approx(0.7)


def test_alpha_weights_tokens_by_domain():
    def target(ids, pos):  # row-dependent: rows of token 3 (math) get a uniform target
        out = torch.zeros(*ids.shape, 2)
        out[..., 0] = torch.where(ids[..., :1] == 3, 0.0, 50.0)
        return out
    draft = lambda ids, pos: torch.zeros(*ids.shape, 2)  # noqa: E731  uniform
    out = heldout_alpha(draft, target, _rows(), batch_size=1)
    assert out["alpha/code"] == pytest.approx(0.5, abs=1e-6)  # p = (1, 0), q = (.5, .5)
    assert out["alpha/math"] == pytest.approx(1.0)
    assert out["alpha"] == pytest.approx((3 * 0.5 + 3 * 1.0) / 6, abs=1e-6)


def test_schedule_and_data_order():
    assert lr_factor(0, 4, 100, 0.1) == pytest.approx(0.25)
    assert lr_factor(3, 4, 100, 0.1) == pytest.approx(1.0)
    assert lr_factor(4, 4, 100, 0.1) < 1.0  # the peak is used once, on the last warmup step
    assert lr_factor(99, 4, 100, 0.1) == pytest.approx(0.1)  # the last step is at the floor
    mid = 3 + 48
    half = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))
    assert lr_factor(mid, 4, 100, 0.1) == pytest.approx(half)
    assert lr_factor(0, 0, 10, 0.1) == 1.0 and lr_factor(9, 0, 10, 0.1) == pytest.approx(0.1)
    # one epoch visits every row once; ranks split each global batch without overlap
    seen = torch.cat([batch_rows(m, 10, 2, seed=3) for m in range(5)]).tolist()
    assert sorted(seen) == list(range(10))
    r0, r1 = batch_rows(0, 10, 2, 3, 0, 2), batch_rows(0, 10, 2, 3, 1, 2)
    assert torch.cat([r0, r1]).tolist() == torch.cat([batch_rows(0, 10, 2, 3),
                                                      batch_rows(1, 10, 2, 3)]).tolist()
