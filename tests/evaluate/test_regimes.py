"""``draftkit regimes``: the crossover finder on synthetic curves, the model's predicted
crossovers, and the regime runner end to end on tiny random models."""

import json
import math

import pytest

from draftkit import metrics
from draftkit.errors import ConfigError, DraftkitError
from draftkit.evaluate.args import RegimesArgs
from draftkit.evaluate.command import regimes, run_regimes
from draftkit.evaluate.regimes.analysis import batch_crossovers, cost_regime, headline
from draftkit.evaluate.regimes.crossovers import entropy_crossover, entropy_model_text
from draftkit.evaluate.regimes.measure import PromptFigures
from draftkit.figures import BatchRow, DraftInfo, PointFigures, RegimesReport

# --- the crossover finder ---------------------------------------------------------------------


def test_crossover_interpolates_the_crossing():
    assert metrics.crossover([0, 1, 2, 3], [1.5, 1.2, 0.8, 0.6]) == ("crosses", 1.5)
    # unsorted input, None points skipped
    assert metrics.crossover([3, 9, 1, 2, 0], [0.6, None, 1.2, 0.8, 1.5])[1] == \
        pytest.approx(1.5)
    # a point exactly at the level is not below it
    assert metrics.crossover([0, 1, 2], [1.2, 1.0, 0.8]) == ("crosses", 1.0)


def test_crossover_never_crossing_and_always_below():
    assert metrics.crossover([1, 2, 4], [1.4, 1.2, 1.01]) == ("above", None)
    assert metrics.crossover([1, 2, 4], [0.9, 0.7, 0.5]) == ("below", None)
    assert metrics.crossover([], []) == ("empty", None)
    assert metrics.crossover([1, 2], [None, None]) == ("empty", None)


def test_crossover_noisy_curve_takes_the_last_crossing():
    # The dip to 0.98 recovers; past the crossover every measured point is below 1.
    kind, x = metrics.crossover([0, 1, 2, 3, 4], [1.3, 0.98, 1.1, 0.9, 0.8])
    assert kind == "crosses" and x == pytest.approx(2.5)
    # A curve that ends above after a dip rises: the last upward crossing.
    kind, x = metrics.crossover([0, 1, 2], [0.8, 0.9, 1.1])
    assert kind == "rises" and x == pytest.approx(1.5)


def test_crossover_in_log_batch_size():
    kind, x = metrics.crossover([1, 2, 4, 8], [1.2, 1.1, 0.9, 0.8], log_x=True)
    assert kind == "crosses" and x == pytest.approx(2 ** 1.5)


# --- crossovers the model predicts ------------------------------------------------------------


def test_predicted_batch_crossover_matches_the_models_break_even():
    alpha, c, k = 0.7, 0.1, 3
    v = lambda b: 1 + 0.5 * math.log2(b)  # noqa: E731 - verify inflation growing with B
    rows = [BatchRow.from_dict({"batch_size": b,
                                "speedup_measured": 0.9 * metrics.speedup(alpha, c, k, v(b)),
                                "speedup_predicted": metrics.speedup(alpha, c, k, v(b))})
            for b in (1, 2, 4, 8, 16)]
    cross = batch_crossovers(rows)
    # exact: S = 1 where v = tau - K c
    v_star = metrics.tau(alpha, k) - k * c
    b_star = 2 ** ((v_star - 1) / 0.5)
    assert cross.predicted.kind == "crosses"
    assert cross.predicted.x == pytest.approx(b_star, rel=0.05)  # interpolation error
    # the measured curve (10% overhead) crosses earlier
    assert cross.measured.kind == "crosses"
    assert cross.measured.x < cross.predicted.x


def test_predicted_entropy_crossover_from_the_break_even_alpha():
    c, k, v = 0.2, 2, 1.2
    be = metrics.break_even_alpha(c, k, v)
    assert metrics.speedup(be, c, k, v) == pytest.approx(1.0)
    def points(alpha):  # alpha(h) at four prompts of these target entropies
        return [PointFigures.from_dict({"target_entropy": h, "alpha": alpha(h)})
                for h in (0.5, 1.0, 2.5, 3.0)]

    pts = points(lambda h: be + 0.2 * (2.0 - h))
    fit = entropy_crossover(pts, be)
    assert fit.slope == pytest.approx(-0.2) and fit.entropy == pytest.approx(2.0)
    assert fit.inside and "2.00 nats" in entropy_model_text(fit)
    # alpha below break-even everywhere: the fitted crossing lies at negative entropy
    low = entropy_crossover(points(lambda h: be + 0.2 * (2.0 - h) - 0.6), be)
    assert low.entropy < 0 and "every entropy" in entropy_model_text(low)
    flat = entropy_crossover(points(lambda h: 0.3), be)
    assert flat.entropy is None and "does not fall" in entropy_model_text(flat)
    assert entropy_crossover(pts[:1], be).slope is None


# --- the answers say what the data say -------------------------------------------------------


def _lost_everywhere(alpha: float | None) -> RegimesReport:
    """A report section where nothing paid, at T = 0 with break-even alpha 0.30."""
    return RegimesReport.from_dict({
        "entropy": {"temperatures": [{"temperature": 0.0, "speedup_measured": 0.9,
                                      "alpha": alpha}],
                    "break_even_alpha": 0.3, "c": 0.2, "v": 1.1},
        "draft_cost": {"drafts": []},
        "mismatch": {"drafts": [], "domains": [], "speedup_measured": []},
        "batch": {"domains": {}}})


def test_headline_says_the_model_agrees_only_when_alpha_is_below_break_even():
    text = headline(_lost_everywhere(0.1))
    assert "the model agrees: the draft's alpha 0.10 is below the 0.30" in text
    # alpha 0.80 is above the 0.30 break-even: the model predicted a gain overhead ate
    text = headline(_lost_everywhere(0.8))
    assert "agrees" not in text and "is below the" not in text
    assert "the model predicts a gain" in text and "per-round overhead" in text
    assert headline(_lost_everywhere(None)).startswith("Speculation did not pay anywhere")


def _cost_answer(points) -> str:
    """cost_regime's answer over early exits of (layers, alpha, c, measured speedup)."""
    drafts = [DraftInfo(name=f"first {n} layers", layers=n, derived=True, main=i == 0)
              for i, (n, *_) in enumerate(points)]
    at_zero = {f"first {n} layers": PromptFigures(prompts={}, domains={}, overall=(
        PointFigures.from_dict({"alpha": a, "alpha_per_position": [a], "c": c, "v": 1.1,
                                "speedup_measured": s, "speedup_predicted": s})))
               for n, a, c, s in points}
    return cost_regime(drafts, at_zero, 2).answer


def test_draft_cost_answer_is_worded_from_the_data():
    # deeper exits accept less here: the answer must not say they accept more
    text = _cost_answer([(1, 0.30, 0.1, 0.9), (2, 0.20, 0.2, 0.8), (4, 0.10, 0.35, 0.7)])
    assert "accept more" not in text
    assert "alpha falls from 0.30 (1 layers) to 0.10 (4 layers)" in text
    assert "c rises from 0.10 (1 layers) to 0.35 (4 layers)" in text
    # nothing paid, so no depth "no longer pays"
    assert "no longer pays" not in text
    text = _cost_answer([(1, 0.10, 0.1, 0.9), (2, 0.13, 0.2, 0.8), (4, 0.06, 0.35, 0.7)])
    assert "alpha moves unevenly (0.06-0.13), from 0.10 (1 layers) to 0.06 (4 layers)" in text
    # alpha rises with depth and the 2-layer exit paid: past it, depth no longer pays
    text = _cost_answer([(1, 0.4, 0.1, 1.1), (2, 0.6, 0.2, 1.2), (4, 0.7, 0.35, 0.95)])
    assert "alpha rises from 0.40 (1 layers) to 0.70 (4 layers)" in text
    assert "Past 2 layers, a deeper draft's extra acceptance no longer pays" in text


def test_a_gain_its_interval_does_not_back_is_no_crossing():
    """The regimes read their curves by eval's rule: 1.04x at batch 2 with an interval across
    1.0 (the model predicting a loss) is not where speculation starts paying."""
    rows = [BatchRow.from_dict({"batch_size": b, "speedup_measured": s, "speedup_low": lo,
                                "speedup_high": hi, "speedup_predicted": 0.95})
            for b, s, lo, hi in ((1, 0.9, 0.85, 0.95), (2, 1.04, 0.97, 1.1),
                                 (4, 0.8, 0.75, 0.85))]
    assert batch_crossovers(rows).measured.kind == "below"
    rows[1].speedup_low = 1.01  # shown: now it crosses, falling below 1.0 between 2 and 4
    assert batch_crossovers(rows).measured.kind == "crosses"
    report = _lost_everywhere(0.1)
    report.entropy.temperatures[0].speedup_measured = 1.1  # one prompt, the model says loss
    text = headline(report)
    assert text.startswith("Speculation did not pay anywhere measured (1 points, speedup "
                           "1.10x; 1 measured a gain that its interval or the model does not "
                           "back)")


# --- end to end on tiny random models ---------------------------------------------------------


def tiny_args(target, draft, suite, out, **kw):
    base = dict(target=str(target), draft=str(draft) if draft else None, suite=str(suite),
                out=str(out),
                layer_sizes=[1, 2, 8], temperatures=[0.0, 1.0], batch_sizes=[1, 2],
                max_new_tokens=8, k=2, k_max=3, device="cpu")
    base.update(kw)
    return RegimesArgs(**base)


def test_regimes_end_to_end(tiny_dirs, suite, tmp_path):
    target, draft = tiny_dirs
    out = tmp_path / "out"
    report = regimes(tiny_args(target, draft, suite, out,
                               drafts_by_domain=[f"code={draft}"])).to_dict()
    for name in ("report.json", "report.md", "report.html", "regime_entropy.png",
                 "regime_draft_cost.png", "regime_mismatch.png", "regime_batch.png"):
        assert (out / name).is_file(), name
    text = (out / "report.json").read_text()
    assert json.loads(text) == json.loads(json.dumps(report))
    # read back, the typed report writes the same bytes
    assert json.dumps(RegimesReport.from_dict(json.loads(text)).to_dict(), indent=2) + "\n" == text
    md = (out / "report.md").read_text()
    # Short answer first, then each regime's figure before its tables.
    assert md.index("## Short answer") < md.index("![") < md.index("| curve |")
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 4

    ent = report["entropy"]
    assert [r["temperature"] for r in ent["temperatures"]] == [0.0, 1.0]
    assert len(ent["prompts"]) == 4 and all(p["target_entropy"] > 0 for p in ent["prompts"])
    for row in ent["temperatures"] + ent["prompts"]:
        # predicted = the speedup model on the same point's measured alpha_i, c, v
        assert row["speedup_predicted"] == pytest.approx(
            metrics.speedup(row["alpha_per_position"], row["c"], 2, row["v"]))
    assert set(ent["crossover"]["temperature"]) == {"measured", "predicted", "alpha"}

    cost = report["draft_cost"]
    layers = sorted(r["layers"] for r in cost["drafts"] if r["derived"])
    assert layers == [1, 2, 4]  # 8 >= the tiny target's 4 layers: the target itself
    whole = next(r for r in cost["drafts"] if r["layers"] == 4)
    assert whole["alpha"] == pytest.approx(1.0)  # the target drafting for itself (greedy)
    assert any(r["main"] and not r["derived"] for r in cost["drafts"])

    mis = report["mismatch"]
    assert mis["domains"] == ["code", "chat"] and len(mis["drafts"]) == 2
    assert mis["home"][mis["drafts"][1]] == "code"
    assert all(len(r) == 2 for r in mis["alpha"] + mis["speedup_measured"])
    assert mis["crossover"]["cells"] == 4

    batch = report["batch"]
    assert set(batch["domains"]) == {"code", "chat"}
    for rows in batch["domains"].values():
        assert [r["batch_size"] for r in rows] == [1, 2]
        assert all(0 <= r["policy_k"] <= 3 and r["speedup_policy"] > 0 for r in rows)
    # Tiny models spend their time in Python: speculation is a slowdown in every regime, and
    # each regime states its measured and predicted crossover.
    assert min(r["speedup_measured"] for r in ent["temperatures"]) < 1.0
    assert min(r["speedup_measured"] for r in cost["drafts"]) < 1.0
    assert mis["crossover"]["measured_slowdowns"] >= 1
    assert min(r["speedup_measured"] for rows in batch["domains"].values() for r in rows) < 1
    for key in ("entropy", "draft_cost", "mismatch", "batch"):
        assert report[key]["answer"] and "measured" in report[key]["answer"], key
    # intervals: over a point's prompts (none for one prompt), over a batch size's batches
    # (two prompts per domain here: batch size 1 has two batches, 2 one), stated in the report
    assert "paired bootstrap" in report["intervals"]
    for row in ent["temperatures"] + cost["drafts"] + list(ent["domains"].values()):
        assert row["speedup_low"] <= row["speedup_measured"] <= row["speedup_high"]
    assert all("speedup_low" not in p for p in ent["prompts"])
    assert len(mis["speedup_low"]) == 2 and all(x is not None for r in mis["speedup_low"]
                                                for x in r)
    for rows in batch["domains"].values():
        assert [r["batches"] for r in rows] == [2, 1] and rows[0]["speedup_low"] is not None
        assert "speedup_low" not in rows[1] and rows[1]["verdict"]
    assert "| speedup measured | 95% interval |" in md and "| none: 1 batch |" in md
    assert "Intervals (error bars): 95% paired bootstrap" in md


def test_default_draft_is_an_early_exit_and_matrix_covers_all_drafts(suite, tmp_path):
    from tests.helpers import tiny_pair

    target, _ = tiny_pair(tmp_path, target_layers=6)
    report = run_regimes(tiny_args(target, None, suite, tmp_path / "o", layer_sizes=[1],
                                   temperatures=[0.0], batch_sizes=[],
                                   prompts_per_domain=1))
    assert report.draft == "first 4 layers"
    assert [d.name for d in report.drafts] == ["first 1 layers", "first 4 layers"]
    assert report.mismatch.drafts == ["first 1 layers", "first 4 layers"]
    assert report.batch.domains == {} and "not measured" in report.batch.answer


def test_flags_and_errors(tiny_dirs, suite, tmp_path):
    from draftkit.cli import build_parser
    from draftkit.config import checked, from_namespace

    ns = build_parser().parse_args(["regimes", "--layer-sizes", "1", "2", "--temperatures",
                                    "0", "1.3", "--drafts-by-domain", "code=a", "math=b"])
    args = from_namespace(RegimesArgs, ns)
    assert args.layer_sizes == [1, 2] and args.temperatures == [0.0, 1.3]
    assert args.drafts_by_domain == ["code=a", "math=b"] and args.target == "embedded"
    with pytest.raises(ConfigError, match="DOMAIN=PATH"):
        RegimesArgs(drafts_by_domain=["code"]).validate()
    with pytest.raises(ConfigError, match="--k"):
        checked(RegimesArgs(k=0))
    target, draft = tiny_dirs
    with pytest.raises(DraftkitError, match="no domain 'math'"):
        run_regimes(tiny_args(target, draft, suite, tmp_path / "e",
                              drafts_by_domain=[f"math={draft}"]))

