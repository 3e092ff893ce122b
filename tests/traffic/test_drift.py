"""``draftkit traffic``: served figures from hand-counted records, the drift flag, bad input as
one line, and the report files. Records are built here and written as ``draftkit serve
--record`` seals them; the bundle is a manifest beside a tiny target."""

import json
from pathlib import Path

import pytest

from draftkit import metrics
from draftkit.cli import main
from draftkit.manifest import Manifest
from draftkit.traffic.drift import (DRIFT, NO_EVAL, NOTHING_DRAFTED, OK, OTHER_RULE, TOO_FEW,
                                    TrafficReport, domain_drift, predicted_speedup,
                                    traffic_drift)
from draftkit.traffic.record import SamplingEntry, TrafficRecord
from tests.helpers import write_manifest


def record(rounds, completion: int, domain="code", *, target="t0", tokenizer="k0",
           draft=None, temperature=0.0, n=0) -> TrafficRecord:
    return TrafficRecord(
        time=f"2026-01-01T00:{n // 60:02d}:{n % 60:02d}+00:00", domain=domain, target=target,
        tokenizer=tokenizer, draft=draft, prompt_ids=[5, 6, 7], completion_ids=[9] * completion,
        sampling=SamplingEntry(temperature=temperature, top_p=1.0, top_k=0, seed=n,
                               max_tokens=64),
        finish_reason="length", rounds=[list(r) for r in rounds])


def write_shard(folder: Path, records, n: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"traffic-20260101T000000Z-{n:05d}.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    return path


def manifest(**domains) -> Manifest:
    return Manifest.from_dict({"target": {}, "draft": {}, "files": {},
                               "num_speculative_tokens": 3, "domains": domains,
                               "report": {"temperature": 0.0}})


# Two requests counted by hand. A: [3, 3] tests positions 0-2 and passes them, [3, 1] tests
# 0-1 and passes 0, [3, 0] tests 0: tested [3, 2, 1], accepted [2, 1, 1]; its rounds keep
# 4 + 2 + 1 = 7 tokens, 8 with the prefill's. B: [2, 2] tests and passes 0-1, [0, 0] is a plain
# step, [2, 0] tests 0: tested [2, 1, 0], accepted [1, 1, 0]; 3 + 1 + 1 = 5 tokens, 6 in all.
A = record([[3, 3], [3, 1], [3, 0]], 8)
B = record([[2, 2], [0, 0], [2, 0]], 6, n=1)


def test_served_figures_equal_the_hand_counts():
    d = domain_drift([A, B], resamples=200)
    assert d.requests == 2 and d.completion_tokens == 14 and d.rounds == 6
    assert d.tested_per_position == [5, 3, 1]
    assert d.alpha_per_position == pytest.approx([3 / 5, 2 / 3, 1.0])
    assert d.alpha.value == pytest.approx(6 / 9)  # accepted / tested: truncation-corrected
    assert d.alpha_1.value == pytest.approx(3 / 5)
    assert d.tau.value == pytest.approx((7 + 5) / 6)  # the prefill's token left out
    assert d.rounds_by_k == {"0": 1, "2": 2, "3": 3}
    assert d.speedup_predicted is None and d.c is None  # no c, no prediction


def test_predicted_speedup_is_the_cost_model_over_the_rounds_served():
    alphas, c = [0.6, 2 / 3, 1.0], 0.1
    assert predicted_speedup(alphas, c, {3: 5}) == pytest.approx(metrics.speedup(alphas, c, 3))
    tokens = 3 * metrics.tau(alphas, 3) + 2 * metrics.tau(alphas, 2) + 1
    steps = 3 * (3 * c + 1) + 2 * (2 * c + 1) + 1
    assert predicted_speedup(alphas, c, {3: 3, 2: 2, 0: 1}) == pytest.approx(tokens / steps)
    d = domain_drift([A, B], c=c, c_source="domain", resamples=200)
    assert d.speedup_predicted.value == pytest.approx(tokens / steps)


def test_a_request_with_no_round_is_plain_decoding():
    d = domain_drift([record([], 1), record([[0, 0], [0, 0]], 3)], resamples=50)
    assert d.alpha is None and d.alpha_1 is None and d.alpha_per_position == []
    assert d.tau.value == pytest.approx(2 / 2)
    assert d.status == NOTHING_DRAFTED


def mixed(n: int, domain="code", **kw) -> list[TrafficRecord]:
    """n requests accepting about a third of what they test, unevenly (a non-zero interval)."""
    shapes = [([[4, 0], [4, 1]], 4), ([[4, 0], [4, 0], [4, 2]], 6), ([[4, 1]], 3)]
    return [record(*shapes[i % 3], domain=domain, n=i, **kw) for i in range(n)]


def test_every_interval_holds_its_estimate():
    d = domain_drift(mixed(30), c=0.2, c_source="domain", resamples=500)
    for e in (d.alpha, d.alpha_1, d.tau, d.speedup_predicted):
        assert e.low <= e.value <= e.high
    assert d.alpha.low < d.alpha.high  # the requests differ: the interval has a width


def test_the_flag_fires_only_beyond_noise_and_with_enough_requests():
    served = domain_drift(mixed(30), resamples=500).alpha.value
    m = manifest(code={"alpha": 0.9, "c": 0.2}, chat={"alpha": served, "c": 0.4},
                 math={"alpha": 0.9}, creative={"alpha": 0.5})
    records = mixed(30) + mixed(30, "chat") + mixed(5, "math") + mixed(30, "poems")
    report = traffic_drift(records, m, resamples=500)
    status = {name: d.status for name, d in report.domains.items()}
    # poems: no eval figure of its own, held to the mean of the eval's alphas
    assert status == {"code": DRIFT, "chat": OK, "math": TOO_FEW, "poems": DRIFT}
    assert report.flagged() == ["code", "poems"]
    assert "below the eval's 0.900" in report.domains["code"].why
    mean = (0.9 + served + 0.9 + 0.5) / 4
    assert f"below the bundle's mean eval alpha (none for this domain) {mean:.3f}" in \
        report.domains["poems"].why
    bare = manifest(code={"c": 0.2})  # an eval with no alpha at all: nothing to hold it to
    assert traffic_drift(mixed(30, "poems"), bare, resamples=200).domains["poems"].status == \
        NO_EVAL
    # c: the domain's own where the eval has one, else the mean over the bundle's domains
    assert report.domains["chat"].c == 0.4 and report.domains["chat"].c_source == "domain"
    assert report.domains["math"].c == pytest.approx(0.3)
    assert report.domains["math"].c_source == "bundle"
    assert any("no served request: creative" in n for n in report.notes)
    # the report reads back as written
    again = TrafficReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.to_dict() == report.to_dict()


def test_a_flag_compares_alphas_under_one_draft_rule():
    """Sampled traffic that vLLM drafted greedily is not held to an eval of sampled drafts
    (their alphas differ by the rule); under the eval's own rule it is."""
    def served(method):
        out = mixed(30, temperature=1.0)
        for r in out:
            r.sampling.draft_sample_method = method
        return out

    m = Manifest.from_dict({**manifest(code={"alpha": 0.9}).to_dict(),
                            "report": {"temperature": 1.0}})
    greedy = traffic_drift(served("greedy"), m, resamples=200).domains["code"]
    assert greedy.status == OTHER_RULE and greedy.draft_sample_methods == ["greedy"]
    assert "--draft-sample-method greedy" in greedy.why
    assert traffic_drift(served("probabilistic"), m, resamples=200).domains["code"].status == \
        DRIFT
    m.report.draft_sample_method = "greedy"  # an eval of vLLM's rule: compared, and flagged
    assert traffic_drift(served("greedy"), m, resamples=200).domains["code"].status == DRIFT
    unknown = traffic_drift(served(None), m, resamples=200).domains["code"]
    assert unknown.status == DRIFT and unknown.draft_sample_methods == ["unknown"]


def test_without_a_bundle_nothing_is_flagged_or_predicted(tmp_path, capsys):
    write_shard(tmp_path / "t", mixed(30))
    assert main(["traffic", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "no domain flagged (nothing to compare: no bundle)" in out
    assert "no predicted speedup" in out and "30" in out


# --- through the command, with a bundle ---------------------------------------------------------

def one_line_error(capsys, argv, *words) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("draftkit traffic: error: "), err
    for w in words:
        assert w in err, err
    return err


def test_the_table_and_the_report_files(bundle, tmp_path, capsys):
    path, ids = bundle
    write_shard(tmp_path / "t", mixed(30, **ids) + mixed(30, "chat", **ids))
    out = tmp_path / "report"
    assert main(["traffic", str(tmp_path / "t"), "--bundle", str(path), "--out", str(out)]) == 3
    said = capsys.readouterr()  # drift found is the answer "no": exit 3, after the report
    text = said.out
    assert "drift: code: served alpha" in text and "eval alpha" in text
    assert said.err.strip() == "draftkit traffic: no: drift in code: served alpha below the " \
        "eval's (the table above says by how much)"
    for name in ("report.json", "report.md", "report.html", "alpha_per_position.png"):
        assert (out / name).stat().st_size > 0
    report = TrafficReport.from_dict(json.loads((out / "report.json").read_text()))
    assert report.flagged() == ["code"] and report.domains["chat"].status == OK
    assert report.domains["code"].eval.alpha == 0.9
    assert report.domains["chat"].c == 0.2 and report.domains["chat"].c_source == "bundle"
    assert "alpha_per_position.png" in (out / "report.md").read_text()
    assert not list(out.glob(".*.tmp"))  # written atomically: no temporary left


def test_bad_input_is_one_line_and_exit_2(bundle, tmp_path, capsys):
    path, ids = bundle
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(capsys, ["traffic", str(empty)], "holds no recorded traffic")
    one_line_error(capsys, ["traffic", str(tmp_path / "nowhere")], "is not a folder")

    cut = tmp_path / "cut"
    shard = write_shard(cut, mixed(3, **ids))
    shard.write_text(shard.read_text()[:-20])  # a shard truncated mid-record
    one_line_error(capsys, ["traffic", str(cut)], f"{shard.name}:3")

    other_target = tmp_path / "other-target"
    write_shard(other_target, mixed(3, target="another", tokenizer=ids["tokenizer"]))
    one_line_error(capsys, ["traffic", str(other_target), "--bundle", str(path)],
                   "recorded with target another")
    other_tok = tmp_path / "other-tokenizer"
    write_shard(other_tok, mixed(3, target=ids["target"], tokenizer="another"))
    one_line_error(capsys, ["traffic", str(other_tok), "--bundle", str(path)],
                   "recorded with tokenizer another")

    good = tmp_path / "good"
    write_shard(good, mixed(3, **ids))
    one_line_error(capsys, ["traffic", str(good), "--domain", "math"],
                   "labelled 'math'", "its labels: code")
    one_line_error(capsys, ["traffic", str(good), "--min-requests", "0"], "--min-requests")

    one_line_error(capsys, ["traffic", str(good), "--bundle", str(tmp_path)],
                   "is not a bundle")
    lost = tmp_path / "lost-target"
    lost.mkdir()
    write_manifest(lost, target={"name": "gone", "path": str(tmp_path / "gone")})
    one_line_error(capsys, ["traffic", str(good), "--bundle", str(lost)], "cannot be found")
    edited = tmp_path / "edited"
    edited.mkdir()
    sealed = write_manifest(edited, target={"name": "tiny", "path": "x"})
    (edited / "draftkit.json").write_text(json.dumps({**sealed, "num_speculative_tokens": 5}))
    one_line_error(capsys, ["traffic", str(good), "--bundle", str(edited)], "edited after export")


def test_domain_filter_keeps_one_label(bundle, tmp_path, capsys):
    path, ids = bundle
    write_shard(tmp_path / "t", mixed(6, **ids) + mixed(6, "chat", **ids))
    assert main(["traffic", str(tmp_path / "t"), "--bundle", str(path), "--domain", "chat"]) == 0
    out = capsys.readouterr().out
    assert "chat" in out and "\ncode " not in out and "6 requests" in out
    assert TOO_FEW in out  # 6 of the default 20
