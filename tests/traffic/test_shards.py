"""Traffic as sealed data: each shard's seal (record count and sha256) and each record's number
in its run, checked by the one reader; what fails is named, left out and counted, or refused
with --strict; shards written before seals still read, as unverified; records kept without
their prompt; the table's largest domains."""

import json
from pathlib import Path

import pytest

from draftkit.cli import main
from draftkit.errors import DraftkitError
from draftkit.traffic.args import TrafficArgs
from draftkit.traffic.command import traffic_report
from draftkit.traffic.recorder import Recorder
from draftkit.traffic.shards import read_traffic, seal_line, shard_paths
from tests.traffic.test_drift import mixed, record, write_shard

T, K = {"target": "t" * 16, "tokenizer": "k" * 16}, "k" * 16


def record_into(folder: Path, records, *, shard_bytes=1500, prompts=True, ids=T) -> Recorder:
    """``records`` written by a recorder (a run of its own), as a server writes them."""
    rec = Recorder(folder, target=ids["target"], tokenizer=ids["tokenizer"],
                   shard_bytes=shard_bytes, prompts=prompts)
    rec.start()
    for i, r in enumerate(records):
        rec.add(domain=r.domain, prompt_ids=r.prompt_ids, completion_ids=r.completion_ids,
                sampling=r.sampling, finish_reason=r.finish_reason, rounds=r.rounds,
                draft=r.draft, when=1.8e9 + i)
    rec.stop()
    return rec


def lines_of(shard: Path) -> list[bytes]:
    return shard.read_bytes().splitlines(keepends=True)


def reseal(shard: Path, lines: list[bytes]) -> None:
    """``lines`` written as a sealed shard, with a seal that holds for them."""
    import hashlib

    body = b"".join(lines)
    shard.write_bytes(body + seal_line(len(lines), hashlib.sha256(body).hexdigest()))


def all_accepted(line: bytes) -> bytes:
    data = json.loads(line)
    data["rounds"] = [[k, k] for k, _ in data["rounds"]]
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


@pytest.fixture
def sealed(tmp_path):
    """12 records in 4 sealed shards of 3."""
    folder = tmp_path / "traffic"
    record_into(folder, [record([[3, 1]], 4, n=i, **T) for i in range(12)], shard_bytes=1000)
    shards = shard_paths(folder)
    assert [len(lines_of(s)) for s in shards] == [4, 4, 4, 4]  # 3 records and the seal
    return folder, shards


def test_sealed_shards_read_verified_and_numbered(sealed):
    folder, shards = sealed
    found = read_traffic(folder)
    assert len(found) == 12 and sorted(r.seq for r in found) == list(range(12))
    assert (found.integrity.sealed_shards, found.integrity.sealed_records) == (4, 12)
    assert not found.integrity.left_out
    assert found.integrity.lines() == ["shards: 4 sealed and verified (12 records)"]


def test_what_changed_after_sealing_is_named_and_left_out(sealed):
    folder, shards = sealed
    edited = lines_of(shards[0])
    edited[1] = all_accepted(edited[1])
    shards[0].write_bytes(b"".join(edited))  # a round edited, the seal kept
    grown = lines_of(shards[1])
    shards[1].write_bytes(b"".join(grown[:1] * 50 + grown[1:]))  # a line duplicated 50 times
    shards[2].write_bytes(b"".join(lines_of(shards[2])[:-1]))  # the seal cut off
    copied = folder / "traffic-29990101T000000Z-00000.jsonl"
    reseal(copied, lines_of(shards[3])[:-1] * 2)  # copies of records, consistently resealed
    found = read_traffic(folder)
    text = "\n".join(found.integrity.lines())
    assert f"{shards[0]}: its bytes do not hash to its seal" in text
    assert f"{shards[1]}: holds 52 records, its seal says 3" in text
    assert f"{shards[2]}: its records are numbered but it has no seal" in text
    assert f"{copied}:1: 6 record(s) read before (a copy)" in text
    assert "left out: 3 bad shard(s), 6 duplicated record(s) (--strict refuses instead):" in text
    assert sorted(r.seq for r in found) == [9, 10, 11]
    with pytest.raises(DraftkitError, match=r"do not hash to its seal: .* \(and 3 more\); "
                                            r"--strict refuses"):
        read_traffic(folder, strict=True)


def test_earlier_shards_open_shards_sequence_and_identity(tmp_path):
    """Shards written before seals read, said unverified; a running server's open shard reads
    to its last whole line; a number below its run's last is out of sequence; records of
    another target than the folder's (most records') are left out, or refused when the
    bundle's target is none of them."""
    folder = tmp_path / "traffic"
    write_shard(folder, mixed(5, **T))  # the earlier format: no seal, no numbers
    lines = [json.dumps({**r.to_dict(), "run": "r1", "seq": s}) + "\n"
             for r, s in zip(mixed(3, **T), (0, 2, 1))]
    (folder / ".traffic-20260101T000000Z-00001.open").write_text("".join(lines) + "{\"for")
    write_shard(folder, [record([[2, 1]], 3, target="x" * 16, tokenizer=K)], n=2)
    found = read_traffic(folder)
    assert len(found) == 7
    i = found.integrity
    assert (i.unsealed_shards, i.unsealed_records, i.open_shards, i.open_records) == (2, 6, 1, 3)
    assert (i.out_of_sequence, i.other_identity) == (1, 1)
    text = "\n".join(i.lines())
    assert "2 written before seals (6 records, unverified)" in text
    assert "1 open, a running server's (3 records, unverified until sealed)" in text
    assert ".open:3: 1 record(s) numbered below one read before in their run (moved)" in text
    assert "1 record(s) of another target (xxxxxxxxxxxxxxxx) than the folder's" in text
    with pytest.raises(DraftkitError, match="recorded with target t+, x+, not this bundle's"):
        read_traffic(folder, target="b" * 16)


def test_any_bytes_give_one_line_per_bad_shard(tmp_path, capsys):
    """Bytes a bad disk leaves, wrong types in any field, counts out of range, a folder in a
    shard's place: one line each, naming the shard and the line, and the rest read; nothing
    left: one line and exit 2."""
    folder = tmp_path / "traffic"
    good = record([[3, 1]], 4, **T).to_dict()
    bad = {"garbage": b"\xff\xfe\x00garbage\n",
           "rounds": {**good, "rounds": "[[3, 1]]"}, "time": {**good, "time": 5},
           "sampling": {**good, "sampling": [0.0]}, "domain": {**good, "domain": ["code"]},
           "target": {**good, "target": None}, "prompt": {**good, "prompt_ids": [1, "2"]},
           "accepted": {**good, "rounds": [[3, 4]]}, "negative": {**good, "rounds": [[3, -1]]},
           "k": {**good, "rounds": [[10 ** 9, 0]]}, "nan": {**good, "sampling": {
               **good["sampling"], "temperature": float("nan")}},
           "deep": b"[" * 100_000 + b"\n", "digits": b"9" * 5000 + b"\n"}
    write_shard(folder, mixed(3, **T))
    for n, (name, content) in enumerate(bad.items(), start=1):
        shard = folder / f"traffic-{name}-{n:05d}.jsonl"
        shard.write_bytes(content if isinstance(content, bytes) else
                          (json.dumps(content) + "\n").encode())
    (folder / "traffic-dir-99999.jsonl").mkdir()
    assert main(["traffic", str(folder)]) == 0
    out = capsys.readouterr().out
    named = [line for line in out.splitlines() if line.startswith(f"  {folder}/traffic-")]
    assert len(named) == len(bad) + 1, out
    for name in bad:
        assert sum(f"traffic-{name}-" in line for line in named) == 1, name
    assert "traffic-rounds-00002.jsonl:1: the record's rounds are not [K, accepted]" in out
    assert "traffic-garbage-00001.jsonl:1: not text (bytes that are not UTF-8)" in out
    assert "traffic-dir-99999.jsonl: not a file" in out
    assert "3 requests" in out
    (folder / "traffic-20260101T000000Z-00000.jsonl").unlink()  # the good one
    assert main(["traffic", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds no readable traffic: " in err, err


def statuses(report) -> dict[str, str]:
    return {name: d.status for name, d in report.domains.items()}


def trusted(folder: Path, bundle: Path) -> dict[str, str]:
    """The statuses had every line been taken at its word (no seal, no number checked)."""
    from draftkit.manifest import read_manifest
    from draftkit.traffic.drift import traffic_drift
    from draftkit.traffic.record import parse_record

    records = [parse_record(line) for shard in shard_paths(folder) for line in lines_of(shard)
               if not line.startswith(b'{"seal"')]
    return statuses(traffic_drift(records, read_manifest(bundle), resamples=300))


@pytest.mark.parametrize("tamper", ["duplicated", "edited"])
def test_a_duplicated_line_and_an_edited_round_are_named_and_the_verdict_stands(
        bundle, tmp_path, capsys, tamper):
    """The probe's two edits, each of which flips chat's status when taken at its word: a
    chat line accepting a third, copied 50 times (into a shard of copies consistently
    resealed, so only the numbers tell), or a chat shard's rounds edited to all accepted.
    Each is named, and every domain's status is the untouched folder's."""
    path, ids = bundle
    folder = tmp_path / "traffic"
    record_into(folder, mixed(40, **ids) + mixed(40, "chat", **ids), shard_bytes=4000, ids=ids)
    args = TrafficArgs(folder=str(folder), bundle=str(path))
    before = statuses(traffic_report(args))
    assert before == {"code": "drift", "chat": "ok"}
    capsys.readouterr()
    chat = [s for s in shard_paths(folder) if b'"domain":"chat"' in s.read_bytes()]
    if tamper == "duplicated":
        low = next(line for line in lines_of(chat[-1]) if b'"rounds":[[4,0],[4,1]]' in line
                   and b'"domain":"chat"' in line)
        changed = folder / "traffic-29990101T000000Z-00000.jsonl"
        reseal(changed, [low] * 50)
        said = f"{changed}:1: 50 record(s) read before (a copy)"
    else:
        changed = chat[-1]
        lines = lines_of(changed)
        changed.write_bytes(b"".join(map(all_accepted, lines[:-1])) + lines[-1])
        said = f"{changed}: its bytes do not hash to its seal"
    assert trusted(folder, path)["chat"] != "ok"
    report = traffic_report(args)
    assert said in capsys.readouterr().out
    assert statuses(report) == before
    assert main(["traffic", str(folder), "--bundle", str(path), "--strict"]) == 2
    assert "--strict refuses" in capsys.readouterr().err


def test_records_without_prompts_say_what_cannot_be_computed(bundle, tmp_path, capsys):
    """--no-record-prompts keeps the completion and the engine's counts: the figures come
    from the counts; a request without counts cannot be replayed (it needs the prompt), and
    the table says both."""
    path, ids = bundle
    folder = tmp_path / "traffic"
    uncounted = record([], 3, **ids)
    uncounted.rounds = None
    record_into(folder, mixed(6, **ids) + [uncounted], prompts=False, ids=ids)
    found = read_traffic(folder)
    assert [r.prompt_ids for r in found] == [None] * 7 and found[0].rounds is not None
    report = traffic_report(TrafficArgs(folder=str(folder), bundle=str(path)))
    out = capsys.readouterr().out
    assert "7 of 7 requests were recorded without their prompt (--no-record-prompts)" in out
    assert "cannot be replayed (a replay needs the prompt: 1 without counts are left out)" in out
    assert report.domains["code"].counts == {"engine": 6, "none": 1}


def test_the_table_shows_the_largest_domains_and_folds_the_rest(bundle, tmp_path, capsys):
    """--top N rows by requests, every flagged domain too, the rest in one row; --all: every
    label. report.json keeps every domain."""
    path, ids = bundle
    folder = tmp_path / "traffic"
    # accepting more than the bundle's mean eval alpha (0.65): not flagged
    labels = [record([[3, 3], [3, 1 + j % 2]], 7, f"l{i:02d}", n=j, **ids)
              for i in range(25) for j in range(8 + (i < 3))]
    write_shard(folder, labels + mixed(6, "code", **ids))  # code: the smallest, and drifted
    argv = ["traffic", str(folder), "--bundle", str(path), "--min-requests", "5"]
    assert main(argv + ["--top", "3"]) == 3  # code drifted: the answer "no"
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines() if " engine " in line]
    assert rows == ["l00", "l01", "l02", "code", "other", "overall"]
    assert "other (22 labels)" in out and "drift: code" in out
    assert main(argv + ["--all", "--out", str(tmp_path / "r")]) == 3
    out = capsys.readouterr().out
    assert "other (" not in out and "\nl24 " in out
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert len(report["domains"]) == 26 and "folded" not in report
