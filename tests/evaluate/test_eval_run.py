"""``draftkit eval`` end to end on tiny random models: the report's schema and its arithmetic."""

import dataclasses
import json
import subprocess
import sys

import pytest

from draftkit import metrics
from draftkit.evaluate.args import EvalArgs
from draftkit.evaluate.command import evaluate, run_eval
from draftkit.evaluate.measure import KMeasurement
from draftkit.evaluate.report import domain_table
from draftkit.figures import DomainFigures, EvalReport

# report.json's keys: the report's and each per-domain row's (and overall's)
DOMAIN_KEYS = ("n_prompts", "new_tokens", "alpha", "alpha_tv", "alpha_after", "alpha_per_position",
               "tau", "c", "v", "k", "plain_round_share", "rounds_by_k", "speedup_predicted",
               "speedup_measured", "speedup_low", "speedup_high", "prompts_to_decide",
               "plain_tokens_per_s", "spec_tokens_per_s", "target_entropy",
               "by_entropy", "overhead_per_round_ms", "verdict")
REPORT_KEYS = ("target", "draft", "device", "dtype", "temperature", "k", "created", "domains",
               "overall", "k_sweep", "batch_sweep", "break_even", "plain_step", "batch_sweep_k",
               "dtype_choice")


def tiny_args(target, draft, suite, out, **kw):
    base = dict(target=str(target), draft=str(draft), suite=str(suite), out=str(out), k=2,
                max_new_tokens=10, batch_sizes=[1, 2], k_sweep=[1, 2], k_max=3, repeats=2)
    base.update(kw)
    return EvalArgs(**base)


def test_report_schema_and_consistency(tiny_dirs, suite, tmp_path):
    target, draft = tiny_dirs
    report = evaluate(tiny_args(target, draft, suite, tmp_path / "out",
                                baseline_draft=str(target), k_sweep_prompts=1,
                                k_sweep_tokens=6)).to_dict()
    text = (tmp_path / "out" / "report.json").read_text()
    on_disk = json.loads(text)
    assert on_disk == json.loads(json.dumps(report))
    # read back, the typed report writes the same bytes
    assert json.dumps(EvalReport.from_dict(on_disk).to_dict(), indent=2) + "\n" == text
    assert list(report) == list(REPORT_KEYS)
    # --dtype auto says what it chose and why: a tiny model is not worth timing
    assert report["dtype_choice"] == "float32 (auto: the model fits in cache)"
    assert list(report["domains"]) == ["code", "chat"]
    # the baseline beside its floor: the whole loop's time per token, then the floor
    step = report["plain_step"]
    assert step["ms_per_token"] == pytest.approx(1000 / report["overall"]["plain_tokens_per_s"])
    # two timings of a sub-millisecond forward: their order is noise on a busy machine
    assert step["forward_ms"] > 0 and step["ms_per_token"] > 0 and step["read_gb_per_s"] > 0
    assert step["floor_ms"] == pytest.approx(1000 * step["weights_gb"] / step["read_gb_per_s"])
    # which path the forwards ran, and why: on a CPU, eager
    assert step["decode_path"].startswith("target eager, draft eager (target: the model is on cpu")
    for name, fig in [*report["domains"].items(), ("overall", report["overall"])]:
        # prompts_to_decide only where the interval includes 1.0 (a key added later is left
        # out while null, so older reports are written back as they were)
        keys = [k for k in DOMAIN_KEYS if k != "prompts_to_decide" or k in fig]
        assert list(fig) == [*keys, "alpha_before"], name
        assert fig["k"] == 2 and 0 <= fig["alpha"] <= 1
        # Tokens per target call predicted from the measured per-position alpha_i bound the
        # measured tau from above: tau counts only the tokens the 10-token budget kept.
        assert fig["tau"] <= metrics.tau(fig["alpha_per_position"], 2) + 1e-9, name
        assert fig["plain_round_share"] == 0 and list(fig["rounds_by_k"]) == ["2"]
        assert fig["speedup_predicted"] == pytest.approx(
            metrics.speedup(fig["alpha_per_position"], fig["c"], 2, fig["v"]))
        assert fig["speedup_measured"] == pytest.approx(
            fig["spec_tokens_per_s"] / fig["plain_tokens_per_s"])
        # two prompts: an interval around the measured speedup, and a verdict that follows it
        assert fig["speedup_low"] <= fig["speedup_measured"] <= fig["speedup_high"], name
        assert fig["verdict"].startswith("speculate" if fig["speedup_low"] > 1 else
                                         ("inconclusive", "do not speculate"))
        # The baseline here is the target itself: it agrees with the target everywhere.
        assert fig["alpha_before"] == pytest.approx(1.0)
        assert 0 <= fig["alpha_after"] <= 1
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
    # the sweep keeps c and v measured at each K it ran (v grows with K)
    assert all((r["c"] is not None and r["v"] is not None) == (r["k"] in measured_k)
               for r in report["k_sweep"])
    # what the sweep's points were measured on is kept, and said beside its plot
    assert {(r["prompts"], r["new_tokens"]) for r in report["k_sweep"]
            if r["k"] in measured_k} == {(1, 6)}
    assert "on the first 1 prompt(s) of each domain, up to 6 new tokens" in md
    # one prompt gives no interval: the sweep's table says so instead of a bare point
    for r in report["k_sweep"]:
        assert ("verdict" in r) == (r["k"] in measured_k) and "speedup_low" not in r
    assert md.count("| none: 1 prompt |") == 4
    assert [r["batch_size"] for r in report["batch_sweep"]] == [1, 2]
    for row in report["batch_sweep"]:
        assert {"batch_size", "alpha", "c", "v", "speedup_predicted",
                "speedup_measured", "batches", "verdict"} <= set(row)
    # batch size 2: the four prompts mixed make two batches, each a plain / speculative pair,
    # and the interval resamples them
    b2 = report["batch_sweep"][1]
    assert b2["batches"] == 2 and b2["speedup_low"] <= b2["speedup_measured"] <= \
        b2["speedup_high"]
    assert b2["verdict"].startswith("speculate" if b2["speedup_low"] > 1 else
                                    ("inconclusive", "do not speculate"))
    assert f"| 2 | 2 | {b2['alpha']:.3f} |" in md
    # one voice: the sweep's batch 1 is the table's overall row, interval and all
    b1, overall = report["batch_sweep"][0], report["overall"]
    assert {key: b1[key] for key in ("speedup_measured", "speedup_low", "speedup_high", "alpha",
                                     "c", "k", "verdict")} == \
        {key: overall[key] for key in ("speedup_measured", "speedup_low", "speedup_high",
                                       "alpha", "c", "k", "verdict")}
    assert b1["batches"] == overall["n_prompts"]
    assert set(report["break_even"]) == {"kind", "x", "batch_size", "per_domain"}
    assert set(report["break_even"]["per_domain"]) == {"code", "chat"}
    assert all(set(b) == {"kind", "x", "batch_size"}
               for b in report["break_even"]["per_domain"].values())
    for name in ("report.md", "report.html", "speedup_vs_k.png", "speedup_vs_batch.png",
                 "alpha_per_position.png", "alpha_per_domain.png", "acceptance_by_entropy.png"):
        assert (tmp_path / "out" / name).is_file(), name


def test_greedy_identity_draft_accepts_everything(tiny_dirs, suite, tmp_path):
    target, _ = tiny_dirs
    report = run_eval(tiny_args(target, target, suite, tmp_path / "o", batch_sizes=[],
                                k_sweep=[], repeats=1))
    assert report.overall.alpha == pytest.approx(1.0)
    by_entropy = report.overall.by_entropy
    assert by_entropy.acceptance["draft"] == [1.0 if n else None for n in by_entropy.positions]
    assert report.batch_sweep == [] and report.break_even.batch_size is None


@pytest.mark.slow  # starts draftkit in another Python
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
    assert proc.returncode == 2
    assert proc.stderr == "draftkit eval: error: --k expects an integer >= 0 or 'auto', got '-1'\n"


def test_verdicts_say_why():
    from draftkit.evaluate.analysis import verdict

    def fig(**figures) -> DomainFigures:  # the figures a verdict reads; the rest not measured
        base = {"alpha_per_position": [], "overhead_per_round_ms": 3.0, "v": 1.1}
        return DomainFigures.from_dict(dict(base, **figures))

    fast = fig(speedup_measured=1.4, speedup_low=1.2, speedup_high=1.6, alpha=0.7, c=0.2, k=3)
    assert verdict(fast, 8) == "speculate with K=3 (measured 1.40x, 95% interval 1.20-1.60x)"
    # one prompt gives no interval: a point, which decides nothing, and the verdict says so
    point = fig(speedup_measured=1.4, alpha=0.7, c=0.2, k=3)
    assert verdict(point, 8).startswith("inconclusive: measured 1.40x on one prompt, which "
                                        "gives no interval (predicted ")
    low = fig(speedup_measured=0.8, alpha=0.1, c=0.2, k=3)
    assert verdict(low, 8).startswith("do not speculate: alpha 0.10 is below the break-even")
    slow = fig(speedup_measured=0.8, alpha=0.5, c=0.9, k=1)
    assert verdict(slow, 8).endswith("(the draft is too slow)")
    overhead = fig(speedup_measured=0.9, speedup_low=0.85, speedup_high=0.95, alpha=0.8, c=0.1,
                   k=3)
    assert "per-round overhead 3.0 ms" in verdict(overhead, 8)
    never = fig(speedup_measured=1.0, alpha=0.0, c=None, k=0, v=None)
    assert "never ran" in verdict(never, 8)
    # the interval decides: above 1.0 speculate, across 1.0 inconclusive with the prompts needed
    sure = fig(speedup_measured=1.2, speedup_low=1.05, speedup_high=1.3, alpha=0.7, c=0.2, k=3)
    assert verdict(sure, 8) == "speculate with K=3 (measured 1.20x, 95% interval 1.05-1.30x)"
    unsure = fig(speedup_measured=1.06, speedup_low=0.97, speedup_high=1.15,
                 prompts_to_decide=27, alpha=0.7, c=0.2, k=3)
    assert verdict(unsure, 8).startswith("inconclusive: measured 1.06x, 95% interval 0.97-1.15x "
                                         "includes 1.0 (predicted ")
    assert verdict(unsure, 8).endswith("; about 27 prompts would decide")
    hopeless = fig(speedup_measured=1.02, speedup_low=0.9, speedup_high=1.1, alpha=0.1, c=0.2,
                   k=3)  # across 1.0, but no K pays at this alpha: the model's reason stands
    assert verdict(hopeless, 8).startswith("do not speculate: alpha 0.10 is below")
    costly = fig(speedup_measured=0.5, alpha=0.8, c=2.0, k=1)
    assert verdict(costly, 8).endswith("no acceptance rate pays")  # not "break-even inf"
    # a parallel head's c is a round's: at K = 5, 5 x 0.2 loses, one 0.2 a round pays
    serial = fig(speedup_measured=1.1, speedup_low=0.9, speedup_high=1.3, alpha=0.3, c=0.2,
                 k=5)
    assert verdict(serial, 8, at_k=True).startswith("do not speculate")
    parallel = dataclasses.replace(serial, draft_per_round=True)
    assert verdict(parallel, 8, at_k=True).startswith("inconclusive")


def test_a_baseline_draft_of_another_vocabulary_is_refused(tiny_dirs, suite, tmp_path):
    from draftkit.errors import ModelError
    from tests.helpers import make_llama, make_tokenizer, save_model

    target, draft = tiny_dirs
    other = make_tokenizer(extra_words=("zebra",))
    mismatched = save_model(make_llama(len(other), num_layers=1), other, tmp_path / "mm")
    with pytest.raises(ModelError, match="vocab"):
        run_eval(tiny_args(target, draft, suite, tmp_path / "o", baseline_draft=str(mismatched)))


def test_k_used_names_the_speculative_k_of_an_auto_run():
    from draftkit.decode.stats import DecodeStats

    stats = DecodeStats()
    stats.target_calls_by_tokens = {1: 50, 3: 20, 4: 5}  # plain steps outnumber any one K
    assert stats.k_used() == 2
    stats.target_calls_by_tokens = {1: 50}
    assert stats.k_used() == 0


def test_prediction_covers_the_mix_of_k_an_auto_run_had():
    """6 plain rounds and 4 at K = 2: the prediction weighs both (expected tokens over
    expected target steps), as the measured speedup does, instead of assuming K = 2 throughout.
    """
    from draftkit.decode.stats import DecodeStats, RoundStats
    from draftkit.evaluate.measure import DomainRun, EvalSettings
    from draftkit.evaluate.analysis import domain_figures

    def plain_round():
        return RoundStats(k=0, rows=1, accepted_per_position=[], tested_per_position=[],
                          beta_sum=0.0, rejections=0, bonus=0, tokens=1, seconds_verify=1.0)

    spec, plain = DecodeStats(), DecodeStats()
    for _ in range(6):
        spec.add_round(plain_round())
        plain.add_round(plain_round())
    for accepted in ([1, 1], [1, 0], [0, 0], [1, 1]):  # alpha_1 = 3/4, alpha_2 = 2/3
        tested = [1, accepted[0]]
        spec.add_round(RoundStats(k=2, rows=1, accepted_per_position=accepted,
                                  tested_per_position=tested, beta_sum=0.0,
                                  rejections=int(sum(accepted) < 2), bonus=int(sum(accepted) == 2),
                                  tokens=sum(accepted) + 1, seconds_draft=0.2, seconds_verify=1.2))
    run = DomainRun([1.0], [1.0], 10, 10, spec, plain, [])
    fig = domain_figures(run, 1, EvalSettings(k="auto"))
    assert fig.k == 2 and fig.c == pytest.approx(0.1) and fig.v == pytest.approx(1.2)
    assert fig.plain_round_share == pytest.approx(0.6)
    assert fig.rounds_by_k == {"0": 6, "2": 4}
    tau2 = metrics.tau([0.75, 2 / 3], 2)
    assert fig.speedup_predicted == pytest.approx((6 + 4 * tau2) / (6 + 4 * (2 * 0.1 + 1.2)))


# --- like for like, and nothing invented ---------------------------------------------------------


def test_alpha_before_compares_with_the_drafts_teacher_forced_alpha(tiny_dirs, tmp_path):
    """--baseline-draft = --draft: before and after must be equal. The decode-time alpha is
    another estimator (tested positions only), so it is not what alpha_before is set against."""
    target, draft = tiny_dirs
    suite = tmp_path / "s.jsonl"
    suite.write_text('{"domain": "chat", "prompt": "what is the answer"}\n'
                     '{"domain": "chat", "prompt": "hello world"}\n')
    report = evaluate(tiny_args(target, draft, suite, tmp_path / "o", k=3, max_new_tokens=24,
                                batch_sizes=[], k_sweep=[], repeats=1,
                                baseline_draft=str(draft)))
    for fig in (report.domains["chat"], report.overall):
        assert fig.alpha_before == pytest.approx(fig.alpha_after, abs=1e-9)
    header, rows = domain_table(report)
    i, j = header.index("alpha before"), header.index("alpha after")
    assert all(r[i] == r[j] for r in rows)


def test_a_run_that_never_drafted_has_no_alpha(tiny_dirs, suite, tmp_path):
    """--k 0: no token was drafted, so alpha is unknown, not 0; every consumer copes."""
    target, draft = tiny_dirs
    report = evaluate(tiny_args(target, draft, suite, tmp_path / "o", k=0, batch_sizes=[1],
                                k_sweep=[1], repeats=1))
    for fig in [*report.domains.values(), report.overall]:
        assert fig.alpha is None and fig.alpha_tv is None and fig.k == 0
        assert fig.verdict.startswith("do not speculate")
    assert all(r.speedup_predicted is None for r in report.k_sweep)
    assert all(r.tau is None for r in report.k_sweep)  # nothing to predict it from
    assert all((r.tau_measured is None) == (r.speedup_measured is None)
               for r in report.k_sweep)
    assert report.break_even.per_domain["code"].kind == "empty"
    header, rows = domain_table(report)
    assert {r[header.index("alpha")] for r in rows} == {"-"}
    assert (tmp_path / "o" / "alpha_per_domain.png").is_file()


def test_untimed_warm_up_then_alternating_order(tiny_dirs):
    """One-time costs (CUDA context, kernel set-up, allocator growth) land in untimed decodes
    of both modes, and the order of the timed pair alternates across calls too (regimes times
    one prompt per call)."""
    from draftkit.evaluate.measure import WARMUP_TOKENS, EvalSettings, Evaluator
    from draftkit.models import load_pair

    target, draft = tiny_dirs
    pair = load_pair(str(target), str(draft), device="cpu", dtype="float32")
    ev = Evaluator(pair.target, pair.draft, EvalSettings(k=2, max_new_tokens=12, repeats=1,
                                                         batch_sizes=[2]))
    calls, generate = [], ev.engine.generate

    def record(prompts, k, max_new_tokens, **kw):
        calls.append((len(prompts), k.fixed, max_new_tokens))
        return generate(prompts, k=k, max_new_tokens=max_new_tokens, **kw)

    ev.engine.generate = record
    ev.run_domain([[5, 6, 7]])
    ev.run_domain([[8, 9]])
    warm = [(1, 0, WARMUP_TOKENS), (1, 2, WARMUP_TOKENS)]
    assert calls == warm + [(1, 0, 12), (1, 2, 12), (1, 2, 12), (1, 0, 12)]
    calls.clear()
    ev.batch_sweep([[5, 6, 7]], 2, [2])  # warmed up again at each batch size, then timed
    # with the table's tokens (--batch-tokens unset)
    assert calls == [(2, 0, WARMUP_TOKENS), (2, 2, WARMUP_TOKENS), (2, 0, 12), (2, 2, 12)]


def test_predictions_use_v_measured_at_each_k():
    """v(K) grows with K. The run at K=3 measured v=1.6, the sweep v=1.05 at K=1 and 1.3 at
    K=2: S(1) is priced with 1.05, not 1.6 (1.39x, not 0.94x), and so is the verdict's K."""
    import dataclasses

    from draftkit.evaluate.analysis import k_sweep_rows, v_of_k, verdict

    fig = DomainFigures.from_dict({"alpha_per_position": [0.6] * 3, "alpha": 0.6, "c": 0.1,
                                   "v": 1.6, "k": 3, "speedup_measured": 0.9,
                                   "overhead_per_round_ms": 3.0})
    at = dict(prompts=2, new_tokens=48)
    measured = [KMeasurement(k=1, tau=1.6, speedup_measured=1.25, c=0.1, v=1.05, **at),
                KMeasurement(k=2, tau=1.9, speedup_measured=1.2, c=0.1, v=1.3, **at)]
    rows = k_sweep_rows("code", fig, measured, 4)
    assert [r.speedup_predicted for r in rows] == pytest.approx(
        [metrics.speedup(0.6, 0.1, k, v) for k, v in ((1, 1.05), (2, 1.3), (3, 1.6), (4, 1.6))])
    assert [(r.c, r.v) for r in rows] == [(0.1, 1.05), (0.1, 1.3), (None, None), (None, None)]
    # tau: predicted at every K from alpha_i, measured only where the sweep ran
    assert [r.tau for r in rows] == pytest.approx([metrics.tau([0.6] * 3, k)
                                                   for k in range(1, 5)])
    assert [r.tau_measured for r in rows] == [1.6, 1.9, None, None]
    assert [r.prompts for r in rows] == [2, 2, None, None]
    # between measured K the line; the run's own v at its K wins over a sweep's row there
    v = v_of_k(dataclasses.replace(fig, k=4, v=2.0),
               measured + [KMeasurement(k=4, tau=1.0, speedup_measured=None, c=None, v=9.0,
                                        **at)])
    assert v(3) == pytest.approx(1.65) and v(4) == 2.0
    # with the run's v at every K it would say K=4 at 1.15x
    assert "predicted 1.39x at K=1" in verdict(fig, 8, v_of_k(fig, measured))


def test_k_auto_keeps_one_policy_per_domain(tiny_dirs):
    """--k auto: the timed decodes of a domain share one K policy (what a server's scheduler
    does across requests), so each prompt does not pay the policy's start-up rounds again; a
    new domain starts a new one."""
    from draftkit.evaluate.measure import EvalSettings, Evaluator
    from draftkit.models import load_pair

    target, draft = tiny_dirs
    pair = load_pair(str(target), str(draft), device="cpu", dtype="float32")
    ev = Evaluator(pair.target, pair.draft, EvalSettings(k="auto", max_new_tokens=10, repeats=2))
    policies, generate = [], ev.engine.generate

    def record(prompts, k, max_new_tokens, **kw):
        if k.label == "auto" and max_new_tokens == 10:  # the timed decodes, not the warm-up
            policies.append(k.policy)
        return generate(prompts, k=k, max_new_tokens=max_new_tokens, **kw)

    ev.engine.generate = record
    ev.run_domain([[5, 6, 7], [8, 9]])
    assert len(policies) == 4 and policies[0] is not None
    assert all(p is policies[0] for p in policies)
    assert policies[0].rounds > 4  # it saw every decode's rounds
    ev.run_domain([[5, 6, 7]])
    assert policies[-1] is not policies[0]


@pytest.mark.slow  # starts draftkit in another Python
def test_k_sweep_size_below_1_is_one_line(tiny_dirs):
    _, draft = tiny_dirs
    proc = subprocess.run([sys.executable, "-m", "draftkit", "eval", "--draft", str(draft),
                           "--k-sweep-prompts", "0"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--k-sweep-prompts must be >= 1" in proc.stderr


def test_the_batch_sweep_measures_batch_1_again_only_when_the_table_did_not():
    from draftkit.evaluate.run import swept_sizes
    from draftkit.evaluate.settings import EvalSettings

    assert swept_sizes(EvalSettings(k="auto", batch_sizes=[1, 2, 4])) == [2, 4]
    assert swept_sizes(EvalSettings(k=3, batch_sizes=[1, 2], max_new_tokens=64,
                                    batch_tokens=64)) == [2]
    # other tokens, or a plain table (--k 0: the sweep speculates at K 1): measured again
    assert swept_sizes(EvalSettings(k=3, batch_sizes=[1, 2], batch_tokens=32)) == [1, 2]
    assert swept_sizes(EvalSettings(k=0, batch_sizes=[1, 2])) == [1, 2]


def test_the_sweeps_pair_their_measurements_and_give_intervals(tiny_dirs):
    """The K sweep decodes each prompt plainly and at every K, back to back in a rotating
    order; the batch sweep decodes batches of distinct prompts, each plainly and with
    speculation: each speedup is pooled over its units with an interval over them."""
    from draftkit.evaluate.measure import EvalSettings, Evaluator, batches
    from draftkit.models import load_pair

    prompts = [[5, 6, 7], [8, 9], [10, 11, 12], [13, 14], [15, 16, 17]]
    assert batches(prompts, 2, 4) == [prompts[0:2], prompts[2:4]]  # no prompt twice
    assert batches(prompts, 2, 1) == [prompts[0:2]]
    assert batches(prompts[:1], 2, 4) == [prompts[:1] * 2]  # fewer prompts than the batch
    target, draft = tiny_dirs
    pair = load_pair(str(target), str(draft), device="cpu", dtype="float32")
    ev = Evaluator(pair.target, pair.draft, EvalSettings(
        k=2, max_new_tokens=6, k_sweep=[1, 2], k_sweep_prompts=3, k_sweep_tokens=6,
        batch_groups=2))
    calls, generate = [], ev.engine.generate

    def record(prompts, k, max_new_tokens, **kw):
        calls.append((tuple(map(tuple, prompts)), k.fixed))
        return generate(prompts, k=k, max_new_tokens=max_new_tokens, **kw)

    ev.engine.generate = record
    rows = ev.k_sweep(prompts)
    # every prompt at K = 0, 1 and 2 before the next prompt, the first mode rotating
    per_prompt = [[k for p, k in calls if p == (tuple(ids),)] for ids in prompts[:3]]
    assert all(sorted(ks) == [0, 1, 2] for ks in per_prompt)
    assert len({ks[0] for ks in per_prompt}) == 3
    assert [c[0] for c in calls] == [(tuple(ids),) for ids in prompts[:3] for _ in range(3)]
    for r in rows:
        assert r.prompts == 3 and r.speedup_low <= r.speedup_measured <= r.speedup_high
    calls.clear()
    (row,) = ev.batch_sweep(prompts, 2, [2])
    timed = [c for c in calls if c[0] in {tuple(map(tuple, b)) for b in batches(prompts, 2, 2)}]
    assert len(timed) == 2 * 2 + 2  # two batches, each plainly and at K 2; the first warmed
    assert row.batches == 2 and row.speedup_low <= row.speedup_measured <= row.speedup_high


def test_a_sweep_rows_verdict_is_the_tables_rule_at_its_k():
    from draftkit.figures import BatchRow, KSweepRow
    from draftkit.evaluate.analysis import sweep_verdict

    fig = DomainFigures.from_dict({"alpha_per_position": [0.8, 0.7], "alpha": 0.75, "c": 0.1,
                                   "v": 1.1, "k": 2, "speedup_measured": 1.3,
                                   "overhead_per_round_ms": 3.0})

    def k_row(**measured):
        return KSweepRow.from_dict(dict({"domain": "code", "k": 1, "c": 0.1, "v": 1.05,
                                         "prompts": 4}, **measured))

    sure = k_row(speedup_measured=1.3, speedup_low=1.1, speedup_high=1.5)
    assert sweep_verdict(sure, 4, fig) == ("speculate with K=1 (measured 1.30x, 95% interval "
                                           "1.10-1.50x)")
    unsure = k_row(speedup_measured=1.05, speedup_low=0.95, speedup_high=1.15,
                   prompts_to_decide=16)
    # predicted at the row's own K (1), not at the best K
    s1 = metrics.speedup([0.8, 0.7], 0.1, 1, 1.05)
    assert sweep_verdict(unsure, 4, fig) == (
        f"inconclusive: measured 1.05x, 95% interval 0.95-1.15x includes 1.0 (predicted "
        f"{s1:.2f}x at K=1); about 16 prompts would decide")
    assert sweep_verdict(k_row(speedup_measured=None), 4, fig) is None
    # a batch of B prompts measured once: no interval, said in the batch's own unit
    batch = BatchRow.from_dict({"batch_size": 8, "alpha": 0.75, "c": 0.1, "v": 1.3, "k": 2,
                                "speedup_measured": 1.2, "batches": 1})
    assert sweep_verdict(batch, 4).startswith("inconclusive: measured 1.20x on one batch of 8 "
                                              "prompts, which gives no interval")
    batch.speedup_low, batch.speedup_high = 0.85, 0.95  # a loss the model does not explain
    assert sweep_verdict(batch, 4).endswith("; per-round overhead eats the gain")


def test_a_parallel_heads_report_prices_its_draft_once_a_round(suite, tmp_path):
    """eval of a parallel EAGLE-3 head says its c is a round's, and its figures use it so."""
    from tests.helpers import parallel_head

    _, target_dir, head_dir = parallel_head(tmp_path)
    report = evaluate(tiny_args(target_dir, head_dir, suite, tmp_path / "out", k=3,
                                batch_sizes=[1], k_sweep=[], repeats=1))
    for fig in (*report.domains.values(), report.overall):
        assert fig.draft_per_round is True
    for row in report.k_sweep:  # predicted at every K for one draft forward a round: c, not K c
        fig = report.domains[row.domain]
        assert row.speedup_predicted == pytest.approx(row.tau / (fig.c + fig.v))
    (row,) = report.batch_sweep
    assert row.draft_per_round is True
    on_disk = json.loads((tmp_path / "out" / "report.json").read_text())
    assert on_disk["overall"]["draft_per_round"] is True


def test_sampled_evals_say_what_greedy_drafts_would_keep(tiny_dirs, tmp_path):
    """At temperature > 0 with sampled drafts the report adds the draft's teacher-forced
    acceptance with greedy drafts (vLLM's default rule) beside alpha after; an eval run with
    --draft-sample-method greedy measures that rule itself and says so, as one with --verify
    block says which verification it measured."""
    target, draft = tiny_dirs
    suite = tmp_path / "s.jsonl"
    suite.write_text('{"domain": "chat", "prompt": "what is the answer"}\n'
                     '{"domain": "chat", "prompt": "hello world"}\n')
    common = dict(k=2, max_new_tokens=16, batch_sizes=[], k_sweep=[], repeats=1,
                  temperature=1.0)
    sampled = evaluate(tiny_args(target, draft, suite, tmp_path / "a", **common))
    fig = sampled.domains["chat"]
    assert sampled.draft_sample_method == "probabilistic" and sampled.verify == "token"
    assert 0 <= fig.alpha_greedy_drafts <= 1 and fig.alpha_greedy_drafts != fig.alpha_after
    assert sampled.overall.alpha_greedy_drafts is not None
    header, _ = domain_table(sampled)
    assert "alpha, greedy drafts" in header and "alpha after" in header
    greedy = evaluate(tiny_args(target, draft, suite, tmp_path / "b", **common,
                                draft_sample_method="greedy", verify="block"))
    assert greedy.draft_sample_method == "greedy" and greedy.verify == "block"
    assert greedy.domains["chat"].alpha_greedy_drafts is None  # it is the rule measured
    assert "greedy drafts, block verification" in (tmp_path / "b" / "report.md").read_text()
