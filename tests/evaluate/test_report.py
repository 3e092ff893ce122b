import json

import pytest

from draftkit.evaluate.analysis import break_even
from draftkit.evaluate.report import break_even_text, domain_table, format_text_table, write_report
from draftkit.figures import BatchRow, DomainFigures, EvalReport


def sample_report():
    dom = {"n_prompts": 3, "new_tokens": 90, "alpha": 0.61, "alpha_tv": 0.58,
           "alpha_per_position": [0.7, 0.6, 0.5], "tau": 2.1, "c": 0.2, "v": 1.1, "k": 3,
           "speedup_predicted": 1.4, "speedup_measured": 1.3, "plain_tokens_per_s": 20.0,
           "spec_tokens_per_s": 26.0, "target_entropy": 1.2, "overhead_per_round_ms": 2.0,
           "verdict": "speculate with K=3"}
    return {"target": "t", "draft": "d", "device": "cpu", "dtype": "float32",
            "temperature": 0.0, "k": 3, "created": "now",
            "domains": {"code": dict(dom, alpha_before=0.3, alpha_after=0.55),
                        "creative": dict(dom, alpha=0.2)},
            "overall": dict(dom),
            "k_sweep": [{"domain": "code", "k": k, "tau": 1 + k * 0.5, "speedup_predicted": 1.1,
                         "speedup_measured": 1.0} for k in (1, 2, 3)],
            "batch_sweep": [{"batch_size": b, "alpha": 0.6, "c": 0.2, "v": 1.0 + b / 8,
                             "speedup_predicted": 1.5 / b, "speedup_measured": 1.4 / b}
                            for b in (1, 2, 4)],
            "break_even": {"kind": "crosses", "x": 1.49, "batch_size": 2,
                           "per_domain": {"code": {"kind": "crosses", "x": 1.9,
                                                   "batch_size": 2}}}}


def test_write_report_files_and_table(tmp_path):
    report = EvalReport.from_dict(sample_report())
    files = write_report(report, tmp_path)
    assert json.loads((tmp_path / "report.json").read_text()) == report.to_dict()
    for name in ("speedup_vs_k", "speedup_vs_batch", "alpha_per_position", "alpha_per_domain"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000, name
        assert name in files
    md = (tmp_path / "report.md").read_text()
    # The per-domain table comes before the plots.
    assert md.index("| domain |") < md.index("![")
    # alpha before sits next to its like, the draft's teacher-forced alpha, explained below
    assert "| domain | prompts | alpha before | alpha after | alpha |" in md
    assert "| code | 3 | 0.300 | 0.550 | 0.610 |" in md
    assert "teacher-forced on the same continuations" in md
    assert "stops paying at batch size 2" in md
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4 and "<table>" in html


def test_table_without_sweeps_or_before():
    data = sample_report()
    for key in ("k_sweep", "batch_sweep", "break_even"):
        data.pop(key)
    data["domains"]["code"].pop("alpha_before")
    header, rows = domain_table(EvalReport.from_dict(data))
    assert "alpha before" not in header and [r[0] for r in rows] == ["code", "creative", "overall"]
    text = format_text_table(header, rows)
    assert "1.30x" in text and "speculate with K=3" in text


def _rows(speedups: dict[int, float], v: dict[int, float] | None = None) -> list[BatchRow]:
    """Batch-sweep rows at K 2 with these measured speedups, which the model predicts too (and
    v(B), else 1.1)."""
    return [BatchRow.from_dict({"batch_size": b, "speedup_measured": s, "c": 0.1,
                                "speedup_predicted": s, "v": (v or {}).get(b, 1.1), "k": 2})
            for b, s in speedups.items()]


def _batch_report(speedups: dict[int, float], k: str | None = None) -> EvalReport:
    """A report of only a batch sweep (``--k``: ``k``)."""
    report = EvalReport.from_dict({"k": k})
    report.batch_sweep = _rows(speedups)
    report.break_even = break_even(report.batch_sweep, {})
    return report


def test_break_even_text_is_worded_from_the_crossover():
    # pays from 2 on: not "does not pay at any batch size"
    text = break_even_text(_batch_report({1: 0.95, 2: 1.25, 4: 1.30, 8: 1.10}))
    assert text.startswith("speculation at K 2 loses at small batches and pays from batch "
                           "size 2 on")
    # a dip at 2 that recovers is not where it stops paying; the largest batch is named
    text = break_even_text(_batch_report({1: 1.4, 2: 0.99, 4: 1.3, 8: 1.2, 16: 0.8}))
    assert text.startswith("speculation at K 2 stops paying at batch size 16 (")
    assert "up to 16" in text
    assert break_even_text(_batch_report({4: 1.2, 1: 1.5, 2: 1.3})) == \
        "speculation at K 2 pays at every batch size measured (up to 4)"
    assert break_even_text(_batch_report({4: 0.7, 1: 0.9})) == \
        "speculation at K 2 does not pay at any batch size measured (up to 4)"
    assert break_even_text(EvalReport.from_dict({"batch_sweep": []})) == \
        "no batch sweep was run"
    # --k 0 decodes plainly, yet the sweep speculates: the sentence says at which K and why
    plain = _batch_report({4: 0.7, 1: 0.9}, k="0")
    for row in plain.batch_sweep:
        row.k = 1
    assert break_even_text(plain) == ("speculation at K 1 does not pay at any batch size "
                                      "measured (up to 4); --k 0 decodes plainly, the sweep "
                                      "used K 1")


def test_the_headline_is_the_table_and_the_sweep_in_one_sentence():
    from draftkit.evaluate.report import headline

    report = _batch_report({1: 1.06, 2: 0.9, 4: 0.8}, k="auto")
    report.batch_sweep_k = "auto"
    report.domains = {name: DomainFigures.from_dict(fig) for name, fig in {
        "math": {"speedup_measured": 1.15, "speedup_low": 1.04, "speedup_high": 1.27,
                 "verdict": "speculate with K=2 (...)"},
        "code": {"speedup_measured": 1.06, "prompts_to_decide": 27,
                 "verdict": "inconclusive: ..."},
        "chat": {"speedup_measured": 1.01, "prompts_to_decide": 400,
                 "verdict": "inconclusive: ..."},
        "creative": {"speedup_measured": 0.9, "verdict": "do not speculate: ..."}}.items()}
    assert headline(report) == (
        "Speculate on math (1.15x, 95% interval 1.04-1.27x) at batch 1; the measurement cannot "
        "tell yet on code and chat (about 400 prompts each would decide); do not speculate on "
        "creative; over the domains mixed, speculation with --k auto stops paying at batch "
        "size 2 (speedup falls below 1.0 at B ~ 1.3 and stays below up to 4).")


def test_a_gain_the_measurement_does_not_back_is_no_gain():
    """Under --k auto a batch size where the policy kept to plain decoding measures 1.0x give
    or take the clock: 1.04x at B 2 and 1.001x at B 8 with alpha 0 (a quickstart run) once read
    as "pays from batch size 8 on"."""
    report = _batch_report({1: 0.94, 2: 1.04, 4: 0.89, 8: 1.001})
    for row in report.batch_sweep:
        row.speedup_predicted = 0.97  # alpha 0: the model predicts a loss everywhere
    report.break_even = break_even(report.batch_sweep, {})
    assert report.break_even.kind == "below"
    # batch size 1 is backed by its interval over prompts, the others by the model
    report.batch_sweep[0].speedup_measured = 1.2
    report.batch_sweep[0].speedup_low, report.batch_sweep[0].speedup_high = 1.05, 1.3
    report.break_even = break_even(report.batch_sweep, {})
    assert (report.break_even.kind, report.break_even.batch_size) == ("crosses", 2)
    report.batch_sweep[0].speedup_low = 0.98  # across 1.0: not shown
    assert break_even(report.batch_sweep, {}).kind == "below"


def test_break_even_batch_does_not_depend_on_the_order_given():
    asc = _rows({1: 1.5, 2: 1.3, 4: 1.1, 8: 0.9, 16: 0.7}, v={1: 1.1, 2: 1.3, 4: 1.6, 8: 2.0,
                                                               16: 2.6})
    figs = {"code": DomainFigures.from_dict({"alpha_per_position": [0.6, 0.5], "alpha": 0.55}),
            "never drafted": DomainFigures.from_dict({"alpha_per_position": [], "alpha": None})}
    be = break_even(asc, figs)
    assert be == break_even(list(reversed(asc)), figs)  # --batch-sizes 16 8 4 2 1
    assert be.kind == "crosses" and be.batch_size == 8
    assert be.x == pytest.approx(2 ** 2.5)  # 1.1 at 4 and 0.9 at 8: halfway in log2 B
    # predicted from alpha_i and c(B), v(B): tau = 1.9 over 0.2 + v, 1.06x at 4, 0.86x at 8
    assert be.per_domain["code"].kind == "crosses"
    assert be.per_domain["code"].batch_size == 8
    assert be.per_domain["never drafted"].to_dict() == {"kind": "empty", "x": None,
                                                        "batch_size": None}


def test_the_sweeps_tables_show_intervals_or_say_why_there_are_none(tmp_path):
    data = sample_report()
    data["k_sweep"] = [{"domain": "code", "k": 1, "tau": 1.5, "tau_measured": 1.4, "c": 0.2,
                        "v": 1.1, "speedup_predicted": 1.1, "speedup_measured": 1.12,
                        "speedup_low": 0.96, "speedup_high": 1.3, "prompts_to_decide": 9,
                        "prompts": 3, "new_tokens": 48, "verdict": "inconclusive: ..."},
                       {"domain": "chat", "k": 1, "tau": 1.5, "tau_measured": 1.3, "c": 0.2,
                        "v": 1.1, "speedup_predicted": 1.1, "speedup_measured": 1.05,
                        "prompts": 1, "new_tokens": 48, "verdict": "inconclusive: one"},
                       {"domain": "code", "k": 2, "tau": 1.9, "speedup_predicted": 1.2}]
    for row, (low, high, batches) in zip(data["batch_sweep"], [(1.2, 1.4, 3), (0.6, 0.8, 2),
                                                               (None, None, 1)]):
        row.update(speedup_low=low, speedup_high=high, batches=batches, k=3, verdict="v")
    files = write_report(EvalReport.from_dict(data), tmp_path)
    md = files["md"].read_text()
    assert "| code | 1 | 3 | 48 | 1.40 | 0.200 | 1.10 | 1.12x | 0.96-1.30x | 1.10x |" in md
    assert "| chat | 1 | 1 | 48 | 1.30 | 0.200 | 1.10 | 1.05x | none: 1 prompt | 1.10x |" in md
    assert "| code | 2 |" not in md  # predicted only: in the plot, not the measured table
    assert "| 1 | 3 | 0.600 | 0.200 | 1.12 | 3 | - | - | 1.40x | 1.20-1.40x | 1.50x | v |" in md
    assert "| 4 | 1 |" in md and "| 0.35x | none: 1 batch |" in md
    assert md.index("## Speedup against K") < md.index("| domain | K |") < \
        md.index("## Speedup against batch size") < md.index("| batch | batches |")
    assert files["html"].read_text().count("<table>") == 3
    # a report from before the sweeps kept verdicts: no sweep tables (test_figures: its
    # Markdown renders as then)
    md = write_report(EvalReport.from_dict(sample_report()), tmp_path / "old")["md"].read_text()
    assert "| domain | K |" not in md and "| batch | batches |" not in md
