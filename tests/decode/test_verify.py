"""The pure verify-and-accept functions, pinned with fixed logits and checked statistically."""

import pytest
import torch

from draftkit.decode.sampling import SamplingParams, probabilities, row_probabilities, sample
from draftkit.decode.verify import (Verdict, accept_test, committed_block, leading_accepts,
                                    residual, verify, verify_greedy, verify_sampled)
from tests.helpers import broken_verify, chi_square_p


def one_hot_logits(ids, vocab=6):
    x = torch.full((len(ids), vocab), -10.0)
    x[torch.arange(len(ids)), torch.tensor(ids)] = 10.0
    return x


def test_leading_accepts():
    acc = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    assert leading_accepts(acc).tolist() == [2, 0, 4]


def test_greedy_accepts_matching_prefix_then_target_token():
    # target argmax per position: 3, 1, 4, 2 (K = 3 drafted, 4 target positions)
    logits = one_hot_logits([3, 1, 4, 2])[None]  # (1, 4, V)
    cases = {(3, 1, 4): (3, 2), (3, 1, 0): (2, 4), (0, 1, 4): (0, 3), (3, 5, 4): (1, 1)}
    for draft, (n, nxt) in cases.items():
        v = verify_greedy(torch.tensor([draft]), logits)
        assert (v.num_accepted.item(), v.next_token.item()) == (n, nxt), draft


def test_sampled_pinned_decisions():
    """p >= q at the drafted token: always accepted; p = 0 there: always rejected and the
    residual max(0, p - q) fixes the replacement exactly."""
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])  # (K = 2, V)
    p_accept = torch.tensor([[0.6, 0.4, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0, 0, 0, 1.0]])
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        v = verify_sampled(torch.tensor([[0, 1]]), q[None], p_accept[None], gen)
        assert v.num_accepted.item() == 2 and v.next_token.item() == 3  # bonus from p_3
    # drafted token 1 has p = 0 at position 1: rejected; residual = max(0, p - q) = token 2
    p_reject = torch.tensor([[0.5, 0.0, 0.5, 0.0], [0.0, 1.0, 0.0, 0.0], [0, 0, 0, 1.0]])
    for _ in range(50):
        v = verify_sampled(torch.tensor([[1, 1]]), q[None], p_reject[None], gen)
        assert v.num_accepted.item() == 0 and v.next_token.item() == 2
    # beta = sum min(p, q) = 1 - TV
    v = verify_sampled(torch.tensor([[1, 1]]), q[None], p_reject[None], gen)
    assert v.beta[0].tolist() == pytest.approx([0.5, 1.0])


def test_accept_test_threshold():
    q = torch.tensor([[[0.8, 0.2]]])
    p = torch.tensor([[[0.4, 0.6], [0.5, 0.5]]])  # p/q at token 0 = 0.5
    d = torch.tensor([[0]])
    assert accept_test(d, q, p, torch.tensor([[0.49]])).item()
    assert not accept_test(d, q, p, torch.tensor([[0.51]])).item()


def test_a_token_the_target_rules_out_is_never_accepted():
    """float32 uniform draws are exactly 0 about once in 2^24: u * q <= p accepted a drafted
    token whose target probability top-k / top-p had set to 0, which plain sampling never
    emits. u = 0 must still accept every token the target allows."""
    q = torch.tensor([[[0.9, 0.1], [0.9, 0.1]]])
    p = torch.tensor([[[0.0, 1.0], [1e-30, 1.0], [0.5, 0.5]]])  # token 0: ruled out, then not
    d = torch.tensor([[0, 0]])
    assert accept_test(d, q, p, torch.zeros(1, 2)).tolist() == [[False, True]]


def test_residual_falls_back_to_p_when_empty():
    p = torch.tensor([[0.3, 0.7]])
    assert torch.allclose(residual(p, p.clone()), p)
    assert torch.allclose(residual(p, torch.tensor([[0.5, 0.5]])), torch.tensor([[0.0, 1.0]]))


def _emit_first(verify, p, q, n, gen):
    """Draw n rounds at once (vectorised): draft from q, verify, return the first emitted token
    and the second (accepted draft or target token)."""
    k = q.shape[0]
    qb, pb = q.expand(n, k, -1), p.expand(n, k + 1, -1)
    drafted = torch.stack([sample(qb[:, i], gen) for i in range(k)], dim=1)  # (n, K)
    v = verify(drafted, qb, pb, gen)
    first = torch.where(v.num_accepted > 0, drafted[:, 0], v.next_token)
    return first, v


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_p=0.9),
                                    SamplingParams(1.3, top_k=5)])
def test_verify_output_matches_target_chi_square(params):
    """Fixed random logits: the first emitted token of 40,000 rounds is distributed as p."""
    gen = torch.Generator().manual_seed(1)
    vocab, k = 12, 3
    lp = torch.randn(k + 1, vocab, generator=gen) * 1.5
    lq = lp + torch.randn(k + 1, vocab, generator=gen) * 1.5  # a different, related draft
    p, q = probabilities(lp, params), probabilities(lq[:k], params)
    first, v = _emit_first(verify_sampled, p, q, 40_000, gen)
    assert chi_square_p(torch.bincount(first, minlength=vocab), p[0]) > 0.01
    assert 0 < v.num_accepted.float().mean() < k  # both paths exercised
    # alpha estimated by counts equals E[beta] at position 1
    acc1 = (v.num_accepted > 0).float().mean()
    assert acc1.item() == pytest.approx(v.beta[:, 0].mean().item(), abs=0.01)


def test_chi_square_catches_broken_rule():
    gen = torch.Generator().manual_seed(1)
    params = SamplingParams(1.0)
    vocab, k = 12, 3
    lp = torch.randn(k + 1, vocab, generator=gen) * 1.5
    lq = lp + torch.randn(k + 1, vocab, generator=gen) * 1.5
    p, q = probabilities(lp, params), probabilities(lq[:k], params)
    first, _ = _emit_first(broken_verify, p, q, 40_000, gen)
    assert chi_square_p(torch.bincount(first, minlength=vocab), p[0]) < 0.01


@pytest.mark.parametrize("u, token", [(0.0, 1), (0.29, 1), (0.31, 2), (1.0, 2)])
def test_the_ends_of_the_uniform_draw_never_sample_a_zero_entry(monkeypatch, u, token):
    """Inverse transform sampling: u = 0 lands on the first token with mass, not a zero entry
    before it; u * total rounded up to total (u = 1 here, as a greedy row's filler draws) lands
    on the last token with mass, not a zero entry past it."""
    import draftkit.decode.sampling as sampling

    monkeypatch.setattr(sampling, "_draw", lambda out, generator: out.fill_(u))
    probs = torch.tensor([[0.0, 0.3, 0.7, 0.0]])
    assert sample(probs, None).tolist() == [token]


# --- a batch mixing greedy and sampled rows -----------------------------------------------------

GREEDY, WARM = SamplingParams(), SamplingParams(0.9, top_p=0.95)


def _mixed_round(params, k=3, vocab=8, seed=0):
    """Target logits (B, K + 1, V), and K tokens drafted as the engine drafts them: greedy
    rows take the draft's argmax, the others sample their warped q. Greedy rows draft the
    target's own argmax at their first two positions, so they accept something."""
    gen = torch.Generator().manual_seed(seed)
    bsz = len(params)
    target = torch.randn(bsz, k + 1, vocab, generator=gen) * 2
    draft = target + torch.randn(bsz, k + 1, vocab, generator=gen)
    for b, x in enumerate(params):
        if x.greedy:
            draft[b, :2] = target[b, :2]
    q = row_probabilities(draft[:, :k], params)  # (B, K, V)
    drafted = sample(q, gen)  # greedy rows: q is one-hot at the argmax
    return drafted, q, target


def _rows(v: Verdict, rows):
    return v.num_accepted[rows], v.next_token[rows], v.beta[rows]


def _assert_rows_equal(a: Verdict, b: Verdict, rows):
    for x, y in zip(_rows(a, rows), _rows(b, rows)):
        assert torch.equal(x, y)


@pytest.mark.parametrize("seed", range(5))
def test_mixed_batch_greedy_rows_are_verify_greedy_sampled_rows_verify_sampled(seed):
    params = [GREEDY, WARM, SamplingParams(1.3, top_k=4), GREEDY, WARM, WARM]
    greedy, sampled = [0, 3], [1, 2, 4, 5]
    drafted, q, logits = _mixed_round(params, seed=seed)
    v = verify(drafted, q, logits, params, torch.Generator().manual_seed(seed))
    _assert_rows_equal(v, verify_greedy(drafted, logits), greedy)
    p = row_probabilities(logits, params)  # (B, K + 1, V)
    _assert_rows_equal(v, verify_sampled(drafted, q, p, torch.Generator().manual_seed(seed)),
                       sampled)
    assert (v.num_accepted[greedy] >= 2).all()


def test_mixed_batch_with_per_row_generators():
    """A greedy row has no generator of its own (its uniform draws read 1, which the sampled
    test would reject); it still gets the exact argmax verdict, and a sampled row draws from
    its own generator whatever its neighbours are."""
    params = [GREEDY, WARM, GREEDY, WARM]
    drafted, q, logits = _mixed_round(params, seed=7)

    def gens():
        return [None, torch.Generator().manual_seed(1), None, torch.Generator().manual_seed(2)]
    v = verify(drafted, q, logits, params, gens())
    _assert_rows_equal(v, verify_greedy(drafted, logits), [0, 2])
    p = row_probabilities(logits, params)
    _assert_rows_equal(v, verify_sampled(drafted, q, p, gens()), [1, 3])
    assert (v.num_accepted[[0, 2]] >= 2).all()


def test_one_mode_batches_are_the_mode_s_own_verdict():
    drafted, q, logits = _mixed_round([GREEDY] * 3, seed=2)
    _assert_rows_equal(verify(drafted, None, logits, [GREEDY] * 3),
                       verify_greedy(drafted, logits), [0, 1, 2])
    drafted, q, logits = _mixed_round([WARM] * 3, seed=2)
    p = row_probabilities(logits, [WARM] * 3)
    _assert_rows_equal(verify(drafted, q, logits, [WARM] * 3, torch.Generator().manual_seed(4)),
                       verify_sampled(drafted, q, p, torch.Generator().manual_seed(4)),
                       [0, 1, 2])


def test_committed_block_is_the_accepted_drafts_then_the_target_token():
    drafted = torch.tensor([[4, 5, 6], [7, 8, 9], [1, 2, 3]])
    v = Verdict(torch.tensor([1, 3, 0]), torch.tensor([0, 2, 5]), torch.zeros(3, 3))
    block = committed_block(drafted, v)  # (B, K + 1)
    assert block.shape == (3, 4)
    assert [row[:n + 1] for row, n in zip(block.tolist(), [1, 3, 0])] == [[4, 0], [7, 8, 9, 2],
                                                                           [5]]
