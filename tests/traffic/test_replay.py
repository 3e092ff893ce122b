"""Replay: a recorded completion through a draft gives the acceptance the engine would have
counted. Greedy: the engine's own rounds, round for round; sampled: the engine's acceptance
in expectation; a draft that is the target accepts everything. Then through ``draftkit
traffic``: records without counts replayed, the column that says so, and --replay off."""

import json

import pytest
import torch

from draftkit.cli import main
from draftkit.decode.engine import SpeculativeEngine
from draftkit.traffic.record import (ENGINE, REPLAY, SamplingEntry, TrafficRecord,
                                     engine_counts)
from draftkit.traffic.replay import Replayer, rounds_before_end
from tests.helpers import eagle3_models, make_llama, make_tokenizer, noisy_copy

K = 3


def prompts(n: int, vocab: int, length: int = 6) -> list[list[int]]:
    return [torch.randint(3, vocab, (length,), generator=torch.Generator().manual_seed(i))
            .tolist() for i in range(n)]


def as_record(prompt, result, temperature: float, rounds=True, domain="code",
              **ids) -> TrafficRecord:
    return TrafficRecord(
        time="2026-12-07T10:00:00+00:00", domain=domain, target=ids.get("target", "t"),
        tokenizer=ids.get("tokenizer", "k"), draft=None, prompt_ids=prompt,
        completion_ids=result.tokens,
        sampling=SamplingEntry(temperature=temperature, top_p=1.0, top_k=0, seed=0,
                               max_tokens=40),
        finish_reason="length", rounds=result.stats.rounds if rounds else None)


@pytest.fixture(scope="module")
def standalone():
    target = make_llama(len(make_tokenizer()), num_layers=3, seed=0)
    return target, noisy_copy(target, 0.05)


@pytest.fixture(scope="module")
def eagle3():
    target, _, head = eagle3_models()
    return target, head


@pytest.mark.parametrize("kind", ["standalone", "eagle3"])
def test_a_greedy_replay_gives_the_engines_rounds(kind, request):
    target, draft = request.getfixturevalue(kind)
    ps = prompts(8, target.config.vocab_size)
    results = SpeculativeEngine(target, draft).generate(ps, k=K, max_new_tokens=40)
    replayer = Replayer(target, draft, K)
    compared = 0
    for p, r in zip(ps, results):
        record = as_record(p, r, 0.0, rounds=False)
        got = replayer.counts(record)
        assert got.source == REPLAY
        total = len(p) + len(r.tokens)
        want = rounds_before_end(r.stats.rounds, len(p), total, K)
        assert rounds_before_end(got.rounds, len(p), total, K) == want
        compared += len(want)
        assert sum(n + 1 for _, n in got.rounds) == len(r.tokens) - 1 or \
            got.rounds[-1][1] == got.rounds[-1][0]  # every token is covered, the last may pass
    assert compared > 100  # many rounds, some accepting several tokens
    assert any(n > 1 for p, r in zip(ps, results) for _, n in r.stats.rounds)


@pytest.mark.parametrize("kind", ["standalone", "eagle3"])
def test_a_sampled_replay_expects_what_the_engine_accepted(kind, request):
    target, draft = request.getfixturevalue(kind)
    ps = prompts(60, target.config.vocab_size)
    results = SpeculativeEngine(target, draft).generate(ps, k=K, max_new_tokens=40,
                                                        temperature=1.0, seed=3)
    replayer = Replayer(target, draft, K)
    served = [engine_counts(as_record(p, r, 1.0)) for p, r in zip(ps, results)]
    replayed = [replayer.counts(as_record(p, r, 1.0, rounds=False))
                for p, r in zip(ps, results)]

    def alpha_1(counts):
        return sum(c.accepted[0] for c in counts) / sum(c.tested[0] for c in counts)

    # ~700 served first positions: the binomial's standard error is under 0.02
    assert abs(alpha_1(served) - alpha_1(replayed)) < 0.05
    assert any(0 < c.accepted[0] % 1 for c in replayed)  # expected counts, not draws


def test_the_target_as_its_own_draft_accepts_everything(standalone):
    target, _ = standalone
    ps = prompts(3, target.config.vocab_size)
    replayer = Replayer(target, target, K)
    for t in (0.0, 1.0):
        for p, r in zip(ps, SpeculativeEngine(target, None).generate(
                ps, k=0, max_new_tokens=20, temperature=t, seed=1)):
            c = replayer.counts(as_record(p, r, t, rounds=False))
            assert c.accepted == pytest.approx(c.tested, abs=1e-4) and sum(c.tested) > 0


def test_a_one_token_completion_has_no_round(standalone):
    target, draft = standalone
    (r,) = SpeculativeEngine(target, draft).generate([[5, 6, 7]], k=K, max_new_tokens=1)
    c = Replayer(target, draft, K).counts(as_record([5, 6, 7], r, 0.0, rounds=False))
    assert c.rounds == [] and c.tested == [0.0] * K


# --- through draftkit traffic ------------------------------------------------------------------

@pytest.fixture(scope="module")
def bundle_traffic(tmp_path_factory):
    """A bundle of a tiny target and a noisy copy of it as the draft (float32, K 3), and a
    traffic folder its engine answered: code with the engine's counts, chat without."""
    from draftkit.export import export_bundle
    from draftkit.models import load_pair
    from draftkit.traffic.command import bundle_identities
    from tests.helpers import save_model

    root = tmp_path_factory.mktemp("replay")
    tok = make_tokenizer()
    target = make_llama(len(tok), num_layers=3, seed=0)
    dirs = save_model(target, tok, root / "target"), save_model(noisy_copy(target, 0.05), tok,
                                                                root / "draft")
    bundle = export_bundle(str(dirs[0]), str(dirs[1]), root / "bundle", k=K, dtype="float32")
    _, target_id, tokenizer_id, _, _ = bundle_identities(str(bundle))
    pair = load_pair(str(bundle), str(bundle))
    ps = prompts(24, len(tok))
    results = SpeculativeEngine(pair.target, pair.draft).generate(ps, k=K, max_new_tokens=24)
    lines = [as_record(p, r, 0.0, rounds=i % 2 == 0, domain=("code", "chat")[i % 2],
                       target=target_id, tokenizer=tokenizer_id).to_dict()
             for i, (p, r) in enumerate(zip(ps, results))]
    traffic = root / "traffic"
    traffic.mkdir()
    (traffic / "traffic-20261207T100000Z-00000.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in lines))
    return bundle, traffic, root


def test_traffic_replays_what_the_engine_did_not_count(bundle_traffic, capsys):
    bundle, traffic, root = bundle_traffic
    out = root / "report"
    assert main(["traffic", str(traffic), "--bundle", str(bundle), "--out", str(out),
                 "--min-requests", "5"]) == 0
    text = capsys.readouterr().out
    assert "engine 12" in text and "replay 12" in text and "replaying their completion" in text
    report = json.loads((out / "report.json").read_text())
    code, chat = report["domains"]["code"], report["domains"]["chat"]
    assert code["counts"] == {ENGINE: 12} and chat["counts"] == {REPLAY: 12}
    assert chat["alpha"] is not None and chat["status"] != "none"

    # --replay all: the engine's counts set aside; greedy, so code's figures barely move
    # (only the rounds at each completion's end, which drafted past it, differ)
    assert main(["traffic", str(traffic), "--bundle", str(bundle), "--replay", "all",
                 "--out", str(root / "all")]) == 0
    again = json.loads((root / "all" / "report.json").read_text())["domains"]["code"]
    assert again["counts"] == {REPLAY: 12}
    assert again["alpha_1"]["value"] == pytest.approx(code["alpha_1"]["value"], abs=0.05)


def test_without_a_replay_the_uncounted_are_said_and_left_out(bundle_traffic, capsys):
    bundle, traffic, root = bundle_traffic
    assert main(["traffic", str(traffic), "--bundle", str(bundle), "--replay", "off",
                 "--out", str(root / "off")]) == 0
    text = capsys.readouterr().out
    assert "none 12" in text and "12 of 24 requests carry no acceptance counts" in text
    chat = json.loads((root / "off" / "report.json").read_text())["domains"]["chat"]
    assert chat["status"] == "none" and chat["alpha"] is None and chat["tau"] is None
    assert main(["traffic", str(traffic), "--replay", "all"]) == 2
    assert "--replay all replays through a bundle's draft" in capsys.readouterr().err


# --- draftkit import-traffic -------------------------------------------------------------------

def chat_entry(content, answer, *, finish="length", n_tokens=None, **request):
    body = {"model": "m", "messages": [{"role": "user", "content": content}], **request}
    choices = [{"index": i, "message": {"role": "assistant", "content": a},
                "finish_reason": finish} for i, a in enumerate(answer)]
    response = {"id": "x", "object": "chat.completion", "created": 1796630400,
                "choices": choices}
    if n_tokens is not None:
        response["usage"] = {"completion_tokens": n_tokens}
    return {"request": body, "response": response}


def test_request_logs_become_records_that_traffic_replays(bundle_traffic, tmp_path, capsys):
    from draftkit.chat import encode_prompt
    from draftkit.models import load_pair
    from draftkit.traffic.record import IMPORTED
    from draftkit.traffic.shards import read_traffic

    bundle, _, _ = bundle_traffic
    pair = load_pair(str(bundle), str(bundle))
    tok = pair.tokenizer
    logs = tmp_path / "gateway.jsonl"
    lines = [
        chat_entry("write python code", ["def sum return", "print x"], n_tokens=5,
                   metadata={"domain": "code"}, temperature=0.0),
        chat_entry([{"type": "text", "text": "a poem"}], ["the water"], finish="stop",
                   user="Creative", temperature=0.7, max_tokens=9),
        {"request": {"prompt": "hello world"}, "response": {"status_code": 200, "body": {
            "object": "text_completion", "choices": [{"index": 0, "text": " python code",
                                                      "finish_reason": "length"}]}}},
        {"request": {"prompt": [5, 6, 7]}, "response": {"choices": [
            {"index": 0, "text": " python", "finish_reason": "length"}]}},
        chat_entry([{"type": "image_url", "image_url": {"url": "x"}}], ["no"]),
        {"request": {"messages": []}, "response": {"error": {"message": "overloaded"}}},
        {"something": "else"},
    ]
    logs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    batch_in, batch_out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    batch_in.write_text(json.dumps({"custom_id": "r1", "method": "POST", "url": "/v1/chat/"
                                    "completions", "body": chat_entry("math sum", [])["request"]})
                        + "\n" + json.dumps({"custom_id": "r2", "body": {"prompt": "x"}}) + "\n")
    batch_out.write_text(json.dumps({"custom_id": "r1", "response": {
        "status_code": 200, "body": chat_entry("", ["answer 4"])["response"]}}) + "\n")
    into = tmp_path / "traffic"
    assert main(["import-traffic", str(logs), str(batch_in), str(batch_out), "--bundle",
                 str(bundle), "--into", str(into), "--domain", "support"]) == 0
    out = capsys.readouterr().out
    assert "imported 6 records of 5 requests" in out
    for skipped in ("1 an error answer", "1 a prompt or answer that is not text",
                    "1 a batch line without its pair", "1 not a request with its answer"):
        assert skipped in out
    assert "1 answers tokenize to another length" not in out  # 5 tokens, as its usage says

    records = read_traffic(into)
    assert all(r.source == IMPORTED and r.rounds is None and r.draft is None for r in records)
    # written as a server writes them: a sealed shard, its records numbered
    assert records.integrity.sealed_records == 6 and not records.integrity.left_out
    assert sorted(r.seq for r in records) == list(range(6))
    by_domain = {r.domain: r for r in records}
    assert sorted(by_domain) == ["code", "creative", "support"]
    code = [r for r in records if r.domain == "code"]
    assert [r.completion_ids for r in code] == [tok("def sum return")["input_ids"],
                                                tok("print x")["input_ids"]]
    assert code[0].prompt_ids == encode_prompt(tok, [{"role": "user",
                                                      "content": "write python code"}])
    assert code[0].sampling.temperature == 0.0 and code[0].time.startswith("2026-12-07")
    poem = by_domain["creative"]  # a stop: the end of turn the text does not show
    assert poem.completion_ids == tok("the water")["input_ids"] + [tok.eos_token_id]
    assert poem.sampling.temperature == 0.7 and poem.sampling.max_tokens == 9
    support = [r.prompt_ids for r in records if r.domain == "support"]
    assert encode_prompt(tok, "hello world", raw=True) in support and [5, 6, 7] in support

    assert main(["traffic", str(into), "--bundle", str(bundle), "--min-requests", "1"]) == 0
    table = capsys.readouterr().out
    assert "replay 3" in table and "replaying their completion" in table


def test_bad_logs_are_one_line_and_write_nothing(bundle_traffic, tmp_path, capsys):
    bundle, traffic, _ = bundle_traffic
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(chat_entry("hi", ["x"])) + "\n{not json\n")
    into = tmp_path / "into"
    for argv, says in [
        ([str(bad)], f"{bad}:2: invalid JSON"),
        ([str(tmp_path / "none.jsonl")], "no log file"),
    ]:
        assert main(["import-traffic", *argv, "--bundle", str(bundle), "--into",
                     str(into)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, err
    assert not into.exists()
    empty = tmp_path / "errors.jsonl"
    empty.write_text(json.dumps({"request": {}, "response": {"error": {}}}) + "\n")
    assert main(["import-traffic", str(empty), "--bundle", str(bundle), "--into",
                 str(into)]) == 2
    assert "nothing to import" in capsys.readouterr().err
    assert not into.exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "traffic-20260101T000000Z-00000.jsonl").write_text(
        (traffic / "traffic-20261207T100000Z-00000.jsonl").read_text().replace(
            '"target":"', '"target":"x').replace('"target": "', '"target": "x'))
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(chat_entry("hi", ["x"])) + "\n")
    assert main(["import-traffic", str(good), "--bundle", str(bundle), "--into",
                 str(other)]) == 2
    assert "was recorded with target x" in capsys.readouterr().err


def test_a_replay_follows_the_engines_draft_rule(standalone):
    """Served with greedy drafts (vLLM's default), a record says so and its replay keeps the
    argmax with probability p: the engine's acceptance under that rule, not the sampled one."""
    target, draft = standalone
    ps = prompts(60, target.config.vocab_size)
    results = SpeculativeEngine(target, draft).generate(
        ps, k=K, max_new_tokens=40, temperature=1.0, seed=3, draft_sample_method="greedy")
    replayer = Replayer(target, draft, K)
    records = [as_record(p, r, 1.0, rounds=False) for p, r in zip(ps, results)]
    for rec in records:
        rec.sampling.draft_sample_method = "greedy"
    served = [engine_counts(as_record(p, r, 1.0)) for p, r in zip(ps, results)]
    greedy = [replayer.counts(rec) for rec in records]
    for rec in records:
        rec.sampling.draft_sample_method = "probabilistic"
    sampled = [replayer.counts(rec) for rec in records]

    def alpha_1(counts):
        return sum(c.accepted[0] for c in counts) / sum(c.tested[0] for c in counts)

    assert abs(alpha_1(served) - alpha_1(greedy)) < 0.05
    assert abs(alpha_1(sampled) - alpha_1(greedy)) > 0.1  # the rules differ here
