"""The divergences against brute-force per-token sums written out from the definitions."""

import math

import pytest
import torch

from draftkit.distill.losses import (dense_logprobs, divergence, forward_kl, jsd, masked_mean,
                                     reverse_kl, sparse_logprobs, tvd, with_tail)


def _dists(seed=0, shape=(2, 3, 7), scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale,
            torch.randn(shape, generator=g, dtype=torch.float64) * scale)


def _brute(name, p, q, beta=0.5):
    """One position, plain Python over the vocabulary."""
    if name == "fkl":
        return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q) if pi > 0)
    if name == "rkl":
        return sum(qi * math.log(qi / pi) for pi, qi in zip(p, q) if qi > 0)
    if name == "tvd":
        return 0.5 * sum(abs(pi - qi) for pi, qi in zip(p, q))
    m = [beta * pi + (1 - beta) * qi for pi, qi in zip(p, q)]
    kl = lambda a, b: sum(ai * math.log(ai / bi) for ai, bi in zip(a, b) if ai > 0)  # noqa
    return beta * kl(p, m) + (1 - beta) * kl(q, m)


@pytest.mark.parametrize("name", ["fkl", "rkl", "jsd", "tvd"])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.0])
def test_dense_matches_brute_force(name, temperature):
    teacher, student = _dists()  # logits: (B, T, V)
    p_logp, q_logp = dense_logprobs(teacher, temperature), dense_logprobs(student, temperature)
    got = divergence(name, p_logp.double(), q_logp.double(), beta=0.3)  # (B, T)
    p_all = torch.softmax(teacher / temperature, -1)
    q_all = torch.softmax(student / temperature, -1)
    for b in range(2):
        for t in range(3):
            want = _brute(name, p_all[b, t].tolist(), q_all[b, t].tolist(), beta=0.3)
            assert got[b, t].item() == pytest.approx(want, rel=1e-4, abs=1e-6)


def test_identities():
    teacher, student = _dists(1)
    p, q = dense_logprobs(teacher), dense_logprobs(student)
    for f in (forward_kl, reverse_kl, tvd, lambda a, b: jsd(a, b, 0.5)):
        assert torch.allclose(f(p, p), torch.zeros(2, 3), atol=1e-6)
        assert (f(p, q) >= -1e-6).all()
    assert torch.allclose(reverse_kl(p, q), forward_kl(q, p))
    assert torch.allclose(jsd(p, q, 0.5), jsd(q, p, 0.5), atol=1e-6)  # symmetric at 0.5
    assert (tvd(p, q) <= 1.0).all()
    with pytest.raises(ValueError):
        jsd(p, q, 0.0)


def test_teacher_zero_mass_has_finite_loss_and_grads():
    student = torch.randn(1, 2, 5, requires_grad=True)
    p_logp = torch.log(torch.tensor([[[0.5, 0.5, 0.0, 0.0, 0.0]] * 2]))  # -inf entries
    # Reverse KL is rightly infinite here (q has mass where p has none); the others are finite.
    for name in ("fkl", "jsd", "tvd"):
        loss = divergence(name, p_logp, dense_logprobs(student)).sum()
        (grad,) = torch.autograd.grad(loss, student)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), name


def test_a_token_both_rule_out_leaves_every_gradient_finite():
    """Top-k / top-p masks or a padded vocabulary put -inf in both models' logits at the same
    token: JSD's log m there had a nan gradient, which spread over the whole row."""
    t = torch.randn(1, 2, 6)
    t[..., 0] = float("-inf")
    s = torch.randn(1, 2, 6)
    s[..., 0] = float("-inf")
    for name in ("fkl", "rkl", "jsd", "tvd"):
        student = s.clone().requires_grad_()
        loss = divergence(name, dense_logprobs(t), dense_logprobs(student), 0.5).sum()
        (grad,) = torch.autograd.grad(loss, student)
        assert torch.isfinite(loss) and torch.isfinite(grad[..., 1:]).all(), name
    beta = 0.3  # the value is unchanged: p = q = 0 at token 0 contributes nothing
    value = divergence("jsd", dense_logprobs(t), dense_logprobs(s), beta)
    ref = divergence("jsd", dense_logprobs(t[..., 1:]), dense_logprobs(s[..., 1:]), beta)
    assert torch.allclose(value, ref)


@pytest.mark.parametrize("name", ["fkl", "rkl", "jsd", "tvd"])
def test_sparse_with_tail_matches_brute_force(name):
    teacher, student = _dists(2, shape=(1, 2, 9))
    k, temperature = 3, 1.5
    p_full = dense_logprobs(teacher, temperature)
    p_topk, ids = p_full.topk(k, dim=-1)  # what the cache stores: (B, T, k)
    p_s, q_s = sparse_logprobs(student, p_topk, ids, temperature)
    assert p_s.shape == (1, 2, k + 1)
    got = divergence(name, p_s, q_s, beta=0.6)
    q_all = torch.softmax(student / temperature, -1)
    for t in range(2):
        kept = ids[0, t].tolist()
        p = [p_full[0, t, i].exp().item() for i in kept]
        q = [q_all[0, t, i].item() for i in kept]
        p.append(1 - sum(p))  # the tail bucket
        q.append(1 - sum(q))
        assert got[0, t].item() == pytest.approx(_brute(name, p, q, 0.6), rel=1e-4, abs=1e-6)


def test_sparse_with_full_support_equals_dense():
    teacher, student = _dists(3, shape=(1, 2, 6))
    p_full = dense_logprobs(teacher)
    p_topk, ids = p_full.topk(6, dim=-1)
    p_s, q_s = sparse_logprobs(student, p_topk, ids)
    assert torch.allclose(tvd(p_s, q_s), tvd(p_full, dense_logprobs(student)), atol=1e-5)
    assert torch.allclose(forward_kl(p_s, q_s), forward_kl(p_full, dense_logprobs(student)),
                          atol=1e-4)


def test_sparse_renormalised_without_tail():
    teacher, student = _dists(4, shape=(1, 1, 8))
    p_topk, ids = dense_logprobs(teacher).topk(2, dim=-1)
    p_s, q_s = sparse_logprobs(student, p_topk, ids, tail=False)
    assert p_s.shape == (1, 1, 2)
    assert torch.allclose(p_s.exp().sum(-1), torch.ones(1, 1, dtype=p_s.dtype))
    assert torch.allclose(q_s.exp().sum(-1), torch.ones(1, 1, dtype=q_s.dtype))


def test_next_token_ce():
    from draftkit.distill.losses import next_token_ce

    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    want = -(torch.log_softmax(logits, -1)[0, 0] + torch.log_softmax(logits, -1)[1, 2]) / 2
    assert next_token_ce(logits, torch.tensor([0, 2])).item() == pytest.approx(want.item())


def test_tail_and_masked_mean():
    full = torch.log(torch.tensor([[0.5, 0.3]]))
    assert torch.allclose(with_tail(full).exp(), torch.tensor([[0.5, 0.3, 0.2]]))
    assert torch.isfinite(with_tail(torch.log(torch.tensor([[0.6, 0.4]])))).all()
    vals = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[0, 1, 1], [0, 0, 1]], dtype=torch.bool)
    assert masked_mean(vals, mask).item() == pytest.approx((2 + 3 + 6) / 3)
    assert masked_mean(vals, torch.zeros_like(mask)).item() == 0.0


def test_masked_mean_leaves_out_what_the_mask_leaves_out():
    values = torch.tensor([[1.0, float("inf")], [3.0, float("nan")]])
    mask = torch.tensor([[True, False], [True, False]])
    assert masked_mean(values, mask).item() == pytest.approx(2.0)
