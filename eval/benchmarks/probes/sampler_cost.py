"""What drawing one token costs: draftkit's sampler against the exponential race it replaced,
and a reduced head's draft chosen among its N tokens against among all V.

At temperature > 0 every drafted token and every plain step draws a token from a distribution
over the whole vocabulary. draftkit draws by inverse transform sampling
(:func:`draftkit.decode.sampling.sample`: one uniform number a row, a cumulative sum, a binary
search); the exponential race, argmax(probs / E) with E ~ Exp(1) (gpt-fast's sampler, and the
one draftkit used until 2026-12-04), draws V exponential numbers instead. This times both on
the same distributions, interleaved round by round, and prints each one's median, and the
race's time over draftkit's with a 95% bootstrap interval over the rounds. ``--reduced N``
makes the distributions zero outside N tokens, as a reduced draft head's are.

With ``--reduced N`` a second table times choosing a draft (greedy and at temperature 1) as the
engine does, among the head's N tokens, mapped to the target's ids and q widened with zeros,
against widening the logits to V with -inf outside the head first (the engine's way until
2026-12-06; the same tokens for a head whose ids are sorted). Command (one core, as a draft
step runs beside nothing else)::

    OMP_NUM_THREADS=1 python eval/benchmarks/probes/sampler_cost.py
"""

from __future__ import annotations

import argparse
import statistics


def exponential_race(probs, generator):
    """argmax(probs / E), E ~ Exp(1): a token drawn with probability probs / sum(probs)."""
    import torch

    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / noise.clamp_min_(torch.finfo(noise.dtype).tiny)).argmax(-1)


def main(argv: list[str] | None = None) -> int:
    import torch

    from draftkit.decode.clock import interleaved_ms
    from draftkit.decode.sampling import sample
    from draftkit.metrics import median_ratio
    from draftkit.models.reduced_head import ReducedHead

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=49152, help="V (SmolLM2's by default)")
    ap.add_argument("--reduced", type=int, default=4096,
                    help="zero the distributions outside this many tokens (0: whole V)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--draws", type=int, default=20, help="draws timed together in a round")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    samplers = {"draftkit": sample, "exponential race": exponential_race}
    print(f"V {args.vocab}, {'whole vocabulary' if not args.reduced else f'{args.reduced} tokens'}"
          f", {torch.get_num_threads()} threads, {args.device}")
    print("| batch | draftkit ms a draw | exponential race ms | race / draftkit (95%) |")
    print("|---|---|---|---|")
    head = None if not args.reduced else ReducedHead(
        torch.randperm(args.vocab, generator=gen, device=device)[:args.reduced].sort().values,
        args.vocab)
    for b in args.batch_sizes:
        logits = torch.randn(b, args.vocab, generator=gen, device=device) * 3
        if head is not None:
            logits = head.expand(head.restrict(logits))  # -inf outside the head
        probs = logits.softmax(-1)  # (B, V)
        times = interleaved_ms({name: (lambda f=f: f(probs, gen)) for name, f in samplers.items()},
                               args.rounds, args.draws, device)
        ours, race = times["draftkit"], times["exponential race"]
        ratio, lo, hi = median_ratio(race, ours)
        print(f"| {b} | {statistics.median(ours):.3f} | {statistics.median(race):.3f} | "
              f"{ratio:.1f}x ({lo:.1f}-{hi:.1f}) |")
    if head is not None:
        among_head(head, args, gen, device)
    return 0


def among_head(head, args, gen, device) -> None:
    """The second table (module docstring): a draft chosen among the head's N tokens, as the
    engine chooses it, against among all V."""
    import torch

    from draftkit.decode.clock import interleaved_ms
    from draftkit.decode.sampling import SamplingParams, next_tokens, next_tokens_among
    from draftkit.metrics import median_ratio

    def over_n(logits, params):  # the engine's way
        return next_tokens_among(logits, params, gen, head)

    def over_v(logits, params):  # widen to V first, -inf outside the head
        return next_tokens(head.expand(logits), params, gen)

    print(f"\na draft among the head's {len(head)} tokens against among all {head.vocab_size}")
    print("| temperature | batch | among N ms a token | among V ms | V / N (95%) |")
    print("|---|---|---|---|---|")
    for temperature in (0.0, 1.0):
        for b in args.batch_sizes:
            logits = torch.randn(b, len(head), generator=gen, device=device) * 3  # (B, N)
            params = [SamplingParams(temperature)] * b
            times = interleaved_ms({"N": lambda: over_n(logits, params),
                                    "V": lambda: over_v(logits, params)},
                                   args.rounds, args.draws, device)
            ratio, lo, hi = median_ratio(times["V"], times["N"])
            print(f"| {temperature:g} | {b} | {statistics.median(times['N']):.3f} | "
                  f"{statistics.median(times['V']):.3f} | {ratio:.1f}x ({lo:.1f}-{hi:.1f}) |")


if __name__ == "__main__":
    raise SystemExit(main())
