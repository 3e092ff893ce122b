"""How many training-time-test steps an EAGLE-3 head needs: held-out tau against TTT steps.

EAGLE-3 (Li et al., arXiv 2503.01840) trains its head unrolled over its own drafts, so that
positions 2, 3, ... of a decoding round see what the head will see there: its own outputs,
not the target's features. More unrolled steps teach the deeper positions but cost a forward
of the head each. This script trains the same head on the same rows for the same number of
optimizer steps at each ``--ttt`` count (a plain ``draftkit distill`` of the recipe with
``draft.ttt_steps`` overridden, each in its own folder under ``--out``: a rerun resumes or
skips what is done) and scores every ``best/`` on the recipe's held-out rows at the same
``--positions`` draft positions, whatever it was trained with (decoding drafts K tokens either
way): alpha at each position (mean of 1 - TV(p, q)) and tau = 1 + sum_k prod_(i<=k) alpha_i,
the expected tokens per target call at K = ``--positions``, per domain. It writes
``table.json``, ``table.md`` and ``table.png`` (tau per domain against TTT steps, and the
training minutes each took). Command::

    OMP_NUM_THREADS=2 python eval/benchmarks/reproduce/ttt_steps_table.py --steps 160 \\
        --out runs/ttt-steps
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BASE = ROOT / "recipes" / "smollm2-135m-instruct_to_eagle3" / "quickstart_ttt.yaml"


def run_overrides(args, ttt: int) -> list[str]:
    every = max(args.steps // 4, 1)
    return [f"out_dir={args.out / f'ttt-{ttt}'}", f"draft.ttt_steps={ttt}",
            f"max_steps={args.steps}", "max_minutes=null", f"eval.every={every}",
            f"train.checkpoint_every={every}", *args.set]


def scorer(args):
    """(score(best) -> figures, held-out rows' domains): one evaluation, ``--positions`` deep,
    on the recipe's held-out rows, for every head."""
    import contextlib

    from draftkit.distill.command import load_config
    from draftkit.distill.distributed import Dist
    from draftkit.distill.eagle3 import Eagle3
    from draftkit.distill.trainer import recipe_rows
    from draftkit.models import load_model, load_tokenizer, resolve_model
    from draftkit.models.eagle3 import load_eagle3

    cfg = load_config(args.recipe, run_overrides(args, args.positions))
    ref = resolve_model(cfg.target, "target")
    tok = load_tokenizer(ref, "target")
    target = load_model(ref, "target", device=args.device, dtype="float32")
    _, heldout = recipe_rows(cfg, tok, target, ref, Dist(), False)
    kind = Eagle3(cfg, target, tok, ref, args.device)  # its evaluation unrolls --positions
    kind.autocast = contextlib.nullcontext

    def score(best: Path) -> dict:
        kind.draft = load_eagle3(best, target).float().to(args.device)
        kind.head = kind.draft.reduced_head
        return kind.evaluate(heldout)

    return score, heldout.domains


def write_table(cells: dict, domains: list[str], args) -> str:
    from draftkit.io import atomic_write_json, atomic_write_text

    k = args.positions
    lines = [f"# Held-out tau against training-time-test steps ({args.steps} optimizer steps "
             f"each, scored at K = {k})", "",
             "| TTT steps | " + " | ".join(f"tau {d}" for d in domains) + " | tau | "
             + " | ".join(f"alpha_{i}" for i in range(1, k + 1)) + " | training minutes |",
             "|---" * (len(domains) + k + 3) + "|"]
    for ttt, c in cells.items():
        f = c["figures"]
        lines.append(f"| {ttt} | " + " | ".join(f"{f[f'tau/{d}']:.3f}" for d in domains)
                     + f" | {f['tau']:.3f} | "
                     + " | ".join(f"{f[f'alpha_{i}']:.3f}" for i in range(1, k + 1))
                     + f" | {c['minutes']:.1f} |")
    best = max(cells, key=lambda t: cells[t]["figures"]["tau"])
    lines += ["", f"Highest tau: {best} TTT steps. tau = 1 + sum_k prod_(i<=k) alpha_i over K = "
                  f"{k} positions, alpha_i = mean(1 - TV(p, q)) at position i of a round on the "
                  f"recipe's held-out rows, the same rows and positions for every head; each "
                  f"head is the run's best/.", "", "![tau by TTT steps](table.png)", ""]
    text = "\n".join(lines)
    atomic_write_text(args.out / "table.md", text)
    atomic_write_json(args.out / "table.json", {"steps": args.steps, "positions": k,
                                                "cells": cells})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ttts = list(cells)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.4))
    for d in domains + [None]:
        key = f"tau/{d}" if d else "tau"
        ax.plot(ttts, [cells[t]["figures"][key] for t in ttts], marker="o",
                label=d or "all", linestyle="-" if d else "--")
    ax.set_xlabel("training-time-test steps")
    ax.set_ylabel(f"held-out tau at K = {k}")
    ax.set_xticks(ttts)
    ax.legend()
    bx.bar([str(t) for t in ttts], [cells[t]["minutes"] for t in ttts])
    bx.set_xlabel("training-time-test steps")
    bx.set_ylabel(f"minutes for {args.steps} steps")
    fig.tight_layout()
    fig.savefig(args.out / "table.png", dpi=120)
    plt.close(fig)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", type=Path, default=BASE, help="an eagle3 recipe (data, head, "
                                                              "train settings)")
    ap.add_argument("--ttt", type=int, nargs="+", default=[1, 3, 5],
                    help="training-time-test step counts to train")
    ap.add_argument("--steps", type=int, default=160, help="optimizer steps per head")
    ap.add_argument("--positions", type=int, default=5, help="draft positions every head is "
                                                             "scored at (K of its tau)")
    ap.add_argument("--set", nargs="*", default=[], help="extra key=value recipe overrides")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=Path("runs/ttt-steps"))
    args = ap.parse_args(argv)
    if min(args.ttt) < 1 or args.positions < 1 or args.steps < 1:
        ap.error("--ttt, --positions and --steps must be >= 1")
    args.out.mkdir(parents=True, exist_ok=True)

    from draftkit.distill.command import load_config
    from draftkit.distill.trainer import train
    from draftkit.io import read_jsonl

    cells = {}
    for ttt in sorted(set(args.ttt)):
        print(f"== {ttt} training-time-test steps", flush=True)
        cfg = load_config(args.recipe, run_overrides(args, ttt))
        best = train(cfg)
        rows = read_jsonl(Path(cfg.out_dir) / "metrics.jsonl", "run metrics", "rerun it")
        cells[ttt] = {"best": str(best), "minutes": rows[-1][1].get("minutes") or 0.0}
    score, domains = scorer(args)
    for ttt, cell in cells.items():
        cell["figures"] = score(Path(cell["best"]))
        print(f"   {ttt} TTT steps: held-out tau {cell['figures']['tau']:.3f} at "
              f"K = {args.positions}", flush=True)
    print(write_table(cells, domains, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
