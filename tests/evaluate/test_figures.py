"""The typed report records: report.json read back writes the same bytes, and reports written
before the records existed still read, render and round-trip.

``reports/`` holds what draftkit wrote before its reports were typed (commit afbadf7), on the
tiny models of ``tests/tiny.py`` and this folder's conftest suite: ``eval.json`` / ``eval.md``
(``--k auto`` with a baseline draft, a K sweep and a batch sweep), ``eval_k0.json`` (``--k 0``:
nothing drafted, alpha null) and ``regimes.json`` / ``regimes.md`` (with a domain draft, so the
mismatch counts carry alpha_home and alpha_away).
"""

import json
from pathlib import Path

import pytest

from draftkit.evaluate.regimes.report import write_regimes_report
from draftkit.evaluate.report import write_report
from draftkit.figures import (ALPHA_BEFORE, DomainFigures, EntropyTable, EvalReport, PointFigures,
                              PromptPoint, RegimesReport)

REPORTS = Path(__file__).parent / "reports"


def written(report) -> str:
    """report.json's text, as the writers write it."""
    return json.dumps(report.to_dict(), indent=2) + "\n"


@pytest.mark.parametrize("name,record", [("eval.json", EvalReport),
                                         ("eval_k0.json", EvalReport),
                                         ("regimes.json", RegimesReport)])
def test_a_report_written_before_the_records_round_trips_byte_for_byte(name, record):
    text = (REPORTS / name).read_text()
    report = record.from_dict(json.loads(text))
    assert written(report) == text


def test_the_records_read_what_the_json_says():
    report = EvalReport.from_dict(json.loads((REPORTS / "eval.json").read_text()))
    assert report.k == "auto" and report.temperature == 0.0
    code = report.domains["code"]
    assert isinstance(code, DomainFigures) and isinstance(code.by_entropy, EntropyTable)
    # the baseline's teacher-forced acceptance: a key of the row, after verdict
    assert code.alpha_before == 1.0 and list(code.baselines) == [ALPHA_BEFORE]
    assert list(code.to_dict())[-2:] == ["verdict", ALPHA_BEFORE]
    assert set(code.by_entropy.acceptance) == {"draft", ALPHA_BEFORE}
    assert report.break_even.per_domain["code"].kind == report.break_even.kind == "rises"
    plain = EvalReport.from_dict(json.loads((REPORTS / "eval_k0.json").read_text()))
    assert plain.overall.alpha is None and plain.overall.baselines == {}  # no key, not null
    regimes = RegimesReport.from_dict(json.loads((REPORTS / "regimes.json").read_text()))
    assert all(isinstance(p, PromptPoint) for p in regimes.entropy.prompts)
    assert set(regimes.mismatch.crossover.home_and_away) == {"alpha_home", "alpha_away"}
    assert [key for key, _ in regimes.regimes()] == ["entropy", "draft_cost", "mismatch",
                                                     "batch"]


def test_missing_keys_read_as_not_measured_and_unknown_ones_are_dropped():
    fig = PointFigures.from_dict({"alpha": 0.5, "from_a_later_version": 1})
    assert fig.alpha == 0.5 and fig.c is None and fig.alpha_per_position is None
    assert "from_a_later_version" not in fig.to_dict()
    report = EvalReport.from_dict({"domains": None})
    assert report.domains == {} and report.k_sweep == [] and report.break_even is None


def test_of_extends_and_narrows_a_record():
    fig = DomainFigures.from_dict(json.loads((REPORTS / "eval.json").read_text())["overall"])
    point = PointFigures.of(fig, break_even_alpha=0.4)
    assert point.alpha == fig.alpha and point.break_even_alpha == 0.4
    prompt = PromptPoint.of(point, domain="code", index=0)
    assert list(prompt.to_dict()) == [*point.to_dict(), "domain", "index"]


@pytest.mark.parametrize("name,record,write", [("eval", EvalReport, write_report),
                                               ("regimes", RegimesReport, write_regimes_report)])
def test_a_report_written_before_the_records_renders_the_same_markdown(name, record, write,
                                                                        tmp_path):
    report = record.from_dict(json.loads((REPORTS / f"{name}.json").read_text()))
    files = write(report, tmp_path)
    expected = (REPORTS / f"{name}.md").read_text()
    if record is EvalReport:  # since then the break-even line is the headline's last clause
        from draftkit.evaluate.report import break_even_text, headline

        line = break_even_text(report)
        assert headline(report).endswith(f"; over the domains mixed, {line}.")
        expected = expected.replace(f"\n{line}\n", f"\n{headline(report)}\n", 1)
    assert files["md"].read_text() == expected
    assert files["json"].read_text() == (REPORTS / f"{name}.json").read_text()
