"""Trace ``--k auto`` on real decodes: the K of every round and the policy's estimates.

Decodes a domain's prompts one after another through one K policy (as ``draftkit eval`` and
the server do), and after each prompt prints the K it chose round by round, its conditional
alpha_i, T_target(n) / T_target(1) for every verify length it timed, c, and the speedup it
predicts for each K. Command (2 CPU cores)::

    OMP_NUM_THREADS=2 python eval/benchmarks/probes/k_policy_trace.py \\
        --draft runs/rh-tpl-fkl/best --domain math --limit 12
"""

from __future__ import annotations

import argparse
from collections import Counter


def main(argv: list[str] | None = None) -> int:
    from draftkit.chat import encode_prompt
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.decode.policy import KPolicy
    from draftkit.evaluate.suite import builtin_suites_dir, load_suite
    from draftkit.models import load_pair

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--draft", required=True)
    ap.add_argument("--domain", default="code")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k-max", type=int, default=8)
    args = ap.parse_args(argv)

    rows = load_suite(builtin_suites_dir(), limit=args.limit, domains=[args.domain])
    pair = load_pair(args.target, args.draft)
    engine = SpeculativeEngine(pair.target, pair.draft)
    policy = KPolicy(k_max=args.k_max)
    chosen: list[int] = []
    choose = policy.choose

    def recording(batch: int) -> int:
        k = choose(batch)
        chosen.append(k)
        return k

    policy.choose = recording
    for i, row in enumerate(rows):
        engine.generate([encode_prompt(pair.tokenizer, row.prompt)], k="auto",
                        max_new_tokens=args.max_new_tokens, policy=policy)
        t1 = policy.target_seconds(1, 1)
        timed = {t: round(s / t1, 2)
                 for (b, t), s in sorted(policy.timings.target.items()) if b == 1}
        print(f"prompt {i}: K per round {''.join(map(str, chosen))}")
        print(f"  K counts {sorted(Counter(chosen).items())}")
        print(f"  alpha_i {[round(a, 2) for a in policy.alphas()]}")
        print(f"  T(n)/T(1) {timed}  c {policy.timings.draft[1] / t1:.3f}")
        predicted = [round(policy.predicted_speedup(k, 1), 2) for k in range(args.k_max + 1)]
        print(f"  predicted S(K) {predicted}")
        chosen.clear()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
