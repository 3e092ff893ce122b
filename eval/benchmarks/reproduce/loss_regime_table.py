"""Which loss with which data: the four divergences against the three data regimes.

DistillSpec (Zhou et al., arXiv 2310.08461) found that the best divergence depends on the data
the draft is trained on. This script trains the same draft for the same small number of steps
under every (loss, regime) pair on one domain and scores each ``best/`` on one common held-out
set, the target's greedy answers to held-out prompts of that domain (what it will serve), as
alpha = mean(1 - TV(p, q)) at the recipe's evaluation temperature:

- regimes: ``fixed`` (real text of the domain: Python source for ``code``), ``target`` (the
  target's answers to the domain's prompts), ``on_policy`` (those answers mixed with the
  draft's own answers scored by the target, a fraction ``--lmbda`` of the steps);
- losses: ``fkl``, ``rkl``, ``jsd`` (``loss.beta`` of the recipe), ``tvd``.

Every run is a plain ``draftkit distill`` of the base recipe with overrides, so each keeps its
own folder, checkpoints and ``metrics.jsonl`` under ``--out`` and a rerun resumes or skips what
is done. It writes ``table.json``, ``table.md`` and ``table.png`` (alpha per cell). Command::

    python eval/benchmarks/reproduce/loss_regime_table.py --domain code --steps 30 \\
        --out runs/loss-regimes
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

LOSSES = ("fkl", "rkl", "jsd", "tvd")
REGIMES = ("fixed", "target", "on_policy")
ROOT = Path(__file__).resolve().parents[3]
BASE = ROOT / "recipes" / "smollm2-135m-instruct_to_4layer" / "quickstart_tvd_topk.yaml"


def prompt_file(domain: str) -> Path:
    path = ROOT / "eval" / "train_prompts" / f"{domain}.jsonl"
    if not path.is_file():
        raise SystemExit(f"no training prompts for domain {domain!r} ({path})")
    return path


def fixed_text(domain: str, out: Path, chunks: int) -> Path:
    if domain != "code":
        raise SystemExit("the fixed regime needs real text of the domain; this script has it for "
                         "'code' (Python source) only: pass --fixed-text FILE.jsonl")
    from draftkit.quickstart import write_code_text

    return write_code_text(out / "code_text.jsonl", chunks)


def run_overrides(args, loss: str, regime: str, text: Path | None) -> list[str]:
    prompts = args.prompts or prompt_file(args.domain)
    if regime == "fixed":
        source = f"{{path: {text}, domain: {args.domain}}}"
    else:
        source = f"{{path: {prompts}, domain: {args.domain}}}"
    over = [f"out_dir={args.out / f'{loss}-{regime}'}", f"data.sources=[{source}]",
            f"data.regime={regime}", f"loss.divergence={loss}", f"max_steps={args.steps}",
            f"eval.every={args.steps}", f"train.checkpoint_every={args.steps}",
            "max_minutes=null"]
    if regime == "on_policy":
        over.append(f"data.lmbda={args.lmbda}")
    if regime == "fixed":
        over.append("teacher.mode=online")  # a top-k cache per text set is not worth it here
    return over + list(args.set)


def common_heldout(args):
    """The target's answers to the held-out prompts: the same rows for every cell."""
    from draftkit.distill.command import load_config
    from draftkit.distill.distributed import Dist
    from draftkit.distill.trainer import recipe_rows
    from draftkit.models import load_model, load_tokenizer, resolve_model

    cfg = load_config(args.recipe, run_overrides(args, "tvd", "target", None))
    ref = resolve_model(cfg.target, "target")
    tok = load_tokenizer(ref, "target")
    target = load_model(ref, "target", device=args.device, dtype="float32")
    _, heldout = recipe_rows(cfg, tok, target, ref, Dist(), False)
    return cfg, target, heldout


def score(best: Path, target, heldout, cfg, device: str) -> float:
    from draftkit.distill.evaluate import heldout_alpha, model_logits
    from draftkit.models import load_model

    draft = load_model(str(best), "draft", device=device, dtype="float32")
    return heldout_alpha(model_logits(draft, device), model_logits(target, device), heldout,
                         cfg.eval.batch_size, cfg.eval.temperature)["alpha"]


def write_table(cells: dict, args) -> str:
    from draftkit.io import atomic_write_json, atomic_write_text

    losses = [x for x in LOSSES if x in args.losses]
    regimes = [r for r in REGIMES if r in args.regimes]
    lines = [f"# Held-out alpha by loss and data regime ({args.domain}, {args.steps} steps each)",
             "", "| loss | " + " | ".join(regimes) + " |", "|---" * (len(regimes) + 1) + "|"]
    for loss in losses:
        lines.append(f"| {loss} | " + " | ".join(
            f"{cells[f'{loss}-{r}']['alpha']:.3f}" for r in regimes) + " |")
    best = max(cells, key=lambda c: cells[c]["alpha"])
    lines += ["", f"Best: {best} (alpha {cells[best]['alpha']:.3f}). alpha = mean(1 - TV) on "
                  f"the target's answers to held-out {args.domain} prompts, the same rows for "
                  f"every cell.", "", "![alpha by loss and regime](table.png)", ""]
    text = "\n".join(lines)
    atomic_write_text(args.out / "table.md", text)
    atomic_write_json(args.out / "table.json", {"domain": args.domain, "steps": args.steps,
                                                "cells": cells})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [[cells[f"{loss}-{r}"]["alpha"] for r in regimes] for loss in losses]
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(regimes), 1.2 + 0.7 * len(losses)))
    im = ax.imshow(grid, cmap="viridis")
    ax.set_xticks(range(len(regimes)), regimes)
    ax.set_yticks(range(len(losses)), losses)
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.3f}", ha="center", va="center", color="w")
    ax.set_title(f"held-out alpha, {args.domain}, {args.steps} steps")
    fig.colorbar(im)
    fig.tight_layout()
    fig.savefig(args.out / "table.png", dpi=120)
    plt.close(fig)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", type=Path, default=BASE, help="base recipe (draft, teacher, "
                                                              "train settings)")
    ap.add_argument("--domain", default="code")
    ap.add_argument("--prompts", type=Path, help="prompts JSONL (default eval/train_prompts)")
    ap.add_argument("--fixed-text", type=Path, help="text JSONL for the fixed regime")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per cell")
    ap.add_argument("--lmbda", type=float, default=0.5, help="on-policy fraction of steps")
    ap.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    ap.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=REGIMES)
    ap.add_argument("--set", nargs="*", default=[], help="extra key=value recipe overrides")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=Path("runs/loss-regimes"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    from draftkit.distill.command import load_config
    from draftkit.distill.trainer import train

    text = None
    if "fixed" in args.regimes:
        text = args.fixed_text or fixed_text(args.domain, args.out, chunks=48)
    cfg0, target, heldout = common_heldout(args)
    cells = {}
    for regime in [r for r in REGIMES if r in args.regimes]:
        for loss in [x for x in LOSSES if x in args.losses]:
            name = f"{loss}-{regime}"
            print(f"== {name}", flush=True)
            cfg = load_config(args.recipe, run_overrides(args, loss, regime, text))
            best = train(cfg)
            rows = [json.loads(x) for x in (Path(cfg.out_dir) / "metrics.jsonl")
                    .read_text().splitlines()]
            cells[name] = {"alpha": score(best, target, heldout, cfg0, args.device),
                           "final_loss": rows[-1]["loss"], "minutes": rows[-1].get("minutes")}
            print(f"   {name}: held-out alpha {cells[name]['alpha']:.4f}", flush=True)
    print(write_table(cells, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
