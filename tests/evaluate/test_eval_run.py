"""``draftkit eval`` end to end on tiny random models: the report's schema and its arithmetic."""

import json
import subprocess
import sys

import pytest

from draftkit import metrics
from draftkit.evaluate.command import EvalArgs, evaluate, run_eval
from draftkit.evaluate.report import DOMAIN_KEYS, REPORT_KEYS


def tiny_args(target, draft, suite, out, **kw):
    base = dict(target=str(target), draft=str(draft), suite=str(suite), out=str(out), k="2",
                max_new_tokens=10, batch_sizes=[1, 2], k_sweep=[1, 2], k_max=3, repeats=2)
    base.update(kw)
    return EvalArgs(**base)


def test_report_schema_and_consistency(tiny_dirs, suite, tmp_path):
    target, draft = tiny_dirs
    report = evaluate(tiny_args(target, draft, suite, tmp_path / "out",
                                baseline_draft=str(target)))
    on_disk = json.loads((tmp_path / "out" / "report.json").read_text())
    assert on_disk == json.loads(json.dumps(report))
    assert set(REPORT_KEYS) <= set(report)
    assert list(report["domains"]) == ["code", "chat"]
    for name, fig in [*report["domains"].items(), ("overall", report["overall"])]:
        assert set(DOMAIN_KEYS) <= set(fig), name
        assert fig["k"] == 2 and 0 <= fig["alpha"] <= 1
        # Tokens per target call predicted from the measured per-position alpha_i bound the
        # measured tau from above: tau counts only the tokens the 10-token budget kept.
        assert fig["tau"] <= metrics.tau(fig["alpha_per_position"], 2) + 1e-9, name
        assert fig["plain_round_share"] == 0 and list(fig["rounds_by_k"]) == ["2"]
        assert fig["speedup_predicted"] == pytest.approx(
            metrics.speedup(fig["alpha_per_position"], fig["c"], 2, fig["v"]))
        assert fig["speedup_measured"] == pytest.approx(
            fig["spec_tokens_per_s"] / fig["plain_tokens_per_s"])
        assert fig["verdict"].startswith("speculate" if fig["speedup_measured"] > 1
                                         else "do not speculate")
        # The baseline here is the target itself: it agrees with the target everywhere.
        assert fig["alpha_before"] == pytest.approx(1.0)
        assert fig["target_entropy"] > 0
        # by entropy: every decoded token falls in one bucket, and the buckets' position-
        # weighted mean is the domain's teacher-forced figure (here the baseline's 1.0)
        b = fig["by_entropy"]
        assert sum(b["positions"]) == fig["new_tokens"]
        assert [a for a in b["alpha_before"] if a is not None] == \
            pytest.approx([1.0] * sum(1 for n in b["positions"] if n))
        assert all(a is None or 0 <= a <= 1 for a in b["draft"])
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Acceptance by the target's entropy" in md and "| chat (before) |" in md
    assert {r["k"] for r in report["k_sweep"]} == {1, 2, 3}
    measured_k = {r["k"] for r in report["k_sweep"] if r["speedup_measured"] is not None}
    assert measured_k == {1, 2}
    assert [r["batch_size"] for r in report["batch_sweep"]] == [1, 2]
    for row in report["batch_sweep"]:
        assert {"batch_size", "alpha", "c", "v", "speedup_predicted",
                "speedup_measured"} <= set(row)
    assert set(report["break_even"]) == {"batch_size", "per_domain"}
    assert set(report["break_even"]["per_domain"]) == {"code", "chat"}
    for name in ("report.md", "report.html", "speedup_vs_k.png", "speedup_vs_batch.png",
                 "alpha_per_position.png", "alpha_per_domain.png", "acceptance_by_entropy.png"):
        assert (tmp_path / "out" / name).is_file(), name


def test_greedy_identity_draft_accepts_everything(tiny_dirs, suite, tmp_path):
    target, _ = tiny_dirs
    report = run_eval(tiny_args(target, target, suite, tmp_path / "o", batch_sizes=[],
                                k_sweep=[], repeats=1))
    assert report["overall"]["alpha"] == pytest.approx(1.0)
    by_entropy = report["overall"]["by_entropy"]
    assert by_entropy["draft"] == [1.0 if n else None for n in by_entropy["positions"]]
    assert report["batch_sweep"] == [] and report["break_even"]["batch_size"] is None


def test_bad_suite_and_flags_are_one_line(tiny_dirs, tmp_path):
    target, draft = tiny_dirs
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"domain": "code", "prompt": "ok"}\n{"prompt": "no domain"}\n')
    proc = subprocess.run([sys.executable, "-m", "draftkit", "eval", "--target", str(target),
                           "--draft", str(draft), "--suite", str(bad), "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{bad}:2" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "draftkit", "eval", "--draft", str(draft),
                           "--k", "-1"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--k must be >= 0" in proc.stderr


def test_verdicts_say_why():
    from draftkit.evaluate.runner import verdict

    base = {"alpha_per_position": [], "overhead_per_round_ms": 3.0, "v": 1.1}
    fast = dict(base, speedup_measured=1.4, alpha=0.7, c=0.2, k=3)
    assert verdict(fast, 8) == "speculate with K=3 (measured 1.40x)"
    low = dict(base, speedup_measured=0.8, alpha=0.1, c=0.2, k=3)
    assert verdict(low, 8).startswith("do not speculate: alpha 0.10 is below the break-even")
    slow = dict(base, speedup_measured=0.8, alpha=0.5, c=0.9, k=1)
    assert verdict(slow, 8).endswith("(the draft is too slow)")
    overhead = dict(base, speedup_measured=0.9, alpha=0.8, c=0.1, k=3)
    assert "per-round overhead 3.0 ms" in verdict(overhead, 8)
    never = dict(base, speedup_measured=1.0, alpha=0.0, c=None, k=0, v=None)
    assert "never ran" in verdict(never, 8)
    costly = dict(base, speedup_measured=0.5, alpha=0.8, c=2.0, k=1)
    assert verdict(costly, 8).endswith("no acceptance rate pays")  # not "break-even inf"


def test_a_baseline_draft_of_another_vocabulary_is_refused(tiny_dirs, suite, tmp_path):
    from draftkit.errors import ModelError
    from tests.tiny import make_llama, make_tokenizer, save_model

    target, draft = tiny_dirs
    other = make_tokenizer(extra_words=("zebra",))
    mismatched = save_model(make_llama(len(other), num_layers=1), other, tmp_path / "mm")
    with pytest.raises(ModelError, match="vocab"):
        run_eval(tiny_args(target, draft, suite, tmp_path / "o", baseline_draft=str(mismatched)))


def test_k_used_names_the_speculative_k_of_an_auto_run():
    from draftkit.decode.stats import DecodeStats
    from draftkit.evaluate.runner import k_used

    stats = DecodeStats()
    stats.target_calls_by_tokens = {1: 50, 3: 20, 4: 5}  # plain steps outnumber any one K
    assert k_used(stats) == 2
    stats.target_calls_by_tokens = {1: 50}
    assert k_used(stats) == 0


def test_prediction_covers_the_mix_of_k_an_auto_run_had():
    """6 plain rounds and 4 at K = 2: the prediction weighs both (expected tokens over
    expected target steps), as the measured speedup does, instead of assuming K = 2 throughout.
    """
    from draftkit.decode.stats import DecodeStats, RoundStats
    from draftkit.evaluate.runner import DomainRun, EvalSettings, domain_figures

    def plain_round():
        return RoundStats(0, 1, [], [], 0.0, 0, 0, 1, 0.0, 1.0, 0.0)

    spec, plain = DecodeStats(), DecodeStats()
    for _ in range(6):
        spec.add_round(plain_round())
        plain.add_round(plain_round())
    for accepted in ([1, 1], [1, 0], [0, 0], [1, 1]):  # alpha_1 = 3/4, alpha_2 = 2/3
        tested = [1, accepted[0]]
        spec.add_round(RoundStats(2, 1, accepted, tested, 0.0, int(sum(accepted) < 2),
                                  int(sum(accepted) == 2), sum(accepted) + 1, 0.2, 1.2, 0.0))
    run = DomainRun([1.0], [1.0], 10, 10, spec, plain, [])
    fig = domain_figures(run, 1, EvalSettings(k="auto"))
    assert fig["k"] == 2 and fig["c"] == pytest.approx(0.1) and fig["v"] == pytest.approx(1.2)
    assert fig["plain_round_share"] == pytest.approx(0.6)
    assert fig["rounds_by_k"] == {"0": 6, "2": 4}
    tau2 = metrics.tau([0.75, 2 / 3], 2)
    assert fig["speedup_predicted"] == pytest.approx((6 + 4 * tau2) / (6 + 4 * (2 * 0.1 + 1.2)))
