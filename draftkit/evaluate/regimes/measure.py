"""Measuring the regimes: every draft on every prompt against plain decoding run right next to
it, the main draft at every temperature, and its batch sweep with the K policy's choice.

Everything the four regimes read is measured here, draft by draft (one engine in memory at a
time besides the target); :mod:`.analysis` turns it into the report's sections.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from draftkit import metrics
from draftkit.decode.k import AUTO
from draftkit.decode.stats import DecodeStats
from draftkit.evaluate import analysis as eval_analysis
from draftkit.evaluate.measure import DomainRun, Evaluator, batches
from draftkit.evaluate.regimes.drafts import Draft
from draftkit.evaluate.settings import EvalSettings
from draftkit.figures import DomainFigures, PointFigures, PolicyBatchRow


# how the measured speedups' intervals are taken, as the report states it
INTERVALS = ("95% paired bootstrap over the prompts of a domain, temperature or draft (each "
             "prompt decoded plainly and with speculation back to back; none for one prompt) "
             "and over the batches of distinct prompts at a batch size (none for one batch)")


@dataclass
class PromptFigures:
    """One draft at one temperature: figures per prompt, per domain and over every prompt, the
    domain and overall figures token-weighted over their prompts' runs (eval's rule)."""

    prompts: dict[str, list[PointFigures]]  # domain -> one per prompt
    domains: dict[str, PointFigures]
    overall: PointFigures


@dataclass
class Measurements:
    at_zero: dict[str, PromptFigures]  # draft name -> its figures at T = 0
    by_temperature: dict[float, PromptFigures]  # the main draft's, at each temperature
    batch: dict[str, list[PolicyBatchRow]]  # domain -> the main draft's batch sweep
    temperatures: list[float]


def point(fig: DomainFigures) -> PointFigures:
    """What the regime map keeps of eval's figures (the rest is noise here), and the
    break-even alpha at their c, K and v."""
    be = (_finite(metrics.break_even_alpha(fig.c, fig.k, fig.v,
                                           per_round=bool(fig.draft_per_round)))
          if fig.c is not None and fig.k else None)
    return PointFigures.of(fig, break_even_alpha=be)


def _finite(x: float) -> float | None:
    return None if x == float("inf") else x


def measure_prompts(ev: Evaluator, prompts: dict[str, list[list[int]]],
                    entropy: bool) -> PromptFigures:
    """Each prompt decoded with K = 0 and with speculation at K, back to back (with
    ``entropy``, the target's entropy on the continuation too): a prompt's figures have no
    interval, a domain's and the overall figures one over their prompts (eval's)."""
    per_prompt: dict[str, list[PointFigures]] = {}
    domains: dict[str, PointFigures] = {}
    all_figs: dict[str, DomainFigures] = {}
    all_runs: dict[str, DomainRun] = {}
    for domain, ids_list in prompts.items():
        figs, runs = {}, {}
        for i, ids in enumerate(ids_list):
            run = ev.run_domain([ids])
            fig = eval_analysis.domain_figures(run, 1, ev.s)
            if entropy:
                fig.target_entropy = ev.teacher_forced(run.sequences, {},
                                                       with_draft=False).target_entropy
            figs[str(i)], runs[str(i)] = fig, run
            all_figs[f"{domain}/{i}"], all_runs[f"{domain}/{i}"] = fig, run
        per_prompt[domain] = [point(f) for f in figs.values()]
        domains[domain] = point(eval_analysis.aggregate(figs, runs, ev.s))
    return PromptFigures(prompts=per_prompt, domains=domains,
                         overall=point(eval_analysis.aggregate(all_figs, all_runs, ev.s)))


def measure_batches(ev: Evaluator, prompts: list[list[int]], k: int) -> list[PolicyBatchRow]:
    """eval's batch sweep at fixed K (measured c(B), v(B), speedup over the batches of distinct
    prompts, with its interval and verdict), then the K policy on the same batches: the K it
    used most and its speedup over the same K = 0 runs."""
    rows = []
    for row in ev.batch_sweep(prompts, k, ev.s.batch_sizes):
        row.verdict = eval_analysis.sweep_verdict(row, ev.s.k_max)
        stats, secs, tokens = DecodeStats(), 0.0, 0
        for batch in batches(prompts, row.batch_size, ev.s.batch_groups):
            res, t = ev.decode(batch, ev.choice(AUTO), ev.s.sweep_tokens, stats, ev.s.seed)
            secs, tokens = secs + t, tokens + sum(len(r.tokens) for r in res)
        ev.progress(1)
        be = (_finite(metrics.break_even_alpha(row.c, k, row.v,
                                               per_round=bool(row.draft_per_round)))
              if row.c is not None and row.v is not None else None)
        rows.append(PolicyBatchRow.of(row, policy_k=stats.k_used(),
                                      speedup_policy=tokens / secs / row.plain_tokens_per_s,
                                      break_even_alpha=be))
    return rows


def measure(pair, drafts: list[Draft], prompts: dict[str, list[list[int]]],
            batch_prompts: dict[str, list[list[int]]], settings: EvalSettings,
            temperatures: list[float], bar) -> Measurements:
    """Everything the four regimes read: ``settings`` (at T = 0) for every draft, and the main
    draft at each of ``temperatures`` (T = 0 always among them) and at each batch size."""
    progress = lambda n=1: bar.update(n)  # noqa: E731
    main = next(d for d in drafts if d.main)
    at_zero: dict[str, PromptFigures] = {}
    by_temperature: dict[float, PromptFigures] = {}
    temps = sorted(set(temperatures) | {0.0})
    for t in temps:  # the main draft: entropy regime (T = 0 is also its cost / mismatch cell)
        bar.set_postfix_str(f"{main.name} T={t:g}")
        ev = Evaluator(pair.target, main.model, dataclasses.replace(settings, temperature=t),
                       progress)
        by_temperature[t] = measure_prompts(ev, prompts, entropy=True)
    at_zero[main.name] = by_temperature[0.0]
    for d in drafts:
        if d.main:
            continue
        bar.set_postfix_str(d.name)
        ev = Evaluator(pair.target, d.model, settings, progress)
        at_zero[d.name] = measure_prompts(ev, prompts, entropy=False)
    batch: dict[str, list[PolicyBatchRow]] = {}
    if settings.batch_sizes:
        ev = Evaluator(pair.target, main.model, settings, progress)
        for domain, ids in batch_prompts.items():
            bar.set_postfix_str(f"batch {domain}")
            batch[domain] = measure_batches(ev, ids, settings.k)
    return Measurements(at_zero=at_zero, by_temperature=by_temperature, batch=batch,
                        temperatures=temps)


def planned_runs(n_prompts: int, n_domains: int, n_drafts: int, temperatures: list[float],
                 batch_sizes: list[int]) -> int:
    """Progress-bar units: decodes at batch 1, batch sizes (K = 0 + K) and policy runs."""
    temps = len(set(temperatures) | {0.0})
    return 2 * n_prompts * (temps + n_drafts - 1) + 2 * n_domains * len(batch_sizes)
