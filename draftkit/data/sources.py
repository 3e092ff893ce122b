"""Reading training rows through ``datasets``: local JSONL / Parquet / text files or the hub.

Each row becomes an :class:`Example` of one domain, in one of three shapes:

- ``messages``: an OpenAI-style chat; a final assistant turn is the response;
- ``prompt`` (and optionally ``response``): a user prompt and the answer to it;
- ``text``: plain text, every token trained; a ``.txt`` file is one such row, a ``document``
  that :func:`draftkit.data.pack.passages` cuts into runs of whole lines;
- ``prompt_ids`` and ``response_ids``: a rendered prompt and its answer as the target's token
  ids (served traffic, as ``draftkit serve --record`` keeps it), trained as they are.

The domain comes from the source (``domain: code``) or from the row's ``domain`` column. A
source's ``columns`` renames other columns to these first (``{question: prompt}``).
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftkit.errors import DraftkitError
from draftkit.extras import require

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text",
            ".text": "text"}


@dataclass
class Example:
    domain: str
    messages: list[dict[str, str]] | None = None  # chat up to (not including) the response
    response: str | None = None  # the assistant's answer, if the row has one
    text: str | None = None  # plain text rows
    origin: str = ""  # "file:row" for error messages
    heldout: bool = True  # may be drawn for the held-out split (its source's ``heldout``)
    document: bool = False  # a whole text file, cut into passages before the held-out split
    prompt_ids: list[int] | None = None  # a prompt already rendered and tokenized
    response_ids: list[int] | None = None  # ... and its answer's ids
    repeat: int = 1  # trained this many times an epoch (its source's ``repeat``)


def source_format(src: Any) -> str:
    """The reader a source needs (json / parquet / text / hub); a source that cannot be read
    as it is written is an error, which ``draftkit distill --dry-run`` reports too."""
    fmt = _format_of(src)
    if fmt != "hub" and Path(src.path).is_dir():
        raise DraftkitError(f"{src.path} is a folder; give its files, such as "
                            f"{Path(src.path) / '*.jsonl'}")
    if src.name and fmt != "hub":
        raise DraftkitError(f"{src.path}: name '{src.name}' picks a hub dataset's config and a "
                            f"local file has none; remove it from the source")
    if src.split != "train" and fmt != "hub":
        raise DraftkitError(f"{src.path}: split '{src.split}' picks a hub dataset's split and a "
                            f"local file has none; remove it from the source")
    return fmt


def _format_of(src: Any) -> str:
    if src.format != "auto":
        return src.format
    name = Path(src.path).name
    for ext in (".gz", ".bz2", ".xz", ".zst"):
        name = name.removesuffix(ext)
    fmt = _FORMATS.get(Path(name).suffix)
    if fmt is None:
        raise DraftkitError(f"cannot tell the format of {src.path}; name it .jsonl, .parquet "
                            f"or .txt, or set format: json | parquet | text in the source")
    return fmt


def _files_with_rows(pattern: str, fmt: str) -> list[str]:
    """The local files ``pattern`` matches that hold rows (blank json and text files and
    0-row parquet files dropped), or ``[pattern]`` where it matches no local file.

    ``datasets`` fails on empty files with messages that do not say so (StopIteration, or "An
    error occurred while generating the dataset"), so they never reach it.
    """
    import fsspec

    def blank(file: str) -> bool:
        try:
            if Path(file).stat().st_size == 0:
                return True
            if fmt == "parquet":
                import pyarrow.parquet as pq

                return pq.read_metadata(file).num_rows == 0
            with fsspec.open(file, "rb", compression="infer") as f:  # .gz, .bz2, .xz, .zst
                return not any(chunk.strip() for chunk in iter(lambda: f.read(1 << 20), b""))
        except Exception:  # unreadable: datasets says why when it reads it
            return False

    if Path(pattern).is_file():  # a name such as rows[v2].jsonl is itself, not a pattern
        return [] if blank(pattern) else [pattern]
    files = sorted(f for f in glob.glob(pattern, recursive=True) if Path(f).is_file())
    return [f for f in files if not blank(f)] if files else [pattern]


def _load(src: Any, fmt: str, file: str):
    """One file of the source (its hub id for the hub) as a ``datasets.Dataset``; a load
    failure is one line naming it."""
    require("train", "reading training data", ("datasets",))
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # we report its failures, once
    escaped = glob.escape(file)  # datasets globs data_files: rows[v2].jsonl is itself
    try:
        if fmt == "hub":
            return datasets.load_dataset(src.path, src.name, split=src.split)
        if fmt == "text":  # a file is one document: lines keep their newlines and context
            return datasets.load_dataset("text", data_files=escaped, split="train",
                                         sample_by="document")
        return datasets.load_dataset(fmt, data_files=escaped, split="train")
    except Exception as e:
        raise _unreadable(file, fmt, e) from None


def _unreadable(path: str, fmt: str, e: BaseException) -> DraftkitError:
    """One line for a source that does not load: the first cause in ``e``'s chain that says
    more than ``datasets``' "An error occurred while generating the dataset"."""
    while type(e).__name__ == "DatasetGenerationError" and (e.__cause__ or e.__context__):
        e = e.__cause__ or e.__context__
    if isinstance(e, UnicodeDecodeError):
        return DraftkitError(f"{path} is not UTF-8 text (byte {e.object[e.start]:#04x} at "
                             f"offset {e.start}); save it as UTF-8")
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    where = "the hub is not reachable or the dataset does not exist" if fmt == "hub" \
        else "check the file"
    return DraftkitError(f"cannot read {path} as {fmt} ({msg}); {where}")


def load_rows(src: Any, fmt: str) -> list[tuple[str, dict]]:
    """The raw rows of one source (a ``DataSource`` from the recipe, read as ``fmt``, its
    :func:`source_format`), its ``columns`` renamed, each with its origin ("file:row").

    Each file of a glob is read on its own, so an origin names the file the row is in and
    files need not share one schema. A source without rows is an error: a blank local file,
    or an empty hub split.
    """
    files = [src.path] if fmt == "hub" else _files_with_rows(src.path, fmt)
    parts = [(f if fmt == "hub" else Path(f).name, _load(src, fmt, f)) for f in files]
    if sum(len(ds) for _, ds in parts) == 0:
        fix = f"check its split '{src.split}' and name" if fmt == "hub" else \
            "give a non-empty data file"
        raise DraftkitError(f"{src.path} has no rows; {fix}")
    rows: list[tuple[str, dict]] = []
    for name, ds in parts:
        missing = [c for c in src.columns if c not in ds.column_names]
        if missing:
            raise DraftkitError(f"{name} has no column '{missing[0]}' for the source's "
                                f"columns to rename (its columns: "
                                f"{', '.join(ds.column_names)}); fix the mapping")
        replaced = [c for c in src.columns.values() if c in ds.column_names
                    and c not in src.columns]
        try:  # rows are decoded as they are read
            rows += [(f"{name}:{i + 1}", row) for i, row in
                     enumerate(ds.remove_columns(replaced).rename_columns(src.columns))]
        except UnicodeDecodeError as e:
            raise _unreadable(name, fmt, e) from None
        if src.max_rows is not None and len(rows) >= src.max_rows:
            return rows[:src.max_rows]
    return rows


def to_example(row: dict, domain: str | None, origin: str) -> Example:
    """One raw row as an Example; rows of no known shape are an error naming the row."""
    domain = domain or row.get("domain")
    if not domain:
        raise DraftkitError(f"{origin}: the row has no 'domain' column and its source sets no "
                            f"domain; add domain: NAME to the source")
    if row.get("messages"):
        for j, m in enumerate(row["messages"]):
            # Arrow gives every message the keys of all rows' messages, so absent ones are None.
            if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)):
                has = ", ".join(f"{k} ({type(v).__name__})" for k, v in m.items()
                                if v is not None) if isinstance(m, dict) else type(m).__name__
                raise DraftkitError(f"{origin}: message {j + 1} has {has or 'nothing'}; a chat "
                                    f"message needs a 'role' and a 'content' string (text "
                                    f"only); fix the row")
        messages = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
        response = None
        if messages[-1]["role"] == "assistant":
            response = messages[-1]["content"]
            messages = messages[:-1]
        if not messages:
            raise DraftkitError(f"{origin}: the chat has only an assistant turn")
        return Example(str(domain), messages=messages, response=response, origin=origin)
    if row.get("prompt_ids") is not None:
        return _ids_example(row, str(domain), origin)
    row = dict(row)
    for key in ("prompt", "response", "text"):
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row[key] = str(value)  # a numeric answer (gsm8k-style) is its digits
        elif value is not None and not isinstance(value, str):
            raise DraftkitError(f"{origin}: '{key}' is a {type(value).__name__} "
                                f"({value!r:.40}); it must be a string: fix the row")
    if row.get("prompt"):
        return Example(str(domain), messages=[{"role": "user", "content": row["prompt"]}],
                       response=row.get("response") or None, origin=origin)
    if row.get("text"):
        return Example(str(domain), text=row["text"], origin=origin)
    raise DraftkitError(f"{origin}: the row has no non-empty 'messages', 'prompt', 'text' or "
                        f"'prompt_ids' column (columns: {', '.join(row) or 'none'})")


def _ids_example(row: dict, domain: str, origin: str) -> Example:
    """A row of token ids: a rendered prompt and the answer to it, both non-empty."""
    ids = {key: row.get(key) for key in ("prompt_ids", "response_ids")}
    for key, value in ids.items():
        if not (isinstance(value, list) and value and
                all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)):
            raise DraftkitError(f"{origin}: '{key}' must be a non-empty list of token ids "
                                f"(non-negative integers); fix the row")
    return Example(domain, prompt_ids=ids["prompt_ids"], response_ids=ids["response_ids"],
                   origin=origin)


def load_examples(sources: list) -> dict[str, list[Example]]:
    """All sources, grouped by domain in first-seen order. Empty inputs are errors."""
    by_domain: dict[str, list[Example]] = {}
    for src in sources:
        fmt = source_format(src)
        document = fmt == "text"
        for origin, row in load_rows(src, fmt):
            ex = to_example(row, src.domain, origin)
            ex.heldout, ex.document, ex.repeat = src.heldout, document, src.repeat
            by_domain.setdefault(ex.domain, []).append(ex)
    if not by_domain:
        raise DraftkitError("the dataset is empty; list data files under data.sources")
    return by_domain
