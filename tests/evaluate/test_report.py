import json

from draftkit.evaluate.report import domain_table, format_text_table, write_report


def sample_report():
    dom = {"n_prompts": 3, "new_tokens": 90, "alpha": 0.61, "alpha_tv": 0.58,
           "alpha_per_position": [0.7, 0.6, 0.5], "tau": 2.1, "c": 0.2, "v": 1.1, "k": 3,
           "speedup_predicted": 1.4, "speedup_measured": 1.3, "plain_tokens_per_s": 20.0,
           "spec_tokens_per_s": 26.0, "target_entropy": 1.2, "overhead_per_round_ms": 2.0,
           "verdict": "speculate with K=3"}
    return {"target": "t", "draft": "d", "device": "cpu", "dtype": "float32",
            "temperature": 0.0, "k": 3, "created": "now",
            "domains": {"code": dict(dom, alpha_before=0.3), "creative": dict(dom, alpha=0.2)},
            "overall": dict(dom),
            "k_sweep": [{"domain": "code", "k": k, "tau": 1 + k * 0.5, "speedup_predicted": 1.1,
                         "speedup_measured": 1.0} for k in (1, 2, 3)],
            "batch_sweep": [{"batch_size": b, "alpha": 0.6, "c": 0.2, "v": 1.0 + b / 8,
                             "speedup_predicted": 1.5 / b, "speedup_measured": 1.4 / b}
                            for b in (1, 2, 4)],
            "break_even": {"batch_size": 2, "per_domain": {"code": 2}}}


def test_write_report_files_and_table(tmp_path):
    report = sample_report()
    files = write_report(report, tmp_path)
    assert json.loads((tmp_path / "report.json").read_text()) == report
    for name in ("speedup_vs_k", "speedup_vs_batch", "alpha_per_position", "alpha_per_domain"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000, name
        assert name in files
    md = (tmp_path / "report.md").read_text()
    # The per-domain table comes before the plots.
    assert md.index("| domain |") < md.index("![")
    assert "| code | 3 | 0.300 | 0.610 |" in md
    assert "break-even" not in md or "batch size 2" in md
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4 and "<table>" in html


def test_table_without_sweeps_or_before():
    report = sample_report()
    for key in ("k_sweep", "batch_sweep", "break_even"):
        report.pop(key)
    report["domains"]["code"].pop("alpha_before")
    header, rows = domain_table(report)
    assert "alpha before" not in header and [r[0] for r in rows] == ["code", "creative", "overall"]
    text = format_text_table(header, rows)
    assert "1.30x" in text and "speculate with K=3" in text


def test_break_even_text():
    from draftkit.evaluate.report import break_even_text

    report = sample_report()
    assert break_even_text(report) == "speculation stops paying at batch size 2"
    report["break_even"]["batch_size"] = 1
    assert break_even_text(report) == "speculation does not pay at any batch size measured"
    report["break_even"]["batch_size"] = None
    assert break_even_text(report) == "speculation pays at every batch size measured (up to 4)"
    report["batch_sweep"] = []
    assert break_even_text(report) == "no batch sweep was run"
