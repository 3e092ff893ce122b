"""Any bytes in a traffic folder: a clean read or one line of DraftkitError, never a traceback;
and what reads is trusted past the reader (the figures and the table take it as it is).

Property-based (hypothesis, derandomized so CI sees the same cases): random bytes as shards,
records with a field given another JSON type or deleted, rounds edited, and recorded shards
mutated as a bad disk or a hand would (lines duplicated, dropped, swapped, cut; bytes flipped;
whole shards copied; a sealed shard renamed open). About 1,200 cases in a few seconds."""

import hashlib
import json
import tempfile
from pathlib import Path

import pytest

from draftkit.errors import DraftkitError
from draftkit.traffic.command import conclusions, drift_table
from draftkit.traffic.drift import traffic_drift
from draftkit.traffic.shards import read_traffic, seal_line, shard_paths
from tests.traffic.test_drift import mixed
from tests.traffic.test_shards import T, record_into

hypothesis = pytest.importorskip("hypothesis", reason="the fuzz tests need hypothesis (the "
                                                     "test extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = settings(deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
VOCAB = 100  # the records' ids lie below 10: a bound the reader applies, not a limit of theirs


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, bytes]:
    """Shards as they come: a run's three sealed shards and one of the earlier format."""
    folder = tmp_path_factory.mktemp("fuzz") / "traffic"
    record_into(folder, mixed(6, **T) + mixed(3, "chat", **T), shard_bytes=1000)
    shards = {p.name: p.read_bytes() for p in shard_paths(folder)}
    shards["traffic-19990101T000000Z-00000.jsonl"] = "".join(
        json.dumps(r.to_dict()) + "\n" for r in mixed(3, "math", **T)).encode()
    return shards


def check(files: dict[str, bytes]) -> None:
    """Write ``files`` as a traffic folder and read it, plainly and strictly: a clean read
    whose records the figures take, or a one-line DraftkitError."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, data in files.items():
            (folder / name).write_bytes(data)
        for strict in (False, True):
            try:
                found = read_traffic(folder, vocab=VOCAB, strict=strict)
            except DraftkitError as e:
                assert "\n" not in str(e), str(e)
                continue
            numbered = [(r.run, r.seq) for r in found if r.seq is not None]
            assert len(numbered) == len(set(numbered))  # a record never counts twice
            assert all(t < VOCAB for r in found for t in (r.prompt_ids or []) + r.completion_ids)
            assert all("\n" not in line for line in found.integrity.lines())
            report = traffic_drift(list(found), resamples=4)
            drift_table(report), conclusions(report)


# --- random bytes --------------------------------------------------------------------------------

SHARD_NAMES = st.sampled_from(["traffic-a-00000.jsonl", "traffic-b-00001.jsonl",
                               ".traffic-c-00002.open"])
JUNK = st.one_of(st.binary(max_size=400), st.text(max_size=200).map(str.encode),
                 st.lists(st.sampled_from([b"{", b"}", b"[", b"]", b'"seal":', b'"format":1',
                                           b",", b"\n", b"1", b"null", b"\xff"]),
                          max_size=40).map(b"".join))


@settings(FUZZ, max_examples=400)
@given(st.dictionaries(SHARD_NAMES, JUNK, min_size=1, max_size=3))
def test_random_bytes_read_cleanly_or_fail_in_one_line(files):
    check(files)



# --- records: fields of another type, rounds edited ----------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() |
                    st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=3) |
                    st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
FIELDS = ["format", "time", "domain", "target", "tokenizer", "draft", "prompt_ids",
          "completion_ids", "sampling", "finish_reason", "rounds", "source", "run", "seq",
          "sampling.temperature", "sampling.top_p", "sampling.top_k", "sampling.seed",
          "sampling.max_tokens", "sampling.draft_sample_method"]
ROUNDS = st.lists(st.lists(st.integers(-3, 300), max_size=3), max_size=4)
EDIT = st.one_of(st.tuples(st.just("set"), st.sampled_from(FIELDS), JSON),
                 st.tuples(st.just("delete"), st.sampled_from(FIELDS), st.none()),
                 st.tuples(st.just("set"), st.just("rounds"), ROUNDS))


def edited(record: dict, edits) -> dict:
    record = json.loads(json.dumps(record))
    for how, key, value in edits:
        *path, name = key.split(".")
        holder = record.get(path[0]) if path else record
        if not isinstance(holder, dict):
            continue
        if how == "delete":
            holder.pop(name, None)
        else:
            holder[name] = value
    return record


@settings(FUZZ, max_examples=500)
@given(st.lists(EDIT, min_size=1, max_size=3), st.booleans(), st.integers(0, 2))
def test_records_of_any_shape_read_cleanly_or_fail_in_one_line(recorded, edits, seal, which):
    """A record edited in place, its shard then consistently resealed (so the record's own
    check is what stands) or left without a seal (the earlier format's shard)."""
    name = sorted(recorded)[1 + which % 3]
    lines = recorded[name].splitlines(keepends=True)
    if lines[-1].startswith(b'{"seal"'):
        lines.pop()
    lines[0] = json.dumps(edited(json.loads(lines[0]), edits)).encode() + b"\n"
    body = b"".join(lines)
    if seal:
        body += seal_line(len(lines), hashlib.sha256(body).hexdigest())
    check({**recorded, name: body})



# --- shards: lines and bytes moved about ----------------------------------------------------------

MUTATION = st.one_of(
    st.tuples(st.just("duplicate"), st.integers(0, 9), st.integers(1, 50)),
    st.tuples(st.just("drop"), st.integers(0, 9), st.none()),
    st.tuples(st.just("swap"), st.integers(0, 9), st.integers(0, 9)),
    st.tuples(st.just("cut"), st.integers(0, 4000), st.none()),
    st.tuples(st.just("flip"), st.integers(0, 4000), st.integers(1, 255)),
    st.tuples(st.just("insert"), st.integers(0, 4000), st.binary(min_size=1, max_size=20)),
    st.tuples(st.just("copy"), st.none(), st.none()),
    st.tuples(st.just("open"), st.none(), st.none()))


def mutated(files: dict[str, bytes], name: str, how: str, a, b) -> dict[str, bytes]:
    data = files[name]
    lines = data.splitlines(keepends=True) or [b""]
    if how == "duplicate":
        lines[a % len(lines):a % len(lines)] = [lines[a % len(lines)]] * b
    elif how == "drop":
        del lines[a % len(lines)]
    elif how == "swap":
        i, j = a % len(lines), b % len(lines)
        lines[i], lines[j] = lines[j], lines[i]
    elif how == "cut":
        lines = [data[:a % (len(data) + 1)]]
    elif how == "flip" and data:
        i = a % len(data)
        lines = [data[:i] + bytes([data[i] ^ b]) + data[i + 1:]]
    elif how == "insert":
        i = a % (len(data) + 1)
        lines = [data[:i] + b + data[i:]]
    elif how == "copy":
        return {**files, "traffic-29990101T000000Z-00000.jsonl": data}
    elif how == "open":
        rest = {k: v for k, v in files.items() if k != name}
        return {**rest, "." + name[:-len(".jsonl")] + ".open": data}
    return {**files, name: b"".join(lines)}


@settings(FUZZ, max_examples=300)
@given(st.lists(st.tuples(st.integers(0, 3), MUTATION), min_size=1, max_size=4))
def test_shards_mutated_read_cleanly_or_fail_in_one_line(recorded, mutations):
    files = dict(recorded)
    for which, (how, a, b) in mutations:
        names = sorted(n for n in files if n.endswith(".jsonl"))
        if names:
            files = mutated(files, names[which % len(names)], how, a, b)
    check(files)
