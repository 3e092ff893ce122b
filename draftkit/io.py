"""Files: read so that any bad one is one clear line, written so that a killed run never
leaves a half-written one behind.

Every JSON or JSONL file draftkit reads (recipes' DeepSpeed configs, prompts, suites, bundle
manifests, eval reports, a draft's vocabulary) goes through :func:`read_json` or
:func:`read_jsonl`: a missing path, a folder, bytes that are not UTF-8, invalid JSON or a value
of the wrong kind each give the caller's error type with the path, what is wrong and what to do.

Everything draftkit writes goes to a temporary sibling first and is renamed into place:
``os.replace`` is atomic on POSIX, so readers see the old file or the new one, never a mix.
The data is synced before the rename and the folder after it, so a power cut or a host crash
(not only a killed process) cannot leave a renamed file whose content never reached the disk.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import io
import json
import os
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import Any, Iterable, Iterator

from filelock import FileLock, Timeout

from draftkit.bundle_checks import file_hash
from draftkit.errors import DraftkitError


def read_text(path: str | Path, what: str, remedy: str,
              error: type[DraftkitError] = DraftkitError) -> str:
    """The UTF-8 text of a file (a ``.gz`` file's decompressed, as HumanEval ships its
    questions; a leading byte-order mark dropped, as some editors write one), or ``error``:
    "<what> <path> does not exist / is a folder / ...; <remedy>"."""
    path = Path(path)
    if not path.exists():
        raise error(f"{what} {path} does not exist; {remedy}")
    if path.is_dir():
        raise error(f"{what} {path} is a folder; {remedy}")
    data = path.read_bytes()
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise error(f"{what} {path} is not whole gzip data ({e}); {remedy}") from None
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise error(f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x}); "
                    f"{remedy}") from None


def read_json(path: str | Path, what: str, remedy: str,
              error: type[DraftkitError] = DraftkitError, kind: type = dict) -> Any:
    """A JSON file whose top level is a ``kind`` (a JSON object unless told otherwise)."""
    text = read_text(path, what, remedy, error)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{what} {path} is not valid JSON (line {e.lineno}: {e.msg}); "
                    f"{remedy}") from None
    if not isinstance(value, kind):
        name = "a JSON object" if kind is dict else f"JSON of type {kind.__name__}"
        raise error(f"{what} {path} is not {name}; {remedy}")
    return value


def read_jsonl(path: str | Path, what: str, remedy: str,
               error: type[DraftkitError] = DraftkitError) -> list[tuple[str, Any]]:
    """("<path>:<line>", value) for each non-blank line of a JSONL file, the first element
    naming the line for the caller's own checks of each value."""
    text = read_text(path, what, remedy, error)
    rows = []
    # only \n, \r and \r\n end a line: str.splitlines would also split at U+2028 and other
    # separators JSON strings may hold as they are
    for number, line in enumerate(io.StringIO(text, newline=None), start=1):
        if not line.strip():  # blank lines, such as a trailing one, are not rows
            continue
        try:
            rows.append((f"{path}:{number}", json.loads(line)))
        except json.JSONDecodeError as e:
            raise error(f"{path}:{number}: invalid JSON ({e.msg}); {remedy}") from None
    return rows


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would make it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_path(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def cut_torn_tail(path: Path) -> None:
    """Drop a torn last line (a run killed mid-write): the next append would glue its answer
    onto it, and a reader that skips lines it cannot parse would then lose that answer with
    the torn line."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        f.truncate(f.read().rfind(b"\n") + 1)


def fsync_path(path: Path | str) -> None:
    """Sync a file's data, or a folder's entries (a rename into it reaches the disk only
    then)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """Sync every file under ``folder``, then every folder, deepest first."""
    for root, _, files in os.walk(folder, topdown=False):
        for name in files:
            fsync_path(os.path.join(root, name))
        fsync_path(root)


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def append_jsonl(path: Path, obj) -> None:
    """Append one JSON line; a line is written whole with a single write call."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_dir(path: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory next to ``path``; rename it to ``path`` on success.

    On any exception the temporary directory is removed and ``path`` is untouched. With
    ``overwrite`` an existing ``path`` is replaced only after the new one is complete.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    except OSError as e:  # the hidden temporary name means nothing to the user: name theirs
        raise OSError(e.errno, e.strerror, str(path)) from None
    tmp.chmod(0o777 & ~_umask())  # as mkdir would make it: mkdtemp's 0700 hides a bundle
    # from a serving process of another user
    try:
        yield tmp
        fsync_tree(tmp)  # its content on disk before the name points at it
        if path.exists():
            if not overwrite:
                raise FileExistsError(path)
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        fsync_path(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def one_builder(lock: Path, what: str) -> Iterator[None]:
    """Hold the file lock ``lock`` while building ``what``, a cache runs share: a second run
    waits for the first (and says so), then reads what it built instead of writing it too."""
    held = FileLock(lock)
    try:
        held.acquire(timeout=0)
    except Timeout:
        print(f"{what}: another run is building it; waiting for it", flush=True)
        held.acquire()
    try:
        yield
    finally:
        held.release()


def take_lock(lock: Path, busy: str) -> Any:
    """The file lock ``lock``, held now (released by the caller, from any thread), or a
    one-line DraftkitError ``busy`` where another process holds it: for work that must not run
    twice at once (two servers recording into one folder, two refreshes writing one bundle)."""
    held = FileLock(lock, thread_local=False)
    try:
        held.acquire(timeout=0)
    except Timeout:
        raise DraftkitError(busy) from None
    return held


def recover_writes(folder: Path, names: Iterable[str] = ("*",)) -> None:
    """Undo what kills inside :func:`atomic_dir` and :func:`atomic_write_bytes` left in
    ``folder`` for the files and folders ``names`` (glob patterns): one set aside by
    ``overwrite`` whose replacement never landed is moved back; then temporary and set-aside
    leftovers are removed. Call it before anything writes there (a live write's temporary
    would go too)."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    olds = sorted(p for n in names for p in folder.glob(f".{n}.old-*"))
    for old in olds:
        path = folder / old.name[1:].rsplit(".old-", 1)[0]
        if not path.exists():
            os.replace(old, path)
    for leftover in [p for n in names for p in (*folder.glob(f".{n}.old-*"),
                                                *folder.glob(f".{n}.*.tmp"),
                                                *folder.glob(f".{n}.tmp"))]:
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks (weights can be large): the bundle checks' own
    function (draftkit.bundle_checks, which bundles carry and so imports nothing of draftkit)."""
    return file_hash(path)
