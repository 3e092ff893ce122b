"""A probe: does a draft that reads the target's features widen forward KL's lead over CE?

The derived drafts of the CPU recipes read tokens only. On code their held-out alpha stays
within +0.06 of a cross-entropy control (eval/results/notes/2026-11-30-fkl-vs-ce-cpu.md): soft
labels lead only where the target is unsure, and a 4-layer draft fits the target's distribution
there poorly. EAGLE (Li et al. 2024, arXiv 2401.15077) gives the draft the target's last hidden
state of the previous position besides the token. This probe trains such a draft twice on a
recipe's rows, in the same order from the same start, once with the recipe's divergence and
once with next-token cross-entropy, and scores both as the recipe's drafts are scored.

The draft at position t: z_t = W [f_(t-1); e(x_t)] (f: the target's final hidden state, after
its norm; e: the target's embeddings, frozen) -> one decoder layer (a copy of the target's
last, trained) -> the target's final norm and head (frozen) over the recipe's reduced vocabulary
-> q_t, scored against p_t = target(x_<=t). At a packed example's first position f_(t-1) is
zero.

What the figures mean and do not: teacher-forced, ``alpha`` reads the target's true f_(t-1)
at every position. That is the draft's first proposal of a round; from its second it reads its
own output in place of f (EAGLE's feature uncertainty). ``alpha2`` scores that: every position
reads the draft's own previous output (stricter than a round, where the earlier positions keep
the target's features). draftkit's decoder cannot run such a draft: this measures what the
architecture would buy in held-out alpha, not a speedup. Each run keeps its best draft's
weights (``<loss>/best.pt``); the target's features are computed once (``features.pt``, in
bfloat16). Forward KL's target is the distribution those features give over the reduced
vocabulary, dense, not the recipe's top-k cache.
Command (about an hour for 960 steps of both runs on 2 cores)::

    python eval/benchmarks/probes/feature_draft_probe.py \\
        --recipe recipes/smollm2-135m-instruct_to_4layer/fkl_topk_cpu_more_prompts.yaml \\
        --steps 960 --out runs/feature-probe
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def load(recipe: str, overrides: list[str]):
    """(cfg, target, train rows, held-out rows, the recipe's reduced head or None)."""
    from draftkit.distill.command import load_config
    from draftkit.distill.distributed import Dist
    from draftkit.distill.draft import choose_draft_vocab
    from draftkit.distill.trainer import recipe_rows
    from draftkit.models import load_model, load_tokenizer, resolve_model

    cfg = load_config(recipe, overrides)
    ref = resolve_model(cfg.target, "target")
    tok = load_tokenizer(ref, "target")
    target = load_model(ref, "target", device="cpu", dtype="float32").requires_grad_(False)
    rows, heldout = recipe_rows(cfg, tok, target, ref, Dist(), False)
    head = None
    if cfg.draft.draft_vocab_size:
        head = choose_draft_vocab(cfg.draft.draft_vocab_size, rows, heldout, tok,
                                  target.config.vocab_size)
    return cfg, target, rows, heldout, head


def features(target, ids, pos):
    """The target's final hidden states, after its norm: (B, T) -> (B, T, H)."""
    import torch

    with torch.no_grad():
        return target.get_decoder()(input_ids=ids, position_ids=pos,
                                    use_cache=False).last_hidden_state


def shifted(feats, pos):
    """f_(t-1) at each position t, zero where a packed example starts: (B, T, H)."""
    import torch

    prev = torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], dim=1)
    return prev * (pos > 0).unsqueeze(-1).to(prev.dtype)


def make_draft(target):
    """The feature-conditioned draft: a fusion layer and a copy of the target's last layer;
    embeddings, final norm and head are the target's own, frozen."""
    import torch

    from draftkit.models.derive import derive_by_layers

    class FeatureDraft(torch.nn.Module):
        def __init__(self):
            super().__init__()
            h = target.config.hidden_size
            self.body = derive_by_layers(target, [target.config.num_hidden_layers - 1]).float()
            self.body.get_input_embeddings().requires_grad_(False)
            self.body.get_output_embeddings().requires_grad_(False)
            self.body.get_decoder().norm.requires_grad_(False)
            self.fuse = torch.nn.Linear(2 * h, h, bias=False)

        def forward(self, prev_feats, ids, pos):
            # prev_feats: (B, T, H), ids, pos: (B, T) -> hidden (B, T, H) before the head
            x = self.fuse(torch.cat([prev_feats, self.body.get_input_embeddings()(ids)], -1))
            return self.body.get_decoder()(inputs_embeds=x, position_ids=pos,
                                           use_cache=False).last_hidden_state

    return FeatureDraft()


def draft_logits_fn(draft, target, head, own: bool = False):
    """``fn(ids, pos) -> (B, T, V)`` for draftkit.distill.evaluate.heldout_alpha.

    ``own``: every position reads the draft's own output at the previous position in place
    of the target's feature, as a round's second proposal does. Stricter than decoding,
    where only the newest position's input is the draft's and the earlier ones are the
    target's, so expect it to read below the second proposal's acceptance."""
    import torch

    from draftkit.distill.reduced_head import head_logits

    def fn(ids, pos):
        with torch.no_grad():
            hidden = draft(shifted(features(target, ids, pos), pos), ids, pos)  # (B, T, H)
            if own:
                hidden = draft(shifted(hidden, pos), ids, pos)
            # only the reduced head's rows: (B, T, |H|), or (B, T, V) without one
            logits = head_logits(draft.body, hidden, head).float()
        return logits if head is None else head.expand(logits)
    return fn


def train_one(divergence: str, cfg, target, rows, heldout, head, feats, steps: int,
              every: int, out: Path) -> list[dict]:
    """Train one feature draft with ``divergence`` (or "ce"); the evaluations, also written
    to ``out/metrics.jsonl``."""
    import torch
    from tqdm import tqdm

    from draftkit.data import positions
    from draftkit.distill.evaluate import heldout_alpha, model_logits
    from draftkit.distill.losses import dense_logprobs, next_token_ce
    from draftkit.distill.losses import divergence as divergence_fn
    from draftkit.distill.reduced_head import head_logits, restrict_labels
    from draftkit.distill.schedule import warmup_cosine
    from draftkit.distill.trainer import batch_rows
    from draftkit.io import append_jsonl

    torch.manual_seed(cfg.seed)
    draft = make_draft(target)
    t = cfg.train
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=t.lr,
                            weight_decay=t.weight_decay)
    sched = warmup_cosine(opt, t.warmup_steps, steps, t.min_lr_ratio)
    target_fn = model_logits(target, "cpu")
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    started, evals = time.time(), []

    def evaluate(step, loss):
        draft.eval()
        row = {"step": step, "loss": loss, "minutes": (time.time() - started) / 60,
               **heldout_alpha(draft_logits_fn(draft, target, head), target_fn, heldout,
                               cfg.eval.batch_size)}
        second = heldout_alpha(draft_logits_fn(draft, target, head, own=True), target_fn,
                               heldout, cfg.eval.batch_size)
        row.update({k.replace("alpha", "alpha2", 1): v for k, v in second.items()})
        draft.train()
        if not evals or row["alpha"] > max(r["alpha"] for r in evals):
            torch.save(draft.state_dict(), out / "best.pt.tmp")
            (out / "best.pt.tmp").replace(out / "best.pt")
        append_jsonl(out / "metrics.jsonl", row)
        evals.append(row)
        return row

    evaluate(0, None)
    bar = tqdm(range(steps), desc=divergence, unit="step")
    for step in bar:
        total = 0.0
        for micro in range(t.grad_accum):
            idx = batch_rows(step * t.grad_accum + micro, len(rows), t.batch_size, cfg.seed)
            ids, mask, pos = rows.input_ids[idx], rows.loss_mask[idx], positions(rows, idx)
            f = feats[idx].float()  # (B, T, H)
            hidden = draft(shifted(f, pos), ids, pos)[mask]  # (N, H)
            logits = head_logits(draft.body, hidden, head)  # (N, |H|)
            if divergence == "ce":
                labels = ids.roll(-1, dims=1)[mask]  # (N,)
                if head is not None:
                    labels, inside = restrict_labels(labels, head)
                    logits, labels = logits[inside], labels[inside]
                loss = next_token_ce(logits, labels)
            else:
                p_logp = dense_logprobs(head_logits(target, f[mask], head))  # over H
                loss = divergence_fn(divergence, p_logp, dense_logprobs(logits),
                                     cfg.loss.beta).mean()
            (loss / t.grad_accum).backward()
            total += float(loss.detach()) / t.grad_accum
        if t.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(draft.parameters(), t.max_grad_norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % every == 0 or step + 1 == steps:
            row = evaluate(step + 1, total)
            bar.set_postfix(alpha=f"{row['alpha']:.3f}")
    return evals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", required=True, help="the recipe whose rows, schedule and "
                    "reduced vocabulary both drafts use")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="recipe overrides, as on the distill command line")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (the recipe's "
                    "max_steps by default)")
    ap.add_argument("--every", type=int, default=None, help="evaluate every N steps")
    ap.add_argument("--losses", nargs="+", default=None,
                    help="what to train with (default: the recipe's divergence, then ce)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch
    from tqdm import tqdm

    from draftkit.data import positions
    from draftkit.io import atomic_write_json

    cfg, target, rows, heldout, head = load(args.recipe, list(args.set))
    steps = args.steps or cfg.max_steps
    every = args.every or cfg.eval.every
    losses = args.losses or [cfg.loss.divergence, "ce"]

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cached = out / "features.pt"  # a rerun on the same recipe skips the target forwards
    feats = torch.load(cached) if cached.is_file() else None
    if feats is None or feats.shape[:2] != rows.input_ids.shape:
        feats = torch.cat([features(target, rows.input_ids[i:i + 8],
                                    positions(rows, slice(i, i + 8))).to(torch.bfloat16)
                           for i in tqdm(range(0, len(rows), 8), desc="target features")])
        torch.save(feats, out / "features.pt.tmp")  # (rows, T, H), shared by the runs
        (out / "features.pt.tmp").replace(cached)
    results = {loss: train_one(loss, cfg, target, rows, heldout, head, feats, steps, every,
                               out / loss) for loss in losses}
    best = {loss: max(evals, key=lambda r: r["alpha"]) for loss, evals in results.items()}
    summary = {"recipe": args.recipe, "steps": steps, "best": best}
    if "ce" in best:
        summary["margin"] = {
            loss: {k: b[k] - best["ce"][k] for k in b if k.startswith("alpha")}
            for loss, b in best.items() if loss != "ce"}
    atomic_write_json(out / "summary.json", summary)
    for loss, b in best.items():
        alphas = " ".join(f"{k}={v:.3f}" for k, v in b.items() if k.startswith("alpha"))
        print(f"{loss}: best at step {b['step']}: {alphas}")
    for loss, m in summary.get("margin", {}).items():
        print(f"{loss} - ce: " + " ".join(f"{k}={v:+.3f}" for k, v in m.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
