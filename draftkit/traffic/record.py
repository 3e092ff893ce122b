"""One served request as ``draftkit serve --record`` keeps it, and the check a record gets where
it is read.

A record holds what a draft needs to learn from the request and what the draft did on it: the
rendered prompt's and the completion's token ids (the completion is a sample of the target:
speculative decoding is lossless), the sampling settings, each round's K and how many of its
drafted tokens were accepted, the domain label, the identities of the target, its tokenizer
and the draft, when it finished, and where it sits in its recording run (``run``, ``seq``). No
header, no text: ids only. The ids are still the users' prompts and answers: they decode with
the target's public tokenizer to the whole text. A server told not to keep prompts
(``--no-record-prompts``) writes ``prompt_ids`` null.

A line of a shard is a user's file, not draftkit's word: :func:`parse_record` checks every
field's type and range before a record is built, so whatever bytes a shard holds, a reader gets
a record or a one-line :class:`~draftkit.errors.DraftkitError` saying what is wrong, and code
past it trusts what it reads. The folder of shards, their seals and the one reader of it:
:mod:`draftkit.traffic.shards`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime

from draftkit.decode.sampling_params import DRAFT_SAMPLE_METHODS
from draftkit.errors import DraftkitError
from draftkit.records import Record, added_later

FORMAT = 1
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
    # the rendered prompt (chat template applied); None: recorded without it
    # (--no-record-prompts), so it cannot be replayed nor trained on
    prompt_ids: list[int] | None
    completion_ids: list[int]  # as served, cut at a stop string
    sampling: SamplingEntry
    finish_reason: str
    # [K, accepted] per decoding round (K 0: a plain step; the prefill is none); None: the
    # engine reported no counts (draftkit traffic replays the completion through the draft)
    rounds: list[list[int]] | None
    source: str = SERVED  # SERVED: recorded by a server; IMPORTED: from a request log
    # the recording run (one server's life, one import: a random id) and the record's number
    # in it, 0, 1, 2, ... across the run's shards; None: written before records were numbered
    run: str | None = added_later()
    seq: int | None = added_later()

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
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    special = sorted(str(t) for t in tokenizer.all_special_tokens)
    blob = json.dumps([vocab, special], ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# --- the check at the edge ---------------------------------------------------------------------

ID_LIMIT = 1 << 31  # token ids lie below this (whatever the vocabulary)
IDENTITY = r"[A-Za-z0-9_.:-]{1,64}"  # a model's or tokenizer's identity (hex digits as written)
ROUND_K_LIMIT = 256  # K of a recorded round, at most: no engine drafts more
REQUIRED = ("time", "domain", "target", "tokenizer", "prompt_ids", "completion_ids",
            "sampling", "finish_reason", "rounds")


def parse_record(line: bytes) -> TrafficRecord:
    """The record a shard's line holds (its end of line included); a one-line DraftkitError
    saying what is wrong with it otherwise, whatever the bytes."""
    if not line.endswith(b"\n"):
        raise DraftkitError("the record is cut short (no end of line)")
    try:
        data = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise DraftkitError("not text (bytes that are not UTF-8)") from None
    except json.JSONDecodeError as e:
        raise DraftkitError(f"not a whole record ({e.msg})") from None
    except (ValueError, RecursionError):  # a number of 5,000 digits, [[[[... nested too deep
        raise DraftkitError("not a record (JSON past the parser's limits)") from None
    if not isinstance(data, dict) or type(data.get("format")) is not int or \
            data["format"] != FORMAT:
        raise DraftkitError(f"not a draftkit traffic record of format {FORMAT}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise DraftkitError(f"the record lacks {', '.join(missing)}")
    wrong = field_problem(data)
    if wrong:
        raise DraftkitError(f"the record's {wrong}")
    return TrafficRecord.from_dict(data)


def _number(x, low: float, high: float) -> bool:
    """An int or float (no bool) in [low, high]: NaN and the infinities compare outside."""
    return type(x) in (int, float) and low <= x <= high


def _int(x, low: int, high: int) -> bool:
    return type(x) is int and low <= x < high


def _ids(x) -> bool:
    return isinstance(x, list) and all(type(t) is int and 0 <= t < ID_LIMIT for t in x)


def field_problem(data: dict) -> str | None:
    """What is wrong with a record's fields (its JSON object), in a few words; None: nothing.
    Each field's type and range, as the recorder writes them."""
    for key in ("time", "domain", "target", "tokenizer", "finish_reason"):
        if not isinstance(data[key], str):
            return f"{key} is not text"
    for key in ("target", "tokenizer", "draft"):
        if not (key == "draft" and data.get(key) is None or
                isinstance(data.get(key), str) and re.fullmatch(IDENTITY, data[key])):
            return f"{key} is not a model's identity (up to 64 letters, digits, _ . : -)"
    if data["domain"] != clean_label(data["domain"]):
        return "domain is not a label (lower case letters, digits, _ . -)"
    try:
        datetime.fromisoformat(data["time"])
    except ValueError:
        return "time is not an ISO 8601 time"
    if not (data["prompt_ids"] is None or _ids(data["prompt_ids"])) or \
            not _ids(data["completion_ids"]):
        return f"prompt_ids or completion_ids are not token ids (integers in 0..{ID_LIMIT - 1})"
    rounds = data["rounds"]
    if not (rounds is None or isinstance(rounds, list) and all(
            isinstance(r, list) and len(r) == 2 and _int(r[0], 0, ROUND_K_LIMIT + 1) and
            _int(r[1], 0, r[0] + 1) for r in rounds)):
        return (f"rounds are not [K, accepted] pairs of integers with 0 <= accepted <= K <= "
                f"{ROUND_K_LIMIT}")
    s = data["sampling"]
    if not isinstance(s, dict) or not _number(s.get("temperature"), 0.0, 1e6) or \
            not (_number(s.get("top_p"), 0.0, 1.0) and s["top_p"] > 0) or \
            not _int(s.get("top_k"), 0, ID_LIMIT) or \
            not (s.get("seed") is None or _int(s["seed"], -(1 << 63), 1 << 64)) or \
            not _int(s.get("max_tokens"), 0, ID_LIMIT) or \
            s.get("draft_sample_method") not in (None, *DRAFT_SAMPLE_METHODS):
        return ("sampling is not temperature >= 0, top_p in (0, 1], top_k >= 0, seed an integer "
                "or null, max_tokens >= 0, draft_sample_method "
                f"{' or '.join(DRAFT_SAMPLE_METHODS)} or null")
    if data.get("source", SERVED) not in (SERVED, IMPORTED):
        return f"source is neither {SERVED} nor {IMPORTED}"
    run, seq = data.get("run"), data.get("seq")
    if not (run is None and seq is None or isinstance(run, str) and _int(seq, 0, 1 << 63)):
        return "run and seq are not a run's id and a number >= 0 (or both absent)"
    return None
