"""Writing an evaluation report: JSON for machines, Markdown and HTML for people, PNG plots.

The report is an :class:`~draftkit.figures.EvalReport`, written as report.json by its
``to_dict``. Writers take whatever sections are present: a quick run without sweeps still
renders, only without those plots. The Markdown and HTML lead with the per-domain table, then
the plots, each sweep's with its table of measured rows (interval and verdict).

Long: the report's tables, plots and documents are read together; each is a short function.
"""

from __future__ import annotations

import html
import math
import textwrap
from pathlib import Path

from draftkit.decode.k import AUTO
from draftkit.evaluate.render import (error_bars, fmt, html_image, html_page, html_table,
                                      interval_cell, markdown_table, save_png, write_files)
from draftkit.figures import ALPHA_BEFORE, DomainFigures, EvalReport, KSweepRow

ENTROPY_NOTE = ("Teacher-forced on the decoded continuations; each cell is the acceptance in "
                "that bucket of the target's entropy and (the bucket's share of positions). "
                "Where the target is unsure a draft keeps up only if it learnt the target's "
                "spread, not just its top token.")

BEFORE_NOTE = ("alpha before / alpha after: the baseline draft's and this draft's acceptance, "
               "teacher-forced on the same continuations, so the two compare; alpha: this "
               "draft's acceptance while decoding (accepted / tested positions), a different "
               "estimator; '-': not measured (alpha when nothing was drafted).")

GREEDY_COLUMN = "alpha, greedy drafts"
GREEDY_NOTE = ("alpha, greedy drafts: the draft's acceptance, teacher-forced on the same "
               "continuations, where it proposes its argmax and the target keeps it with "
               "probability p (vLLM's default draft_sample_method, and every vLLM release "
               "before it had draft_sample_method probabilistic); alpha after is the same "
               "estimate with its tokens sampled as this eval's were.")

# (column title, figure, format) of the per-domain table; the two teacher-forced columns only
# when a baseline draft was measured (BEFORE_NOTE), the interval only where one was (not from
# one prompt, nor in reports from before intervals).
INTERVAL = "95% interval"
TABLE = [("prompts", lambda f: f.n_prompts, "{}"),
         ("alpha before", lambda f: f.alpha_before, "{:.3f}"),
         ("alpha after", lambda f: f.alpha_after, "{:.3f}"),
         (GREEDY_COLUMN, lambda f: f.alpha_greedy_drafts, "{:.3f}"),
         ("alpha", lambda f: f.alpha, "{:.3f}"), ("tau", lambda f: f.tau, "{:.2f}"),
         ("c", lambda f: f.c, "{:.3f}"), ("v", lambda f: f.v, "{:.2f}"),
         ("K", lambda f: f.k, "{}"), ("K=0 rounds", lambda f: f.plain_round_share, "{:.0%}"),
         ("speedup measured", lambda f: f.speedup_measured, "{:.2f}x"),
         (INTERVAL, lambda f: f.speedup_low is not None and
          f"{f.speedup_low:.2f}-{f.speedup_high:.2f}x" or None, "{}"),
         ("speedup predicted", lambda f: f.speedup_predicted, "{:.2f}x"),
         ("plain tok/s", lambda f: f.plain_tokens_per_s, "{:.1f}"),
         ("spec tok/s", lambda f: f.spec_tokens_per_s, "{:.1f}"),
         ("verdict", lambda f: f.verdict, "{}")]
BEFORE_COLUMNS = ("alpha before", "alpha after")


def break_even_text(report: EvalReport) -> str:
    """One sentence on where speculation stops paying along the batch sweep, worded from the
    break-even's ``kind`` (``summary.break_even_batch``), naming the K the sweep ran at."""
    rows = report.batch_sweep
    if not rows:
        return "no batch sweep was run"
    be = report.break_even
    kind, b, x = (be.kind, be.batch_size, be.x) if be else (None, None, None)
    top = max(r.batch_size for r in rows)
    k = rows[-1].k
    spec = ("speculation with --k auto" if report.batch_sweep_k == AUTO else
            "speculation" if k is None else f"speculation at K {k}")
    # --k 0 decodes plainly; the sweep still speculates (at K 1) to show what it would buy
    why = "" if str(report.k) != "0" else f"; --k 0 decodes plainly, the sweep used K {k}"
    if kind == "above":
        text = f"{spec} pays at every batch size measured (up to {top})"
    elif kind == "below":
        text = f"{spec} does not pay at any batch size measured (up to {top})"
    elif kind == "crosses":
        text = (f"{spec} stops paying at batch size {b} (speedup falls below 1.0 at B ~ "
                f"{x:.3g} and stays below up to {top})")
    elif kind == "rises":
        text = (f"{spec} loses at small batches and pays from batch size {b} on (speedup "
                f"rises above 1.0 at B ~ {x:.3g})")
    else:
        text = "the batch sweep measured no speedup"
    return text + why


def headline(report: EvalReport) -> str:
    """The report in one sentence a user can act on: where to speculate at batch 1 (measured,
    with its interval), where the measurement cannot tell yet, where not to, and up to which
    batch size; the same figures and verdicts as the table and the batch sweep."""
    groups: dict[str, list[str]] = {"speculate": [], "inconclusive": [], "not": []}
    need = []
    for name, fig in report.domains.items():
        verdict = fig.verdict or ""
        if verdict.startswith("speculate"):
            interval = (f", 95% interval {fig.speedup_low:.2f}-{fig.speedup_high:.2f}x"
                        if fig.speedup_low is not None else "")
            groups["speculate"].append(f"{name} ({fig.speedup_measured:.2f}x{interval})")
        elif verdict.startswith("inconclusive"):
            groups["inconclusive"].append(name)
            need += [fig.prompts_to_decide] if fig.prompts_to_decide else []
        else:
            groups["not"].append(name)
    parts = []
    if groups["speculate"]:
        parts.append(f"speculate on {_and(groups['speculate'])} at batch 1")
    if groups["inconclusive"]:
        more = f" (about {max(need)} prompts each would decide)" if need else ""
        parts.append(f"the measurement cannot tell yet on {_and(groups['inconclusive'])}{more}")
    if groups["not"]:
        parts.append(f"do not speculate on {_and(groups['not'])}")
    text = "; ".join(parts) or "no domain was measured"
    if report.batch_sweep:
        text += f"; over the domains mixed, {break_even_text(report)}"
    return text[0].upper() + text[1:] + "."


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _rows(report: EvalReport) -> list[tuple[str, DomainFigures]]:
    """(name, figures) of the domains, then ``overall``."""
    rows = list(report.domains.items())
    if report.overall is not None:
        rows.append(("overall", report.overall))
    return rows


def entropy_table(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    """Header and rows of teacher-forced acceptance by the target's entropy: a row per domain
    (and per domain before distillation, when measured), a column per entropy bucket, each
    cell the acceptance there and the bucket's share of the domain's positions."""
    header: list[str] = []
    rows = []
    for name, fig in _rows(report):
        b = fig.by_entropy
        if b is None:
            continue
        header = ["domain", *(f"H {label} nats" for label in b.buckets)]
        total = sum(b.positions) or 1
        for key, title in (("draft", name), (ALPHA_BEFORE, f"{name} (before)")):
            if key in b.acceptance:
                rows.append([title, *(f"{fmt(a, '{:.2f}')} ({n / total:.0%})"
                                      for a, n in zip(b.acceptance[key], b.positions))])
    return header, rows


def domain_table(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-domain table (plus an ``overall`` row)."""
    rows_src = _rows(report)
    has_before = any(ALPHA_BEFORE in row.baselines for _, row in rows_src)
    has_interval = any(row.speedup_low is not None for _, row in rows_src)
    has_greedy = any(row.alpha_greedy_drafts is not None for _, row in rows_src)
    columns = [c for c in TABLE if (c[0] not in BEFORE_COLUMNS or has_before or
                                    c[0] == "alpha after" and has_greedy)
               and (c[0] != INTERVAL or has_interval) and (c[0] != GREEDY_COLUMN or has_greedy)]
    header = ["domain"] + [c[0] for c in columns]
    rows = [[name] + [fmt(figure(row), pattern) for _, figure, pattern in columns]
            for name, row in rows_src]
    return header, rows


def k_sweep_table(report: EvalReport) -> tuple[list[str], list[list[str]]] | None:
    """Header and rows of the K sweep's measured rows, interval and verdict included; None for
    a report from before the sweep kept them (its plot alone shows the sweep)."""
    rows = [r for r in report.k_sweep if r.speedup_measured is not None]
    if not any(r.verdict for r in rows):
        return None
    header = ["domain", "K", "prompts", "new tokens", "tau measured", "c", "v",
              "speedup measured", INTERVAL, "speedup predicted", "verdict"]
    return header, [[r.domain, str(r.k), fmt(r.prompts, "{}"), fmt(r.new_tokens, "{}"),
                     fmt(r.tau_measured, "{:.2f}"), fmt(r.c, "{:.3f}"), fmt(r.v, "{:.2f}"),
                     fmt(r.speedup_measured, "{:.2f}x"),
                     interval_cell(r.speedup_low, r.speedup_high, r.prompts, "prompt"),
                     fmt(r.speedup_predicted, "{:.2f}x"), fmt(r.verdict, "{}")] for r in rows]


def batch_table(report: EvalReport) -> tuple[list[str], list[list[str]]] | None:
    """Header and rows of the batch sweep, interval and verdict included; None for a report
    from before the sweep kept them."""
    rows = sorted(report.batch_sweep, key=lambda r: r.batch_size)
    if not any(r.verdict for r in rows):
        return None
    header = ["batch", "batches", "alpha", "c", "v", "K", "plain tok/s", "spec tok/s",
              "speedup measured", INTERVAL, "speedup predicted", "verdict"]
    return header, [[str(r.batch_size), fmt(r.batches, "{}"), fmt(r.alpha, "{:.3f}"),
                     fmt(r.c, "{:.3f}"), fmt(r.v, "{:.2f}"), fmt(r.k, "{}"),
                     fmt(r.plain_tokens_per_s, "{:.1f}"), fmt(r.spec_tokens_per_s, "{:.1f}"),
                     fmt(r.speedup_measured, "{:.2f}x"),
                     interval_cell(r.speedup_low, r.speedup_high, r.batches,
                                   "prompt" if r.batch_size == 1 else "batch"),
                     fmt(r.speedup_predicted, "{:.2f}x"), fmt(r.verdict, "{}")] for r in rows]


def format_text_table(header: list[str], rows: list[list[str]]) -> str:
    """A fixed-width table for the terminal."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


# --- plots --------------------------------------------------------------------------------------

def _plot_k_sweep(plt, report: EvalReport):
    """Measured and predicted speedup against K, one colour per domain; None without a K
    sweep."""
    if not report.k_sweep:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    by_domain: dict[str, list[KSweepRow]] = {}
    for row in report.k_sweep:
        by_domain.setdefault(row.domain, []).append(row)
    for i, (name, rows) in enumerate(by_domain.items()):
        rows = sorted(rows, key=lambda r: r.k)
        color = f"C{i % 10}"
        ks = [r.k for r in rows]
        measured = [r for r in rows if r.speedup_measured is not None]
        if measured:
            ax.errorbar([r.k for r in measured], [r.speedup_measured for r in measured],
                        yerr=error_bars(measured), fmt="o-", color=color, capsize=3,
                        label=f"{name} measured")
        ax.plot(ks, [r.speedup_predicted for r in rows], "--", color=color, alpha=0.7,
                label=f"{name} predicted")
    ax.axhline(1.0, color="gray", lw=1)
    ax.set_xlabel("K (drafted tokens per round)")
    ax.set_ylabel("speedup over plain decoding")
    ax.legend(fontsize=7, ncol=2)
    return fig


def _plot_batch_sweep(plt, report: EvalReport):
    """Measured and predicted speedup against batch size, with the break-even batch; None
    without a batch sweep."""
    if not report.batch_sweep:
        return None
    rows = sorted(report.batch_sweep, key=lambda r: r.batch_size)
    fig, ax = plt.subplots(figsize=(6.4, 4))
    bs = [r.batch_size for r in rows]
    measured = [r for r in rows if r.speedup_measured is not None]
    if measured:
        ax.errorbar([r.batch_size for r in measured], [r.speedup_measured for r in measured],
                    yerr=error_bars(measured), fmt="o-", capsize=3, label="measured")
    ax.plot(bs, [r.speedup_predicted for r in rows], "s--", label="predicted")
    ax.axhline(1.0, color="gray", lw=1)
    be = report.break_even
    if be is not None and be.kind in ("crosses", "rises"):
        ax.axvline(be.x, color="red", ls=":", label=f"break-even batch ~{be.x:.3g}")
    ax.set_title(textwrap.fill(break_even_text(report), 80), fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup over plain decoding")
    ax.legend(fontsize=8)
    return fig


def _plot_alpha_per_position(plt, report: EvalReport):
    """Conditional acceptance at each draft position, per domain; None if none measured it."""
    per_pos = {n: d.alpha_per_position for n, d in report.domains.items()
               if d.alpha_per_position}
    if not per_pos:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for name, values in per_pos.items():
        ax.plot(range(1, len(values) + 1), values, "o-", label=name)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("conditional alpha_i")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    return fig


def _plot_by_entropy(plt, report: EvalReport):
    """Teacher-forced acceptance per bucket of the target's entropy, per domain (dotted: the
    baseline draft's); None if no domain has the table."""
    by_entropy = {n: d.by_entropy for n, d in report.domains.items() if d.by_entropy is not None}
    if not by_entropy:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for i, (name, b) in enumerate(by_entropy.items()):
        x = range(len(b.buckets))
        ax.plot(x, [a if a is not None else math.nan for a in b.acceptance["draft"]], "o-",
                color=f"C{i % 10}", label=name)
        if ALPHA_BEFORE in b.acceptance:
            ax.plot(x, [a if a is not None else math.nan for a in b.acceptance[ALPHA_BEFORE]],
                    "x:", color=f"C{i % 10}", alpha=0.6)
        ticks = b.buckets
    ax.set_xticks(list(range(len(ticks))), ticks)
    ax.set_xlabel("target entropy at the position (nats)")
    ax.set_ylabel("acceptance (teacher-forced)")
    ax.set_title("dotted: before distillation" if any(ALPHA_BEFORE in b.acceptance for b in
                                                        by_entropy.values()) else "",
                 fontsize=9)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    return fig


def _plot_alpha_per_domain(plt, report: EvalReport):
    """A bar per domain: alpha, or alpha before and after beside each other where a baseline
    draft was measured; None without domains."""
    domains = report.domains
    if not domains:
        return None
    names = list(domains)
    fig, ax = plt.subplots(figsize=(6.4, 4))

    def bars(xs, figure, **kw):  # a missing value gets "n/a", not a bar at 0
        vals = [figure(domains[n]) for n in names]
        ax.bar(xs, [math.nan if a is None else a for a in vals], **kw)
        for pos, a in zip(xs, vals):
            if a is None:
                ax.text(pos, 0.01, "n/a", ha="center", fontsize=7)

    x = range(len(names))
    if any(domains[n].alpha_before is not None for n in names):
        # both teacher-forced on the same continuations (BEFORE_NOTE)
        bars([i - 0.2 for i in x], lambda f: f.alpha_before, width=0.4, label="before")
        bars([i + 0.2 for i in x], lambda f: f.alpha_after, width=0.4, label="after")
        ax.legend(fontsize=8)
        ax.set_ylabel("alpha (teacher-forced)")
    else:
        bars(list(x), lambda f: f.alpha)
        ax.set_ylabel("alpha")
    ax.set_xticks(list(x), names, rotation=20)
    ax.set_xlim(-0.6, len(names) - 0.4)  # a domain with no bar keeps its place
    ax.set_ylim(0, 1)
    return fig


# (file, title, maker) in the order the documents show them; a maker returns None when its
# section is absent from the report
PLOTS = [("speedup_vs_k.png", "Speedup against K", _plot_k_sweep),
         ("speedup_vs_batch.png", "Speedup against batch size", _plot_batch_sweep),
         ("alpha_per_position.png", "Acceptance per draft position", _plot_alpha_per_position),
         ("acceptance_by_entropy.png", "Acceptance by the target's entropy", _plot_by_entropy),
         ("alpha_per_domain.png", "Acceptance per domain", _plot_alpha_per_domain)]


def write_plots(report: EvalReport, out_dir: Path) -> dict[str, Path]:
    """PNG plots for the sections present; returns {title: path}."""
    import matplotlib  # local: a report that draws pays for it, Agg set first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    plots: dict[str, Path] = {}
    for name, title, make in PLOTS:
        fig = make(plt, report)
        if fig is not None:
            plots[title] = save_png(fig, out_dir / name)
    return plots


# --- documents ----------------------------------------------------------------------------------

def k_sweep_note(report: EvalReport) -> str | None:
    """What the K sweep's measured points were measured on. They are no like-for-like rival to
    the table's ``--k auto`` figure unless they cover the same prompts: on 12 math prompts of
    128 tokens, fixed K 6 measured 1.20x where the default sweep (2 prompts of 48 tokens) had
    measured 1.63x, and ``--k auto`` 1.30x."""
    sizes = {(r.prompts, r.new_tokens) for r in report.k_sweep if r.prompts}
    if not sizes:
        return None
    prompts = "/".join(sorted({str(p) for p, _ in sizes}))
    tokens = "/".join(sorted({str(t) for _, t in sizes}))
    return (f"Points: measured at fixed K on the first {prompts} prompt(s) of each domain, up to "
            f"{tokens} new tokens each; dashed lines: predicted from the table's alpha_i, c and v. "
            "The table covers every prompt: to compare its figures with these points like for "
            "like, set draftkit eval's --k-sweep-prompts and --k-sweep-tokens to its prompts "
            "and tokens.")


VERDICT_RULE = ("the verdict is the table's rule at the row's K: speculate only where the "
                "interval lies above 1.0")
SWEEP_NOTES = {
    "speedup_vs_k": "95% interval (the error bars): a paired bootstrap over the prompts, each "
                    "decoded plainly and at every K back to back; " + VERDICT_RULE + ".",
    "speedup_vs_batch": "95% interval (the error bars): a paired bootstrap over the batches of "
                        "distinct prompts at each batch size, each decoded plainly and with "
                        "speculation back to back (batch size 1: the table's overall row, over "
                        "its prompts); " + VERDICT_RULE + " and batch size."}


def sweep_table(report: EvalReport, plot: str) -> tuple[list[str], list[list[str]]] | None:
    """The table under a sweep's plot (by the plot's file stem), if it has one."""
    maker = {"speedup_vs_k": k_sweep_table, "speedup_vs_batch": batch_table}.get(plot)
    return maker(report) if maker else None


def plain_step_text(report: EvalReport) -> str | None:
    """One sentence setting plain decoding beside the memory floor of its target."""
    p = report.plain_step
    if p is None:
        return None
    forward = "" if p.forward_ms is None else f" (the target's forward alone {p.forward_ms:.1f} ms)"
    return (f"plain decoding took {p.ms_per_token:.1f} ms a token at batch 1{forward}, "
            f"{p.over_floor:.2f}x the memory floor of {p.floor_ms:.1f} ms: the target's "
            f"{p.weights_gb:.2f} GB of weights read once at the {p.read_gb_per_s:.1f} GB/s "
            f"this device reads" + (f"; forwards: {p.decode_path}" if p.decode_path else ""))


def _summary_lines(report: EvalReport) -> list[str]:
    drafts = f", {report.draft_sample_method} drafts" if report.draft_sample_method else ""
    drafts += f", {report.verify} verification" if report.verify else ""
    lines = [f"benchmark {report.benchmark}"] if report.benchmark else []
    lines.append(f"target `{report.target}`, draft `{report.draft}`, device {report.device}, "
                 f"dtype {report.dtype_choice or report.dtype}, "
                 f"temperature {report.temperature}{drafts}, K {report.k}")
    lines.append(headline(report))  # the batch sweep's break-even included
    if report.plain_step is not None:
        lines.append(plain_step_text(report))
    if report.machine:
        lines.append(report.machine)
    return lines


def render_markdown(report: EvalReport, plots: dict[str, Path]) -> str:
    header, rows = domain_table(report)
    out = ["# draftkit evaluation report", ""] + _summary_lines(report) + [""]
    out += markdown_table(header, rows) + [""]
    if "alpha before" in header:
        out += [BEFORE_NOTE, ""]
    if GREEDY_COLUMN in header:
        out += [GREEDY_NOTE, ""]
    sweep_note = k_sweep_note(report)
    for title, path in plots.items():
        out += [f"## {title}", "", f"![{title}]({path.name})", ""]
        if path.stem == "speedup_vs_k" and sweep_note:
            out += [sweep_note, ""]
        table = sweep_table(report, path.stem)
        if table is not None:
            out += [SWEEP_NOTES[path.stem], ""] + markdown_table(*table) + [""]
        if path.stem == "acceptance_by_entropy":
            out += [ENTROPY_NOTE, ""] + markdown_table(*entropy_table(report)) + [""]
    return "\n".join(out)


def render_html(report: EvalReport, plots: dict[str, Path]) -> str:
    header, rows = domain_table(report)
    esc = html.escape
    parts = [f"<p>{esc(line).replace('`', '')}</p>" for line in _summary_lines(report)]
    parts.append(html_table(header, rows))
    if "alpha before" in header:
        parts.append(f"<p>{esc(BEFORE_NOTE)}</p>")
    if GREEDY_COLUMN in header:
        parts.append(f"<p>{esc(GREEDY_NOTE)}</p>")
    sweep_note = k_sweep_note(report)
    for title, path in plots.items():
        parts.append(f"<h2>{esc(title)}</h2>{html_image(title, path)}")
        if path.stem == "speedup_vs_k" and sweep_note:
            parts.append(f"<p>{esc(sweep_note)}</p>")
        table = sweep_table(report, path.stem)
        if table is not None:
            parts += [f"<p>{esc(SWEEP_NOTES[path.stem])}</p>", html_table(*table)]
        if path.stem == "acceptance_by_entropy":
            parts += [f"<p>{esc(ENTROPY_NOTE)}</p>", html_table(*entropy_table(report))]
    return html_page("draftkit evaluation report", parts)


def write_report(report: EvalReport, out_dir: str | Path, tracker=None) -> dict[str, Path]:
    """Write report.json, report.md, report.html and the plots; log them to ``tracker``."""
    plots, files = write_files(report, out_dir, write_plots, render_markdown, render_html)
    if tracker is not None:
        header, rows = domain_table(report)
        tracker.log_table("eval/domains", header, rows)
        for title, path in plots.items():
            tracker.log_image(f"eval/{path.stem}", path)
        if report.overall is not None:
            tracker.summary({f"eval/{k}": v for k, v in report.overall.to_dict().items()
                             if isinstance(v, (int, float))})
    return files
