"""What drawing one token costs: draftkit's sampler against the exponential race it replaced.

At temperature > 0 every drafted token and every plain step draws a token from a distribution
over the whole vocabulary. draftkit draws by inverse transform sampling
(:func:`draftkit.decode.sampling.sample`: one uniform number a row, a cumulative sum, a binary
search); the exponential race, argmax(probs / E) with E ~ Exp(1) (gpt-fast's sampler, and the
one draftkit used until 2026-12-04), draws V exponential numbers instead. This times both on
the same distributions, interleaved round by round, and prints each one's median, and the
race's time over draftkit's with a 95% bootstrap interval over the rounds. ``--reduced N``
makes the distributions zero outside N tokens, as a reduced draft head's are. Command (one
core, as a draft step runs beside nothing else)::

    OMP_NUM_THREADS=1 python eval/benchmarks/probes/sampler_cost.py
"""

from __future__ import annotations

import argparse
import statistics
import time


def exponential_race(probs, generator):
    """argmax(probs / E), E ~ Exp(1): a token drawn with probability probs / sum(probs)."""
    import torch

    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / noise.clamp_min_(torch.finfo(noise.dtype).tiny)).argmax(-1)


def main(argv: list[str] | None = None) -> int:
    import torch

    from draftkit.decode.clock import synchronize
    from draftkit.decode.sampling import sample
    from draftkit.metrics import bootstrap

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
    for b in args.batch_sizes:
        logits = torch.randn(b, args.vocab, generator=gen, device=device) * 3
        if args.reduced:
            keep = torch.randperm(args.vocab, generator=gen, device=device)[:args.reduced]
            outside = torch.ones(args.vocab, dtype=torch.bool, device=device)
            outside[keep] = False
            logits[:, outside] = float("-inf")
        probs = logits.softmax(-1)  # (B, V)
        times: dict[str, list[float]] = {name: [] for name in samplers}
        for r in range(args.rounds + 2):  # two rounds warm up, untimed
            order = list(samplers) if r % 2 else list(reversed(samplers))
            for name in order:
                synchronize(device)
                t = time.perf_counter()
                for _ in range(args.draws):
                    samplers[name](probs, gen)
                synchronize(device)
                if r >= 2:
                    times[name].append((time.perf_counter() - t) / args.draws * 1e3)
        ours, race = times["draftkit"], times["exponential race"]
        ratio, lo, hi = bootstrap(
            lambda idx: statistics.median(race[i] for i in idx)
            / statistics.median(ours[i] for i in idx), len(ours), resamples=2000)
        print(f"| {b} | {statistics.median(ours):.3f} | {statistics.median(race):.3f} | "
              f"{ratio:.1f}x ({lo:.1f}-{hi:.1f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
