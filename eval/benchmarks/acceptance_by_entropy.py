"""Where a distilled draft loses acceptance: held-out alpha by the target's entropy, per domain.

For each draft it prints, on the recipe's rows:

- alpha on a sample of the *training* rows next to alpha on the held-out rows (the
  generalisation gap: a draft far better on its training rows is short of data, not capacity);
- held-out acceptance 1 - TV(p, q) at temperature 1 (Leviathan et al. 2023, arXiv 2211.17192)
  bucketed by the target's entropy at that position, with each bucket's share of positions.

Soft-label distillation can only beat a cross-entropy control where the target is uncertain
(there the hard label hides the rest of its distribution); where the target is near-certain both
see the same signal. The buckets show how much of a domain's traffic is which. Command::

    python eval/benchmarks/acceptance_by_entropy.py \\
        --recipe recipes/smollm2-135m-instruct_to_4layer/fkl_topk_cpu.yaml \\
        --drafts runs/long-fkl/best runs/long-ce/best --out runs/entropy
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EDGES = (0.0, 0.1, 0.5, 1.0, 2.0, float("inf"))  # nats


def load(args):
    import torch

    from draftkit.distill.command import load_config
    from draftkit.distill.distributed import Dist
    from draftkit.distill.trainer import _rows
    from draftkit.models import load_model, load_tokenizer, resolve_model

    cfg = load_config(args.recipe, list(args.set))
    ref = resolve_model(cfg.target, "target")
    tok = load_tokenizer(ref, "target")
    target = load_model(ref, "target", device=args.device, dtype="float32")
    train_rows, heldout = _rows(cfg, tok, target, ref, Dist(), False)
    pick = torch.randperm(len(train_rows), generator=torch.Generator().manual_seed(0))
    pick = pick[:args.train_rows]
    sample = type(train_rows)(train_rows.input_ids[pick], train_rows.loss_mask[pick],
                              train_rows.domain_ids[pick], train_rows.domains,
                              None if train_rows.position_ids is None
                              else train_rows.position_ids[pick])
    return cfg, target, sample, heldout


def logits_fn(model, device: str):
    def fn(ids, pos):  # (B, T), (B, T) -> (B, T, V)
        return model(input_ids=ids.to(device), position_ids=pos.to(device),
                     use_cache=False).logits.float()
    return fn


def by_entropy(draft_fn, target_fn, rows, batch_size: int) -> dict[str, list[tuple]]:
    """{domain: [(lo, hi, positions, mean acceptance), ...]} over ``rows``' response tokens."""
    import torch

    from draftkit.data import positions
    from draftkit.distill.losses import dense_logprobs

    n = len(EDGES) - 1
    sums = torch.zeros(len(rows.domains), n, dtype=torch.float64)
    counts = torch.zeros_like(sums)
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            sel = slice(start, start + batch_size)
            ids, mask, pos = rows.input_ids[sel], rows.loss_mask[sel], positions(rows, sel)
            p_logp = dense_logprobs(target_fn(ids, pos), 1.0)  # (B, T, V)
            q_logp = dense_logprobs(draft_fn(ids, pos), 1.0)
            accept = torch.minimum(p_logp.exp(), q_logp.exp()).sum(-1).double().cpu()  # (B, T)
            entropy = -(p_logp.exp() * p_logp).sum(-1).double().cpu()  # (B, T)
            bucket = (torch.bucketize(entropy, torch.tensor(EDGES[1:-1], dtype=torch.float64),
                                      right=True))  # (B, T) in [0, n)
            dom = rows.domain_ids[sel][:, None].expand_as(bucket)
            flat = (dom * n + bucket)[mask.bool()]
            sums.view(-1).index_add_(0, flat, accept[mask.bool()])
            counts.view(-1).index_add_(0, flat, torch.ones_like(flat, dtype=torch.float64))
    return {d: [(EDGES[b], EDGES[b + 1], int(counts[i, b]),
                 float(sums[i, b] / counts[i, b]) if counts[i, b] else float("nan"))
                for b in range(n)] for i, d in enumerate(rows.domains) if counts[i].sum()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", type=Path, required=True, help="the recipe the drafts came from "
                                                                "(its rows and held-out split)")
    ap.add_argument("--drafts", nargs="+", required=True, help="draft folders (e.g. RUN/best)")
    ap.add_argument("--train-rows", type=int, default=32, help="training rows sampled for the "
                                                               "generalisation gap")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--set", nargs="*", default=[], help="key=value recipe overrides")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, help="also write acceptance_by_entropy.md here")
    args = ap.parse_args(argv)

    from draftkit.distill.evaluate import heldout_alpha
    from draftkit.io import atomic_write_text
    from draftkit.models import load_model

    cfg, target, train_sample, heldout = load(args)
    target_fn = logits_fn(target, args.device)
    names = [str(d) for d in args.drafts]
    gap, buckets = {}, {}
    for name in names:
        draft_fn = logits_fn(load_model(name, "draft", device=args.device, dtype="float32"),
                             args.device)
        gap[name] = (heldout_alpha(draft_fn, target_fn, train_sample, args.batch_size, 1.0),
                     heldout_alpha(draft_fn, target_fn, heldout, args.batch_size, 1.0))
        buckets[name] = by_entropy(draft_fn, target_fn, heldout, args.batch_size)

    domains = list(buckets[names[0]])
    lines = ["# Acceptance by the target's entropy", "",
             f"Recipe `{args.recipe}`; held-out rows of its split, temperature 1.", "",
             "## Training rows against held-out rows (alpha)", "",
             "| draft | " + " | ".join(f"{d} train | {d} held-out" for d in domains) + " |",
             "|---" * (1 + 2 * len(domains)) + "|"]
    for name in names:
        train_a, held_a = gap[name]
        lines.append(f"| {name} | " + " | ".join(
            f"{train_a.get(f'alpha/{d}', float('nan')):.3f} | {held_a[f'alpha/{d}']:.3f}"
            for d in domains) + " |")
    for d in domains:
        total = sum(c for _, _, c, _ in buckets[names[0]][d])
        lines += ["", f"## {d}: held-out acceptance by target entropy (nats), {total} positions",
                  "", "| entropy | share | " + " | ".join(names) + " |",
                  "|---" * (2 + len(names)) + "|"]
        for b, (lo, hi, count, _) in enumerate(buckets[names[0]][d]):
            if not count:
                continue
            label = f"[{lo:g}, {hi:g})" if hi != float("inf") else f">= {lo:g}"
            lines.append(f"| {label} | {count / total:.3f} | " + " | ".join(
                f"{buckets[n][d][b][3]:.3f}" for n in names) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out / "acceptance_by_entropy.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
