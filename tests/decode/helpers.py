"""Models and reference computations for the decoder tests (tiny, built in-process)."""

from __future__ import annotations

import copy


def tiny_target_and_draft(vocab_size: int | None = None, target_layers: int = 3, seed: int = 0):
    """A tiny random Llama target and an unrelated 1-layer draft (low acceptance)."""
    from tests.tiny import make_llama, make_tokenizer

    v = vocab_size or len(make_tokenizer())
    return make_llama(v, num_layers=target_layers, seed=seed), make_llama(v, num_layers=1,
                                                                          seed=seed + 1)


def noisy_copy(model, scale: float = 0.02, seed: int = 7):
    """The target with small weight noise: a draft that agrees most of the time, so rounds
    accept several tokens and the bonus / catch-up path runs."""
    import torch

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=gen) * scale)
    return draft


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos_token_id=None) -> list[int]:
    """Plain greedy decoding with HF ``generate``: the reference our engine must match."""
    import torch

    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                             dtype=torch.long), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=eos_token_id, pad_token_id=0, temperature=None,
                             top_p=None, top_k=None)
    return out[0, len(prompt):].tolist()


def chi_square_p(observed, expected_probs, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit; bins expected below ``min_expected`` are pooled.

    observed: (V,) counts; expected_probs: (V,) summing to 1. p = Q(df/2, stat/2).
    """
    import torch

    observed = observed.double()
    expected = expected_probs.double() * observed.sum()
    small = expected < min_expected
    obs = torch.cat([observed[~small], observed[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    if (obs[~keep] > 0).any():
        return 0.0  # a token the target can never produce was produced
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))


def exact_marginals(model, prompt: list[int], params, steps: int = 3):
    """Exact distributions of generated tokens 1..steps under warped sampling from ``model``.

    Enumerates every prefix (V^(steps-1) rows at the last step), so keep V small.
    Returns a list of (V,) tensors.
    """
    import torch

    from draftkit.decode.sampling import probabilities

    v = model.config.vocab_size
    prefixes = torch.tensor([prompt])  # (N, P + t)
    weights = torch.ones(1, dtype=torch.float64)  # probability of each prefix
    out = []
    with torch.inference_mode():
        for _ in range(steps):
            logits = model(prefixes).logits[:, -1]  # (N, V)
            p = probabilities(logits, params).double()  # (N, V)
            joint = weights[:, None] * p  # (N, V)
            out.append(joint.sum(0))
            n = prefixes.shape[0]
            prefixes = torch.cat([prefixes.repeat_interleave(v, 0),
                                  torch.arange(v).repeat(n)[:, None]], dim=1)
            weights = joint.reshape(-1)
    return out
