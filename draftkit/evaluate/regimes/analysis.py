"""The regime map's sections: each regime's curves and crossovers from the measured figures,
and its answer in one sentence, worded from the data; then one headline over all four. A
measured gain counts only where the measurement backs it, by eval's rule (:func:`shown`).

Pure functions of the measurements (:mod:`.measure`); nothing here decodes.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Callable

from draftkit import metrics
from draftkit.evaluate.regimes.crossovers import (crossing, describe, entropy_crossover,
                                                  entropy_model_text)
from draftkit.figures import (BatchRegime, BatchRow, CostRegime, Crossover, CrossoverPair,
                              DraftInfo, DraftPoint, EntropyCrossovers, EntropyRegime,
                              EntropyRegimeCrossovers, MismatchCounts, MismatchRegime, PointFigures,
                              PolicyBatchRow, PromptPoint, RegimesReport, TemperatureCrossovers,
                              TemperaturePoint, shown_speedup)

if TYPE_CHECKING:  # the measurements import torch; only their types are read here
    from draftkit.evaluate.regimes.measure import PromptFigures


def _span(values, fmt: str = "{:.2f}") -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    lo, hi = min(vals), max(vals)
    return fmt.format(lo) if abs(hi - lo) < 5e-3 else f"{fmt.format(lo)}-{fmt.format(hi)}"


def shown(rows) -> list[float | None]:
    """The measured speedups of a curve's points where the measurement backs a gain: eval's
    rule (:func:`~draftkit.evaluate.analysis.shown_speedup`: an interval above 1.0, or without
    one the model's prediction too), so that a measured crossover does not rest on a gain
    within the noise."""
    return [shown_speedup(r) for r in rows]


def _gains(rows) -> tuple[list, list]:
    """(the points whose gain is shown, those that measured a gain that is not)."""
    shown_ = [r for r in rows if (shown_speedup(r) or 0.0) > 1.0]
    return shown_, [r for r in rows if (r.speedup_measured or 0.0) > 1.0 and r not in shown_]


def depth_trend(curve: list[DraftPoint], figure: Callable[[DraftPoint], float | None]) -> str:
    """How a figure moves with draft depth, in words from the measured points (``curve`` in
    depth order): it rises or falls only if every step does."""
    pts = [(r.layers, figure(r)) for r in curve if figure(r) is not None]
    if not pts:
        return "was not measured"
    vals = [v for _, v in pts]
    (d0, v0), (d1, v1) = pts[0], pts[-1]
    ends = f"from {v0:.2f} ({d0} layers) to {v1:.2f} ({d1} layers)"
    if max(vals) - min(vals) < 5e-3:
        return f"stays at {v0:.2f}"
    if all(a <= b for a, b in zip(vals, vals[1:])):
        return f"rises {ends}"
    if all(a >= b for a, b in zip(vals, vals[1:])):
        return f"falls {ends}"
    return f"moves unevenly ({_span(vals)}), {ends}"


def entropy_regime(draft: str, by_temperature: dict[float, PromptFigures], temps: list[float],
                   k: int) -> EntropyRegime:
    zero = by_temperature[0.0]
    prompts = [PromptPoint.of(p, domain=d, index=i) for d, ps in zero.prompts.items()
               for i, p in enumerate(ps)]
    base = zero.overall
    alpha_be = base.break_even_alpha
    rows = []
    for t in temps:
        res = by_temperature[t]
        rows.append(TemperaturePoint.of(res.overall, temperature=t,
                                        per_domain={d: res.domains[d] for d in res.domains}))
    xs = [r.temperature for r in rows]
    cross_t = TemperatureCrossovers(
        measured=crossing(xs, shown(rows)),
        predicted=crossing(xs, [r.speedup_predicted for r in rows]),
        alpha=(crossing(xs, [r.alpha for r in rows], alpha_be)
               if alpha_be is not None else Crossover(kind="empty", x=None)))
    hs = [p.target_entropy for p in prompts]
    cross_h = EntropyCrossovers(
        measured=crossing(hs, shown(prompts)),
        predicted=crossing(hs, [p.speedup_predicted for p in prompts]),
        model=entropy_crossover(prompts, alpha_be))
    per_domain_t = {d: CrossoverPair(
        measured=crossing(xs, shown([r.per_domain[d] for r in rows])),
        predicted=crossing(xs, [r.per_domain[d].speedup_predicted for r in rows]))
        for d in zero.domains}
    measured = [r.speedup_measured for r in rows]
    pays, unshown = _gains(rows)
    temps_of = lambda rs: ", ".join(f"{r.temperature:g}" for r in rs)  # noqa: E731
    head = (f"with {draft} at K={k}, speculation pays at temperature {temps_of(pays)}" if pays
            else f"with {draft} at K={k}, speculation pays at no temperature measured")
    if unshown:
        head += f" (at {temps_of(unshown)} a gain its interval or the model does not back)"
    answer = (f"{head} (speedup {_span(measured)}x); measured: "
              f"{describe(cross_t.measured, 'temperature')}; predicted from alpha, c, v: "
              f"{describe(cross_t.predicted, 'temperature')}. Per prompt, "
              f"{entropy_model_text(cross_h.model)}.")
    return EntropyRegime(
        draft=draft, k=k, break_even_alpha=alpha_be, c=base.c, v=base.v, prompts=prompts,
        domains=zero.domains, temperatures=rows,
        crossover=EntropyRegimeCrossovers(temperature=cross_t, entropy=cross_h,
                                          per_domain_temperature=per_domain_t),
        answer=answer)


def cost_regime(drafts: list[DraftInfo], at_zero: dict[str, PromptFigures],
                k: int) -> CostRegime:
    rows = []
    for d in drafts:
        if not (d.derived or d.main):
            continue
        fig = at_zero[d.name].overall
        alphas = fig.alpha_per_position or fig.alpha
        max_c = (metrics.max_draft_cost(alphas, k, fig.v, per_round=bool(fig.draft_per_round))
                 if fig.v is not None and alphas is not None else None)
        rows.append(DraftPoint.of(fig, name=d.name, layers=d.layers, derived=d.derived,
                                  main=d.main, max_c=max_c))
    curve = sorted((r for r in rows if r.derived), key=lambda r: r.layers)
    xs = [r.layers for r in curve]
    cross = CrossoverPair(measured=crossing(xs, shown(curve)),
                          predicted=crossing(xs, [r.speedup_predicted for r in curve]))

    def best(figure: Callable[[DraftPoint], float | None]) -> str | None:
        vals = [r for r in rows if figure(r) is not None]
        return max(vals, key=figure).name if vals else None

    best_m = best(lambda r: r.speedup_measured)
    best_p = best(lambda r: r.speedup_predicted)
    pays = [r for r in curve if r.c is not None and r.max_c is not None and r.c < r.max_c]
    answer = (f"with early-exit depth, alpha {depth_trend(curve, lambda r: r.alpha)} and c "
              f"{depth_trend(curve, lambda r: r.c)}; measured speedup "
              f"{_span(r.speedup_measured for r in rows)}x, best {best_m}; measured: "
              f"{describe(cross.measured, 'draft layers')}; predicted: "
              f"{describe(cross.predicted, 'draft layers')}. ")
    best_curve = max((r for r in curve if r.speedup_measured is not None),
                     key=lambda r: r.speedup_measured, default=None)
    # "no longer pays" only past a depth that paid
    if (best_curve is not None and best_curve is not curve[-1]
            and (shown_speedup(best_curve) or 0.0) > 1.0):
        answer += (f"Past {best_curve.layers} layers, a deeper draft's extra acceptance no "
                   f"longer pays for its extra cost. ")
    answer += (f"The model says a draft pays only while c stays below the largest cost its alpha "
               f"affords (c_max); {len(pays)} of {len(curve)} derived drafts are under it.")
    return CostRegime(k=k, drafts=rows, crossover=cross, best_measured=best_m,
                      best_predicted=best_p, answer=answer)


def mismatch_regime(drafts: list[DraftInfo], at_zero: dict[str, PromptFigures],
                    domains: list[str]) -> MismatchRegime:
    homes = any(d.home for d in drafts)
    rows = [d for d in drafts if d.home or d.main or not homes]

    def matrix(figure: Callable[[PointFigures], float | None]) -> list[list[float | None]]:
        return [[figure(at_zero[d.name].domains[dom]) for dom in domains] for d in rows]

    alpha = matrix(lambda f: f.alpha)
    measured = matrix(lambda f: f.speedup_measured)
    predicted = matrix(lambda f: f.speedup_predicted)
    low, high = matrix(lambda f: f.speedup_low), matrix(lambda f: f.speedup_high)
    has_interval = any(x is not None for r in low for x in r)
    flat = [(m, p) for mr, pr in zip(measured, predicted) for m, p in zip(mr, pr)
            if m is not None and p is not None]
    slow_m = sum(m < 1.0 for m, _ in flat)
    slow_p = sum(p < 1.0 for _, p in flat)
    agree = sum((m < 1.0) == (p < 1.0) for m, p in flat)
    cross = MismatchCounts(cells=len(flat), measured_slowdowns=slow_m,
                           predicted_slowdowns=slow_p, agree=agree)
    answer = (f"{slow_m} of {len(flat)} draft x domain cells are measured slowdowns; the model "
              f"predicts {slow_p} from each cell's alpha, c and v and agrees on {agree}. ")
    if homes:
        home_a = [a for d, ar in zip(rows, alpha) for dom, a in zip(domains, ar)
                  if d.home == dom and a is not None]
        away_a = [a for d, ar in zip(rows, alpha) for dom, a in zip(domains, ar)
                  if d.home and d.home != dom and a is not None]
        home = statistics.fmean(home_a) if home_a else None
        away = statistics.fmean(away_a) if away_a else None
        cross.home_and_away = {"alpha_home": home, "alpha_away": away}
        if home_a and away_a:
            answer += f"Drafts accept {home:.2f} on their own domain and {away:.2f} elsewhere."
    else:
        main_row = next(i for i, d in enumerate(rows) if d.main)
        vals = [(a, dom) for a, dom in zip(alpha[main_row], domains) if a is not None]
        if vals:
            lo, hi = min(vals), max(vals)
            answer += (f"No domain-distilled drafts were given (--drafts-by-domain), so rows are "
                       f"the drafts measured; the main draft's alpha ranges from {lo[0]:.2f} "
                       f"({lo[1]}) to {hi[0]:.2f} ({hi[1]}).")
    return MismatchRegime(drafts=[d.name for d in rows], home={d.name: d.home for d in rows},
                          domains=domains, alpha=alpha, speedup_measured=measured,
                          speedup_predicted=predicted, crossover=cross, answer=answer,
                          speedup_low=low if has_interval else None,
                          speedup_high=high if has_interval else None)


def batch_crossovers(rows: list[BatchRow]) -> CrossoverPair:
    """Measured and predicted break-even batch size (interpolated in log2 B); a measured gain
    counts where it is shown, as in eval's break-even (:func:`shown`)."""
    bs = [r.batch_size for r in rows]
    return CrossoverPair(measured=crossing(bs, shown(rows), log_x=True),
                         predicted=crossing(bs, [r.speedup_predicted for r in rows], log_x=True))


def batch_regime(draft: str, batch: dict[str, list[PolicyBatchRow]], k: int) -> BatchRegime:
    if not batch:
        return BatchRegime(draft=draft, k=k, domains={}, crossover={},
                           answer="not measured (no --batch-sizes)")
    cross = {d: batch_crossovers(rows) for d, rows in batch.items()}
    allrows = [r for rows in batch.values() for r in rows]
    ks = sorted({r.policy_k for r in allrows})
    groups: dict[str, list[str]] = {}  # domains whose crossovers read the same share a line
    for d, c in cross.items():
        text = (f"measured {describe(c.measured, 'batch')}, predicted "
                f"{describe(c.predicted, 'batch')}")
        groups.setdefault(text, []).append(d)
    parts = [f"{', '.join(ds) if len(ds) < len(cross) else 'every domain'}: {text}"
             for text, ds in groups.items()]
    answer = (f"with {draft} at K={k}, speedup runs {_span(r.speedup_measured for r in allrows)}"
              f"x over batch sizes {min(r.batch_size for r in allrows)}-"
              f"{max(r.batch_size for r in allrows)}, with v(B) "
              f"{_span(r.v for r in allrows)}; the policy picks K in "
              f"{{{', '.join(map(str, ks))}}}. " + "; ".join(parts) + ".")
    return BatchRegime(draft=draft, k=k, domains=batch, crossover=cross, answer=answer)


def headline(report: RegimesReport) -> str:
    """One sentence over all four regimes: where speculation paid, as measured, a gain counted
    only where the measurement backs it (:func:`shown`)."""
    points = [("temperature " + f"{r.temperature:g}", r) for r in report.entropy.temperatures]
    points += [(r.name, r) for r in report.draft_cost.drafts]
    mis = report.mismatch
    cell = lambda i, j, m: PointFigures.from_dict({  # noqa: E731
        "speedup_measured": m, "speedup_predicted": mis.speedup_predicted[i][j],
        "speedup_low": mis.speedup_low and mis.speedup_low[i][j],
        "speedup_high": mis.speedup_high and mis.speedup_high[i][j]})
    points += [(f"{d} on {dom}", cell(i, j, m)) for i, (d, row) in
               enumerate(zip(mis.drafts, mis.speedup_measured))
               for j, (dom, m) in enumerate(zip(mis.domains, row))]
    points += [(f"batch {r.batch_size} ({dom})", r)
               for dom, rows in report.batch.domains.items() for r in rows]
    points = [(name, r) for name, r in points if r.speedup_measured is not None]
    wins, unshown = _gains([r for _, r in points])
    names = {id(r): name for name, r in points}
    speedups = _span(r.speedup_measured for _, r in points)
    noise = (f"; {len(unshown)} measured a gain that its interval or the model does not back"
             if unshown else "")
    main = report.entropy
    if not wins:
        be = main.break_even_alpha
        why = ""
        a = main.temperatures[0].alpha if main.temperatures else None  # T = 0
        if None not in (be, a, main.c, main.v):
            at = f"at c={main.c:.2f}, v={main.v:.2f}"
            why = (f"; the model agrees: the draft's alpha {a:.2f} is below the {be:.2f} it "
                   f"needs {at}" if a < be else
                   f"; the model predicts a gain (the draft's alpha {a:.2f} is at or above the "
                   f"break-even {be:.2f} {at}), so per-round overhead, which it leaves out, ate "
                   f"it")
        return (f"Speculation did not pay anywhere measured ({len(points)} points, speedup "
                f"{speedups}x{noise}){why}.")
    best = max(wins, key=lambda r: r.speedup_measured)
    unsure = (f", and measured a gain at {len(unshown)} more that its interval or the model "
              f"does not back" if unshown else "")
    return (f"Speculation paid at {len(wins)} of {len(points)} points measured (best "
            f"{best.speedup_measured:.2f}x: {names[id(best)]}), lost at "
            f"{len(points) - len(wins) - len(unshown)}{unsure}; the regimes below say where "
            f"the line runs.")
