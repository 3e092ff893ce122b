"""What verifying K + 1 tokens costs against one plain step: T(n) / T(1) of the fast-path forward.

Speculation pays only if a forward over K + 1 new tokens costs little more than over one
(memory-bound decoding). This times ``LlamaRunner.forward`` on the target at a cache of
``--context`` tokens for n = 1..``--max-tokens`` new tokens, interleaved over ``--repeats``
rounds (:func:`draftkit.decode.clock.interleaved_ms`), and prints the medians;
``--fixed-layouts`` skips the per-machine layout timing of :mod:`draftkit.decode.cpu_linear` to
show what it buys. ``--dtype`` takes several dtypes: the target is loaded in each and every
(dtype, n) forward is timed in the same rounds, so the plain steps of the dtypes are compared
side by side, with an interval (on a CPU that multiplies bfloat16 natively, AVX-512 BF16 or
AMX, bfloat16 can be the faster one). Command (2 CPU cores)::

    OMP_NUM_THREADS=2 python eval/benchmarks/reproduce/verify_cost.py
    OMP_NUM_THREADS=2 python eval/benchmarks/reproduce/verify_cost.py --fixed-layouts
    OMP_NUM_THREADS=2 python eval/benchmarks/reproduce/verify_cost.py --dtype float32 bfloat16
"""

from __future__ import annotations

import argparse
import statistics
import time

def main(argv: list[str] | None = None) -> int:
    import torch

    from draftkit.decode import cpu_linear
    from draftkit.decode.clock import interleaved_ms
    from draftkit.decode.runners import LlamaRunner
    from draftkit.metrics import median_ratio
    from draftkit.models import default_device, dtype_name, load_pair, parse_dtype
    from draftkit.models.load import DTYPES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="embedded", help="the target whose forward is timed")
    ap.add_argument("--device", default=None, help="cpu, cuda, ...; default: cuda if present")
    ap.add_argument("--dtype", nargs="+", default=["auto"], choices=DTYPES,
                    help="one or more dtypes, timed side by side; auto: bf16 on GPU, fp32 on CPU")
    ap.add_argument("--context", type=int, default=200, help="tokens already in the cache")
    ap.add_argument("--max-tokens", type=int, default=9, help="largest n (K + 1) timed")
    ap.add_argument("--repeats", type=int, default=15, help="timed rounds")
    ap.add_argument("--fixed-layouts", action="store_true",
                    help="keep the fixed CPU matmul layouts instead of timing them")
    args = ap.parse_args(argv)
    device_name = args.device or default_device()
    if len({parse_dtype(d, device_name) for d in args.dtype}) != len(args.dtype):
        ap.error(f"--dtype {' '.join(args.dtype)} names one dtype twice on {device_name} "
                 f"(auto is float32 on a CPU, bfloat16 on a GPU)")

    if args.fixed_layouts:
        cpu_linear.MIN_TUNE_BYTES = float("inf")
    runners = {}
    for dtype in args.dtype:
        pair = load_pair(args.target, None, device=device_name, dtype=dtype)
        start = time.perf_counter()
        runner = LlamaRunner(pair.target)
        name = dtype_name(pair.target)
        print(f"{name}: runner set-up (layout timing included): "
              f"{time.perf_counter() - start:.1f} s")
        runner.reset(1, args.context + args.max_tokens + 1)
        runners[name] = runner
    device = next(iter(runners.values())).param.device
    gen = torch.Generator().manual_seed(0)
    ns = range(1, args.max_tokens + 1)
    ways = {}
    with torch.inference_mode():
        for name, runner in runners.items():
            runner.forward(torch.randint(0, runner.vocab_size, (1, args.context),
                                         generator=gen).to(device), [0])
            for n in ns:
                tokens = torch.randint(0, runner.vocab_size, (1, n), generator=gen).to(device)
                ways[name, n] = (lambda r=runner, x=tokens: r.forward(x, [args.context]))
        # every (dtype, n) in each round: the cache is written at the same positions each
        # time, so every forward sees a context of --context tokens
        times = interleaved_ms(ways, args.repeats, 1, device)
    names = list(runners)
    print("| new tokens | " + " | ".join(f"{d} median ms | {d} T(n) / T(1)" for d in names)
          + " |")
    print("|---|" + "---|---|" * len(names))
    for n in ns:
        cells = []
        for d in names:
            med = statistics.median(times[d, n])
            cells += [f"{med:.1f}", f"{med / statistics.median(times[d, 1]):.2f}"]
        print(f"| {n} | " + " | ".join(cells) + " |")
    for d in names[1:]:
        ratio, low, high = median_ratio(times[d, 1], times[names[0], 1])
        print(f"plain step time, {d} / {names[0]}: {ratio:.2f} (95% {low:.2f}-{high:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
