"""``draftkit refresh`` on the tiny pair: a trained EAGLE-3 head's bundle, traffic decoded by its
target, a warm-started head measured against the old one; the export rule; bad inputs."""

import json
import shutil
from pathlib import Path

import pytest

from draftkit.cli import main
from draftkit.errors import Declined, DraftkitError
from draftkit.traffic.compare import MIX, DomainComparison, Speedup, decide
from draftkit.traffic.record import SamplingEntry, TrafficRecord
from draftkit.traffic.args import RefreshArgs
from draftkit.traffic.refresh import refresh, split
from tests.helpers import distill_config

EAGLE3 = {"kind": "eagle3", "draft_vocab_size": 40, "ttt_steps": 3}


def _row(domain, old_plain, new_old, requests=8):
    def s(x):
        return Speedup(estimate=x[0], low=x[1], high=x[2])
    return DomainComparison(domain=domain, requests=requests, alpha_1={"old": 0.3, "new": 0.4},
                            tau={"old": 1.3, "new": 1.4},
                            over_plain={"old": s(old_plain), "new": s(old_plain)},
                            new_over_old=s(new_old),
                            # the wall clock's, reported but not deciding: a loss here changes
                            # nothing
                            measured_over_plain={"old": s(old_plain), "new": s(old_plain)},
                            measured_new_over_old=s((0.5, 0.4, 0.6)))


def test_the_export_rule_wants_a_win_on_the_mix_and_no_loss_where_the_old_draft_paid():
    paid, flat = (1.3, 1.1, 1.5), (0.95, 0.8, 1.1)
    win, tie, loss = (1.2, 1.05, 1.4), (1.0, 0.9, 1.1), (0.8, 0.7, 0.9)
    assert decide([_row("chat", flat, win), _row(MIX, flat, win)])[0]
    ok, why = decide([_row("chat", flat, win), _row("code", paid, loss), _row(MIX, flat, win)])
    assert not ok and "slower than the old beyond noise on code" in why
    # a loss where the old draft did not pay is no reason to keep it
    assert decide([_row("chat", flat, win), _row("creative", flat, loss), _row(MIX, flat, win)])[0]
    ok, why = decide([_row("chat", flat, tie), _row(MIX, flat, tie)])
    assert not ok and "not faster than the old beyond noise on the traffic mix" in why
    ok, why = decide([_row(MIX, flat, (1.2, None, None), requests=1)])
    assert not ok and "too few held-out requests" in why


def _record(domain, t, prompt, completion, target="t", tokenizer="k"):
    return TrafficRecord(time=f"2026-12-05T08:{t:02d}:00+00:00", domain=domain, target=target,
                         tokenizer=tokenizer, draft="d", prompt_ids=prompt,
                         completion_ids=completion,
                         sampling=SamplingEntry(temperature=0.0, top_p=1.0, top_k=0, seed=None,
                                                max_tokens=16),
                         finish_reason="length", rounds=[[2, 1]])


def test_the_most_recent_requests_are_held_out_and_small_domains_only_measured():
    records = [_record("chat", t, [1, 2], [3]) for t in range(10)] + \
        [_record("code", t, [1], [2]) for t in range(3)]
    train, held, trained = split(records, 0.25, min_requests=8)
    assert trained == ["chat"]
    assert sorted(r.time for r in held if r.domain == "chat") == \
        [f"2026-12-05T08:{t:02d}:00+00:00" for t in (7, 8, 9)]  # 10 x 0.25 = 2.5, half up: the 3 newest
    assert all(r.domain == "chat" for r in train) and len(train) == 7
    assert sum(r.domain == "code" for r in held) == 3


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(bundle of a trained tiny head with its recipe, traffic folder its target answered)."""
    from draftkit.decode.engine import SpeculativeEngine
    from draftkit.distill.trainer import train
    from draftkit.export import export_bundle
    from draftkit.models import load_pair, resolve_model
    from draftkit.models.resolve import model_identity
    from draftkit.traffic.record import tokenizer_identity
    from tests.helpers import tiny_pair

    tmp = tmp_path_factory.mktemp("refresh")
    dirs = tiny_pair(tmp)
    best = train(distill_config(tmp, dirs, draft=dict(EAGLE3)), progress=False)
    bundle = export_bundle(str(dirs[0]), str(best), tmp / "bundle", k=2,
                           recipe=tmp / "run" / "config.yaml")
    pair = load_pair(str(bundle), str(bundle))
    ident = (model_identity(resolve_model(str(bundle), "target")),
             tokenizer_identity(pair.tokenizer))
    engine = SpeculativeEngine(pair.target, None)
    traffic = tmp / "traffic"
    traffic.mkdir()
    lines = []
    for i in range(12):
        prompt = pair.tokenizer(f"say {i} then {i + 1} and more")["input_ids"]
        (res,) = engine.generate([prompt], k=0, max_new_tokens=12, temperature=0.0)
        lines.append(_record("chat", i, prompt, res.tokens, *ident).to_dict())
    (traffic / "traffic-20261205T080000Z-000001.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in lines))
    return bundle, traffic, tmp


def _args(bundle, traffic, out, **over):
    return RefreshArgs(**{"bundle": str(bundle), "traffic": str(traffic), "out": str(out),
                          "steps": 4, "heldout": 0.34, "min_requests": 4, "max_new_tokens": 8,
                          **over})


def test_a_refresh_trains_from_the_served_head_and_writes_the_bundle_only_if_faster(served):
    """... on its own rollouts over the traffic's prompts (--on-policy: every step here)."""
    from draftkit.export import check_bundle

    bundle, traffic, tmp = served
    out = tmp / "new"
    try:
        refresh(_args(bundle, traffic, out, on_policy=1.0))
        exported = True
    except Declined as e:  # the answer "no" (exit status 3)
        assert str(e).startswith(f"{out} not written: ") and "refresh.md" in str(e)
        exported = False
    work = tmp / "new.work"
    report = json.loads((work / "refresh.json").read_text())
    assert report["exported"] == exported == out.exists()
    mix = report["domains"][-1]
    assert mix["domain"] == MIX and mix["requests"] == 4  # 12 x 0.34 = 4.08: the 4 newest
    assert set(mix["over_plain"]) == {"old", "new"} and mix["new_over_old"]["low"] is not None
    assert mix["measured_new_over_old"]["low"] is not None
    # the cost model's speed is tokens per priced round: tau over (v + c K) for each draft
    assert mix["tau"]["old"] > 1.0
    rows = [json.loads(x) for x in (work / "data" / "traffic.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and set(rows[0]) == {"domain", "prompt_ids", "response_ids"}
    metrics = [json.loads(x) for x in (work / "distill" / "metrics.jsonl").read_text()
               .splitlines()]
    assert metrics[-1]["step"] == 4  # fixed work
    import yaml

    recorded = yaml.safe_load((work / "distill" / "config.yaml").read_text())
    recipe = recorded["draft"]
    # the head's vocabulary is chosen again on the traffic, at the head's size
    assert recipe["model"] == str(bundle) and recipe["draft_vocab_size"] == 40
    # the traffic weighs --traffic-repeat times (default 5) beside the replayed rows
    assert recorded["data"]["sources"][0]["repeat"] == 5
    assert (recorded["data"]["regime"], recorded["data"]["lmbda"]) == ("on_policy", 1.0)
    if exported:
        check_bundle(out)


def test_refresh_bad_inputs_are_one_line_and_write_nothing(served, capsys):
    bundle, traffic, tmp = served
    empty = tmp / "empty"
    empty.mkdir()
    other = tmp / "other"
    other.mkdir()
    rec = json.loads((traffic / "traffic-20261205T080000Z-000001.jsonl").read_text()
                     .splitlines()[0])
    (other / "traffic-x-1.jsonl").write_text(json.dumps({**rec, "target": "0" * 16}) + "\n")
    cut = tmp / "cut"
    cut.mkdir()
    (cut / "traffic-x-1.jsonl").write_text(json.dumps(rec)[:40])
    taken = tmp / "taken"
    taken.mkdir()
    cases = [(empty, tmp / "o1", "holds no recorded traffic"),
             (other, tmp / "o2", "was recorded with target 0000000000000000, not this "
                                 "bundle's"),
             (cut, tmp / "o3", "the record is cut short"),
             (traffic, taken, "already exists; choose another --out")]
    for folder, out, said in cases:
        code = main(["refresh", str(bundle), "--traffic", str(folder), "--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and said in err and len(err.splitlines()) == 1, err
        assert out == taken or not out.exists()
    damaged = tmp / "damaged"
    shutil.copytree(traffic, damaged)
    (damaged / "traffic-x-2.jsonl").write_bytes(b"\xff\x00 what a bad disk leaves\n")
    code = main(["refresh", str(bundle), "--traffic", str(damaged), "--out", str(tmp / "o4"),
                 "--min-requests", "40"])
    said = capsys.readouterr()
    assert code == 2 and "no domain has 40 requests" in said.err
    assert "left out: 1 bad shard(s)" in said.out and "traffic-x-2.jsonl:1: not text" in said.out
    code = main(["refresh", str(bundle), "--traffic", str(damaged), "--out", str(tmp / "o6"),
                 "--strict"])
    assert code == 2 and "--strict refuses" in capsys.readouterr().err
    promptless = tmp / "promptless"
    promptless.mkdir()
    (promptless / "traffic-x-1.jsonl").write_text(json.dumps({**rec, "prompt_ids": None}) + "\n")
    code = main(["refresh", str(bundle), "--traffic", str(promptless), "--out", str(tmp / "o7")])
    assert code == 2 and "every request was recorded without its prompt" in \
        capsys.readouterr().err
    code = main(["refresh", str(bundle), "--traffic", str(traffic), "--out", str(tmp / "o5"),
                 "--traffic-repeat", "0"])
    assert code == 2 and "--traffic-repeat must be >= 1, got 0" in capsys.readouterr().err


def test_a_refresh_that_declines_exits_3_and_signs_what_it_writes(served, capsys, monkeypatch):
    """Not faster is a valid "no": exit status 3, nothing written; refresh without a key
    stops before it trains (a bundle is unsigned only when asked)."""
    import draftkit.traffic.refresh as refresh_module

    bundle, traffic, tmp = served
    argv = ["refresh", str(bundle), "--traffic", str(traffic), "--out", str(tmp / "no"),
            "--steps", "1", "--min-requests", "4", "--heldout", "0.34"]
    monkeypatch.setattr(refresh_module, "_compare",
                        lambda *a: ([], (False, "the new draft is not faster on the mix")))
    assert main(argv) == 3 and not (tmp / "no").exists()
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar
    assert last.startswith(f"draftkit refresh: no: {tmp / 'no'} not written: the new draft "
                           f"is not faster")
    monkeypatch.delenv("DRAFTKIT_SIGNING_KEY")
    assert main(argv[:5] + [str(tmp / "no2")] + argv[6:]) == 2
    assert "a bundle is signed: pass --signing-key PEM" in capsys.readouterr().err
    assert not (tmp / "no2.work").exists()  # stopped before any work


def test_two_refreshes_cannot_write_one_out(served):
    from filelock import FileLock

    bundle, traffic, tmp = served
    out = tmp / "locked"
    with FileLock(tmp / ".locked.refresh.lock"):
        with pytest.raises(DraftkitError, match="another `draftkit refresh` is writing"):
            refresh(_args(bundle, traffic, out))
    assert not Path(out).exists()
