"""What verifying K + 1 tokens costs against one plain step: T(n) / T(1) of the fast-path forward.

Speculation pays only if a forward over K + 1 new tokens costs little more than over one
(memory-bound decoding). This times ``LlamaRunner.forward`` on the target at a cache of
``--context`` tokens for n = 1..``--max-tokens`` new tokens, interleaved over ``--repeats``
rounds, and prints the medians; ``--fixed-layouts`` skips the per-machine layout timing of
:mod:`draftkit.decode.cpu_linear` to show what it buys. Command (2 CPU cores)::

    OMP_NUM_THREADS=2 python eval/benchmarks/reproduce/verify_cost.py
    OMP_NUM_THREADS=2 python eval/benchmarks/reproduce/verify_cost.py --fixed-layouts
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    import torch

    from draftkit.decode import cpu_linear
    from draftkit.decode.clock import synchronize
    from draftkit.decode.runners import LlamaRunner
    from draftkit.models import load_pair

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--device", default=None)
    ap.add_argument("--context", type=int, default=200, help="tokens already in the cache")
    ap.add_argument("--max-tokens", type=int, default=9, help="largest n (K + 1) timed")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--fixed-layouts", action="store_true",
                    help="keep the fixed CPU matmul layouts instead of timing them")
    args = ap.parse_args(argv)

    if args.fixed_layouts:
        cpu_linear.MIN_TUNE_BYTES = float("inf")
    pair = load_pair(args.target, None, device=args.device)
    start = time.perf_counter()
    runner = LlamaRunner(pair.target)
    print(f"runner set-up (layout timing included): {time.perf_counter() - start:.1f} s")
    device = runner.param.device
    runner.reset(1, args.context + args.max_tokens + 1)
    vocab = runner.vocab_size
    times: dict[int, list[float]] = {n: [] for n in range(1, args.max_tokens + 1)}
    with torch.inference_mode():
        runner.forward(torch.randint(0, vocab, (1, args.context), device=device), [0])
        for _ in range(args.repeats + 2):  # the first two rounds warm up, untimed
            for n in times:
                tokens = torch.randint(0, vocab, (1, n), device=device)
                synchronize(device)
                t = time.perf_counter()
                runner.forward(tokens, [args.context])
                synchronize(device)
                times[n].append(time.perf_counter() - t)
    t1 = statistics.median(times[1][2:])
    print("| new tokens | median ms | T(n) / T(1) |")
    print("|---|---|---|")
    for n, ts in times.items():
        med = statistics.median(ts[2:])
        print(f"| {n} | {med * 1e3:.1f} | {med / t1:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
