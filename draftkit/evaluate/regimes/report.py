"""Writing the regime map: ``report.json``, ``report.md``, ``report.html`` and one PNG per regime.

The Markdown and HTML read as a short answer to "when does speculation pay for this target and
draft, and when does it not": the four one-sentence answers first, then per regime its figure,
the measured crossover next to the predicted one, and the numbers behind them.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from draftkit.evaluate.regimes.crossovers import describe, entropy_model_text
from draftkit.evaluate.render import (error_bars, fmt, html_image, html_page, html_table,
                                      interval_cell, markdown_table, save_png, write_files)
from draftkit.figures import (BatchRegime, CostRegime, Crossover, EntropyRegime, MismatchRegime,
                              RegimesReport)

# report key, title
REGIMES = [("entropy", "Entropy and temperature"), ("draft_cost", "Draft cost"),
           ("mismatch", "Domain mismatch"), ("batch", "Batch size")]
PLOTS = {"entropy": "regime_entropy.png", "draft_cost": "regime_draft_cost.png",
         "mismatch": "regime_mismatch.png", "batch": "regime_batch.png"}


# --- plots --------------------------------------------------------------------------------------

def _vline(ax, cross: Crossover, color: str, label: str) -> None:
    """Mark a crossover: ``label`` is "measured" or "predicted"."""
    if cross.x is not None:
        how = "falls below" if cross.kind == "crosses" else "rises above"
        ax.axvline(cross.x, color=color, ls=":", lw=1.2,
                   label=f"{label}: {how} 1.0 at {cross.x:.3g}")


def _plot_entropy(plt, sec: EntropyRegime):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    domains = list(sec.domains)
    color = {d: f"C{i % 10}" for i, d in enumerate(domains)}
    for p in sec.prompts:
        if p.target_entropy is None:
            continue
        col = color[p.domain]
        ax1.scatter(p.target_entropy, p.speedup_measured, marker="o", color=col, s=28)
        ax1.scatter(p.target_entropy, p.alpha, marker="^", color=col, s=22, alpha=0.6)
    for d, f in sec.domains.items():
        if f.target_entropy is not None:
            ax1.scatter(f.target_entropy, f.speedup_measured, marker="o", s=110,
                        facecolors="none", edgecolors=color[d], label=d)
    model = sec.crossover.entropy.model
    hs = [p.target_entropy for p in sec.prompts if p.target_entropy is not None]
    if model.slope is not None and hs:
        lo, hi = min(hs), max(hs)
        ax1.plot([lo, hi], [model.intercept + model.slope * h for h in (lo, hi)], "k--",
                 lw=0.8, label="alpha fit")
    ax1.axhline(1.0, color="gray", lw=1)
    if sec.break_even_alpha is not None:
        ax1.axhline(sec.break_even_alpha, color="red", ls="--", lw=0.8,
                    label=f"break-even alpha {sec.break_even_alpha:.2f}")
    ax1.set_xlabel("target entropy (nats per token) on its greedy continuation")
    ax1.set_ylabel("speedup (o) and alpha (^)")
    ax1.set_title("per prompt (small) and per domain (rings)", fontsize=9)
    ax1.legend(fontsize=7)
    rows = sec.temperatures
    ts = [r.temperature for r in rows]
    ax2.errorbar(ts, [r.speedup_measured for r in rows], yerr=error_bars(rows), fmt="o-",
                 color="C0", capsize=3, label="speedup measured")
    ax2.plot(ts, [r.speedup_predicted for r in rows], "s--", color="C0", alpha=0.6,
             label="speedup predicted")
    ax2.plot(ts, [r.alpha for r in rows], "^-", color="C2", label="alpha")
    for d in domains:
        ax2.plot(ts, [r.per_domain[d].speedup_measured for r in rows], "-",
                 color=color[d], lw=0.7, alpha=0.6)
    ax2.axhline(1.0, color="gray", lw=1)
    if sec.break_even_alpha is not None:
        ax2.axhline(sec.break_even_alpha, color="red", ls="--", lw=0.8)
    cross = sec.crossover.temperature
    _vline(ax2, cross.measured, "C0", "measured")
    _vline(ax2, cross.predicted, "C1", "predicted")
    ax2.set_xlabel("temperature")
    ax2.set_title("against temperature (thin: per domain, measured)", fontsize=9)
    ax2.legend(fontsize=7)
    return fig


def _plot_cost(plt, sec: CostRegime):
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    curve = sorted((r for r in sec.drafts if r.derived), key=lambda r: r.layers)
    xs = [r.layers for r in curve]
    ax.errorbar(xs, [r.speedup_measured for r in curve], yerr=error_bars(curve) if curve else
                None, fmt="o-", capsize=3, label="speedup measured")
    ax.plot(xs, [r.speedup_predicted for r in curve], "s--", alpha=0.7,
            label="speedup predicted")
    ax.plot(xs, [r.alpha for r in curve], "^-", color="C2", label="alpha")
    ax.plot(xs, [r.c for r in curve], "d:", color="gray", label="c (draft / target step)")
    for r in sec.drafts:
        if not r.derived:
            ax.scatter([r.layers], [r.speedup_measured], marker="*", s=160, color="C3",
                       label=f"{r.name} (measured)", zorder=3)
    ax.axhline(1.0, color="gray", lw=1)
    _vline(ax, sec.crossover.measured, "C0", "measured")
    _vline(ax, sec.crossover.predicted, "C1", "predicted")
    ax.set_xlabel("draft depth (decoder layers; early exits of the target)")
    ax.set_ylabel("speedup, alpha, c")
    ax.set_title(f"K={sec.k}", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def _plot_mismatch(plt, sec: MismatchRegime):
    from matplotlib.colors import TwoSlopeNorm  # local: only a report that draws imports it
    from matplotlib.patches import Rectangle

    drafts, domains = sec.drafts, sec.domains
    nan = lambda m: np.array([[np.nan if v is None else v for v in r] for r in m], float)  # noqa
    alpha, speed = nan(sec.alpha), nan(sec.speedup_measured)
    h = 1.6 + 0.45 * len(drafts)
    fig, axes = plt.subplots(1, 2, figsize=(12, h))
    hi = max(1.05, float(np.nanmax(speed)) if np.isfinite(speed).any() else 1.05)
    lo = min(0.95, float(np.nanmin(speed)) if np.isfinite(speed).any() else 0.95)
    panels = [(axes[0], alpha, "alpha", "viridis", None, "{:.2f}"),
              (axes[1], speed, "measured speedup (red: slowdown)", "RdYlGn",
               TwoSlopeNorm(vmin=lo, vcenter=1.0, vmax=hi), "{:.2f}x")]
    for ax, data, title, cmap, norm, pattern in panels:
        im = ax.imshow(data, cmap=cmap, norm=norm, vmin=None if norm else 0,
                       vmax=None if norm else 1, aspect="auto")
        ax.set_xticks(range(len(domains)), domains, rotation=25, fontsize=8)
        ax.set_yticks(range(len(drafts)), drafts, fontsize=8)
        for i in range(len(drafts)):
            for j in range(len(domains)):
                if np.isfinite(data[i, j]):
                    dark = norm is None and data[i, j] < 0.5  # viridis is dark there
                    ax.text(j, i, pattern.format(data[i, j]), ha="center", va="center",
                            fontsize=7, color="white" if dark else "black")
                if sec.home.get(drafts[i]) == domains[j]:  # a draft on its own domain
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=2,
                                           ec="black"))
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.04)
    return fig


def _plot_batch(plt, sec: BatchRegime):
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, (d, rows) in enumerate(sec.domains.items()):
        color = f"C{i % 10}"
        bs = [r.batch_size for r in rows]
        ax.errorbar(bs, [r.speedup_measured for r in rows], yerr=error_bars(rows), fmt="o-",
                    color=color, capsize=3, label=f"{d} measured (K={sec.k})")
        ax.plot(bs, [r.speedup_predicted for r in rows], "--", color=color, alpha=0.6)
        for r in rows:  # the K the policy picked at this batch size
            ax.annotate(f"K={r.policy_k}", (r.batch_size, r.speedup_measured),
                        textcoords="offset points", xytext=(0, 6), fontsize=6, color=color,
                        ha="center")
        x = sec.crossover[d].measured.x
        if x is not None:
            ax.axvline(x, color=color, ls=":", lw=1.2)
    ax.axhline(1.0, color="gray", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (dashed: predicted from alpha, c(B), v(B); dotted: break-even)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title("K=.. over each point: the K the policy picks at that batch size", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def write_plots(report: RegimesReport, out_dir: Path) -> dict[str, Path]:
    """One PNG per regime present; returns {report key: path}."""
    import matplotlib  # local: a report that draws pays for it, Agg set first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    makers = {"entropy": _plot_entropy, "draft_cost": _plot_cost, "mismatch": _plot_mismatch,
              "batch": _plot_batch}
    plots = {}
    for key, sec in report.regimes():
        if sec is None or (key == "batch" and not sec.domains):
            continue
        plots[key] = save_png(makers[key](plt, sec), out_dir / PLOTS[key])
    return plots


# --- tables -------------------------------------------------------------------------------------

def _x(v) -> str:
    return fmt(v, "{:.2f}x")


def _f(v, pattern: str = "{:.3f}") -> str:
    return fmt(v, pattern)


Table = tuple[str, list[str], list[list[str]]]  # caption, header, rows
INTERVAL = "95% interval"


def _with_interval(header: list[str], rows: list[list[str]], points, intervals: bool,
                   unit: str = "prompt") -> tuple[list[str], list[list[str]]]:
    """``header`` and ``rows`` with the points' 95% intervals after "speedup measured", in a
    report that took them (``intervals``); as they were in one from before."""
    if not intervals:
        return header, rows
    i = header.index("speedup measured") + 1
    cells = [interval_cell(p.speedup_low, p.speedup_high,
                           p.batches if unit == "batch" else p.n_prompts, unit) for p in points]
    return (header[:i] + [INTERVAL] + header[i:],
            [r[:i] + [c] + r[i:] for r, c in zip(rows, cells)])


def _entropy_tables(sec: EntropyRegime, intervals: bool = False) -> list[Table]:
    c = sec.crossover
    cross = ("crossovers", ["curve", "measured", "predicted from alpha, c, v"], [
        ["speedup against temperature", describe(c.temperature.measured, "temperature"),
         describe(c.temperature.predicted, "temperature")],
        ["alpha against break-even alpha", describe(c.temperature.alpha, "temperature",
                                                    "alpha", _f(sec.break_even_alpha, "{:.2f}")),
         "-"],
        ["speedup against target entropy (per prompt)",
         describe(c.entropy.measured, "entropy"), describe(c.entropy.predicted, "entropy")],
        ["alpha fitted against entropy, against break-even alpha", "-",
         entropy_model_text(c.entropy.model)]])
    temps = ("by temperature (all domains; target entropy of the distribution sampled "
             "from, T=1 for greedy)", *_with_interval(
                 ["temperature", "target entropy", "alpha", "break-even alpha", "c", "v",
                  "speedup measured", "speedup predicted"],
                 [[f"{r.temperature:g}", _f(r.target_entropy, "{:.2f}"), _f(r.alpha),
                   _f(r.break_even_alpha), _f(r.c), _f(r.v, "{:.2f}"), _x(r.speedup_measured),
                   _x(r.speedup_predicted)] for r in sec.temperatures],
                 sec.temperatures, intervals))
    doms = ("by domain at T=0", *_with_interval(
        ["domain", "target entropy", "alpha", "speedup measured", "speedup predicted"],
        [[d, _f(f.target_entropy, "{:.2f}"), _f(f.alpha), _x(f.speedup_measured),
          _x(f.speedup_predicted)] for d, f in sec.domains.items()],
        list(sec.domains.values()), intervals))
    return [cross, temps, doms]


def _cost_tables(sec: CostRegime, intervals: bool = False) -> list[Table]:
    c = sec.crossover
    cross = ("crossovers", ["curve", "measured", "predicted from alpha, c, v"], [
        ["speedup against draft depth", describe(c.measured, "layers"),
         describe(c.predicted, "layers")],
        ["best draft", sec.best_measured or "-", sec.best_predicted or "-"]])
    drafts = sorted(sec.drafts, key=lambda r: r.layers)
    rows = ("drafts", *_with_interval(
        ["draft", "layers", "alpha", "c", "c_max (break-even)", "v", "speedup measured",
         "speedup predicted"],
        [[r.name, str(r.layers), _f(r.alpha), _f(r.c), _f(r.max_c), _f(r.v, "{:.2f}"),
          _x(r.speedup_measured), _x(r.speedup_predicted)] for r in drafts],
        drafts, intervals))
    return [cross, rows]


def _mismatch_tables(sec: MismatchRegime, intervals: bool = False) -> list[Table]:
    c = sec.crossover
    if intervals and sec.speedup_low is not None:  # the measured speedup [its interval]
        measured = [[f"{_x(m)} [{interval_cell(lo, hi, None, 'prompt')}]" if lo is not None
                     else _x(m) for m, lo, hi in zip(mr, lr, hr)]
                    for mr, lr, hr in zip(sec.speedup_measured, sec.speedup_low,
                                          sec.speedup_high)]
        caption = "alpha / measured speedup [95% interval] / predicted speedup"
    else:
        measured = [[_x(m) for m in mr] for mr in sec.speedup_measured]
        caption = "alpha / measured speedup / predicted speedup"
    cross = ("crossovers", ["cells", "measured slowdowns", "predicted slowdowns", "agree"],
             [[str(c.cells), str(c.measured_slowdowns), str(c.predicted_slowdowns),
               str(c.agree)]])
    matrix = (caption, ["draft"] + sec.domains,
              [[d + (f" [{sec.home[d]}]" if sec.home.get(d) else "")]
               + [f"{_f(a, '{:.2f}')} / {m} / {_x(p)}" for a, m, p in zip(ar, mr, pr)]
               for d, ar, mr, pr in zip(sec.drafts, sec.alpha, measured,
                                        sec.speedup_predicted)])
    return [cross, matrix]


def _batch_tables(sec: BatchRegime, intervals: bool = False) -> list[Table]:
    if not sec.domains:
        return []
    cross = ("break-even batch size", ["domain", "measured", "predicted from alpha, c(B), v(B)"],
             [[d, describe(c.measured, "batch"), describe(c.predicted, "batch")]
              for d, c in sec.crossover.items()])
    points = [r for rs in sec.domains.values() for r in rs]
    header, cells = _with_interval(
        ["domain", "batch", "alpha", "c", "v", "break-even alpha", "speedup measured",
         "speedup predicted", "policy K", "policy speedup"],
        [[d, str(r.batch_size), _f(r.alpha), _f(r.c), _f(r.v, "{:.2f}"),
          _f(r.break_even_alpha), _x(r.speedup_measured), _x(r.speedup_predicted),
          str(r.policy_k), _x(r.speedup_policy)] for d, rs in sec.domains.items() for r in rs],
        points, intervals, unit="batch")
    if intervals:  # the batches each row pooled, and the verdict at its K and batch size
        header = header[:2] + ["batches"] + header[2:] + ["verdict"]
        cells = [c[:2] + [fmt(r.batches, "{}")] + c[2:] + [fmt(r.verdict, "{}")]
                 for c, r in zip(cells, points)]
    rows = ("by batch size (policy speedup: the K policy's runs on the same batches against "
            "the same K=0 runs, timed after the fixed-K runs, so they carry more timing noise)"
            if intervals else
            "by batch size (policy speedup: the K policy's run against the same K=0 run, "
            "timed after the fixed-K run, so it carries more timing noise)", header, cells)
    return [cross, rows]


# report key -> (caption, header, rows) of that regime's tables; the first is its crossovers
TABLES = {"entropy": _entropy_tables, "draft_cost": _cost_tables,
          "mismatch": _mismatch_tables, "batch": _batch_tables}


# --- documents ----------------------------------------------------------------------------------

TITLE = "When does speculation pay? draftkit regime map"
MODEL_NOTE = ("Predicted speedups use the speedup model S(K) = tau(alpha_1..K) / (K c + v(K)) "
              "with the alpha_i, c and v measured at that point (arXiv 2211.17192); it "
              "leaves out per-round overhead, so a measured speedup below the predicted one is "
              "that overhead. The break-even alpha is the i.i.d. alpha at which S(K) = 1 for this "
              "c and v. A crossover is where a curve falls below 1.0, interpolated between the "
              "two measured points around its last crossing.")


def _setup(report: RegimesReport) -> str:
    return (f"target `{report.target}` ({report.target_layers} layers), draft "
            f"`{report.draft}`, K={report.k} in every measurement (greedy unless a "
            f"temperature is given), {report.prompts_per_domain} prompts per domain x "
            f"{report.max_new_tokens} new tokens, device {report.device}, "
            f"{report.dtype_choice or report.dtype}; measured in {report.seconds / 60:.1f} min")


def _sections(report: RegimesReport) -> list[tuple[int, str, str, object]]:
    """(number, report key, title, section) of each regime the report holds."""
    titles = dict(REGIMES)
    return [(n, key, titles[key], sec) for n, (key, sec) in enumerate(report.regimes(), 1)
            if sec is not None]


def _how_to_read(report: RegimesReport) -> str:
    """MODEL_NOTE, and in a report that took intervals, how and what they decide."""
    if report.intervals is None:
        return MODEL_NOTE
    return (f"{MODEL_NOTE} Intervals (error bars): {report.intervals}. A measured gain counts "
            "only where the measurement backs it, as in draftkit eval's verdicts and "
            "break-even: its interval lies above 1.0, or, without one, the model predicts a "
            "gain too; the measured crossovers and the answers read the curves so.")


def _tables(report: RegimesReport, key: str, sec) -> list[Table]:
    return TABLES[key](sec, report.intervals is not None)


def render_markdown(report: RegimesReport, plots: dict[str, Path]) -> str:
    out = [f"# {TITLE}", "", _setup(report), "", "## Short answer", "", report.headline, ""]
    out += [f"- **{title}**: {sec.answer}" for _, _, title, sec in _sections(report)]
    for n, key, title, sec in _sections(report):
        out += ["", f"## {n}. {title}", ""]
        if key in plots:
            out += [f"![{title}]({plots[key].name})", ""]
        out += [sec.answer, ""]
        for caption, header, rows in _tables(report, key, sec):
            out += [f"**{caption}**", ""] + markdown_table(header, rows) + [""]
    out += ["## How to read this", "", _how_to_read(report), ""]
    return "\n".join(out)


def render_html(report: RegimesReport, plots: dict[str, Path]) -> str:
    esc = html.escape
    parts = [f"<p>{esc(_setup(report)).replace('`', '')}</p>", "<h2>Short answer</h2>",
             f"<p>{esc(report.headline)}</p><ul>"]
    parts += [f"<li><b>{esc(title)}</b>: {esc(sec.answer)}</li>"
              for _, _, title, sec in _sections(report)]
    parts.append("</ul>")
    for n, key, title, sec in _sections(report):
        parts.append(f"<h2>{n}. {esc(title)}</h2>")
        if key in plots:
            parts.append(html_image(title, plots[key]))
        parts.append(f"<p>{esc(sec.answer)}</p>")
        for caption, header, rows in _tables(report, key, sec):
            parts.append(f"<p><b>{esc(caption)}</b></p>{html_table(header, rows)}")
    parts.append(f"<h2>How to read this</h2><p>{esc(_how_to_read(report))}</p>")
    return html_page(TITLE, parts)


def write_regimes_report(report: RegimesReport, out_dir: str | Path,
                         tracker=None) -> dict[str, Path]:
    """Write report.json, report.md, report.html and the plots; log the plots to ``tracker``."""
    plots, files = write_files(report, out_dir, write_plots, render_markdown, render_html)
    if tracker is not None:
        for path in plots.values():
            tracker.log_image(f"regimes/{path.stem}", path)
    return files
