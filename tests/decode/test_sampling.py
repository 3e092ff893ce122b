import pytest
import torch

from draftkit.decode.sampling import SamplingParams, probabilities, sample, warp_logits
from draftkit.errors import DraftkitError


def test_top_k_and_top_p_keep_expected_tokens():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))
    assert (probabilities(logits, SamplingParams(1.0, top_k=2)) > 0).tolist() == \
        [True, True, False, False]
    # top_p 0.7: 0.5 alone is below it, 0.5 + 0.25 reaches it -> two tokens kept
    assert (probabilities(logits, SamplingParams(1.0, top_p=0.7)) > 0).tolist() == \
        [True, True, False, False]
    assert (probabilities(logits, SamplingParams(1.0, top_p=0.5)) > 0).tolist() == \
        [True, False, False, False]
    p = probabilities(logits, SamplingParams(1.0, top_p=0.95))
    assert p.sum().item() == pytest.approx(1.0) and (p > 0).sum() == 4


def test_a_tiny_temperature_is_greedy():
    """logits / 1e-40 overflow to NaN probabilities: such a temperature decodes as greedy."""
    assert SamplingParams(1e-40).greedy and SamplingParams(0.0).greedy
    assert not SamplingParams(1e-3).greedy


def test_warp_identical_for_batched_shapes():
    x = torch.randn(3, 5, 50)
    params = SamplingParams(0.8, top_k=10, top_p=0.9)
    full = warp_logits(x, params)
    for i in range(3):
        assert torch.equal(full[i], warp_logits(x[i], params))


def test_sample_follows_probs_and_is_seeded():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3]).expand(100_000, 4)
    a = sample(probs, torch.Generator().manual_seed(3))
    b = sample(probs, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    freq = torch.bincount(a, minlength=4).float() / a.numel()
    assert freq[1] == 0
    assert torch.allclose(freq, probs[0], atol=0.01)


def test_a_block_of_positions_per_row_is_chosen_by_each_rows_own_parameters():
    """next_tokens over (B, K, V), as the engine chooses a parallel head's K drafts at once: a
    greedy row takes its argmax at every position, a sampled row draws each position from its
    own distribution (one-hot ones here, so the draw is known), q (B, K, V)."""
    from draftkit.decode.sampling import next_tokens

    logits = torch.randn(3, 4, 12, generator=torch.Generator().manual_seed(0))
    sampled = torch.full_like(logits[1], -1e9).scatter(-1, torch.tensor([[7], [2], [9], [0]]), 0)
    logits[1] = sampled  # row 1 samples distributions with all their mass on one token
    params = [SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.0)]
    gens = [None, torch.Generator().manual_seed(1), None]
    tokens, q = next_tokens(logits, params, gens)
    assert tokens.shape == (3, 4) and q.shape == (3, 4, 12)
    assert torch.equal(tokens[[0, 2]], logits[[0, 2]].argmax(-1))
    assert tokens[1].tolist() == [7, 2, 9, 0]
    assert torch.equal(next_tokens(logits[[0, 2]], [params[0]] * 2, None)[0], tokens[[0, 2]])


@pytest.mark.parametrize("kw", [{"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5},
                                {"top_k": -1}])
def test_bad_sampling_params(kw):
    with pytest.raises(DraftkitError):
        SamplingParams(**kw)


def test_the_sampler_cost_probe_draws_as_draftkit_does_and_prints_both(capsys):
    """eval/benchmarks/probes/sampler_cost.py: its exponential race (the sampler it is held
    against) draws the same distribution, and it prints a row per batch size."""
    from pathlib import Path

    from tests.helpers import load_script

    script = load_script(Path(__file__).parents[2] / "eval" / "benchmarks" / "probes"
                         / "sampler_cost.py")
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3]).expand(50_000, 4)
    freq = torch.bincount(script.exponential_race(probs, torch.Generator().manual_seed(0)),
                          minlength=4).float() / 50_000
    assert freq[1] == 0 and torch.allclose(freq, probs[0], atol=0.01)
    assert script.main(["--vocab", "64", "--reduced", "16", "--batch-sizes", "1", "2",
                        "--rounds", "3", "--draws", "2"]) == 0
    out = capsys.readouterr().out.split("\n\n")
    rows = [x for x in out[0].splitlines() if x.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| 1", "| 2"]  # under the header
    rows = [x for x in out[1].splitlines() if x.startswith("| ")]  # among N against among V
    assert [r.split(" | ")[:2] for r in rows[1:]] == [["| 0", "1"], ["| 0", "2"], ["| 1", "1"],
                                                      ["| 1", "2"]]

