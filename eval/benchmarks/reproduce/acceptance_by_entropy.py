"""Where a distilled draft loses acceptance: held-out alpha by the target's entropy, per domain.

For each draft it prints, on the recipe's rows:

- alpha on a sample of the *training* rows next to alpha on the held-out rows (the
  generalisation gap: a draft far better on its training rows is short of data, not capacity);
- held-out acceptance 1 - TV(p, q) at temperature 1 (Leviathan et al. 2023, arXiv 2211.17192)
  bucketed by the target's entropy at that position, with each bucket's share of positions;
- with ``--control``, each draft's held-out margin over the control per domain with a 95%
  interval from a paired bootstrap over the held-out rows: with a dozen held-out prompts per
  domain, how much of a margin is the prompts drawn and how much the drafts.

Soft-label distillation can only beat a cross-entropy control where the target is uncertain
(there the hard label hides the rest of its distribution); where the target is near-certain both
see the same signal. The buckets show how much of a domain's traffic is which. Command::

    python eval/benchmarks/reproduce/acceptance_by_entropy.py \\
        --recipe recipes/smollm2-135m-instruct_to_4layer/fkl_topk_cpu.yaml \\
        --drafts runs/long-fkl/best --control runs/long-ce/best --out runs/entropy
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def load(args):
    import torch

    from draftkit.distill.command import load_config
    from draftkit.distill.distributed import Dist
    from draftkit.distill.trainer import recipe_rows
    from draftkit.models import load_model, load_tokenizer, resolve_model

    cfg = load_config(args.recipe, list(args.set))
    ref = resolve_model(cfg.target, "target")
    tok = load_tokenizer(ref, "target")
    target = load_model(ref, "target", device=args.device, dtype="float32")
    train_rows, heldout = recipe_rows(cfg, tok, target, ref, Dist(), False)
    pick = torch.randperm(len(train_rows), generator=torch.Generator().manual_seed(0))
    return cfg, target, train_rows.select(pick[:args.train_rows]), heldout


def by_entropy(draft_logits, target_logits, rows, batch_size: int
               ) -> tuple[dict[str, list[tuple]], list[float]]:
    """({domain: [(lo, hi, positions, mean acceptance), ...]}, per-row acceptance sums) over
    ``rows``' response tokens."""
    from draftkit.distill.evaluate import position_acceptance
    from draftkit.evaluate.entropy import EDGES, EntropyBuckets

    buckets = {d: EntropyBuckets(["accept"]) for d in rows.domains}
    per_row: list[float] = []
    for dom, mask, accept, p_logp in position_acceptance(draft_logits, target_logits, rows,
                                                         batch_size, 1.0):
        entropy = -(p_logp.exp() * p_logp).sum(-1).cpu()  # (B, T)
        accept, keep = accept.double().cpu(), mask.bool().cpu()  # (B, T)
        for i, d in enumerate(rows.domains):
            sel = keep & (dom[:, None] == i)  # (B, T)
            buckets[d].add(entropy[sel], {"accept": accept[sel]})
        per_row += (accept * keep).sum(1).tolist()
    out = {}
    for d, eb in buckets.items():
        r = eb.result()
        if sum(r.positions):
            out[d] = [(EDGES[b], EDGES[b + 1], n, float("nan") if a is None else a)
                      for b, (n, a) in enumerate(zip(r.positions, r.acceptance["accept"]))]
    return out, per_row


def margins(per_row: dict[str, list[float]], drafts: list[str], control: str, rows
            ) -> list[str]:
    """A markdown table: each draft's held-out alpha minus the control's per domain, with a
    95% paired-bootstrap interval over the held-out rows of that domain (rows with positions)."""
    from draftkit.metrics import paired_bootstrap

    counts = rows.loss_mask.sum(1).tolist()
    doms = rows.domain_ids.tolist()
    by_domain = {d: [r for r, di in enumerate(doms) if di == i and counts[r]]
                 for i, d in enumerate(rows.domains)}
    by_domain = {d: idx for d, idx in by_domain.items() if idx}
    out = ["| draft | " + " | ".join(f"{d} ({len(idx)} rows)" for d, idx in by_domain.items())
           + " |", "|---" * (1 + len(by_domain)) + "|"]
    for name in drafts:
        cells = []
        for idx in by_domain.values():
            delta, lo, hi = paired_bootstrap([per_row[name][r] for r in idx],
                                             [per_row[control][r] for r in idx],
                                             [counts[r] for r in idx])
            cells.append(f"{delta:+.3f} [{lo:+.3f}, {hi:+.3f}]")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out


def bucket_alpha(buckets: list[tuple]) -> float:
    """A domain's alpha from its buckets: the position-weighted mean acceptance."""
    total = sum(c for _, _, c, _ in buckets)
    return sum(c * a for _, _, c, a in buckets if c) / total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", type=Path, required=True, help="the recipe the drafts came from "
                                                                "(its rows and held-out split)")
    ap.add_argument("--drafts", nargs="+", required=True, help="draft folders (e.g. RUN/best)")
    ap.add_argument("--control", help="a control draft (e.g. the CE run's best/): each draft's "
                                      "margin over it, with a 95%% bootstrap interval")
    ap.add_argument("--train-rows", type=int, default=32, help="training rows sampled for the "
                                                               "generalisation gap")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--set", nargs="*", default=[], help="key=value recipe overrides")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--whole-head", action="store_true",
                    help="score drafts with a reduced head (draft_vocab.json) on all of their "
                         "head, as engines that ignore that file propose")
    ap.add_argument("--out", type=Path, help="also write acceptance_by_entropy.md here")
    args = ap.parse_args(argv)

    from draftkit.distill.evaluate import heldout_alpha, model_logits
    from draftkit.evaluate.entropy import label
    from draftkit.io import atomic_write_text
    from draftkit.models import load_model
    from draftkit.models.reduced_head import attach

    cfg, target, train_sample, heldout = load(args)
    target_fn = model_logits(target, args.device)
    names = [str(d) for d in args.drafts] + ([args.control] if args.control else [])
    train_alpha, buckets, per_row = {}, {}, {}
    for name in names:
        draft = load_model(name, "draft", device=args.device, dtype="float32")
        if args.whole_head:
            attach(draft, None)
        draft_fn = model_logits(draft, args.device)
        train_alpha[name] = heldout_alpha(draft_fn, target_fn, train_sample, args.batch_size)
        buckets[name], per_row[name] = by_entropy(draft_fn, target_fn, heldout, args.batch_size)

    domains = list(buckets[names[0]])
    lines = ["# Acceptance by the target's entropy", "",
             f"Recipe `{args.recipe}`; held-out rows of its split, temperature 1; drafts "
             f"scored on {'all of their head' if args.whole_head else 'the head they decode with'}"
             ".", "",
             "## Training rows against held-out rows (alpha)", "",
             "| draft | " + " | ".join(f"{d} train | {d} held-out" for d in domains) + " |",
             "|---" * (1 + 2 * len(domains)) + "|"]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(
            f"{train_alpha[name].get(f'alpha/{d}', float('nan')):.3f} | "
            f"{bucket_alpha(buckets[name][d]):.3f}" for d in domains) + " |")
    for d in domains:
        total = sum(c for _, _, c, _ in buckets[names[0]][d])
        lines += ["", f"## {d}: held-out acceptance by target entropy (nats), {total} positions",
                  "", "| entropy | share | " + " | ".join(names) + " |",
                  "|---" * (2 + len(names)) + "|"]
        for b, (_, _, count, _) in enumerate(buckets[names[0]][d]):
            if not count:
                continue
            lines.append(f"| {label(b)} | {count / total:.3f} | " + " | ".join(
                f"{buckets[n][d][b][3]:.3f}" for n in names) + " |")
    if args.control:
        lines += ["", f"## Held-out margin over the control `{args.control}`", "",
                  "alpha of the draft minus the control's, [95% interval] from a paired "
                  "bootstrap over the held-out rows (10000 resamples).", ""]
        lines += margins(per_row, names[:-1], args.control, heldout)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out / "acceptance_by_entropy.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
