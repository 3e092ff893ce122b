"""The distillation quality bars, read from two finished runs and an eval report.

    draftkit distill recipes/smollm2-135m-instruct_to_4layer/fkl_topk_cpu.yaml out_dir=runs/fkl
    draftkit distill recipes/smollm2-135m-instruct_to_4layer/ce_control_cpu.yaml out_dir=runs/ce
    draftkit eval --draft runs/fkl/best --domains code,math --k auto --out runs/fkl-eval
    python eval/benchmarks/reproduce/distill_quality.py --run runs/fkl --control runs/ce \
        --eval-report runs/fkl-eval/report.json --out runs/quality

It prints, and writes to ``--out/quality.md`` with a plot ``alpha_vs_minutes.png``:

1. held-out alpha per domain of the recipe against the cross-entropy control, and the margin
   the bar asks for (>= 0.1 on every trained domain), twice: at the last step both evaluated
   (the same tokens: both recipes draw the same rows in the same order), and between the two
   drafts each run keeps in ``best/`` (the evaluation its ``best/best.json`` records). The bar is
   judged on the second: a control that peaks early and then overfits ships its peak (for a
   95% interval on that margin over the held-out rows, run ``acceptance_by_entropy.py
   --control``);
2. held-out alpha against wall minutes of the recipe's run (set-up included), so users see what
   more compute buys;
3. the measured greedy speedup over plain decoding per domain from the eval report (the bar:
   above 1.0x on code and math).

Runs written before ``metrics.jsonl`` carried ``minutes`` get them from the times their
checkpoints were written (every evaluation step had one) relative to the run's ``config.yaml``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    if rows and "minutes" not in rows[-1]:
        t0 = (run / "config.yaml").stat().st_mtime
        for r in rows:
            manifest = run / "checkpoints" / f"step-{r['step']:07d}" / "manifest.json"
            if manifest.is_file():
                r["minutes"] = (manifest.stat().st_mtime - t0) / 60
    return rows


def domains_of(row: dict) -> list[str]:
    return sorted(k.split("/", 1)[1] for k in row if k.startswith("alpha/"))


def read_best(run: Path) -> dict:
    """The evaluation row of the draft the trainer exported to ``best/`` (``best/best.json``)."""
    path = run / "best" / "best.json"
    if not path.is_file() and (run / "best.json").is_file():  # a run from before best/best.json
        path = run / "best.json"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: point --run/--control at a draftkit distill out_dir")
    return json.loads(path.read_text())


def margins(a: dict, b: dict, margin: float) -> dict:
    """Per-domain alpha of evaluation row ``a`` (the recipe) against ``b`` (the control)."""
    per = {d: {"recipe": a[f"alpha/{d}"], "control": b[f"alpha/{d}"],
               "delta": a[f"alpha/{d}"] - b[f"alpha/{d}"]} for d in domains_of(a)}
    return {"steps": (a["step"], b["step"]), "domains": per,
            "passed": all(v["delta"] >= margin for v in per.values())}


def compare(run_rows: list[dict], ctl_rows: list[dict], bests: tuple[dict, dict],
            margin: float) -> dict:
    """The two runs at the last step both evaluated, and their ``best/`` drafts (``bests``)."""
    common = sorted({r["step"] for r in run_rows} & {r["step"] for r in ctl_rows})
    if not common:
        raise SystemExit("the two runs share no evaluated step; evaluate both at the same steps")
    step = common[-1]
    last = margins(next(r for r in run_rows if r["step"] == step),
                   next(r for r in ctl_rows if r["step"] == step), margin)
    best = margins(*bests, margin)
    return {"last": last, "best": best, "passed": best["passed"]}


def margin_table(title: str, cmp_: dict) -> list[str]:
    lines = [title, "", "| domain | recipe | CE control | delta |", "|---|---|---|---|"]
    for d, v in cmp_["domains"].items():
        lines.append(f"| {d} | {v['recipe']:.3f} | {v['control']:.3f} | {v['delta']:+.3f} |")
    return lines


def plot_curve(rows: list[dict], ctl_rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for rs, style, name in ((rows, "-o", "recipe"), (ctl_rows, "--s", "CE control")):
        rs = [r for r in rs if r.get("minutes") is not None]
        if not rs:
            continue
        for d in domains_of(rs[-1]):
            ax.plot([r["minutes"] for r in rs], [r[f"alpha/{d}"] for r in rs], style,
                    label=f"{name}: {d}", markersize=3)
    ax.set_xlabel("wall minutes (set-up included)")
    ax.set_ylabel("held-out alpha = mean(1 - TV)")
    ax.set_title("What more training buys")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, type=Path, help="the recipe's out_dir")
    ap.add_argument("--control", required=True, type=Path, help="the CE control's out_dir")
    ap.add_argument("--eval-report", type=Path, help="report.json of `draftkit eval` on best/")
    ap.add_argument("--out", type=Path, default=Path("runs/quality"))
    ap.add_argument("--margin", type=float, default=0.1)
    ap.add_argument("--speedup-domains", default="code,math")
    args = ap.parse_args(argv)

    rows, ctl = read_metrics(args.run), read_metrics(args.control)
    for run, rs in ((args.run, rows), (args.control, ctl)):
        missing = sum(r.get("minutes") is None for r in rs)
        if missing:
            print(f"warning: {missing} of {len(rs)} evaluations of {run} have no minutes (the run "
                  "predates the field and those checkpoints are gone); the curve leaves them out",
                  file=sys.stderr)
    cmp_ = compare(rows, ctl, (read_best(args.run), read_best(args.control)), args.margin)
    step = cmp_["last"]["steps"][0]
    run_best, ctl_best = cmp_["best"]["steps"]
    lines = [f"# Distillation quality: {args.run} against {args.control}", ""]
    lines += margin_table(f"## Held-out alpha at step {step} (the same tokens)", cmp_["last"])
    lines += [""] + margin_table(f"## The drafts in best/ (recipe step {run_best}, "
                                 f"control step {ctl_best})", cmp_["best"])
    lines += ["", f"Bar (delta >= {args.margin} on every domain, best against best): "
                  f"{'met' if cmp_['passed'] else 'NOT met'}.", "",
              "## Held-out alpha against minutes (recipe)", "",
              "| step | minutes | " + " | ".join(domains_of(rows[-1])) + " |",
              "|---" * (2 + len(domains_of(rows[-1]))) + "|"]
    for r in rows:
        m = r.get("minutes")
        lines.append(f"| {r['step']} | {'' if m is None else f'{m:.1f}'} | " +
                     " | ".join(f"{r[f'alpha/{d}']:.3f}" for d in domains_of(rows[-1])) + " |")
    if args.eval_report:
        rep = json.loads(args.eval_report.read_text())
        want = args.speedup_domains.split(",")
        lines += ["", "## Measured greedy speedup over plain decoding", "",
                  "| domain | alpha | c | K | speedup measured | predicted |",
                  "|---|---|---|---|---|---|"]
        ok = True
        for d in want:
            fig = rep["domains"].get(d)
            if fig is None:
                lines.append(f"| {d} | not in the report | | | | |")
                ok = False
                continue
            s = fig.get("speedup_measured") or 0.0
            ok &= s > 1.0
            lines.append(f"| {d} | {fig.get('alpha', 0):.3f} | {fig.get('c') or 0:.3f} | "
                         f"{fig.get('k')} | {s:.3f}x | {fig.get('speedup_predicted') or 0:.3f}x |")
        lines += ["", f"Bar (speedup > 1.0x on {', '.join(want)}): {'met' if ok else 'NOT met'}."]
    args.out.mkdir(parents=True, exist_ok=True)
    plot_curve(rows, ctl, args.out / "alpha_vs_minutes.png")
    lines += ["", "![alpha against minutes](alpha_vs_minutes.png)", ""]
    text = "\n".join(lines)
    (args.out / "quality.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
