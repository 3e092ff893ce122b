"""The engine comparison's report: report.json (:class:`ParityReport`), report.md,
report.html and one plot, acceptance per draft position in each engine."""

from __future__ import annotations

import html
from pathlib import Path

from draftkit.evaluate.parity.figures import ParityReport, ParityRow
from draftkit.evaluate.render import (fmt, html_image, html_page, html_table, interval_cell,
                                      markdown_table, save_png, write_files)

TITLE = "draftkit engine comparison"
HOW = ("Each engine counted as vLLM's server counters count: rounds that drafted, and rounds "
       "whose first i drafted tokens were all accepted; alpha_i is the acceptance at draft "
       "position i given the positions before it passed, tau the tokens per target call. "
       "Greedy rows must agree exactly (the same tokens, the same counts); sampled rows compare "
       "alpha_1 with a 95% interval over the prompts. vLLM's tokens/s are its own, speculative "
       "against plain, interleaved prompt by prompt, at batch 1.")


def _alphas(side) -> str:
    return " / ".join(fmt(a, "{:.3f}") for a in side.alpha_per_pos)


def _diff(row: ParityRow) -> str:
    if row.alpha1_diff is None:
        return "-"
    if row.alpha1_diff_low is None:
        return f"{row.alpha1_diff:+.3f}"
    return f"{row.alpha1_diff:+.3f} ({row.alpha1_diff_low:+.3f} to {row.alpha1_diff_high:+.3f})"


def parity_table(report: ParityReport) -> tuple[list[str], list[list[str]]]:
    header = ["domain", "temp", "config", "vLLM alpha_i", "draftkit alpha_i", "vLLM tau",
              "draftkit tau", "alpha_1 diff (95%)", "agreement", "greedy: spec = plain",
              "greedy: vLLM = draftkit", "vLLM speedup", "95% interval"]
    rows = []
    for r in report.rows:
        n = r.vllm.prompts
        rows.append([r.domain, f"{r.temperature:g}", r.config, _alphas(r.vllm),
                     _alphas(r.draftkit), fmt(r.vllm.tau, "{:.2f}"), fmt(r.draftkit.tau, "{:.2f}"),
                     _diff(r), r.agreement,
                     "-" if r.spec_equals_plain is None else f"{r.spec_equals_plain}/{n}",
                     "-" if r.equals_draftkit is None else f"{r.equals_draftkit}/{n}",
                     fmt(r.speedup, "{:.2f}x"),
                     interval_cell(r.speedup_low, r.speedup_high, n, "prompt")])
    return header, rows


def control_table(report: ParityReport) -> tuple[list[str], list[list[str]]]:
    header = ["temperature", "K", "prompts", "drafted", "accepted", "acceptance", "control"]
    return header, [[f"{c.temperature:g}", str(c.k), str(c.prompts), str(c.draft_tokens),
                     str(c.accepted), fmt(c.acceptance, "{:.1%}"),
                     "passed" if c.passed else "FAILED"] for c in report.controls]


def verdicts(report: ParityReport) -> list[str]:
    """One line per finding: disagreements are named, never averaged away."""
    out = list(report.notes)
    for r in report.rows:
        where = f"{r.domain} at temperature {r.temperature:g}, {r.config}"
        if r.agreement == "counts differ":
            out.append(f"{where}: greedy counts differ (vLLM {r.vllm.drafts} drafts, "
                       f"{r.vllm.accepted_per_pos} accepted per position; draftkit "
                       f"{r.draftkit.drafts}, {r.draftkit.accepted_per_pos})")
        if r.agreement == "beyond noise" and report.sampled_path != "broken":
            out.append(f"{where}: alpha_1 differs beyond noise ({_diff(r)})")
        if r.spec_equals_plain is not None and r.spec_equals_plain < r.vllm.prompts:
            out.append(f"{where}: vLLM's speculative greedy output differs from its plain "
                       f"output on {r.vllm.prompts - r.spec_equals_plain} prompts "
                       f"({r.first_difference})")
        elif r.equals_draftkit is not None and r.equals_draftkit < r.vllm.prompts:
            out.append(f"{where}: vLLM's greedy output differs from draftkit's on "
                       f"{r.vllm.prompts - r.equals_draftkit} prompts ({r.first_difference})")
    trusted = [r for r in report.rows if r.agreement != "not compared" and
               (r.temperature == 0 or report.sampled_path != "broken")]
    agree = sum(r.agreement in ("same counts", "within noise") for r in trusted)
    if report.rows:
        left_out = len(report.rows) - len(trusted)
        out.append(f"{agree} of {len(trusted)} rows compared agree (greedy: the same counts; "
                   f"sampled: alpha_1 within noise)" +
                   (f"; {left_out} not compared (the engine's sampled path is broken, or an "
                    f"engine drafted nothing)" if left_out else ""))
    return out


def write_plot(report: ParityReport, out_dir: Path) -> dict[str, Path]:
    """alpha_i per draft position, one panel per temperature: each domain a colour, vLLM solid
    with dots and draftkit dashed with crosses, so agreement shows as lines drawn twice."""
    import matplotlib  # local: a report that draws pays for it, Agg set first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = [r for r in report.rows if any(a is not None for a in r.vllm.alpha_per_pos)]
    if not rows:
        return {}
    temps = sorted({r.temperature for r in rows})
    configs = sorted({r.config for r in rows})
    domains = sorted({r.domain for r in rows})
    fig, axes = plt.subplots(1, len(temps), figsize=(4.2 * len(temps) + 1.6, 3.8), sharey=True,
                             squeeze=False)
    for ax, t in zip(axes[0], temps):
        for r in (r for r in rows if r.temperature == t):
            color = f"C{domains.index(r.domain) % 10}"
            pos = list(range(1, len(r.vllm.alpha_per_pos) + 1))
            for side, style in ((r.vllm, "o-"), (r.draftkit, "x--")):
                ax.plot(pos, [a if a is not None else float("nan") for a in side.alpha_per_pos],
                        style, color=color, alpha=0.9 if style == "o-" else 0.7)
        ax.set_title(f"temperature {t:g}" + (f", {configs[0]}" if len(configs) == 1 else ""))
        ax.set_xlabel("draft position i")
        ax.set_xticks(range(1, max(len(r.vllm.alpha_per_pos) for r in rows) + 1))
        ax.set_ylim(-0.02, 1.02)
    axes[0][0].set_ylabel("alpha_i (conditional acceptance)")
    handles = [Line2D([], [], color=f"C{i % 10}", label=d) for i, d in enumerate(domains)]
    handles += [Line2D([], [], color="gray", marker="o", label=report.engine.split(" (")[0]),
                Line2D([], [], color="gray", marker="x", ls="--", label="draftkit")]
    axes[0][-1].legend(handles=handles, loc="center left", bbox_to_anchor=(1.02, 0.5),
                       fontsize=7, frameon=False)
    return {"Acceptance per position, vLLM and draftkit":
            save_png(fig, out_dir / "acceptance_by_engine.png")}


def _head(report: ParityReport) -> str:
    return (f"{report.bundle} ({report.draft_kind}) on {report.target}, in {report.engine} and "
            f"draftkit, {report.dtype}, {report.max_new_tokens} new tokens a prompt, seed "
            f"{report.seed}; {report.created}")


def render_markdown(report: ParityReport, plots: dict[str, Path]) -> str:
    lines = [f"# {TITLE}", "", _head(report), "", HOW, "", "## Findings", ""]
    lines += [f"- {v}" for v in verdicts(report)]
    lines += ["", "## vLLM beside draftkit", ""] + markdown_table(*parity_table(report))
    lines += ["", "## Control: the target drafting for itself in the engine", "",
              f"Sampled verification: **{report.sampled_path}**.", ""]
    lines += markdown_table(*control_table(report))
    for title, path in plots.items():
        lines += ["", f"## {title}", "", f"![{title}]({path.name})"]
    return "\n".join(lines) + "\n"


def render_html(report: ParityReport, plots: dict[str, Path]) -> str:
    parts = [f"<p>{html.escape(_head(report))}</p>", f"<p>{html.escape(HOW)}</p>", "<ul>"]
    parts += [f"<li>{html.escape(v)}</li>" for v in verdicts(report)] + ["</ul>"]
    parts += [html_table(*parity_table(report)),
              f"<h2>Control (sampled verification: {html.escape(report.sampled_path)})</h2>",
              html_table(*control_table(report))]
    parts += [html_image(title, path) for title, path in plots.items()]
    return html_page(TITLE, parts)


def write_parity_report(report: ParityReport, out_dir: str | Path) -> dict[str, Path]:
    return write_files(report, out_dir, write_plot, render_markdown, render_html)[1]
