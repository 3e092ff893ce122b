"""``draftkit serve --record``: finished requests kept as token ids in sealed shards, labelled
by metadata, user or route, and split per domain in /metrics."""

import hashlib
import json
import logging

import httpx
import pytest

from draftkit.cli import main
from draftkit.errors import DraftkitError
from draftkit.serve.detok import TextStream
from draftkit.traffic.record import SamplingEntry, TrafficRecord, tokenizer_identity
from draftkit.traffic.recorder import Recorder, folder_bytes
from draftkit.traffic.shards import read_traffic, shard_paths
from tests.helpers import start_server
from tests.serve.test_metrics import samples

TARGET, DRAFT = "t" * 16, "d" * 16


def recording(tiny_models, folder, shard_bytes=1 << 20, quota_bytes=1 << 30, **kw):
    """A live server (fixed K 2) recording into ``folder``, and its recorder."""
    rec = Recorder(folder, target=TARGET, tokenizer=tokenizer_identity(tiny_models[0]),
                   shard_bytes=shard_bytes, quota_bytes=quota_bytes)
    kw = {"k": 2, "max_batch": 4, "max_tokens_limit": 64, "draft": DRAFT, **kw}
    return start_server(tiny_models, recorder=rec, **kw), rec


def files_text(folder) -> str:
    return "".join(p.read_text() for p in sorted(folder.iterdir()) if p.is_file())


def test_finished_requests_are_recorded_as_served(tiny_models, tmp_path):
    """Each finished request is one record: its prompt ids, the completion ids as served (they
    give the served text; cut after the token that completed a stop string, as usage counts),
    its sampling, finish reason and one [K, accepted] per round after the prefill (so they sum
    to the response's drafted and accepted). Records read back as written."""
    tok = tiny_models[0]
    srv, _ = recording(tiny_models, tmp_path / "traffic")
    try:
        c = srv.client()
        plain = c.completions.create(model="tiny", prompt=[10, 11, 12], max_tokens=12,
                                     temperature=0)
        text = plain.choices[0].text
        stop = text[len(text) // 2:len(text) // 2 + 2]
        stopped = c.completions.create(model="tiny", prompt=[10, 11, 12], max_tokens=12,
                                       temperature=0, stop=[stop])
        chat = c.chat.completions.create(model="tiny", max_tokens=10, temperature=0.8,
                                         top_p=0.9, seed=7,
                                         messages=[{"role": "user", "content": "hello world"}])
        streamed = "".join(ch.choices[0].text for ch in c.completions.create(
            model="tiny", prompt="the sum of", max_tokens=8, temperature=0, stream=True)
            if ch.choices)
    finally:
        srv.stop()
    records = read_traffic(tmp_path / "traffic", target=TARGET, tokenizer=tokenizer_identity(tok))
    assert len(records) == 4
    by_text = {}
    for r, stops in zip(records, ([], [stop], [], [])):
        served = TextStream(tok, stops, r.prompt_ids).feed(r.completion_ids, final=True)
        by_text[served] = r
        assert (r.target, r.tokenizer, r.draft, r.domain) == (TARGET, tokenizer_identity(tok),
                                                              DRAFT, "unlabeled")
    for response, text_ in ((plain, text), (stopped, stopped.choices[0].text),
                            (chat, chat.choices[0].message.content)):
        r = by_text[text_]
        spec = response.model_extra["draftkit"]
        assert len(r.completion_ids) == response.usage.completion_tokens
        assert r.finish_reason == response.choices[0].finish_reason
        assert len(r.rounds) == spec["target_calls"] - 1  # the prefill is no round
        assert sum(k for k, _ in r.rounds) == spec["drafted"]
        assert sum(n for _, n in r.rounds) == spec["accepted"]
    assert streamed in by_text
    assert by_text[text].prompt_ids == [10, 11, 12]
    assert stop not in stopped.choices[0].text and by_text[stopped.choices[0].text] \
        .finish_reason == "stop"
    assert len(by_text[stopped.choices[0].text].completion_ids) < len(by_text[text]
                                                                     .completion_ids)
    sampling = by_text[chat.choices[0].message.content].sampling
    assert (sampling.temperature, sampling.top_p, sampling.seed, sampling.max_tokens) == (
        0.8, 0.9, 7, 10)
    lines = [line for shard in shard_paths(tmp_path / "traffic")
             for line in shard.read_text().splitlines()[:-1]]  # the seal last
    assert sorted(json.dumps(r.to_dict(), separators=(",", ":")) for r in records) == \
        sorted(lines)
    # numbered in the run, across its shards
    assert sorted(r.seq for r in records) == [0, 1, 2, 3] and len({r.run for r in records}) == 1


def test_labels_opt_out_headers_and_domain_metrics(tiny_models, tmp_path):
    """The label is metadata.domain, else user, else the route's, else "unlabeled" (cleaned);
    a request with metadata.draftkit_record "off" is served, not recorded; no header and no
    text reaches a shard; /metrics splits drafts and accepted-per-position by the label."""
    folder = tmp_path / "traffic"
    srv, _ = recording(tiny_models, folder, route_labels=("code", "math"))
    secret = "sk-SECRET-4242"
    try:
        client = httpx.Client(base_url=srv.base, timeout=60, headers={
            "Authorization": f"Bearer {secret}", "X-Private": "hush-hush"})

        def ask(path, **body):
            r = client.post(path, json={"prompt": "hello world python", "max_tokens": 8,
                                        "temperature": 0, **body})
            assert r.status_code == 200, r.text
            return r.json()

        ask("/v1/completions", metadata={"domain": "Math Problems!"})
        ask("/v1/completions", user="Alice")
        ask("/code/v1/completions")
        ask("/code/v1/completions", metadata={"domain": "chat"}, user="bob")
        ask("/math/v1/completions", user="carol")
        ask("/v1/completions")
        ask("/math/v1/completions", metadata={"draftkit_record": "off"})
        r = client.post("/code/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
        assert r.status_code == 200
        assert client.post("/nope/v1/completions", json={"prompt": "x"}).status_code == 404
        assert client.get("/code/v1/models").status_code == 200
        bad = client.post("/v1/completions", json={"prompt": "x", "metadata": {
            "draftkit_record": "maybe"}})
        assert bad.status_code == 400 and "draftkit_record" in bad.json()["error"]["message"]
        drafts = {s.labels["domain"]: s.value for s in samples(
            srv.base, "draftkit:spec_decode_num_drafts_by_domain")}
        per_pos = samples(srv.base, "draftkit:spec_decode_num_accepted_tokens_per_pos_by_domain")
        total = samples(srv.base, "draftkit:spec_decode_num_drafts")[0].value
        recording_on = httpx.get(f"{srv.base}/metrics").text
    finally:
        srv.stop()
    records = read_traffic(folder)
    assert sorted(r.domain for r in records) == sorted(
        ["math_problems", "alice", "code", "chat", "carol", "unlabeled", "code"])
    assert set(drafts) == {r.domain for r in records} | {"math"}  # math: the opted-out one
    assert sum(drafts.values()) == total  # every drafted round is some domain's
    for domain in drafts:  # per-position counts = the records' rounds (math: one unrecorded)
        mine = [r for r in records if r.domain == domain]
        if domain != "math":
            assert drafts[domain] == sum(r.drafted_rounds for r in mine)
            assert sum(s.value for s in per_pos if s.labels["domain"] == domain) == sum(
                n for r in mine for _, n in r.rounds)
    assert {s.labels["position"] for s in per_pos} == {"0", "1"}
    assert "draftkit:traffic_recording{" in recording_on and \
        [line for line in recording_on.splitlines()
         if line.startswith("draftkit:traffic_recording{")][0].endswith(" 1.0")
    stored = files_text(folder)
    for leak in (secret, "Bearer", "hush", "X-Private", "authorization", "hello world"):
        assert leak.lower() not in stored.lower()


def test_shards_rotate_by_size_and_hold_whole_lines(tiny_models, tmp_path):
    """A shard is sealed once it passes shard_bytes: several sealed shards, each of whole
    records, none left open once the server stops."""
    folder = tmp_path / "traffic"
    srv, rec = recording(tiny_models, folder, shard_bytes=600)
    try:
        c = srv.client()
        for i in range(6):
            c.completions.create(model="tiny", prompt=[10 + i, 11, 12], max_tokens=10,
                                 temperature=0)
    finally:
        srv.stop()
    shards = shard_paths(folder)
    assert len(shards) >= 3 and not list(folder.glob(".traffic-*.open"))
    for shard in shards:
        data = shard.read_bytes()
        assert data.endswith(b"\n")
        *lines, seal = data.splitlines(keepends=True)
        assert all(json.loads(line)["format"] == 1 for line in lines)
        assert json.loads(seal)["seal"] == {"records": len(lines),
                                            "sha256": hashlib.sha256(b"".join(lines)).hexdigest()}
    traffic = read_traffic(folder)
    assert len(traffic) == rec.written == 6 and [r.seq for r in traffic] == list(range(6))
    assert traffic.integrity.sealed_shards == len(shards) and not traffic.integrity.left_out
    assert folder_bytes(folder) == rec.used


def _record_line(i: int) -> str:
    record = TrafficRecord(time=f"2025-01-01T00:00:0{i}.000+00:00", domain="code", target=TARGET,
                           tokenizer="k" * 16, draft=None, prompt_ids=[1, 2], completion_ids=[i],
                           sampling={"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None,
                                     "max_tokens": 4}, finish_reason="length", rounds=[[2, 1]])
    return json.dumps(TrafficRecord.from_dict(record.to_dict()).to_dict()) + "\n"


def test_a_killed_servers_open_shard_is_sealed_keeping_whole_lines(tmp_path):
    """At start a recorder seals the .open shards a killed server left, dropping the line it
    died writing (one holding no whole line goes); a second recorder on the folder refuses."""
    folder = tmp_path / "traffic"
    folder.mkdir()
    whole = _record_line(1) + _record_line(2)
    (folder / ".traffic-20250101T000000Z-00000.open").write_text(whole + _record_line(3)[:40])
    (folder / ".traffic-20250101T000000Z-00001.open").write_text(_record_line(4)[:25])
    rec = Recorder(folder, target=TARGET, tokenizer="k" * 16)
    rec.open()
    try:
        assert not list(folder.glob(".traffic-*.open"))
        assert [p.name for p in shard_paths(folder)] == ["traffic-20250101T000000Z-00000.jsonl"]
        *lines, seal = shard_paths(folder)[0].read_bytes().splitlines(keepends=True)
        assert b"".join(lines) == whole.encode()  # sealed as it was found
        assert json.loads(seal)["seal"]["records"] == 2
        traffic = read_traffic(folder)
        assert [r.completion_ids for r in traffic] == [[1], [2]]
        assert traffic.integrity.sealed_shards == 1
        with pytest.raises(DraftkitError, match="another server is recording into"):
            Recorder(folder, target=TARGET, tokenizer="k" * 16).open()
    finally:
        rec.stop()
    other = Recorder(folder, target="o" * 16, tokenizer="k" * 16)
    with pytest.raises(DraftkitError, match=r"recorded with target t+, not this server's"):
        other.open()


def test_quota_stops_recording_and_a_full_folder_is_refused(tiny_models, tmp_path, caplog,
                                                            capsys):
    """Past its quota the recorder stops (the log says so once, the gauge reads 0) and
    nothing it wrote is cut; `draftkit serve` on a folder at its quota exits 2 with one line."""
    folder = tmp_path / "traffic"
    srv, rec = recording(tiny_models, folder, quota_bytes=1000)
    caplog.set_level(logging.WARNING, logger="draftkit.traffic")
    try:
        c = srv.client()
        for i in range(5):
            c.completions.create(model="tiny", prompt=[10 + i, 11, 12], max_tokens=10,
                                 temperature=0)
        text = httpx.get(f"{srv.base}/metrics").text
    finally:
        srv.stop()
    assert 0 < rec.written < 5 and folder_bytes(folder) <= 1000
    assert len(read_traffic(folder)) == rec.written
    assert [line for line in text.splitlines()
            if line.startswith("draftkit:traffic_recording{")][0].endswith(" 0.0")
    assert len([m for m in caplog.messages if "recording stopped" in m]) == 1
    quota_mb = str(folder_bytes(folder) / (1 << 20))
    assert main(["serve", "--target", "embedded", "--record", str(folder),
                 "--record-quota-mb", quota_mb]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "quota" in err and "--record-quota-mb" in err


def test_bad_recording_flags_are_one_line_errors(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    for flags, says in ((["--record-shard-mb", "0"], "--record-shard-mb must be"),
                        (["--record-quota-mb", "-1"], "--record-quota-mb must be"),
                        (["--route-labels", "code,Math"], "'Math' cannot be a route label"),
                        (["--route-labels", "code,code"], "names a label twice"),
                        (["--record", str(a_file)], "is a file; give a folder")):
        assert main(["serve", "--target", "embedded", *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err


def test_serve_records_under_the_models_identities(tiny_dirs, tmp_path):
    """`draftkit serve --record` stamps each record with the target's and its tokenizer's
    identities and with the identity of the draft it decoded with (none under --k 0: plain
    decoding, each round [0, 0]); --no-record-prompts (here under --k 0) keeps no prompt ids,
    the completion and the counts only."""
    from draftkit.cli import build_parser, parse
    from draftkit.config import from_namespace
    from draftkit.models.resolve import model_identity, resolve_model
    from draftkit.serve.args import ServeArgs
    from draftkit.serve.command import build
    from tests.helpers import LiveServer

    target, draft = tiny_dirs
    for k, drafted in ((2, model_identity(resolve_model(str(draft), "draft"))), (0, None)):
        folder = tmp_path / f"traffic-k{k}"
        argv = ["serve", str(target), "--draft", str(draft), "--k", str(k), "--max-batch", "2",
                "--max-model-len", "64", "--device", "cpu", "--record", str(folder),
                "--served-model-name", "tiny"] + (["--no-record-prompts"] if k == 0 else [])
        app, desc, _ = build(from_namespace(ServeArgs, parse(build_parser(), argv)))
        assert f"recording into {folder}" in desc
        srv = LiveServer(app)
        try:
            srv.client().completions.create(model="tiny", prompt=[10, 11], max_tokens=6,
                                            temperature=0)
        finally:
            srv.stop()
        [r] = read_traffic(folder)
        assert (r.target, r.draft) == (model_identity(resolve_model(str(target))), drafted)
        assert r.tokenizer == tokenizer_identity(app.state.completions.tokenizer)
        assert r.rounds and all(kn[0] == k for kn in r.rounds)
        assert r.prompt_ids == ([10, 11] if k else None) and r.completion_ids


def test_shards_are_their_owners_only_and_expire_after_the_retention(tmp_path, caplog):
    """Recorded ids are users' prompts and answers: the folder a recorder creates is 0700, each
    shard 0600 (open and sealed); with a retention, sealed shards older than it are deleted
    when the folder is taken and as shards seal, newer ones kept."""
    import os
    import stat
    import time

    folder = tmp_path / "traffic"
    rec = Recorder(folder, target=TARGET, tokenizer="k" * 16, shard_bytes=1)
    rec.start()
    sampling = SamplingEntry(temperature=0.0, top_p=1.0, top_k=0, seed=None, max_tokens=4)
    rec.add(domain="code", prompt_ids=[1, 2], completion_ids=[3], sampling=sampling,
            finish_reason="stop", rounds=[[2, 1]], draft=None)
    rec.stop()
    (shard,) = shard_paths(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(shard.stat().st_mode) == 0o600
    old = time.time() - 3 * 86400
    os.utime(shard, (old, old))
    kept = folder / "traffic-20991231T000000Z-00000.jsonl"
    kept.write_text(_record_line(9))
    caplog.set_level(logging.INFO, logger="draftkit.traffic")
    rec = Recorder(folder, target=TARGET, tokenizer="k" * 16, retention_days=2)
    rec.open()
    rec.stop()
    assert shard_paths(folder) == [kept]
    assert any("deleted 1 traffic shard(s)" in m for m in caplog.messages)
    assert main(["serve", "--target", "embedded", "--record", str(folder),
                 "--record-retention-days", "0"]) == 2
