"""What a drafting round costs a parallel EAGLE-3 head (P-EAGLE, arXiv 2602.01469) against an
autoregressive one, with the engine's own runner, per number of pending target features.

An autoregressive head drafts K tokens in K forwards: the first reads the round's pending target
features (the tokens the last verify committed, n of them) and scores d_1, each later one reads
the head's own output and d_i. A parallel head drafts all K in one forward over the n features
and K - 1 placeholders. The issue's bar compares the parallel round with one autoregressive
step (the autoregressive round over K).

Each timed round is one drafting lap as the engine runs it (the features fused, the forwards,
the greedy choice of the drafts among the head's tokens), the two heads in turn, the order
reversed every other round (:func:`draftkit.decode.clock.interleaved_ms`). ``--between
verify`` (the default) runs the target's (K + 1)-token verify forward before each lap,
untimed, as decoding does, so a head's weights come from memory where the target's pushed
them out of the caches; ``--between none`` times the laps back to back, weights in cache.
The ratio's interval resamples whole rounds (:func:`draftkit.metrics.median_ratio`). Command
(two heads for one target, e.g. the ``rounds`` stage's untrained ones from
``eval/benchmarks/reproduce/gpu_check.py round-heads``)::

    OMP_NUM_THREADS=2 python eval/benchmarks/probes/round_cost.py \\
        --autoregressive W/heads/autoregressive --parallel W/heads/parallel --target embedded
"""

from __future__ import annotations

import argparse
import statistics


def main(argv: list[str] | None = None) -> int:
    import torch

    from draftkit.decode.clock import interleaved_ms
    from draftkit.decode.eagle3_runner import Eagle3Runner
    from draftkit.decode.runners import make_runner
    from draftkit.metrics import median_ratio
    from draftkit.models.eagle3 import load_eagle3
    from draftkit.models.load import DTYPES, dtype_name, load_model
    from draftkit.models.resolve import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--autoregressive", required=True, help="an autoregressive EAGLE-3 head")
    ap.add_argument("--parallel", required=True, help="a parallel head for the same target")
    ap.add_argument("--target", default="embedded", help="the target the heads read")
    ap.add_argument("--k", type=int, default=5, help="drafted tokens a round (K)")
    ap.add_argument("--pending", type=int, nargs="+", default=[1, 2, 3],
                    help="target features a round reads (1 .. K + 1: accepted + 1)")
    ap.add_argument("--context", type=int, default=200, help="tokens before the round")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--between", choices=("verify", "none"), default="verify")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto", choices=DTYPES,
                    help="the target's dtype, which the heads load in; auto: bf16 on GPU, fp32 "
                         "on CPU")
    args = ap.parse_args(argv)
    if not 1 <= min(args.pending) <= max(args.pending) <= args.k + 1:
        ap.error(f"--pending must lie in 1 .. K + 1 = {args.k + 1}")

    device = torch.device(args.device)
    target = load_model(resolve_model(args.target, "target"), "target", args.device, args.dtype)
    heads = {name: Eagle3Runner(load_eagle3(path, target).eval())
             for name, path in (("autoregressive", args.autoregressive),
                                ("parallel", args.parallel))}
    if not heads["parallel"].model.parallel or heads["autoregressive"].model.parallel:
        ap.error("--autoregressive takes an autoregressive head, --parallel a parallel one")
    runner = make_runner(target)
    k, c, width = args.k, args.context, 3 * target.config.hidden_size
    gen = torch.Generator().manual_seed(0)
    n_vocab = heads["parallel"].head.ids.numel()
    max_len = c + 2 * k + 8

    with torch.no_grad():
        runner.reset(1, max_len)
        runner.forward(torch.randint(0, target.config.vocab_size, (1, c), generator=gen)
                       .to(device), [0])
        verify_in = torch.randint(0, target.config.vocab_size, (1, k + 1),
                                  generator=gen).to(device)
        for head in heads.values():
            head.reset(1, max_len)
            head.feed(head.fuse(torch.randn(1, c, width, generator=gen).to(device)),
                      torch.randint(0, n_vocab, (1, c), generator=gen).to(device), [0])

        def autoregressive(aux, tokens):
            r = heads["autoregressive"]
            n = aux.shape[1]
            logits, h = r.forward(r.fuse(aux), tokens, [c], last=[n - 1])
            for i in range(k - 1):
                d = r.head.ids[logits.argmax(-1)]  # a target id, as the engine maps it
                logits, h = r.forward(h[:, None], d[:, None], [c + n + i], last=[0])
            return r.head.ids[logits.argmax(-1)]

        def parallel(aux, tokens):
            r = heads["parallel"]
            block = r.forward_parallel(r.fuse(aux), tokens, [c], [aux.shape[1]], k)
            return r.head.ids[block.argmax(-1)]  # the K drafts chosen at once, as the engine does

        ways = {"autoregressive": autoregressive, "parallel": parallel}
        verify = (lambda: runner.forward(verify_in, [c])) if args.between == "verify" else None
        print(f"K {k}, context {c}, {torch.get_num_threads()} threads, {args.device}, "
              f"{dtype_name(target)}, between laps: {args.between}; ms a drafting lap (median "
              f"of {args.rounds} rounds)")
        print("| pending features | autoregressive round | autoregressive step | parallel round "
              "| parallel round / autoregressive step (95%) |")
        print("|---|---|---|---|---|")
        for n in args.pending:
            aux = torch.randn(1, n, width, generator=gen).to(device)
            tokens = torch.randint(0, n_vocab, (1, n), generator=gen).to(device)
            times = interleaved_ms({name: (lambda f=f: f(aux, tokens)) for name, f in ways.items()},
                                   args.rounds, 1, device, before=verify)
            ar, par = times["autoregressive"], times["parallel"]
            step = [t / k for t in ar]
            ratio, low, high = median_ratio(par, step)
            print(f"| {n} | {statistics.median(ar):.2f} | {statistics.median(step):.3f} | "
                  f"{statistics.median(par):.2f} | {ratio:.2f}x ({low:.2f}-{high:.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
