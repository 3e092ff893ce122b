"""``draftkit serve --record DIR``: finished requests appended to a traffic folder, off the
scheduler's thread.

The scheduler hands each finished request to :meth:`Recorder.add`, a queue put that never
waits on the disk; a writer thread makes it a :class:`~draftkit.traffic.record.TrafficRecord`
and appends it to the open shard ``.traffic-<start>-<n>.open`` as one JSON line (one write,
no buffer left behind), numbered in the run (``run``, ``seq``). A shard past ``shard_bytes``
gets its seal (a last line with its record count and sha256), is fsynced and renamed
``traffic-<start>-<n>.jsonl``; so does the open shard when the server stops. The format and how
:func:`~draftkit.traffic.shards.read_traffic` checks it: :mod:`draftkit.traffic.shards`. Where
it can go wrong:

- the server is killed: the next server recording into the folder seals its ``.open`` shard,
  keeping the whole lines (the one being written when it died is dropped);
- the folder reaches ``quota_bytes`` (all its shards counted): recording stops, the log says so
  once, ``Recorder.recording`` (the gauge ``draftkit:traffic_recording``) turns False; a server
  started on a folder at its quota refuses to start (:func:`check_folder`);
- a write fails (disk full): the shard is cut back to its last whole line and sealed, and
  recording stops, as at the quota;
- a second server on the same folder: it refuses to start (a lock held while recording).

So a line in a shard is a whole record, and a record accepted is written unless recording had
to stop (said in the log).

Recorded ids are the users' prompts and answers (they decode with the target's tokenizer to the
whole text): the folder is created readable by its owner only (0700) and each shard so (0600),
``retention_days`` deletes sealed shards older than that (when the folder is taken and as each
shard seals), and ``prompts`` False keeps no prompt at all (``prompt_ids`` null: the completion
and the engine's counts only).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from draftkit.errors import ConfigError, DraftkitError
from draftkit.io import fsync_path, take_lock
from draftkit.models.resolve import model_identity
from draftkit.traffic.record import SERVED, SamplingEntry, TrafficRecord, tokenizer_identity
from draftkit.traffic.shards import (OPEN_GLOB, SEAL_BYTES, SEAL_PREFIX, SHARD_GLOB, seal_line,
                                     sealed_path)

log = logging.getLogger("draftkit.traffic")

LOCK = ".traffic.lock"
MAX_PENDING = 10_000  # records waiting for the writer; past it (a stalled disk) one is dropped
MB = 1 << 20
DAY = 86400.0  # seconds
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600  # the folder and its shards: their owner's only
_STOP = object()


def folder_bytes(folder: Path) -> int:
    """Bytes of every shard in ``folder``, sealed or open: what the quota counts."""
    return sum(p.stat().st_size for pattern in (SHARD_GLOB, OPEN_GLOB)
               for p in Path(folder).glob(pattern))


def check_folder(folder: str | Path, quota_bytes: int) -> Path:
    """The traffic folder ``--record`` names, if a server may record into it: a folder (or
    nothing yet) below its quota; else a one-line error."""
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--record {path} is a file; give a folder (created if missing)")
    used = folder_bytes(path) if path.is_dir() else 0
    if used >= quota_bytes:
        raise ConfigError(f"--record {path} already holds {used / MB:.1f} MB of traffic, its "
                          f"quota (--record-quota-mb {quota_bytes / MB:g}); move its shards "
                          f"elsewhere or raise --record-quota-mb")
    return path


def seal_leftover(path: Path) -> Path | None:
    """Seal the ``.open`` shard a killed server left: cut to its last whole line, its seal
    appended (unless it died after writing it), fsynced, then renamed into place; an open shard
    without a whole line is removed. -> the sealed shard."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end == 0:
        path.unlink()
        return None
    if end < len(data):
        os.truncate(path, end)  # the line being written when the server died
    last = data[data.rfind(b"\n", 0, end - 1) + 1:end]
    if not last.startswith(SEAL_PREFIX):
        with open(path, "ab") as f:
            f.write(seal_line(data.count(b"\n", 0, end), hashlib.sha256(data[:end]).hexdigest()))
    fsync_path(path)
    sealed = sealed_path(path)
    os.replace(path, sealed)
    fsync_path(path.parent)
    return sealed


def open_recorder(args, target_ref, tokenizer) -> Recorder:
    """The traffic folder of ``draftkit serve --record`` (``args``: the serve command's),
    taken (locked, a killed server's shards sealed), for either engine: its records carry the
    target's (resolved) and its tokenizer's identities, and each the identity of the draft it
    decoded with, the engine's."""
    recorder = Recorder(args.record, target=model_identity(target_ref),
                        tokenizer=tokenizer_identity(tokenizer),
                        shard_bytes=int(args.record_shard_mb * MB),
                        quota_bytes=int(args.record_quota_mb * MB),
                        retention_days=args.record_retention_days, prompts=args.record_prompts)
    recorder.open()
    return recorder


class Recorder:
    """A traffic folder being filled: :meth:`open` takes it (the serve command, before the
    server starts, so a refusal is one line), :meth:`start` / :meth:`stop` run the writer with
    the app's lifespan, :meth:`add` is the scheduler's hand-off.

    ``target``, ``tokenizer``: the identities every record carries
    (:func:`~draftkit.models.resolve.model_identity`,
    :func:`~draftkit.traffic.record.tokenizer_identity`); the draft's comes with each record
    (the draft it decoded with: a server may swap its draft). ``prompts`` False: records keep
    no prompt ids (null), where a policy forbids keeping prompts."""

    def __init__(self, folder: str | Path, *, target: str, tokenizer: str,
                 shard_bytes: int = 64 * MB, quota_bytes: int = 10240 * MB,
                 retention_days: float | None = None, prompts: bool = True):
        self.folder = Path(folder).expanduser()
        self.target, self.tokenizer, self.prompts = target, tokenizer, prompts
        self.shard_bytes, self.quota_bytes = shard_bytes, quota_bytes
        # sealed shards older than this many seconds are deleted; None: kept
        self.retention_s = None if retention_days is None else retention_days * DAY
        self.recording = False  # from open() until stop(), the quota or a failed write
        self.written = self.dropped = 0  # records
        self.used = 0  # bytes of all shards in the folder
        self._queue: queue.Queue = queue.Queue(MAX_PENDING)
        self._thread: threading.Thread | None = None
        self._lock = None
        self._stamp = ""
        self._n = 0  # the next shard's number
        self._file = None  # the open shard (unbuffered)
        self._path: Path | None = None
        self._size = 0  # bytes of whole lines in the open shard
        self._hash = hashlib.sha256()  # of those bytes, for its seal
        self._lines = 0  # lines in the open shard
        self.run = ""  # this run's id, chosen when the folder is taken
        self._seq = 0  # the next record's number in the run

    # --- the server's side -------------------------------------------------------------------

    def open(self) -> None:
        """Take the folder: create it, lock it against a second server, seal what a killed one
        left open, check that its traffic is this target's and that it is below its quota.
        Raises a one-line DraftkitError; a no-op once open."""
        if self._lock is not None:
            return
        check_folder(self.folder, self.quota_bytes)
        self.folder.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        lock = take_lock(self.folder / LOCK, f"another server is recording into {self.folder}; "
                                             f"give each server a --record folder of its own")
        try:
            for leftover in sorted(self.folder.glob(OPEN_GLOB)):
                sealed = seal_leftover(leftover)
                log.warning(f"sealed {sealed or leftover}, left open by a server that did not "
                            f"stop cleanly (its whole lines kept)")
            self._check_identity()
            self.expire()
            check_folder(self.folder, self.quota_bytes)
        except BaseException:
            lock.release()
            raise
        self._lock, self.used, self.recording = lock, folder_bytes(self.folder), True
        self._stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.run, self._seq = os.urandom(6).hex(), 0

    def start(self) -> None:
        self.open()
        self._thread = threading.Thread(target=self._run, name="draftkit-recorder", daemon=True)
        self._thread.start()

    def add(self, *, domain: str, prompt_ids: list[int], completion_ids: list[int],
            sampling: SamplingEntry, finish_reason: str, rounds: list[list[int]] | None,
            draft: str | None, when: float | None = None, source: str = SERVED) -> None:
        """A finished request, queued for the writer (never waits on the disk); ``draft``: the
        identity of the draft it decoded with (None: plain decoding); ``rounds`` None: the
        engine reported no counts; ``when``: when it finished (default: now, in seconds since
        the epoch); ``source``: SERVED, or IMPORTED from a request log."""
        if not self.recording:
            return
        item = dict(time=time.time() if when is None else when, draft=draft, domain=domain,
                    prompt_ids=prompt_ids if self.prompts else None,
                    completion_ids=completion_ids, sampling=sampling,
                    finish_reason=finish_reason, rounds=rounds, source=source)
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.warning(f"traffic recording falls behind ({MAX_PENDING} records wait for "
                            f"{self.folder}'s disk); records are dropped until it catches up")

    def stop(self) -> None:
        """Write what is queued, seal the open shard, release the folder."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None
        self._seal()
        self.recording = False
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # --- the writer thread -------------------------------------------------------------------

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            if not self.recording:
                continue
            try:
                self._write(self._line(item))
            except Exception as e:  # a full disk, a bug: stop recording, keep serving
                log.exception("writing a traffic record failed")
                self._halt(f"a write failed ({type(e).__name__}: {e})")

    def _line(self, item: dict) -> bytes:
        when = datetime.fromtimestamp(item.pop("time"), timezone.utc)
        record = TrafficRecord(time=when.isoformat(timespec="milliseconds"), target=self.target,
                               tokenizer=self.tokenizer, **item, run=self.run, seq=self._seq)
        return (json.dumps(record.to_dict(), separators=(",", ":")) + "\n").encode()

    def _write(self, line: bytes) -> None:
        if self.used + len(line) + SEAL_BYTES > self.quota_bytes:  # room for its shard's seal
            self._halt(f"{self.folder} reached its quota of {self.quota_bytes / MB:g} MB "
                       f"(--record-quota-mb)")
            return
        if self._file is None:
            self._new_shard()
        self._append(self._file, line)
        self._hash.update(line)
        self._lines += 1
        self._seq += 1
        self.written += 1
        if self._size >= self.shard_bytes:
            self._seal()

    def _append(self, f, data: bytes) -> None:
        """``data`` appended to the open shard ``f`` in one write (a short one, rare, goes on
        where it stopped); a failed one cut back to the last whole line."""
        try:
            view = memoryview(data)
            while view:
                view = view[f.write(view):]
        except BaseException:
            os.ftruncate(f.fileno(), self._size)
            raise
        self._size += len(data)
        self.used += len(data)

    def _new_shard(self) -> None:
        # a number no shard of this folder has (a server started in the same second before)
        while any((self.folder / name).exists() for name in self._names(self._n)):
            self._n += 1
        self._path = self.folder / self._names(self._n)[0]
        fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
        self._file = os.fdopen(fd, "wb", buffering=0)
        self._size, self._hash, self._lines = 0, hashlib.sha256(), 0

    def _names(self, n: int) -> tuple[str, str]:
        """(open, sealed) file names of shard ``n`` of this server's run."""
        stem = f"traffic-{self._stamp}-{n:05d}"
        return f".{stem}.open", f"{stem}.jsonl"

    def _seal(self) -> None:
        """Append the open shard's seal, fsync it and rename it into place. Where that fails
        the ``.open`` file stays, for the next server recording into the folder to seal."""
        if self._file is None:
            return
        f, self._file = self._file, None
        try:
            self._append(f, seal_line(self._lines, self._hash.hexdigest()))
            os.fsync(f.fileno())
        finally:
            f.close()
        os.replace(self._path, self.folder / self._names(self._n)[1])
        fsync_path(self.folder)
        self._n += 1
        self.expire()

    def expire(self) -> int:
        """Delete the sealed shards older than ``retention_s`` (by when they were sealed);
        -> how many."""
        if self.retention_s is None:
            return 0
        cutoff, gone = time.time() - self.retention_s, 0
        for shard in self.folder.glob(SHARD_GLOB):
            try:
                stat = shard.stat()
                if stat.st_mtime < cutoff:
                    shard.unlink()
                    self.used -= stat.st_size
                    gone += 1
            except OSError:  # another process expired it first; not a file
                continue
        if gone:
            log.info(f"deleted {gone} traffic shard(s) of {self.folder} older than "
                     f"{self.retention_s / DAY:g} days (--record-retention-days)")
        return gone

    def _halt(self, reason: str) -> None:
        """Stop recording for good (the server keeps serving), saying why once."""
        if not self.recording:
            return
        self.recording = False
        log.warning(f"traffic recording stopped: {reason}; requests are still served, not "
                    f"recorded ({self.written} records written)")
        try:
            self._seal()
        except OSError:
            log.exception(f"sealing {self._path} failed; the next server recording into "
                          f"{self.folder} seals it")

    def _check_identity(self) -> None:
        """The folder's traffic is this target's (and tokenizer's): :func:`read_traffic` takes
        a folder of one. The first line of each shard says whose it is."""
        for shard in sorted(self.folder.glob(SHARD_GLOB)):
            try:
                with open(shard, "rb") as f:
                    first = json.loads(f.readline().decode("utf-8"))
            except (OSError, ValueError, RecursionError):  # not UTF-8, not JSON, not a file
                continue  # read_traffic names a damaged shard
            for field, mine in (("target", self.target), ("tokenizer", self.tokenizer)):
                theirs = first.get(field) if isinstance(first, dict) else None
                if theirs is not None and theirs != mine:
                    raise DraftkitError(f"{shard} was recorded with {field} {theirs}, not this "
                                        f"server's ({mine}); give --record a folder of its own")
