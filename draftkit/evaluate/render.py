"""The pieces both reports are made of (``draftkit eval``'s and the regime map): cells, tables,
PNG plots, a self-contained HTML page, and the files written together.
"""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path
from typing import Any, Callable

from draftkit.figures import Record
from draftkit.io import atomic_write_bytes, atomic_write_json, atomic_write_text


def fmt(value: Any, pattern: str) -> str:
    """A table cell: ``value`` formatted, or "-" where it was not measured."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    try:
        return pattern.format(value)
    except (ValueError, TypeError):
        return str(value)


def interval_cell(low: float | None, high: float | None, units: int | None, unit: str) -> str:
    """A measured speedup's 95% interval, or why it has none: measured on one ``unit`` (a
    prompt, a batch); "-" where the report does not say."""
    if low is not None:
        return f"{low:.2f}-{high:.2f}x"
    return f"none: 1 {unit}" if units == 1 else "-"


def error_bars(rows) -> list[list[float]] | None:
    """Matplotlib's yerr (below, above) of measured speedups from their 95% intervals; 0 where
    a row has none (one prompt or batch); None where no row has one."""
    if all(r.speedup_low is None for r in rows):
        return None
    below = [0.0 if r.speedup_low is None else r.speedup_measured - r.speedup_low for r in rows]
    above = [0.0 if r.speedup_high is None else r.speedup_high - r.speedup_measured
             for r in rows]
    return [below, above]


def save_png(fig, path: Path, dpi: int = 110) -> Path:
    """Write a matplotlib figure atomically (a killed run leaves no half a PNG), close it."""
    import matplotlib.pyplot as plt  # matplotlib only where a report is drawn

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


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


def write_files(report: Record, out_dir: str | Path, plot: Callable, markdown: Callable,
                page: Callable) -> tuple[dict[str, Path], dict[str, Path]]:
    """Plots (``plot(report, dir)``), then report.json, report.md and report.html rendered by
    ``markdown`` / ``page(report, plots)``, each written atomically. Returns (plots, files)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = plot(report, out_dir)
    atomic_write_json(out_dir / "report.json", report.to_dict())
    atomic_write_text(out_dir / "report.md", markdown(report, plots))
    atomic_write_text(out_dir / "report.html", page(report, plots))
    return plots, {"json": out_dir / "report.json", "md": out_dir / "report.md",
                   "html": out_dir / "report.html", **{p.stem: p for p in plots.values()}}
