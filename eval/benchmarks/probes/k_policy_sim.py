"""``--k auto`` in the decode simulator (draftkit/labs/simulate.py): the speedup
over plain decoding at batch 1, i.i.d. alpha and draft cost ratio c, as the mean over seeds
0..``--seeds``-1, beside the same simulation at the K that the speedup model finds best.
``--rev`` adds a column for the policy as committed at a git revision, to compare a change
with what it replaces. ``--verify concave`` prices verification as a 2-core CPU did before its
matmul layouts were tuned (2 tokens 2.1 plain steps, each further token 0.09 more) instead of
the memory-bound 1 + 0.05 K. Command::

    python eval/benchmarks/probes/k_policy_sim.py --rev HEAD --seeds 20
    python eval/benchmarks/probes/k_policy_sim.py --rev HEAD --verify concave --cs 0.18 \\
        --alphas 0.8 0.9
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from draftkit.decode.policy import KPolicy  # noqa: E402
from draftkit.labs.simulate import best_fixed_k, linear_v, simulate_speedup  # noqa: E402


def concave_v(k: int) -> float:
    return 1.0 if k == 0 else 2.0 + 0.09 * k


VERIFY = {"linear": linear_v, "concave": concave_v}


def policy_at(rev: str) -> type:
    path = "draftkit/decode/policy.py"
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"],
                            capture_output=True, text=True, check=True).stdout
    module = types.ModuleType(f"policy@{rev}")
    sys.modules[module.__name__] = module  # a dataclass in it looks its module up there
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)
    return module.KPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rev", action="append", default=[], help="git revision (repeatable)")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.35, 0.6, 0.8])
    ap.add_argument("--cs", type=float, nargs="+", default=[0.22, 0.6])
    ap.add_argument("--rounds", type=int, nargs="+", default=[128, 1000])
    ap.add_argument("--verify", choices=sorted(VERIFY), default="linear",
                    help="verify cost T_target(K + 1) / T_target(1) as a function of K")
    args = ap.parse_args()
    v = VERIFY[args.verify]
    policies = {rev: policy_at(rev) for rev in args.rev} | {"working tree": KPolicy}
    print("| rounds | c | alpha | " + " | ".join(policies) + " | best fixed K |")
    print("|---" * (len(policies) + 4) + "|")
    for rounds in args.rounds:
        for c in args.cs:
            for alpha in args.alphas:
                k, _ = best_fixed_k(alpha, c, v=v)
                runs = [("auto", p) for p in policies.values()] + [(k, KPolicy)]
                cells = [statistics.mean(simulate_speedup(alpha, c, kk, rounds, seed, p, v)[0]
                                         for seed in range(args.seeds)) for kk, p in runs]
                print(f"| {rounds} | {c} | {alpha} | "
                      + " | ".join(f"{x:.4f}" for x in cells[:-1])
                      + f" | K = {k}: {cells[-1]:.4f} |", flush=True)


if __name__ == "__main__":
    main()
