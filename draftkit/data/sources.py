"""Reading training rows through ``datasets``: local JSONL / Parquet / text files or the hub.

A source's files are read one by one (each row's origin names its file and row), its
``columns`` renamed to draftkit's, and each row becomes an :class:`Example` of one domain by
the shape it is in (:mod:`draftkit.data.shapes`: ShareGPT or SpecForge ``conversations``,
OpenAI ``messages``, ``prompt`` / ``response``, ``prompt_ids`` / ``response_ids``, or
``text``; a ``.txt`` file is one ``text`` row, a ``document`` that
:func:`draftkit.data.pack.passages` cuts into runs of whole lines).

The domain comes from the source (``domain: code``) or from the row's ``domain`` column.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import fsspec

from draftkit.data.shapes import Example, to_example
from draftkit.errors import DraftkitError
from draftkit.extras import require

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text",
            ".text": "text"}


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

    def blank(file: str) -> bool:
        try:
            if Path(file).stat().st_size == 0:
                return True
            if fmt == "parquet":
                import pyarrow.parquet as pq  # optional extra: train (datasets')

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
    import datasets  # optional extra: train

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


def load_examples(sources: list) -> dict[str, list[Example]]:
    """All sources, grouped by domain in first-seen order. Empty inputs are errors."""
    by_domain: dict[str, list[Example]] = {}
    for src in sources:
        fmt = source_format(src)
        document = fmt == "text"
        for origin, row in load_rows(src, fmt):
            ex = to_example(row, src.domain, origin, src.shape)
            ex.heldout, ex.document, ex.repeat = src.heldout, document, src.repeat
            by_domain.setdefault(ex.domain, []).append(ex)
    if not by_domain:
        raise DraftkitError("the dataset is empty; list data files under data.sources")
    return by_domain
