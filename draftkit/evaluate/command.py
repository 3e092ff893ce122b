"""``draftkit eval``: alpha, tau, c, predicted and measured speedup per domain.

    draftkit eval --target embedded --draft runs/quickstart/bundle --out runs/eval
    draftkit eval --target embedded --draft D --baseline-draft D0 --limit 10 --k 3

Writes ``report.json``, ``report.md``, ``report.html`` and PNG plots to ``--out`` and the
same tables and plots to W&B (offline by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftkit.config import option
from draftkit.decode.args import DecodingArgs
from draftkit.decode.k import check_k
from draftkit.errors import ConfigError


@dataclass
class EvalArgs(DecodingArgs):
    """Measure a draft against its target on domain suites and write a report. Under --k auto,
    one K policy runs per domain, learning across its prompts as a server's does across
    requests; --k-max also bounds the K sweep's predictions."""

    draft: str = option(help="draft model: HF folder, bundle, hub id")
    target: str = option("embedded", help="target model: HF folder, bundle, hub id, 'embedded'")
    suite: str = option("builtin", help="JSONL suite file or folder of them; 'builtin' = the "
                                        "shipped eval/suites")
    out: str = option("runs/eval", help="output directory for the report")
    baseline_draft: str | None = option(None, help="a second draft (e.g. before distillation): "
                                                   "its teacher-forced alpha on the same "
                                                   "continuations is reported as alpha_before, "
                                                   "the draft's as alpha_after")
    max_new_tokens: int = option(128, help="new tokens per prompt")
    batch_sizes: list[int] = option([1, 2, 4, 8, 16], help="batch sizes of the batch sweep "
                                                           "(empty to skip)")
    k_sweep: list[int] = option([1, 2, 4, 6], help="K values measured in the K sweep (empty "
                                                   "to skip; predictions cover 1..k_max)")
    k_sweep_prompts: int = option(2, help="prompts per domain the K sweep decodes at each K "
                                          "(its first ones)")
    k_sweep_tokens: int = option(48, help="new tokens per prompt in the K sweep; with "
                                          "--k-sweep-prompts equal to the table's, the sweep "
                                          "compares like for like with it")
    limit: int | None = option(None, help="at most N prompts per domain")
    domains: list[str] | None = option(None, nargs="*", metavar="DOMAIN",
                                       help="only these domains (space- or comma-separated)")
    repeats: int = option(1, help="timing repeats (medians reported)")
    dtype: str = option("auto", help="auto, float32, bfloat16 or float16")
    device: str | None = option(None, help="cpu or cuda (default: cuda if available)")

    def validate(self) -> None:
        super().validate()
        check_k(self.k, self.k_max, bounded=True)  # predictions and the K sweep stop at k_max
        for name in ("max_new_tokens", "repeats", "k_max", "k_sweep_prompts", "k_sweep_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
        if self.limit is not None and self.limit < 1:
            raise ConfigError("--limit must be >= 1")
        if any(b < 1 for b in self.batch_sizes) or any(k < 1 for k in self.k_sweep):
            raise ConfigError("--batch-sizes and --k-sweep take positive integers")


def run_eval(args: EvalArgs, tracker=None, extra_drafts: dict[str, Any] | None = None) -> dict:
    """Measure and return the report dict (``evaluate`` also writes it)."""
    import torch
    from tqdm.auto import tqdm

    from draftkit.chat import encode_prompt
    from draftkit.evaluate import runner
    from draftkit.evaluate.suite import builtin_suites_dir, by_domain, load_suite
    from draftkit.models import load_another_draft, load_pair

    suite = builtin_suites_dir() if args.suite == "builtin" else Path(args.suite)
    rows = load_suite(suite, limit=args.limit, domains=args.domains)
    pair = load_pair(args.target, args.draft, device=args.device, dtype=args.dtype)
    settings = runner.EvalSettings.of(
        args, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
        k_sweep=[k for k in args.k_sweep if k <= args.k_max],
        k_sweep_prompts=args.k_sweep_prompts, k_sweep_tokens=args.k_sweep_tokens,
        batch_sizes=args.batch_sizes)
    baselines = dict(extra_drafts or {})
    if args.baseline_draft:
        baselines["alpha_before"] = load_another_draft(pair, args.baseline_draft,
                                                       device=args.device, dtype=args.dtype)
    groups = by_domain(rows)
    prompts = {name: [encode_prompt(pair.tokenizer, r.prompt) for r in group]
               for name, group in groups.items()}
    total = sum(2 * len(p) * settings.repeats for p in prompts.values())
    if settings.k_sweep:
        total += sum(min(len(p), settings.k_sweep_prompts) * (1 + len(settings.k_sweep))
                     for p in prompts.values())
    total += len(settings.batch_sizes)
    torch.manual_seed(args.seed)
    ev = None
    domains: dict[str, dict] = {}
    runs: dict[str, runner.DomainRun] = {}
    k_rows: list[dict] = []
    swept: list[dict] = []  # the K sweep's measured rows, every domain
    with tqdm(total=total, desc="eval", unit="run", dynamic_ncols=True) as bar:
        ev = runner.Evaluator(pair.target, pair.draft, settings,
                              progress=lambda n=1: bar.update(n))
        for name, ids in prompts.items():
            bar.set_postfix_str(name)
            run = ev.run_domain(ids)
            fig = runner.domain_figures(run, len(ids), settings)
            tf = ev.teacher_forced(run.sequences, baselines)
            fig["target_entropy"] = tf.pop("target_entropy")
            # like for like with alpha_before: teacher-forced too, unlike the decode-time alpha
            fig["alpha_after"] = tf.pop("draft")
            fig.update(tf)
            measured = ev.k_sweep(ids) if settings.k_sweep else []
            fig["verdict"] = runner.verdict(fig, settings.k_max, runner.v_of_k(fig, measured))
            domains[name] = fig
            runs[name] = run
            swept += measured
            k_rows += runner.k_sweep_rows(name, fig, measured, settings.k_max)
            alpha = "n/a" if fig["alpha"] is None else f"{fig['alpha']:.2f}"
            bar.set_postfix_str(f"{name} alpha={alpha} S={fig['speedup_measured']:.2f}x")
        overall = runner.aggregate(domains, runs, settings, swept)
        batch_rows = []
        if settings.batch_sizes:
            # Interleave domains so every batch size mixes them.
            mixed = [ids[i] for i in range(max(map(len, prompts.values())))
                     for ids in prompts.values() if i < len(ids)]
            bar.set_postfix_str("batch sweep")
            batch_rows = ev.batch_sweep(mixed, max(overall["k"], 1))
    report = {
        "target": pair.target_ref.name, "draft": pair.draft_ref.name if pair.draft_ref else None,
        "device": str(ev.device), "dtype": str(next(pair.target.parameters()).dtype).replace(
            "torch.", ""), "temperature": args.temperature, "k": args.k, "created": runner.now(),
        "domains": domains, "overall": overall, "k_sweep": k_rows, "batch_sweep": batch_rows,
        "break_even": break_even(batch_rows, domains, settings),
    }
    return report


def break_even(batch_rows: list[dict], domains: dict[str, dict], settings) -> dict:
    """Where speculation stops (or starts) paying along the batch sweep, measured, and per
    domain as predicted from the measured c(B), v(B) and that domain's alpha_i.

    Each is :func:`break_even_batch` of its curve (``kind``, ``x``, ``batch_size``), so that a
    noisy dip that recovers, or batch sizes given out of order, do not move it."""
    from draftkit import metrics

    rows = sorted(batch_rows, key=lambda r: r["batch_size"])
    bs = [r["batch_size"] for r in rows]
    per_domain = {}
    for name, fig in domains.items():
        alpha = fig["alpha_per_position"] or fig["alpha"]
        predicted = [metrics.speedup(alpha, r["c"], r["k"], r["v"])
                     if None not in (alpha, r["c"], r["v"]) else None for r in rows]
        per_domain[name] = break_even_batch(bs, predicted)
    return {**break_even_batch(bs, [r["speedup_measured"] for r in rows]),
            "per_domain": per_domain}


def break_even_batch(batch_sizes: list[int], speedups: list[float | None]) -> dict:
    """The break-even of one speedup-against-batch-size curve (points in batch order).

    ``kind`` and ``x`` are :func:`draftkit.metrics.crossover`'s in log2 B (``crosses``: it
    stops paying at x; ``rises``: it pays only from x on; ``below`` / ``above``: it loses /
    pays at every batch size; ``empty``). ``batch_size`` is the first measured batch size from
    which every larger one is on the final side of 1.0 (the smallest for ``below``; None for
    ``above`` and ``empty``).
    """
    from draftkit import metrics

    kind, x = metrics.crossover(batch_sizes, speedups, log_x=True)
    pts = [(b, s) for b, s in zip(batch_sizes, speedups) if s is not None]
    first = None
    if kind in ("crosses", "rises", "below"):
        pays_at_end = kind == "rises"
        for b, s in reversed(pts):  # walk back while the points stay on the final side
            if (s >= 1.0) != pays_at_end:
                break
            first = b
    return {"kind": kind, "x": x, "batch_size": first}


def evaluate(args: EvalArgs) -> dict:
    """``draftkit eval``: measure, write the report and print the per-domain table."""
    from draftkit.config import to_dict
    from draftkit.evaluate.report import (break_even_text, domain_table, format_text_table,
                                          write_report)
    from draftkit.tracking import Tracker

    with Tracker("eval", to_dict(args), out_dir=args.out) as tracker:
        report = run_eval(args, tracker)
        files = write_report(report, args.out, tracker)
    print(format_text_table(*domain_table(report)))
    print(f"\n{break_even_text(report)}")
    print(f"report: {files['md']} (also {files['html'].name}, {files['json'].name}, plots)")
    return report
