"""One served request as ``draftkit serve --record`` keeps it, and the folder of shards it fills.

A record holds what a draft needs to learn from the request and what the draft did on it: the
rendered prompt's and the completion's token ids (the completion is a sample of the target:
speculative decoding is lossless), the sampling settings, each round's K and how many of its
drafted tokens were accepted, the domain label, the identities of the target, its tokenizer
and the draft, and when it finished. No header, no text: ids only.

A folder holds shards ``traffic-<start>-<n>.jsonl``, one record per line. The recorder appends
to a hidden ``.open`` file and renames it into place when it is full or the server stops, so a
sealed shard holds only whole records, and a line that is not one (a shard truncated by hand or
by a full disk) is an error that names it. :func:`read_traffic` also reads the whole lines of
the shard a running server has open (each record is appended with one write), so a live
server's traffic can be looked at and trained on without stopping it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from draftkit.errors import DraftkitError
from draftkit.records import Record

FORMAT = 1
SHARD_GLOB = "traffic-*.jsonl"
OPEN_GLOB = ".traffic-*.open"
UNLABELED = "unlabeled"
LABEL_CHARS = 32  # a domain label's length at most, once cleaned (clean_label)
DOMAIN_KEY = "domain"  # metadata key of a request's domain label
RECORD_KEY = "draftkit_record"  # metadata key: "off" keeps the request out of --record
SERVED, IMPORTED = "served", "imported"  # where a record came from
ENGINE, REPLAY = "engine", "replay"  # where a record's acceptance counts came from


@dataclass(kw_only=True)
class SamplingEntry(Record):
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    max_tokens: int
    # how the engine chose drafts at temperature > 0 (SamplingParams.draft_sample_method):
    # draftkit's probabilistic, or vLLM's greedy; None: not known (a server the front did not
    # start, an imported log)
    draft_sample_method: str | None = "probabilistic"


@dataclass(kw_only=True)
class TrafficRecord(Record):
    format: int = FORMAT
    time: str  # when the request finished, ISO 8601 in UTC
    domain: str  # the request's label (metadata, user or route), else "unlabeled"
    target: str  # models.resolve.model_identity of the target
    tokenizer: str  # tokenizer_identity of its tokenizer
    draft: str | None  # model_identity of the draft; None: plain decoding
    prompt_ids: list[int]  # the rendered prompt (chat template applied)
    completion_ids: list[int]  # as served, cut at a stop string
    sampling: SamplingEntry
    finish_reason: str
    # [K, accepted] per decoding round (K 0: a plain step; the prefill is none); None: the
    # engine reported no counts (draftkit traffic replays the completion through the draft)
    rounds: list[list[int]] | None
    source: str = SERVED  # SERVED: recorded by a server; IMPORTED: from a request log

    def per_position(self, k_max: int) -> tuple[list[int], list[int]]:
        """(accepted, tested) at draft positions 0..k_max-1 over this request's rounds."""
        return position_counts(self.rounds or [], k_max)

    @property
    def drafted_rounds(self) -> int:
        return sum(1 for k, _ in self.rounds or [] if k > 0)


def position_counts(rounds: list[list[int]], k_max: int) -> tuple[list[int], list[int]]:
    """(accepted, tested) at draft positions 0..k_max-1 over ``rounds`` ``[K, accepted]``: a
    round that accepted n of K tested positions 0..min(n, K-1) and passed 0..n-1."""
    accepted, tested = [0] * k_max, [0] * k_max
    for k, n in rounds:
        for i in range(min(k, k_max)):
            tested[i] += i <= n
            accepted[i] += i < n
    return accepted, tested


@dataclass
class Counts:
    """One request's acceptance: per draft position, tested and accepted there (expected
    counts for a sampled replay: :mod:`draftkit.traffic.replay`), and its rounds ``[K,
    accepted]``."""

    source: str  # ENGINE: the serving engine's own; REPLAY: computed by draftkit traffic
    accepted: list[float]
    tested: list[float]
    rounds: list[list[int]]


def round_counts(source: str, rounds: list[list[int]], k: int | None = None) -> Counts:
    """The counts of whole rounds (:func:`position_counts`), over positions 0..k-1 (default:
    the largest K of the rounds)."""
    k = max((kk for kk, _ in rounds), default=0) if k is None else k
    accepted, tested = position_counts(rounds, k)
    return Counts(source, [float(a) for a in accepted], [float(t) for t in tested], rounds)


def engine_counts(record: TrafficRecord) -> Counts | None:
    """The counts the engine reported with ``record``; None where it reported none."""
    return None if record.rounds is None else round_counts(ENGINE, record.rounds)


def clean_label(text: str | None) -> str:
    """A request's domain label as records and /metrics keep it: lower case letters, digits,
    ``_ . -`` (anything else becomes ``_``), at most LABEL_CHARS characters; nothing left is
    UNLABELED. A label is a client's text: cleaned here, it cannot break a JSON line or a
    Prometheus label, nor grow without bound."""
    import re

    label = re.sub(r"[^a-z0-9_.-]", "_", (text or "").strip().lower())[:LABEL_CHARS]
    return label.strip("_") or UNLABELED


def request_label(metadata: object, user: object, route: str | None = None) -> str:
    """A request's domain label: its ``metadata.domain``, else its ``user``, else the label of
    the route it came by, cleaned (:func:`clean_label`). ``metadata`` and ``user`` are what the
    body holds, checked here: anything but a string counts as absent."""
    meta = metadata if isinstance(metadata, dict) else {}
    domain = meta.get(DOMAIN_KEY)
    for text in (domain, user, route):
        if isinstance(text, str) and text.strip():
            return clean_label(text)
    return UNLABELED


def recorded(metadata: object) -> bool:
    """False when the request opts out of ``--record``: ``metadata.draftkit_record`` "off"."""
    return not (isinstance(metadata, dict) and metadata.get(RECORD_KEY) == "off")


def tokenizer_identity(tokenizer) -> str:
    """A fingerprint of a tokenizer's vocabulary (token -> id) and special tokens: traffic
    recorded under another tokenizer holds ids that mean other text."""
    import hashlib

    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    special = sorted(str(t) for t in tokenizer.all_special_tokens)
    blob = json.dumps([vocab, special], ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def sealed_path(open_shard: Path) -> Path:
    """Where an open shard ``.traffic-X.open`` goes when it is sealed: ``traffic-X.jsonl``."""
    return open_shard.with_name(open_shard.name[1:-len(".open")] + ".jsonl")


def shard_paths(folder: str | Path) -> list[Path]:
    """The sealed shards of a traffic folder, oldest first (their names sort by start)."""
    return sorted(Path(folder).glob(SHARD_GLOB))


def read_traffic(folder: str | Path, *, target: str | None = None,
                 tokenizer: str | None = None) -> list[TrafficRecord]:
    """Every record of a traffic folder, oldest first; ``target`` / ``tokenizer``: the
    identities they must have been recorded under (a bundle's), else an error that says so.

    Errors (one line each): not a folder, no sealed shard, a line that is not a whole record,
    records of several targets or tokenizers in one folder."""
    path = Path(folder)
    if not path.is_dir():
        raise DraftkitError(f"{path} is not a folder; give the folder `draftkit serve --record` "
                            f"wrote")
    records: list[TrafficRecord] = []
    shards = shard_paths(path)
    for shard in shards:
        with open(shard, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                records.append(_parse(line, f"{shard}:{number}"))
    for shard in sorted(path.glob(OPEN_GLOB)):
        records += _open_shard(shard, shards)
    if not records:
        raise DraftkitError(f"{path} holds no recorded traffic; serve with "
                            f"`draftkit serve BUNDLE --record {path}` and send requests first")
    _one_of(records, "target", target, path)
    _one_of(records, "tokenizer", tokenizer, path)
    records.sort(key=lambda r: r.time)
    return records


def _open_shard(path: Path, sealed: list[Path]) -> list[TrafficRecord]:
    """The whole lines of a shard a server is writing (its last line may be half written);
    one sealed since the folder was listed is read under its sealed name."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        done = sealed_path(path)
        if done in sealed or not done.is_file():
            return []
        data = done.read_bytes()
    text = data[:data.rfind(b"\n") + 1].decode("utf-8")
    return [_parse(line, f"{path}:{i}") for i, line in enumerate(text.splitlines(True), 1)
            if line.strip()]


def _parse(line: str, where: str) -> TrafficRecord:
    remedy = "the shard is damaged; move it out of the folder (other shards still read)"
    if not line.endswith("\n"):
        raise DraftkitError(f"{where}: the record is cut short (no end of line); {remedy}")
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise DraftkitError(f"{where}: not a whole record ({e.msg}); {remedy}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise DraftkitError(f"{where}: not a draftkit traffic record of format {FORMAT} (format "
                            f"{got}); {remedy}")
    missing = [k for k in ("time", "domain", "target", "tokenizer", "prompt_ids",
                           "completion_ids", "sampling", "finish_reason", "rounds")
               if k not in data]
    if missing:
        raise DraftkitError(f"{where}: the record lacks {', '.join(missing)}; {remedy}")
    record = TrafficRecord.from_dict(data)
    if not all(isinstance(t, int) for t in record.prompt_ids + record.completion_ids) or \
            not (record.rounds is None or all(isinstance(r, list) and len(r) == 2 and
                                              0 <= r[1] <= r[0] for r in record.rounds)) or \
            record.source not in (SERVED, IMPORTED):
        raise DraftkitError(f"{where}: token ids, rounds or source are malformed; {remedy}")
    return record


def _one_of(records: list[TrafficRecord], field: str, want: str | None, folder: Path) -> None:
    seen = sorted({getattr(r, field) for r in records})
    if len(seen) > 1:
        raise DraftkitError(f"{folder} holds traffic of {len(seen)} {field}s ({', '.join(seen)}); "
                            f"record each {field}'s traffic in a folder of its own")
    if want is not None and seen and seen[0] != want:
        raise DraftkitError(f"{folder} was recorded with {field} {seen[0]}, not this bundle's "
                            f"({want}); use the traffic of the model it was served with")
