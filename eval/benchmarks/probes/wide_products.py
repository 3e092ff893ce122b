"""What the wide products' measured layouts buy: the target's forward over more rows than
``MAX_ROWS`` (a batch's verify, B (K + 1) rows; a prefill) with the form
:mod:`draftkit.decode.cpu_linear` measured for its bucket, against ``F.linear``, the fixed
choice the engine used for every such product until 2026-12-07.

Two runners of one target: one as decoding builds it, one whose ``WIDE_ROWS`` buckets are
pinned to ``F.linear``; each (batch, new tokens) shape is timed on both in turn
(:func:`draftkit.decode.clock.interleaved_ms`), at a cache of ``--context`` tokens (a prefill of
``--prefill`` tokens starts at 0), and the table gives each one's median and the measured
form's time over ``F.linear``'s with a 95% interval over the rounds. Command (2 CPU cores)::

    OMP_NUM_THREADS=2 python eval/benchmarks/probes/wide_products.py
"""

from __future__ import annotations

import argparse
import statistics


def shape(text: str) -> tuple[int, int]:
    """``BxT``: a batch of B rows, T new tokens each."""
    try:
        b, t = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not BxT, e.g. 2x5") from None
    if b < 1 or t < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: B and T must be at least 1")
    return b, t


def main(argv: list[str] | None = None) -> int:
    import torch

    from draftkit.decode.clock import interleaved_ms
    from draftkit.decode.cpu_linear import WIDE_ROWS
    from draftkit.decode.runners import LlamaRunner
    from draftkit.metrics import median_ratio
    from draftkit.models import dtype_name, load_pair

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="embedded", help="the target whose forward is timed")
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                    help="the target's dtype; auto: float32 on a CPU")
    ap.add_argument("--shapes", type=shape, nargs="+",
                    default=[(1, 1), (1, 9), (2, 5), (4, 4), (8, 4)],
                    help="BxT: B rows of T new tokens each, verified at once")
    ap.add_argument("--prefill", type=int, default=128, help="a prompt's length, 0: none")
    ap.add_argument("--context", type=int, default=200, help="tokens already in the cache")
    ap.add_argument("--rounds", type=int, default=12, help="timed rounds")
    args = ap.parse_args(argv)

    pair = load_pair(args.target, None, device="cpu", dtype=args.dtype)
    runners = {"measured": LlamaRunner(pair.target), "F.linear": LlamaRunner(pair.target)}
    for lin in runners["F.linear"].linears():
        lin.set_forms({**lin.forms, **{b: "linear" for b in WIDE_ROWS}}, lin.pad)
    head = runners["measured"].w_head
    print(f"{dtype_name(pair.target)}, {torch.get_num_threads()} threads; the target's head "
          f"took " + ", ".join(f"{head.forms[b]} for {b} rows" for b in WIDE_ROWS))
    gen = torch.Generator().manual_seed(0)
    vocab = runners["measured"].vocab_size
    work = [(b, t, args.context) for b, t in args.shapes]
    work += [(1, args.prefill, 0)] if args.prefill else []
    print("| batch | new tokens | rows | measured ms | F.linear ms | measured / F.linear (95%) |")
    print("|---|---|---|---|---|---|")
    with torch.inference_mode():
        for b, t, at in work:
            for runner in runners.values():
                runner.reset(b, args.context + t + 1)
                if at:
                    runner.forward(torch.randint(0, vocab, (b, at), generator=gen), [0] * b)
            tokens = torch.randint(0, vocab, (b, t), generator=gen)
            times = interleaved_ms({name: (lambda r=r: r.forward(tokens, [at] * b))
                                    for name, r in runners.items()},
                                   args.rounds, 1, torch.device("cpu"))
            ratio, low, high = median_ratio(times["measured"], times["F.linear"])
            print(f"| {b} | {t} | {b * t} | {statistics.median(times['measured']):.1f} | "
                  f"{statistics.median(times['F.linear']):.1f} | {ratio:.2f} "
                  f"({low:.2f}-{high:.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
