"""One evaluation: a target and draft measured on a suite's domains, into an EvalReport.

Per domain, :class:`~draftkit.evaluate.measure.Evaluator` decodes every prompt plainly and
speculatively, the teacher-forced figures are taken on the continuations it decoded, and the K
sweep runs on the domain's first prompts; then the batch sweep runs on every domain's prompts
mixed. :mod:`draftkit.evaluate.analysis` turns each measurement into the report's figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from draftkit.chat import encode_prompt
from draftkit.data.generate import answer_stop_ids, engine_answers
from draftkit.data.turns import answer_text
from draftkit.decode.dtype_choice import load_decoding_pair
from draftkit.evaluate import analysis
from draftkit.evaluate.measure import GREEDY_DRAFTS, DomainRun, Evaluator
from draftkit.evaluate.settings import EvalSettings
from draftkit.evaluate.suite import benchmark_of, by_domain, load_suite, with_later_turns
from draftkit.figures import ALPHA_BEFORE, BatchRow, DomainFigures, EvalReport, now
from draftkit.models import load_another_draft


def eval_report(target: str, draft: str, suite: Path, settings: EvalSettings, *,
                baseline_draft: str | None = None, limit: int | None = None,
                domains: list[str] | None = None, device: str | None = None,
                dtype: str = "auto", every_turn: bool = False) -> EvalReport:
    """Measure ``draft`` against ``target`` on the suite's domains (at most ``limit`` prompts
    each, only ``domains`` if given) and return the report; with ``baseline_draft``, its
    teacher-forced acceptance on the same continuations is each row's ``alpha_before``.
    ``every_turn``: a benchmark's multi-turn questions add their later turns, each after the
    target's greedy answers to those before (:func:`~draftkit.evaluate.suite.with_later_turns`)."""
    rows = load_suite(suite, limit=limit, domains=domains)
    pair, chosen = load_decoding_pair(target, draft, device=device, dtype=dtype)
    if every_turn:
        rows = with_later_turns(rows, lambda chats: target_answers(pair, chats,
                                                                   settings.max_new_tokens))
    baselines: dict[str, Any] = {}
    if baseline_draft:
        baselines[ALPHA_BEFORE] = load_another_draft(pair, baseline_draft, device=device,
                                                     dtype=chosen.dtype)
    prompts = {name: [encode_prompt(pair.tokenizer, r.prompt) for r in group]
               for name, group in by_domain(rows).items()}
    total = sum(2 * len(p) * settings.repeats for p in prompts.values())
    if settings.k_sweep:
        total += sum(min(len(p), settings.k_sweep_prompts) * (1 + len(settings.k_sweep))
                     for p in prompts.values())
    total += len(swept_sizes(settings))
    torch.manual_seed(settings.seed)
    figures: dict[str, DomainFigures] = {}
    runs: dict[str, DomainRun] = {}
    k_rows = []
    swept = []  # the K sweep's measurements, every domain
    with tqdm(total=total, desc="eval", unit="run", dynamic_ncols=True) as bar:
        ev = Evaluator(pair.target, pair.draft, settings, progress=lambda n=1: bar.update(n))
        for name, ids in prompts.items():
            bar.set_postfix_str(name)
            run = ev.run_domain(ids)
            fig = analysis.domain_figures(run, len(ids), settings)
            tf = ev.teacher_forced(run.sequences, baselines)
            fig.target_entropy = tf.target_entropy
            # like for like with alpha_before: teacher-forced too, unlike the decode-time alpha
            fig.alpha_after = tf.acceptance.pop("draft")
            fig.alpha_greedy_drafts = tf.acceptance.pop(GREEDY_DRAFTS, None)
            fig.baselines = tf.acceptance
            fig.by_entropy = tf.by_entropy
            measured = ev.k_sweep(ids) if settings.k_sweep else []
            fig.verdict = analysis.verdict(fig, settings.k_max, analysis.v_of_k(fig, measured))
            figures[name] = fig
            runs[name] = run
            swept += measured
            k_rows += analysis.k_sweep_rows(name, fig, measured, settings.k_max)
            alpha = "n/a" if fig.alpha is None else f"{fig.alpha:.2f}"
            bar.set_postfix_str(f"{name} alpha={alpha} S={fig.speedup_measured:.2f}x")
        overall = analysis.aggregate(figures, runs, settings, swept)
        baseline = analysis.plain_step(runs, overall, pair.target, ev.device) if runs else None
        batch_rows = []
        if settings.batch_sizes:
            # Interleave domains so every batch size mixes them.
            mixed = [ids[i] for i in range(max(map(len, prompts.values())))
                     for ids in prompts.values() if i < len(ids)]
            bar.set_postfix_str("batch sweep")
            batch_rows = batch_sweep(ev, mixed, overall, settings)
    return EvalReport(
        target=pair.target_ref.name, draft=pair.draft_ref.name if pair.draft_ref else None,
        device=str(ev.device),
        dtype=chosen.dtype, dtype_choice=chosen.describe(),
        temperature=settings.temperature, k=settings.k, created=now(), domains=figures,
        draft_sample_method=settings.draft_sample_method if settings.temperature > 0 else None,
        verify=settings.verify if settings.temperature > 0 else None,
        overall=overall, k_sweep=k_rows, batch_sweep=batch_rows,
        break_even=analysis.break_even(batch_rows, figures), plain_step=baseline,
        batch_sweep_k=sweep_k(settings) if batch_rows else None,
        benchmark=benchmark_of(rows, every_turn))


def target_answers(pair: Any, chats: list, max_new_tokens: int) -> list[str]:
    """The target's greedy answer to each chat, as text a client sends back in the history."""
    stops = answer_stop_ids(pair.target, pair.tokenizer)
    prompts = [encode_prompt(pair.tokenizer, chat) for chat in chats]
    done = dict(engine_answers(pair.target, prompts, max_new_tokens, 0.0, stops,
                               [0] * len(prompts), min(len(prompts), 16)))
    return [answer_text(pair.tokenizer, done[i], stops) for i in range(len(prompts))]


def batch_sweep(ev: Evaluator, prompts: list[list[int]], overall: DomainFigures,
                settings: EvalSettings) -> list[BatchRow]:
    """The batch sweep, in one voice with the table: at the table's K (auto, or the number
    given; K 1 under --k 0, to show what speculation would buy) on the suite's prompts, with the
    table's new tokens unless --batch-tokens says otherwise, each batch size over up to
    --batch-groups batches of distinct prompts (its interval). Batch size 1 is the table's own
    overall row, interval and verdict included, rather than one prompt measured again."""
    rows = {row.batch_size: row for row in ev.batch_sweep(prompts, sweep_k(settings),
                                                           swept_sizes(settings))}
    for row in rows.values():  # the table's rule at each row's K and B
        row.verdict = analysis.sweep_verdict(row, settings.k_max)
    if 1 not in rows and 1 in settings.batch_sizes:
        rows[1] = BatchRow.of(overall, batch_size=1, batches=overall.n_prompts)
    return [rows[b] for b in settings.batch_sizes]


def sweep_k(settings: EvalSettings):
    """The batch sweep's K: the table's, but K 1 under --k 0."""
    return settings.k if settings.k != 0 else 1


def swept_sizes(settings: EvalSettings) -> list[int]:
    """The batch sizes the sweep decodes: all but 1 where the table measured batch 1 as the
    sweep would (speculating, with the sweep's tokens)."""
    table_is_b1 = settings.k != 0 and settings.batch_tokens in (None, settings.max_new_tokens)
    return [b for b in settings.batch_sizes if not (b == 1 and table_is_b1)]
