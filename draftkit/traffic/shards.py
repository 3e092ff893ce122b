"""A traffic folder: its shards, their seals, and the one reader that checks them.

A folder holds shards ``traffic-<start>-<n>.jsonl``, one record per line
(:class:`~draftkit.traffic.record.TrafficRecord`). The recorder appends to a hidden
``.traffic-<start>-<n>.open`` file and, when the shard is full or the server stops, appends
its seal and renames it into place. The seal is the shard's last line::

    {"seal":{"records":812,"sha256":"<hex digest of every byte of the shard before it>"}}

and each record carries ``run`` (a random id of the recording run: one server's life, one
import) and ``seq``, its number in the run, 0, 1, 2, ... across the run's shards. So a reader
tells apart:

- a shard edited, cut or grown since it was sealed (its bytes do not hash to its seal, or it
  holds another count of lines), or one that lost its seal (its records are numbered: only the
  open shard of a running server holds numbered records and no seal);
- a record copied (its run and number read before) or moved (a number below the last one read
  of its run);
- records of another target or tokenizer than the bundle's (without one: than the folder's,
  the most records').

:func:`read_traffic` is the one reader: ``draftkit traffic``, ``refresh`` and the server's
canary read through it. It leaves each bad shard and record out and names it, one line per
shard (whatever bytes a shard holds, never a traceback), or refuses with ``strict``. Shards
written before seals (no seal, records not numbered) still read, counted as unverified; so do
the whole lines of the shard a running server has open (each record is appended with one
write), so a live server's traffic can be looked at without stopping it.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from draftkit.errors import DraftkitError
from draftkit.records import Record
from draftkit.traffic.record import TrafficRecord, parse_record

SHARD_GLOB = "traffic-*.jsonl"
OPEN_GLOB = ".traffic-*.open"
SEAL_PREFIX = b'{"seal":'
SEALED, UNSEALED, OPEN = "sealed", "unsealed", "open"  # a shard's state as read
STRICT_HELP = ("refuse the folder where a shard fails its seal or cannot be read, or records "
               "are duplicated, out of sequence, of another target or outside its vocabulary "
               "(default: they are left out, named and counted)")  # --strict, wherever read


def seal_line(records: int, digest: str) -> bytes:
    """A shard's last line: how many lines come before it and the sha256 of their bytes."""
    return SEAL_PREFIX + json.dumps({"records": records, "sha256": digest},
                                    separators=(",", ":")).encode() + b"}\n"


SEAL_BYTES = len(seal_line(10 ** 15, "0" * 64))  # room a seal takes, at most


def sealed_path(open_shard: Path) -> Path:
    """Where an open shard ``.traffic-X.open`` goes when it is sealed: ``traffic-X.jsonl``."""
    return open_shard.with_name(open_shard.name[1:-len(".open")] + ".jsonl")


def shard_paths(folder: str | Path) -> list[Path]:
    """The sealed shards of a traffic folder, oldest first (their names sort by start)."""
    return sorted(Path(folder).glob(SHARD_GLOB))


@dataclass(kw_only=True)
class Integrity(Record):
    """What reading a traffic folder verified, and what it left out (and why, one line per bad
    shard or kind of record)."""

    sealed_shards: int = 0  # their seal held
    sealed_records: int = 0
    unsealed_shards: int = 0  # written before seals: read, unverified
    unsealed_records: int = 0
    open_shards: int = 0  # a running server's, not sealed yet: read, unverified
    open_records: int = 0
    bad_shards: int = 0  # left out whole
    duplicated: int = 0  # records left out: their run and number read before
    out_of_sequence: int = 0  # a number below the last one read of its run
    other_identity: int = 0  # of another target or tokenizer
    out_of_vocabulary: int = 0  # a token id the target does not have
    problems: list[str] = field(default_factory=list)

    @property
    def left_out(self) -> bool:
        return bool(self.problems)

    def lines(self) -> list[str]:
        """What was read, then each problem: for a command's output."""
        read = [f"{self.sealed_shards} sealed and verified ({self.sealed_records} records)"]
        if self.unsealed_shards:
            read.append(f"{self.unsealed_shards} written before seals ({self.unsealed_records} "
                        f"records, unverified)")
        if self.open_shards:
            read.append(f"{self.open_shards} open, a running server's ({self.open_records} "
                        f"records, unverified until sealed)")
        lines = [f"shards: {'; '.join(read)}"]
        gone = [f"{n} {what}" for n, what in (
            (self.bad_shards, "bad shard(s)"), (self.duplicated, "duplicated record(s)"),
            (self.out_of_sequence, "record(s) out of sequence"),
            (self.other_identity, "record(s) of another target or tokenizer"),
            (self.out_of_vocabulary, "record(s) with ids outside the vocabulary")) if n]
        if gone:
            lines.append(f"left out: {', '.join(gone)} (--strict refuses instead):")
            lines += [f"  {p}" for p in self.problems]
        return lines


@dataclass
class Traffic(Sequence):
    """A folder's records, oldest first (a sequence of them), and what reading it found."""

    folder: Path
    records: list[TrafficRecord]
    integrity: Integrity

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i):
        return self.records[i]


def read_traffic(folder: str | Path, *, target: str | None = None,
                 tokenizer: str | None = None, vocab: int | None = None,
                 strict: bool = False) -> Traffic:
    """Every good record of a traffic folder, oldest first, and what was left out and why
    (module docstring); ``target`` / ``tokenizer``: the identities they must have been
    recorded under (a bundle's); ``vocab``: the target's vocabulary size, which every token id
    must lie below; ``strict``: refuse a folder where anything is left out.

    Errors (one line each): not a folder, no record read, no record of ``target`` or
    ``tokenizer``, anything left out under ``strict``."""
    path = Path(folder)
    if not path.is_dir():
        raise DraftkitError(f"{path} is not a folder; give the folder `draftkit serve --record` "
                            f"wrote")
    found = Integrity()
    read: list[tuple[Path, int, TrafficRecord]] = []  # as written: shard, line, record
    listed = shard_paths(path)
    for shard in listed + sorted(path.glob(OPEN_GLOB)):
        try:
            state, records = _read_shard(shard, listed)
        except DraftkitError as e:
            found.bad_shards += 1
            found.problems.append(f"{shard}{e}")
            continue
        if state is None:  # gone since the folder was listed
            continue
        shards, count = f"{state}_shards", f"{state}_records"
        setattr(found, shards, getattr(found, shards) + 1)
        setattr(found, count, getattr(found, count) + len(records))
        read += [(shard, n, r) for n, r in records]
    records = _in_sequence(read, found)
    for name, want in (("target", target), ("tokenizer", tokenizer)):
        records = _one_identity(records, name, want, path, found)
    if vocab is not None:
        records = _in_vocabulary(records, vocab, found)
    more = f" (and {len(found.problems) - 1} more)" if len(found.problems) > 1 else ""
    if not records and found.problems:
        raise DraftkitError(f"{path} holds no readable traffic: {found.problems[0]}{more}")
    if not records:
        raise DraftkitError(f"{path} holds no recorded traffic; serve with `draftkit serve "
                            f"BUNDLE --record {path}` and send requests first")
    if strict and found.left_out:
        raise DraftkitError(f"{path}: {found.problems[0]}{more}; --strict refuses a folder with "
                            f"bad shards or records (without it they are left out and counted)")
    records.sort(key=lambda r: r.time)
    return Traffic(path, records, found)


def _read_shard(path: Path, listed: list[Path]
                ) -> tuple[str | None, list[tuple[int, TrafficRecord]]]:
    """(the shard's state, its records with their line numbers), (None, []) for a shard gone
    since the folder was listed; a DraftkitError whose text follows the shard's name
    (``:LINE: what`` or ``: what``) where it is bad."""
    is_open = path.name.endswith(".open")
    try:
        if path.exists() and not path.is_file():
            raise DraftkitError(": not a file; move it out of the folder")
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # expired, or an open shard sealed (renamed) since listed
            done = sealed_path(path)
            if not is_open or done in listed or not done.is_file():
                return None, []
            data = done.read_bytes()
    except FileNotFoundError:
        return None, []
    except OSError as e:
        raise DraftkitError(f": cannot be read ({e.strerror})") from None
    if is_open:  # its last line may be half written
        data = data[:data.rfind(b"\n") + 1]
    lines = [line + b"\n" for line in data.split(b"\n")]
    lines[-1] = lines[-1][:-1]  # after the last end of line: b"", or a line cut short
    if not lines[-1]:
        lines.pop()
    seal = bool(lines) and lines[-1].startswith(SEAL_PREFIX)
    if seal:
        _check_seal(lines.pop(), len(lines), data)
    records = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                records.append((number, parse_record(line)))
            except DraftkitError as e:
                raise DraftkitError(f":{number}: {e}; the shard is damaged, move it out of "
                                    f"the folder") from None
    if not seal and not is_open and any(r.seq is not None for _, r in records):
        raise DraftkitError(": its records are numbered but it has no seal: cut short or edited "
                            "after it was sealed")
    return (SEALED if seal else OPEN if is_open else UNSEALED), records


def _check_seal(line: bytes, records: int, data: bytes) -> None:
    """That the seal ``line`` (the shard's last) holds for the ``records`` lines before it,
    the first ``len(data) - len(line)`` bytes of ``data``."""
    try:
        seal = json.loads(line)["seal"]
        count, digest = seal["records"], seal["sha256"]
    except (ValueError, TypeError, KeyError, RecursionError, UnicodeDecodeError):
        raise DraftkitError(": its seal (last line) is not one; the shard was edited") from None
    if count != records:
        raise DraftkitError(f": holds {records} records, its seal says {count}: lines were added "
                            f"or removed after it was sealed")
    if hashlib.sha256(data[:len(data) - len(line)]).hexdigest() != digest:
        raise DraftkitError(": its bytes do not hash to its seal: edited after it was sealed")


def _in_sequence(read: list[tuple[Path, int, TrafficRecord]], found: Integrity
                 ) -> list[TrafficRecord]:
    """The records read, less those whose (run, number) was read before (duplicated) or whose
    number lies below the last one read of its run (out of sequence): one line per shard."""
    last: dict[str, int] = {}
    seen: set[tuple[str, int]] = set()
    kept, dropped = [], Counter()
    where: dict[tuple[Path, str], int] = {}  # the first line of each kind, per shard
    for shard, number, r in read:
        if r.seq is None:
            kept.append(r)
            continue
        kind = "duplicated" if (r.run, r.seq) in seen else \
            "out_of_sequence" if r.seq < last.get(r.run, -1) else None
        if kind is None:
            seen.add((r.run, r.seq))
            last[r.run] = r.seq
            kept.append(r)
            continue
        dropped[shard, kind] += 1
        where.setdefault((shard, kind), number)
        setattr(found, kind, getattr(found, kind) + 1)
    for (shard, kind), n in dropped.items():
        what = "read before (a copy)" if kind == "duplicated" else \
            "numbered below one read before in their run (moved)"
        found.problems.append(f"{shard}:{where[shard, kind]}: {n} record(s) {what}")
    return kept


def _one_identity(records: list[TrafficRecord], name: str, want: str | None, folder: Path,
                  found: Integrity) -> list[TrafficRecord]:
    """``records`` of the ``name`` (target, tokenizer) ``want``, else of the most records;
    the rest left out, in one line. None of ``want``: the traffic is another model's, an
    error."""
    seen = Counter(getattr(r, name) for r in records)
    if not seen:
        return records
    if want is not None and want not in seen:
        theirs = ", ".join(sorted(seen)[:3])
        raise DraftkitError(f"{folder} was recorded with {name} {theirs}, not this bundle's "
                            f"({want}); use the traffic of the model it was served with")
    whose = "the bundle's" if want is not None else "the folder's (most of its records')"
    want = want if want is not None else seen.most_common(1)[0][0]
    other = len(records) - seen[want]
    if other:
        found.other_identity += other
        names = ", ".join(sorted(set(seen) - {want})[:3])
        found.problems.append(f"{other} record(s) of another {name} ({names}) than "
                              f"{whose}, {want}: record each {name}'s traffic in a folder "
                              f"of its own")
    return [r for r in records if getattr(r, name) == want]


def _in_vocabulary(records: list[TrafficRecord], vocab: int, found: Integrity
                   ) -> list[TrafficRecord]:
    """``records`` whose every token id lies below ``vocab``; the rest left out, in one line."""
    kept = [r for r in records if max(r.prompt_ids or [0], default=0) < vocab and
            max(r.completion_ids, default=0) < vocab]
    if len(kept) < len(records):
        found.out_of_vocabulary += len(records) - len(kept)
        found.problems.append(f"{len(records) - len(kept)} record(s) hold token ids the "
                              f"target's vocabulary ({vocab} ids) lacks")
    return kept
