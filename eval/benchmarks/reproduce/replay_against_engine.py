"""Replayed acceptance against the serving engine's own counts, on recorded traffic.

Takes a traffic folder whose records carry the engine's per-step counts (``draftkit serve
--engine vllm --record``: vLLM's ``per_step_accepted``), replays every request the bundle's
draft served through that draft (:mod:`draftkit.traffic.replay`, as ``draftkit traffic`` does
for requests without counts) and prints, per domain, alpha_1 from the engine and from the
replay, and on how many requests the rounds away from the completion's end are the same (greedy
traffic: a replay gives the exact rounds up to near-ties between the engine's arithmetic and
draftkit's), once per ``--dtype``. Command (2 CPU cores; the traffic of
``traffic_loop.py --engine vllm``)::

    OMP_NUM_THREADS=2 python eval/benchmarks/reproduce/replay_against_engine.py \\
        --traffic runs/loop-vllm/traffic --bundle runs/quickstart/bundle
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from draftkit.models import load_pair
from draftkit.traffic.command import bundle_identities, replay_k
from draftkit.traffic.record import engine_counts
from draftkit.traffic.shards import read_traffic
from draftkit.traffic.replay import Replayer, rounds_before_end


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traffic", required=True)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    args = ap.parse_args(argv)
    manifest, target, tokenizer, draft, vocab = bundle_identities(args.bundle)
    records = [r for r in read_traffic(args.traffic, target=target, tokenizer=tokenizer,
                                       vocab=vocab)
               if r.draft == draft and r.rounds is not None]
    k = replay_k(manifest)
    print(f"{len(records)} requests the bundle's draft served, with the engine's counts; K {k}")
    for dtype in args.dtype:
        pair = load_pair(args.bundle, args.bundle, device="cpu", dtype=dtype)
        replayer = Replayer(pair.target, pair.draft, k)
        sums = defaultdict(lambda: [0.0] * 4)  # engine accepted, tested; replay the same
        same, started = 0, time.perf_counter()
        for r in records:
            e, c = engine_counts(r), replayer.counts(r)
            s = sums[r.domain]
            s[0], s[1] = s[0] + e.accepted[0], s[1] + e.tested[0]
            s[2], s[3] = s[2] + c.accepted[0], s[3] + c.tested[0]
            total = len(r.prompt_ids) + len(r.completion_ids)
            same += rounds_before_end(r.rounds, len(r.prompt_ids), total, k) == \
                rounds_before_end(c.rounds, len(r.prompt_ids), total, k)
        print(f"\nreplay in {dtype}: {time.perf_counter() - started:.0f} s; rounds the same "
              f"away from the end on {same} of {len(records)} requests")
        print("| domain | alpha_1 engine | alpha_1 replay | difference |\n|---|---|---|---|")
        for domain, (ea, et, ra, rt) in sorted(sums.items()):
            a, b = ea / et if et else 0.0, ra / rt if rt else 0.0
            print(f"| {domain} | {a:.3f} | {b:.3f} | {b - a:+.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
