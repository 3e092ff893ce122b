"""From measurements to the report's figures: what ``draftkit eval`` writes per domain.

:class:`~draftkit.evaluate.measure.Evaluator` measures; these functions turn its runs into
:class:`~draftkit.figures.DomainFigures` (alpha, alpha_i, tau, c, v and the speedup the
model predicts for the rounds the run had), the ``overall`` row (token-weighted over the
domains), a verdict per row, the K sweep's rows (tau and speedup predicted for K = 1..k_max
from the measured alpha_i and v(K), beside the K the sweep measured), a verdict per measured
sweep row by the table's rule (:func:`sweep_verdict`) and the batch sweep's break-even (where
speedup crosses 1.0 as batch size grows, a gain counted only where it is shown).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Callable

from draftkit import metrics
from draftkit.decode.stats import DecodeStats
from draftkit.evaluate import entropy, floor
from draftkit.evaluate.measure import DomainRun, KMeasurement, paired_speedup
from draftkit.evaluate.settings import EvalSettings
from draftkit.figures import (ALPHA_BEFORE, BatchBreakEven, BatchRow, BreakEven, DomainFigures,
                              KSweepRow, PlainStep, shown_speedup)


def domain_figures(run: DomainRun, n_prompts: int, settings: EvalSettings) -> DomainFigures:
    """The report's per-domain fields from one domain's measurements.

    ``k`` (and ``v``, at that K) is the positive K the run used most; under ``--k auto``
    ``plain_round_share`` and ``rounds_by_k`` say how the rounds were spread over K, and
    ``speedup_predicted`` is for that spread (:func:`predicted_speedup`)."""
    stats = run.stats
    step = run.plain_stats.target_step_seconds(1)
    k = stats.k_used()
    plain_tps, spec_tps, low, high, to_decide = measured_speedup(run)
    alphas = stats.alphas()
    by_k = stats.rounds_by_k()
    rounds = stats.rounds or 1
    # Round time the model does not explain: measured decode time per round minus the draft
    # and verify forwards it accounts for (the draft's catch-up after K = 0 rounds included).
    overhead_ms = 1000 * (stats.seconds_other + stats.seconds_catchup) / rounds
    # Nothing drafted (--k 0, or auto never speculated): alpha is unknown, not 0.
    drafted = stats.accepted + stats.rejections > 0
    return DomainFigures(
        n_prompts=n_prompts, new_tokens=run.spec_tokens,
        alpha=stats.alpha() if drafted else None,
        alpha_tv=stats.alpha_tv() if settings.temperature > 0 and drafted else None,
        alpha_after=None,  # the draft's teacher-forced acceptance, set by the caller
        alpha_per_position=alphas, tau=stats.tau(), c=stats.c(step),
        v=stats.v(k, step) if k else None, k=k,
        plain_round_share=by_k.get(0, 0) / rounds,
        rounds_by_k={str(x): by_k[x] for x in sorted(by_k)},
        speedup_predicted=stats.predicted_speedup(step),
        speedup_measured=spec_tps / plain_tps, speedup_low=low, speedup_high=high,
        prompts_to_decide=to_decide,
        plain_tokens_per_s=plain_tps, spec_tokens_per_s=spec_tps,
        target_entropy=None, by_entropy=None, overhead_per_round_ms=overhead_ms,
        verdict=None,  # the teacher-forced figures and the verdict are set by the caller
        draft_per_round=stats.draft_per_round or None)


def measured_speedup(run: DomainRun) -> tuple[float, float, float | None, float | None,
                                               int | None]:
    """(plain tokens/s, speculative tokens/s, the speedup's 95% interval low and high, prompts
    that would decide) of a run, pooled over its prompts and repeats; the interval is a paired
    bootstrap over prompts (:func:`~draftkit.evaluate.measure.paired_speedup`), None from fewer
    than two."""
    pairs = [(p, s, tp, ts) for (p, s), (tp, ts) in zip(run.prompt_seconds, run.prompt_tokens)
             if p > 0 and s > 0]
    if pairs:
        plain_s, spec_s, plain_n, spec_n = (sum(x) for x in zip(*pairs))
    else:  # a run without its prompts' pairs: the repeats' totals
        plain_s, spec_s = sum(run.plain_seconds), sum(run.spec_seconds)
        plain_n, spec_n = run.tokens * len(run.plain_seconds), run.spec_tokens * len(
            run.spec_seconds)
    plain_tps, spec_tps = plain_n / max(plain_s, 1e-12), spec_n / max(spec_s, 1e-12)
    _, low, high, to_decide = paired_speedup(pairs) if pairs else (None,) * 4
    return plain_tps, spec_tps, low, high, to_decide


def verdict(fig: DomainFigures, k_max: int, v: Callable[[int], float] | None = None, *,
            at_k: bool = False, unit: str = "prompt") -> str:
    """Speculate with which K, or do not, and why, from measured figures: "speculate" only where
    the measured speedup's 95% interval lies above 1.0; "inconclusive" where it includes 1.0,
    or where there is no interval (one ``unit`` measured), though the speedup model says a K
    pays, with the prompts that would decide; otherwise the reason it does not pay.

    ``v`` is v(K) for the predictions (:func:`v_of_k`); by default the run's v at every K. With
    ``at_k`` the predictions are at ``fig.k`` alone (a sweep's row, :func:`sweep_verdict`),
    else at the best K up to ``k_max``."""
    measured, alpha, c = fig.speedup_measured, fig.alpha, fig.c
    per_round = bool(fig.draft_per_round)  # c prices a round, not a token (a parallel head)
    low, high = fig.speedup_low, fig.speedup_high
    interval = "" if low is None else f", 95% interval {low:.2f}-{high:.2f}x"
    if measured > 1.0 and fig.k and low is not None and low > 1.0:
        return f"speculate with K={fig.k} (measured {measured:.2f}x{interval})"
    if c is None:
        return "do not speculate: the draft never ran, so its cost is unknown"
    if alpha is None:
        return "do not speculate: no token was drafted, so alpha is unknown"
    if v is None:
        v_run = fig.v if fig.v is not None else 1.0
        v = lambda k: v_run  # noqa: E731
    ks = [fig.k] if at_k and fig.k else list(range(1, k_max + 1))
    be = min(metrics.break_even_alpha(c, k, v, per_round=per_round) for k in ks)
    if not math.isfinite(be):  # no alpha below 1 pays at this c and v
        vs = [v(k) for k in ks]
        span = f"{min(vs):.2f}" if max(vs) - min(vs) < 5e-3 else f"{min(vs):.2f}-{max(vs):.2f}"
        return (f"do not speculate: at this draft's c={c:.2f} and verification cost v="
                f"{span} no acceptance rate pays")
    if alpha < be:
        why = f"alpha {alpha:.2f} is below the break-even {be:.2f} at this draft's c={c:.2f}"
        if c >= 0.5:
            why += " (the draft is too slow)"
        return f"do not speculate: {why}"
    alphas = fig.alpha_per_position or alpha
    best_k, best_s = ((fig.k, metrics.speedup(alphas, c, fig.k, v, per_round=per_round))
                      if len(ks) == 1 else
                      metrics.optimal_k(alphas, c, k_max, v, per_round=per_round))
    if best_k == 0 or best_s <= 1.0:
        return "do not speculate: no K pays at this alpha, c and v"
    predicted = f"predicted {best_s:.2f}x at K={best_k}"
    if low is None:  # one prompt (or batch): a point, not a measurement that decides
        return (f"inconclusive: measured {measured:.2f}x on one {unit}, which gives no "
                f"interval ({predicted}); measure two or more")
    if low <= 1.0 <= high:  # the model says it can pay; not shown yet
        more = (f"; about {fig.prompts_to_decide} prompts would decide"
                if fig.prompts_to_decide else "")
        return f"inconclusive: measured {measured:.2f}x{interval} includes 1.0 ({predicted}){more}"
    overhead = ("" if fig.overhead_per_round_ms is None
                else f" {fig.overhead_per_round_ms:.1f} ms")
    return (f"do not speculate yet: {predicted} but measured {measured:.2f}x{interval}; "
            f"per-round overhead{overhead} eats the gain")


def sweep_verdict(row: KSweepRow | BatchRow, k_max: int, fig: DomainFigures | None = None,
                  v: Callable[[int], float] | None = None) -> str | None:
    """A measured sweep row's verdict, by :func:`verdict`'s rule at the row's own K: the row
    gives K, c, v, the measured speedup and its interval; ``fig`` (the domain a K sweep row
    belongs to) gives alpha_i, else the row's own alpha prices the prediction. None where the
    row measured nothing."""
    if row.speedup_measured is None:
        return None
    batch = getattr(row, "batch_size", 1)
    base = fig if fig is not None else DomainFigures.from_dict({"alpha": row.alpha,
                                                                "alpha_per_position": []})
    own = {name: getattr(row, name) for name in ("k", "c", "v", "speedup_measured",
                                                   "speedup_low", "speedup_high",
                                                   "prompts_to_decide")}
    own["draft_per_round"] = getattr(row, "draft_per_round", None) or base.draft_per_round
    return verdict(dataclasses.replace(base, **own, overhead_per_round_ms=None), k_max,
                   v if fig is not None else None, at_k=True,
                   unit="prompt" if batch == 1 else f"batch of {batch} prompts")


def v_of_k(fig: DomainFigures, measured: list[KMeasurement]):
    """v(K) for the predictions (:func:`metrics.v_between`): the run's v at the run's K, the K
    sweep's v at the K it measured (the mean where several domains' rows measured one K),
    interpolated in between; None when no v was measured."""
    by_k: dict[int, list[float]] = {}
    for r in measured:
        if r.v is not None:
            by_k.setdefault(r.k, []).append(r.v)
    points = {k: statistics.fmean(vs) for k, vs in by_k.items()}
    if fig.k and fig.v is not None:
        points[fig.k] = fig.v  # measured over every round of the run, not a few prompts
    return metrics.v_between(points)


def k_sweep_rows(domain: str, fig: DomainFigures, measured: list[KMeasurement],
                 k_max: int) -> list[KSweepRow]:
    """Predicted tau and speedup for K = 1..k_max from the measured alpha_i, c and v(K)
    (:func:`v_of_k`), beside the figures measured where the sweep ran that K (``tau_measured``,
    c, v, ``speedup_measured`` with its interval and verdict (:func:`sweep_verdict`), and the
    ``prompts`` and ``new_tokens`` they were measured on; None elsewhere)."""
    by_k = {r.k: r for r in measured}
    rows = []
    alpha = fig.alpha_per_position or fig.alpha
    v = v_of_k(fig, measured)
    for k in range(1, k_max + 1):
        pred = tau = None
        if alpha is not None:  # None: nothing was drafted
            tau = metrics.tau(alpha, k)
            if fig.c is not None:
                pred = metrics.speedup(alpha, fig.c, k, v, per_round=bool(fig.draft_per_round))
        m = by_k.get(k)  # the sweep's measurement at this K: None (and so its figures) if none
        row = KSweepRow(
            domain=domain, k=k, tau=tau, tau_measured=m and m.tau, c=m and m.c, v=m and m.v,
            speedup_predicted=pred, speedup_measured=m and m.speedup_measured,
            prompts=m and m.prompts, new_tokens=m and m.new_tokens,
            speedup_low=m and m.speedup_low, speedup_high=m and m.speedup_high,
            prompts_to_decide=m and m.prompts_to_decide)
        row.verdict = sweep_verdict(row, k_max, fig, v)
        rows.append(row)
    return rows


def aggregate(domains: dict[str, DomainFigures], runs: dict[str, DomainRun],
              settings: EvalSettings, measured: list[KMeasurement] = ()) -> DomainFigures:
    """The ``overall`` row: token-weighted over all domains' runs; ``measured`` are the K
    sweep's rows of every domain (their v(K) price the verdict's predictions)."""
    total, plain = DecodeStats(), DecodeStats()
    for run in runs.values():
        total.merge(run.stats)
        plain.merge(run.plain_stats)
    merged = DomainRun(
        [sum(r.plain_seconds[i] for r in runs.values()) for i in range(settings.repeats)],
        [sum(r.spec_seconds[i] for r in runs.values()) for i in range(settings.repeats)],
        sum(r.tokens for r in runs.values()), sum(r.spec_tokens for r in runs.values()),
        total, plain, [],
        prompt_seconds=[p for r in runs.values() for p in r.prompt_seconds],
        prompt_tokens=[p for r in runs.values() for p in r.prompt_tokens])
    fig = domain_figures(merged, sum(d.n_prompts for d in domains.values()), settings)

    def per_token(figure: Callable[[DomainFigures], float | None]) -> float | None:
        """A teacher-forced figure over all domains: one value per decoded token."""
        vals = [(figure(d), d.new_tokens) for d in domains.values() if figure(d) is not None]
        return sum(a * n for a, n in vals) / max(1, sum(n for _, n in vals)) if vals else None

    fig.target_entropy = per_token(lambda d: d.target_entropy)
    fig.alpha_after = per_token(lambda d: d.alpha_after)
    fig.alpha_greedy_drafts = per_token(lambda d: d.alpha_greedy_drafts)
    before = per_token(lambda d: d.alpha_before)
    if before is not None:  # the key only where a baseline was measured, as in the domains
        fig.baselines[ALPHA_BEFORE] = before
    by_entropy = [d.by_entropy for d in domains.values() if d.by_entropy is not None]
    if by_entropy:
        fig.by_entropy = entropy.merge(by_entropy)
    fig.verdict = verdict(fig, settings.k_max, v_of_k(fig, list(measured)))
    return fig


def plain_step(runs: dict[str, DomainRun], overall: DomainFigures, target_model,
               device) -> PlainStep:
    """Plain decoding's time per token over every domain, its one-token forward alone, and the
    memory floor of the target on ``device``, measured now."""
    calls = sum(r.plain_stats.target_calls_by_tokens.get(1, 0) for r in runs.values())
    secs = sum(r.plain_stats.target_seconds_by_tokens.get(1, 0.0) for r in runs.values())
    rate = floor.read_bytes_per_second(device)
    ran = DecodeStats()
    for r in runs.values():
        ran.merge(r.plain_stats)
        ran.merge(r.stats)
    return PlainStep(ms_per_token=1000 / overall.plain_tokens_per_s,
                     forward_ms=1000 * secs / calls if calls else None,
                     floor_ms=1000 * floor.floor_seconds(target_model, rate),
                     weights_gb=floor.weight_bytes(target_model) / 1e9, read_gb_per_s=rate / 1e9,
                     decode_path=ran.path_text())


def break_even(batch_rows: list[BatchRow], domains: dict[str, DomainFigures]) -> BreakEven:
    """Where speculation stops (or starts) paying along the batch sweep, measured, and per
    domain as predicted from the measured c(B), v(B) and that domain's alpha_i.

    Each is :func:`break_even_batch` of its curve, so that a noisy dip that recovers, or batch
    sizes given out of order, do not move it. A measured gain counts only where it is shown
    (:func:`shown_speedup`): under ``--k auto`` a batch size where the policy kept to plain
    decoding measures 1.0x give or take the clock, and one such 1.001x must not read as
    "pays from here on"."""
    rows = sorted(batch_rows, key=lambda r: r.batch_size)
    bs = [r.batch_size for r in rows]
    per_domain = {}
    for name, fig in domains.items():
        alpha = fig.alpha_per_position or fig.alpha
        predicted = [metrics.speedup(alpha, r.c, r.k, r.v, per_round=bool(r.draft_per_round))
                     if None not in (alpha, r.c, r.v) else None for r in rows]
        per_domain[name] = break_even_batch(bs, predicted)
    return BreakEven.of(break_even_batch(bs, [shown_speedup(r) for r in rows]),
                        per_domain=per_domain)


def break_even_batch(batch_sizes: list[int], speedups: list[float | None]) -> BatchBreakEven:
    """The break-even of one speedup-against-batch-size curve (points in batch order).

    ``kind`` and ``x`` are :func:`draftkit.metrics.crossover`'s in log2 B (``crosses``: it
    stops paying at x; ``rises``: it pays only from x on; ``below`` / ``above``: it loses /
    pays at every batch size; ``empty``). ``batch_size`` is the first measured batch size from
    which every larger one is on the final side of 1.0 (the smallest for ``below``; None for
    ``above`` and ``empty``).
    """
    kind, x = metrics.crossover(batch_sizes, speedups, log_x=True)
    pts = [(b, s) for b, s in zip(batch_sizes, speedups) if s is not None]
    first = None
    if kind in ("crosses", "rises", "below"):
        pays_at_end = kind == "rises"
        for b, s in reversed(pts):  # walk back while the points stay on the final side
            if (s >= 1.0) != pays_at_end:
                break
            first = b
    return BatchBreakEven(kind=kind, x=x, batch_size=first)
