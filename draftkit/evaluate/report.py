"""Writing an evaluation report: JSON for machines, Markdown and HTML for people, PNG plots.

The report dict follows the schema of ``draftkit eval`` (see ``REPORT_KEYS``). Writers take
whatever sections are present: a quick run without sweeps still renders, only without those
plots. The Markdown and HTML lead with the per-domain table, then the plots.
"""

from __future__ import annotations

import base64
import html
import math
import textwrap
from pathlib import Path
from typing import Any

from draftkit.io import atomic_write_json, atomic_write_text

DOMAIN_KEYS = ("n_prompts", "new_tokens", "alpha", "alpha_tv", "alpha_after", "alpha_per_position",
               "tau", "c", "v", "k", "plain_round_share", "rounds_by_k", "speedup_predicted",
               "speedup_measured", "plain_tokens_per_s", "spec_tokens_per_s", "target_entropy",
               "by_entropy", "overhead_per_round_ms", "verdict")
REPORT_KEYS = ("target", "draft", "device", "dtype", "temperature", "k", "created", "domains",
               "overall", "k_sweep", "batch_sweep", "break_even")

ENTROPY_NOTE = ("Teacher-forced on the decoded continuations; each cell is the acceptance in "
                "that bucket of the target's entropy and (the bucket's share of positions). "
                "Where the target is unsure a draft keeps up only if it learnt the target's "
                "spread, not just its top token.")

BEFORE_NOTE = ("alpha before / alpha after: the baseline draft's and this draft's acceptance, "
               "teacher-forced on the same continuations, so the two compare; alpha: this "
               "draft's acceptance while decoding (accepted / tested positions), a different "
               "estimator; '-': not measured (alpha when nothing was drafted).")

# (column title, key, format) of the per-domain table; the two teacher-forced columns only
# when a baseline draft was measured (BEFORE_NOTE).
TABLE = [("domain", None, "{}"), ("prompts", "n_prompts", "{}"),
         ("alpha before", "alpha_before", "{:.3f}"), ("alpha after", "alpha_after", "{:.3f}"),
         ("alpha", "alpha", "{:.3f}"), ("tau", "tau", "{:.2f}"), ("c", "c", "{:.3f}"),
         ("v", "v", "{:.2f}"), ("K", "k", "{}"), ("K=0 rounds", "plain_round_share", "{:.0%}"),
         ("speedup measured", "speedup_measured", "{:.2f}x"),
         ("speedup predicted", "speedup_predicted", "{:.2f}x"),
         ("plain tok/s", "plain_tokens_per_s", "{:.1f}"), ("spec tok/s", "spec_tokens_per_s",
         "{:.1f}"), ("verdict", "verdict", "{}")]


def break_even_text(report: dict) -> str:
    """One sentence on where speculation stops paying along the batch sweep, worded from the
    break-even's ``kind`` (``command.break_even_batch``), naming the K the sweep ran at."""
    rows = report.get("batch_sweep") or []
    if not rows:
        return "no batch sweep was run"
    be = report.get("break_even") or {}
    kind, b, x = be.get("kind"), be.get("batch_size"), be.get("x")
    top = max(r["batch_size"] for r in rows)
    k = rows[0].get("k")
    spec = "speculation" if k is None else f"speculation at K {k}"
    # --k 0 decodes plainly; the sweep still speculates (at K 1) to show what it would buy
    why = "" if str(report.get("k")) != "0" else f"; --k 0 decodes plainly, the sweep used K {k}"
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


def entropy_table(report: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of teacher-forced acceptance by the target's entropy: a row per domain
    (and per domain before distillation, when measured), a column per entropy bucket, each
    cell the acceptance there and the bucket's share of the domain's positions."""
    header: list[str] = []
    rows = []
    figs = [*(report.get("domains") or {}).items(), ("overall", report.get("overall") or {})]
    for name, fig in figs:
        b = fig.get("by_entropy")
        if not b:
            continue
        header = ["domain", *(f"H {label} nats" for label in b["buckets"])]
        total = sum(b["positions"]) or 1
        for key, title in (("draft", name), ("alpha_before", f"{name} (before)")):
            if key in b:
                rows.append([title, *(f"{fmt(a, '{:.2f}')} ({n / total:.0%})"
                                      for a, n in zip(b[key], b["positions"]))])
    return header, rows


def fmt(value: Any, pattern: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    try:
        return pattern.format(value)
    except (ValueError, TypeError):
        return str(value)


def domain_table(report: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-domain table (plus an ``overall`` row)."""
    rows_src = list((report.get("domains") or {}).items())
    if report.get("overall"):
        rows_src.append(("overall", report["overall"]))
    has_before = any("alpha_before" in row for _, row in rows_src)
    columns = [c for c in TABLE if c[1] not in ("alpha_before", "alpha_after") or has_before]
    header = [c[0] for c in columns]
    rows = [[name if key is None else fmt(row.get(key), pattern) for _, key, pattern in columns]
            for name, row in rows_src]
    return header, rows


def format_text_table(header: list[str], rows: list[list[str]]) -> str:
    """A fixed-width table for the terminal."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


# --- plots --------------------------------------------------------------------------------------

def save_png(fig, path: Path, dpi: int = 110) -> Path:
    """Write a matplotlib figure atomically (a killed run leaves no half a PNG), close it."""
    import io

    import matplotlib.pyplot as plt

    from draftkit.io import atomic_write_bytes

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def write_plots(report: dict, out_dir: Path) -> dict[str, Path]:
    """PNG plots for the sections present; returns {title: path}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    plots: dict[str, Path] = {}
    domains = report.get("domains") or {}

    def save(fig, name: str, title: str) -> None:
        plots[title] = save_png(fig, out_dir / name)

    if report.get("k_sweep"):
        fig, ax = plt.subplots(figsize=(6.4, 4))
        by_domain: dict[str, list[dict]] = {}
        for row in report["k_sweep"]:
            by_domain.setdefault(row["domain"], []).append(row)
        for i, (name, rows) in enumerate(by_domain.items()):
            rows = sorted(rows, key=lambda r: r["k"])
            color = f"C{i % 10}"
            ks = [r["k"] for r in rows]
            measured = [r for r in rows if r.get("speedup_measured") is not None]
            if measured:
                ax.plot([r["k"] for r in measured], [r["speedup_measured"] for r in measured],
                        "o-", color=color, label=f"{name} measured")
            ax.plot(ks, [r.get("speedup_predicted") for r in rows], "--", color=color, alpha=0.7,
                    label=f"{name} predicted")
        ax.axhline(1.0, color="gray", lw=1)
        ax.set_xlabel("K (drafted tokens per round)")
        ax.set_ylabel("speedup over plain decoding")
        ax.legend(fontsize=7, ncol=2)
        save(fig, "speedup_vs_k.png", "Speedup against K")

    if report.get("batch_sweep"):
        rows = sorted(report["batch_sweep"], key=lambda r: r["batch_size"])
        fig, ax = plt.subplots(figsize=(6.4, 4))
        bs = [r["batch_size"] for r in rows]
        if any(r.get("speedup_measured") is not None for r in rows):
            ax.plot(bs, [r.get("speedup_measured") for r in rows], "o-", label="measured")
        ax.plot(bs, [r.get("speedup_predicted") for r in rows], "s--", label="predicted")
        ax.axhline(1.0, color="gray", lw=1)
        be = report.get("break_even") or {}
        if be.get("kind") in ("crosses", "rises"):
            ax.axvline(be["x"], color="red", ls=":", label=f"break-even batch ~{be['x']:.3g}")
        ax.set_title(textwrap.fill(break_even_text(report), 80), fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("speedup over plain decoding")
        ax.legend(fontsize=8)
        save(fig, "speedup_vs_batch.png", "Speedup against batch size")

    per_pos = {n: d["alpha_per_position"] for n, d in domains.items()
               if d.get("alpha_per_position")}
    if per_pos:
        fig, ax = plt.subplots(figsize=(6.4, 4))
        for name, values in per_pos.items():
            ax.plot(range(1, len(values) + 1), values, "o-", label=name)
        ax.set_xlabel("draft position i")
        ax.set_ylabel("conditional alpha_i")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
        save(fig, "alpha_per_position.png", "Acceptance per draft position")

    by_entropy = {n: d["by_entropy"] for n, d in domains.items() if d.get("by_entropy")}
    if by_entropy:
        fig, ax = plt.subplots(figsize=(6.4, 4))
        for i, (name, b) in enumerate(by_entropy.items()):
            x = range(len(b["buckets"]))
            ax.plot(x, [a if a is not None else math.nan for a in b["draft"]], "o-",
                    color=f"C{i % 10}", label=name)
            if "alpha_before" in b:
                ax.plot(x, [a if a is not None else math.nan for a in b["alpha_before"]], "x:",
                        color=f"C{i % 10}", alpha=0.6)
            ticks = b["buckets"]
        ax.set_xticks(list(range(len(ticks))), ticks)
        ax.set_xlabel("target entropy at the position (nats)")
        ax.set_ylabel("acceptance (teacher-forced)")
        ax.set_title("dotted: before distillation" if any("alpha_before" in b for b in
                                                            by_entropy.values()) else "",
                     fontsize=9)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
        save(fig, "acceptance_by_entropy.png", "Acceptance by the target's entropy")

    if domains:
        names = list(domains)
        fig, ax = plt.subplots(figsize=(6.4, 4))

        def bars(xs, key, **kw):  # a missing value gets "n/a", not a bar at 0
            vals = [domains[n].get(key) for n in names]
            ax.bar(xs, [math.nan if a is None else a for a in vals], **kw)
            for pos, a in zip(xs, vals):
                if a is None:
                    ax.text(pos, 0.01, "n/a", ha="center", fontsize=7)

        x = range(len(names))
        if any(domains[n].get("alpha_before") is not None for n in names):
            # both teacher-forced on the same continuations (BEFORE_NOTE)
            bars([i - 0.2 for i in x], "alpha_before", width=0.4, label="before")
            bars([i + 0.2 for i in x], "alpha_after", width=0.4, label="after")
            ax.legend(fontsize=8)
            ax.set_ylabel("alpha (teacher-forced)")
        else:
            bars(list(x), "alpha")
            ax.set_ylabel("alpha")
        ax.set_xticks(list(x), names, rotation=20)
        ax.set_xlim(-0.6, len(names) - 0.4)  # a domain with no bar keeps its place
        ax.set_ylim(0, 1)
        save(fig, "alpha_per_domain.png", "Acceptance per domain")
    return plots


# --- documents ----------------------------------------------------------------------------------

def k_sweep_note(report: dict) -> str | None:
    """What the K sweep's measured points were measured on. They are no like-for-like rival to
    the table's ``--k auto`` figure unless they cover the same prompts: on 12 math prompts of
    128 tokens, fixed K 6 measured 1.20x where the default sweep (2 prompts of 48 tokens) had
    measured 1.63x, and ``--k auto`` 1.30x."""
    sizes = {(r["prompts"], r["new_tokens"]) for r in report.get("k_sweep") or []
             if r.get("prompts")}
    if not sizes:
        return None
    prompts = "/".join(sorted({str(p) for p, _ in sizes}))
    tokens = "/".join(sorted({str(t) for _, t in sizes}))
    return (f"Points: measured at fixed K on the first {prompts} prompt(s) of each domain, up to "
            f"{tokens} new tokens each; dashed lines: predicted from the table's alpha_i, c and v. "
            "The table covers every prompt: to compare its figures with these points like for "
            "like, set draftkit eval's --k-sweep-prompts and --k-sweep-tokens to its prompts "
            "and tokens.")


def _summary_lines(report: dict) -> list[str]:
    lines = [f"target `{report.get('target')}`, draft `{report.get('draft')}`, device "
             f"{report.get('device')}, dtype {report.get('dtype')}, temperature "
             f"{report.get('temperature')}, K {report.get('k')}"]
    if report.get("batch_sweep"):
        lines.append(break_even_text(report))
    return lines


def render_markdown(report: dict, plots: dict[str, Path]) -> str:
    header, rows = domain_table(report)
    out = ["# draftkit evaluation report", ""] + _summary_lines(report) + [""]
    out += markdown_table(header, rows) + [""]
    if "alpha before" in header:
        out += [BEFORE_NOTE, ""]
    sweep_note = k_sweep_note(report)
    for title, path in plots.items():
        out += [f"## {title}", "", f"![{title}]({path.name})", ""]
        if path.stem == "speedup_vs_k" and sweep_note:
            out += [sweep_note, ""]
        if path.stem == "acceptance_by_entropy":
            out += [ENTROPY_NOTE, ""] + markdown_table(*entropy_table(report)) + [""]
    return "\n".join(out)


def render_html(report: dict, plots: dict[str, Path]) -> str:
    header, rows = domain_table(report)
    esc = html.escape
    parts = [f"<p>{esc(line).replace('`', '')}</p>" for line in _summary_lines(report)]
    parts.append(html_table(header, rows))
    if "alpha before" in header:
        parts.append(f"<p>{esc(BEFORE_NOTE)}</p>")
    sweep_note = k_sweep_note(report)
    for title, path in plots.items():
        parts.append(f"<h2>{esc(title)}</h2>{html_image(title, path)}")
        if path.stem == "speedup_vs_k" and sweep_note:
            parts.append(f"<p>{esc(sweep_note)}</p>")
        if path.stem == "acceptance_by_entropy":
            parts += [f"<p>{esc(ENTROPY_NOTE)}</p>", html_table(*entropy_table(report))]
    return html_page("draftkit evaluation report", parts)


# --- shared by the report writers (eval and regimes) ---------------------------------------

def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a Markdown table."""
    return (["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
            + ["| " + " | ".join(r) + " |" for r in rows])


def html_table(header: list[str], rows: list[list[str]]) -> str:
    esc = html.escape
    return ("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
            + "</table>")


def html_image(title: str, path: Path) -> str:
    """An <img> with the PNG inlined: the HTML report is one self-contained file to share."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f"<img alt='{html.escape(title)}' src='data:image/png;base64,{data}'>"


def html_page(title: str, body: list[str]) -> str:
    """A whole HTML document: the title as <h1>, then ``body`` (HTML fragments)."""
    esc = html.escape
    return "\n".join([
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;"
        "text-align:right}td:first-child,th:first-child,td:last-child{text-align:left}"
        f"</style></head><body><h1>{esc(title)}</h1>", *body, "</body></html>"])


def write_files(report: dict, out_dir: str | Path, plot, markdown, page
                ) -> tuple[dict[str, Path], dict[str, Path]]:
    """Plots (``plot(report, dir)``), then report.json, report.md and report.html rendered by
    ``markdown`` / ``page(report, plots)``, each written atomically. Returns (plots, files)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = plot(report, out_dir)
    atomic_write_json(out_dir / "report.json", report)
    atomic_write_text(out_dir / "report.md", markdown(report, plots))
    atomic_write_text(out_dir / "report.html", page(report, plots))
    return plots, {"json": out_dir / "report.json", "md": out_dir / "report.md",
                   "html": out_dir / "report.html", **{p.stem: p for p in plots.values()}}


def write_report(report: dict, out_dir: str | Path, tracker=None) -> dict[str, Path]:
    """Write report.json, report.md, report.html and the plots; log them to ``tracker``."""
    plots, files = write_files(report, out_dir, write_plots, render_markdown, render_html)
    if tracker is not None:
        header, rows = domain_table(report)
        tracker.log_table("eval/domains", header, rows)
        for title, path in plots.items():
            tracker.log_image(f"eval/{path.stem}", path)
        if report.get("overall"):
            tracker.summary({f"eval/{k}": v for k, v in report["overall"].items()
                             if isinstance(v, (int, float))})
    return files
