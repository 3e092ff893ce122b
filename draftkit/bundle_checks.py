"""What a bundle must be before any value of it is used: the checks ``draftkit check``, every
command that loads a bundle, and the bundle's own ``serving/preflight.py`` run. One
implementation, standard library only, copied into each bundle beside ``preflight.py``
(the serving machine need not have draftkit), so the script that launches an engine refuses
what ``check`` refuses.

The checks, in the order a reader runs them: the manifest's seal (:func:`check_seal`: its own
hash, ``manifest_sha256``, over canonical JSON), its values in range (:func:`check_values`),
every file it lists with its sha256 and none it does not (:func:`check_files`), and every value
the bundle states in two places stated alike (:func:`check_consistent`). Each failure is one
:class:`BundleError` line naming the field or file; draftkit turns it into its own error type.

Long: the bundle's launcher runs a copy of this file, so every check it runs (and the target's
hash it compares) is here; split in two, the copies would have to be kept in step.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from pathlib import Path

NAME = "draftkit.json"
SIGNATURE = "draftkit.sig"  # model-signing's signature of every other file (draftkit.signing)
HASH = "manifest_sha256"
REMEDY = "re-export the bundle with `draftkit export`"
DTYPES = ("float32", "float16", "bfloat16")
_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


class BundleError(Exception):
    """What is wrong with a bundle, in one line."""


# --- the seal and the files -----------------------------------------------------------------------

def content_hash(manifest: dict) -> str:
    """sha256 of ``manifest`` without its own hash, as canonical JSON."""
    body = {k: v for k, v in manifest.items() if k != HASH}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def check_seal(manifest: dict, where: str) -> None:
    """The manifest's own hash present and its own."""
    recorded = manifest.get(HASH)
    if recorded is None:
        raise BundleError(f"{where} has no {HASH} (exported by a draftkit before format 2, or "
                          f"the hash was removed), so its figures cannot be trusted; {REMEDY}")
    if recorded != content_hash(manifest):
        raise BundleError(f"{where} was edited after export: its content does not match its "
                          f"{HASH}; {REMEDY}")


def file_hash(path: Path) -> str:
    """Hex sha256 of a file, read in chunks (weights can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def target_hash(folder: Path) -> str:
    """A target folder's content hash, as a bundle records it: sha256 over config.json's and
    each safetensors file's name and sha256, in that order.

    A target's weights are read once, not by every command (16 GB for an 8B target): each
    file's sha256 is kept in a record in draftkit's cache (``$DRAFTKIT_CACHE/file-hashes/``),
    keyed by the file's size, inode and modification and status-change times, and taken from
    there while they stay. Any write to the file changes its status-change time, which cannot
    be set back, so an edited file is read again. A file the Hugging Face cache names by its
    sha256 (``blobs/<sha256>``) is taken by that name on first sight."""
    files = sorted(folder.glob("config.json")) + sorted(folder.glob("*.safetensors"))
    known, seen = _read_record(folder), {}
    h = hashlib.sha256()
    for f in files:
        stamp = _stamp(f)
        entry = known.get(f.name)
        digest = entry["sha256"] if entry is not None and entry.get("stamp") == stamp else \
            _named_digest(f) or file_hash(f)
        seen[f.name] = {"stamp": stamp, "sha256": digest}
        h.update(f.name.encode())
        h.update(digest.encode())
    if seen != known:
        _write_record(folder, seen)
    return h.hexdigest()


def _stamp(path: Path) -> list[int]:
    st = path.stat()  # the file a hub-cache link leads to
    return [st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns]


def _named_digest(path: Path) -> str | None:
    """The sha256 the Hugging Face cache names a weight blob by, where it does."""
    real = path.resolve()
    name = real.name
    ok = real.parent.name == "blobs" and len(name) == 64 and \
        all(c in "0123456789abcdef" for c in name)
    return name if ok else None


def _record_path(folder: Path) -> Path:
    root = os.environ.get("DRAFTKIT_CACHE") or Path.home() / ".cache" / "draftkit"
    key = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:32]
    return Path(root) / "file-hashes" / f"{key}.json"


def _read_record(folder: Path) -> dict:
    try:
        record = json.loads(_record_path(folder).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) and all(
        isinstance(v, dict) and isinstance(v.get("sha256"), str) for v in record.values()) \
        else {}


def _write_record(folder: Path, record: dict) -> None:
    """The record, written whole (a reader never sees half of it); a cache that cannot be
    written costs a read next time, nothing else."""
    path = _record_path(folder)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def bundle_files(root: Path) -> list[Path]:
    """Every file in the bundle at ``root`` but the manifest and its signature: what the
    manifest's ``files`` must list."""
    return sorted(p for p in root.rglob("*")
                  if p.is_file() and p.relative_to(root).as_posix() not in (NAME, SIGNATURE))


def check_plain(root: Path) -> None:
    """No symbolic link in the bundle: a link would have the checks (and their messages) read
    a file outside it."""
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            raise BundleError(f"bundle {root} holds a symbolic link, "
                              f"{path.relative_to(root).as_posix()}; a bundle is plain files: "
                              f"copy it with links followed (cp -rL), or {REMEDY}")


def check_files(root: Path, files: dict) -> None:
    """Every file ``files`` lists present with its sha256 and none it does not list. Every
    file is hashed every time (a bundle's head is ~15 MB: ~30 ms): a cache keyed by path, size
    and mtime would take a file edited in place with its size and mtime kept."""
    for rel, digest in files.items():
        path = root / rel
        if not path.is_file():
            raise BundleError(f"bundle file {rel} is missing; {REMEDY}")
        if file_hash(path) != digest:
            raise BundleError(f"bundle file {rel} does not match its sha256 in {NAME} "
                              f"(modified or truncated); {REMEDY}")
    extra = [p.relative_to(root).as_posix() for p in bundle_files(root)
             if p.relative_to(root).as_posix() not in files]
    if extra:
        raise BundleError(f"bundle holds a file its manifest does not list: {extra[0]}; remove "
                          f"it or {REMEDY}")


# --- ranges ---------------------------------------------------------------------------------------

def check_values(manifest: dict, where: str) -> None:
    """Refuse a manifest whose structure or figures are out of range, naming the field."""
    def bad(field: str, value, want: str) -> BundleError:
        return BundleError(f"{where}: {field} is {_shown(value)}, {want}; {REMEDY}")

    for key in ("target", "draft", "files"):
        if not isinstance(manifest.get(key), dict):
            raise bad(key, manifest.get(key), "not a mapping")
    for rel, digest in manifest["files"].items():
        if not (isinstance(digest, str) and len(digest) == 64):
            raise bad(f"files.{rel}", digest, "not a sha256")
    k = manifest.get("num_speculative_tokens")
    if not _is_int(k) or k < 0:
        raise bad("num_speculative_tokens", k, "not a whole number of at least 0")
    be = manifest.get("break_even_batch")
    if be is not None and (not _is_int(be) or be < 1):
        raise bad("break_even_batch", be, "not a batch size of at least 1")
    domains = manifest.get("domains", {})
    if not isinstance(domains, dict):
        raise bad("domains", domains, "not a mapping")
    for name, row in domains.items():
        if not isinstance(row, dict):
            raise bad(f"domains.{name}", row, "not a mapping")
        for figure, ok, want in _FIGURES:
            value = row.get(figure)
            if value is not None and not (_is_number(value) and ok(value)):
                raise bad(f"domains.{name}.{figure}", value, want)
        if row.get("k") is not None and (not _is_int(row["k"]) or row["k"] < 0):
            raise bad(f"domains.{name}.k", row["k"], "not a whole number of at least 0")
    if manifest.get("serving") is not None:  # added later: bundles before it have none
        _check_serving(manifest["serving"], bad)
    signing = manifest.get("signing")
    if signing is not None and not (
            isinstance(signing, dict) and signing.get("method") in ("key", "certificate", "none")
            and (signing["method"] == "none" or (
                isinstance(signing.get("key_id"), str) and len(signing["key_id"]) == 64 and
                isinstance(signing.get("public_key"), str)))):
        raise bad("signing", signing, "not a signing entry (method key, certificate or none; "
                  "a signed one's key_id and public_key)")


def _check_serving(serving, bad) -> None:
    """The ``serving`` entry's structure and values."""
    if not isinstance(serving, dict):
        raise bad("serving", serving, "not a mapping")
    if serving.get("dtype") not in DTYPES:
        raise bad("serving.dtype", serving.get("dtype"), f"not one of {', '.join(DTYPES)}")
    tp = serving.get("tp_sizes")
    if not (isinstance(tp, list) and all(_is_int(n) and n >= 1 for n in tp)):
        raise bad("serving.tp_sizes", tp, "not a list of sizes of at least 1")
    k = serving.get("num_speculative_tokens")
    if not _is_int(k) or k < 1:
        raise bad("serving.num_speculative_tokens", k, "not a whole number of at least 1")
    table = serving.get("k_per_batch_size")
    if table is not None and not (isinstance(table, list) and all(
            isinstance(r, list) and len(r) == 3 and all(_is_int(x) for x in r) and
            1 <= r[0] <= r[1] and r[2] >= 0 for r in table)):
        raise bad("serving.k_per_batch_size", table, "not a list of [first batch size, last, "
                  "K >= 0]")
    engines = serving.get("engines")
    if not (isinstance(engines, dict) and all(isinstance(engines.get(e), dict)
                                              for e in ("vllm", "sglang"))):
        raise bad("serving.engines", engines, "not a mapping with vllm and sglang entries")
    if not isinstance(serving.get("target"), str):
        raise bad("serving.target", serving.get("target"), "not a path")


def _shown(value) -> str:
    """A value for a message: a number, a short string or a short list of them as it is,
    anything else by its type (a message never echoes a file's content at length)."""
    scalar = (type(None), bool, int, float, str)
    plain = isinstance(value, scalar) or (isinstance(value, list) and
                                          all(isinstance(v, scalar) for v in value))
    return repr(value) if plain and len(repr(value)) <= 80 else f"a {type(value).__name__}"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_FIGURES = (  # (field, in range, what it must be)
    ("alpha", lambda x: 0.0 <= x <= 1.0, "not an acceptance rate in [0, 1]"),
    ("tau", lambda x: x >= 1.0, "not an accepted length of at least 1"),
    ("c", lambda x: x >= 0.0, "not a cost ratio of at least 0"),
    ("speedup_measured", lambda x: x > 0.0, "not a speedup above 0"),
    ("speedup_predicted", lambda x: x > 0.0, "not a speedup above 0"),
)


# --- one value, two places ------------------------------------------------------------------------

def check_consistent(root: Path, manifest: dict) -> list[str]:
    """Every value the bundle at ``root`` states in two places stated the same in both, or one
    BundleError line naming both places: K (the top level, the serving entry,
    serving/vllm.json), the draft vLLM is given, parallel drafting (the serving entry,
    serving/vllm.json, the draft's config.json), the dtype (the draft entry, the serving entry,
    the draft's config.json, its stored weights), an EAGLE-3 head's tapped layers and
    vocabulary size (the draft entry, its config.json, its tensors), the serving target and
    the target entry, the measured temperature and the report entry. Reads the draft's
    config.json and safetensors headers only (milliseconds). Figures measured apart (a
    domain's alpha and tau) are range-checked, not compared. Returns notes that are not
    faults (a moved bundle)."""
    def differ(a: str, b: str) -> BundleError:
        return BundleError(f"{root}: {a} but {b}; the bundle disagrees with itself: {REMEDY}")

    serving, draft = manifest.get("serving"), manifest["draft"]
    k, notes = manifest["num_speculative_tokens"], []
    if serving is not None:
        if serving["num_speculative_tokens"] != max(k, 1):
            raise differ(f"{NAME} num_speculative_tokens is {k}",
                         f"serving.num_speculative_tokens is {serving['num_speculative_tokens']}")
        if draft.get("dtype") is not None and draft["dtype"] != serving["dtype"]:
            raise differ(f"{NAME} draft.dtype is {draft['dtype']}",
                         f"serving.dtype is {serving['dtype']}")
        target = manifest["target"]
        if target.get("kind") != "hub" and serving["target"] != target.get("path"):
            raise differ(f"serving.target is {serving['target']}",
                         f"target.path is {target.get('path')}")
        temperature = (manifest.get("report") or {}).get("temperature")
        measured = serving.get("measured_temperature")
        if None not in (temperature, measured) and temperature != measured:
            raise differ(f"serving.measured_temperature is {measured}",
                         f"report.temperature is {temperature}")
    if (manifest.get("report") is not None or manifest.get("domains")) and \
            manifest.get("measured") is False:
        raise differ(f"{NAME} measured is false", "it records a report's figures")
    _check_draft(root, manifest, differ)  # first: an edited head is named as such
    if serving is not None:
        notes += _check_vllm_json(root, manifest, differ)
    return notes


def _check_draft(root: Path, manifest: dict, differ) -> None:
    """The draft entry against draft/config.json and the stored tensors."""
    draft, serving = manifest["draft"], manifest.get("serving")
    config = read_config(root / "draft" / "config.json")
    stored, dtype = config.get("torch_dtype") or config.get("dtype"), draft.get("dtype")
    if dtype is not None and stored not in (None, dtype):
        raise differ(f"{NAME} draft.dtype is {dtype}", f"draft/config.json says {stored}")
    tensors = tensor_headers(root / "draft")
    floats = sorted({_SAFETENSORS_DTYPES.get(t["dtype"], t["dtype"]) for t in tensors.values()
                     if t.get("dtype") in _SAFETENSORS_DTYPES})
    if dtype is not None and floats and floats != [dtype]:
        raise differ(f"{NAME} draft.dtype is {dtype}",
                     f"draft/'s weights are stored as {', '.join(floats)}")
    if draft.get("kind") != "eagle3":
        return
    spec = config.get("speculators_config")
    if serving is not None and isinstance(spec, dict):  # what `vllm serve draft/` runs
        proposed = (spec.get("proposal_methods") or [{}])[0].get("speculative_tokens")
        verifier = (spec.get("verifier") or {}).get("name_or_path")
        if proposed != serving["num_speculative_tokens"]:
            raise differ(f"draft/config.json's speculators_config proposes K {_shown(proposed)}",
                         f"serving.num_speculative_tokens is {serving['num_speculative_tokens']}")
        if verifier != serving["target"]:
            raise differ(f"draft/config.json's speculators_config verifier is {_shown(verifier)}",
                         f"serving.target is {serving['target']}")
    layers = config.get("eagle_aux_hidden_state_layer_ids")
    if draft.get("eagle_aux_hidden_state_layer_ids") != layers:
        raise differ(f"{NAME} records tapped layers "
                     f"{draft.get('eagle_aux_hidden_state_layer_ids')}",
                     f"draft/config.json {_shown(layers)}")
    n = draft.get("draft_vocab_size")
    if n is not None and config.get("draft_vocab_size") != n:
        raise differ(f"{NAME} draft.draft_vocab_size is {n}",
                     f"draft/config.json says {_shown(config.get('draft_vocab_size'))}")
    parallel = serving["engines"]["vllm"].get("parallel_drafting") if serving else None
    if serving is not None and bool(parallel) != bool(config.get("parallel_drafting")):
        raise differ(f"{NAME} serving.engines.vllm.parallel_drafting is {parallel}",
                     f"draft/config.json parallel_drafting is "
                     f"{_shown(config.get('parallel_drafting'))}")
    rows = tensors.get("lm_head.weight", {}).get("shape", [n])[0]
    if n is not None and rows != n:
        raise differ(f"{NAME} draft.draft_vocab_size is {n}",
                     f"draft/model.safetensors' lm_head.weight has {rows} rows")


def _check_vllm_json(root: Path, manifest: dict, differ) -> list[str]:
    """serving/vllm.json as export writes it from the serving entry, and the head it names
    this bundle's draft/ by content: the same folder, or (a moved or copied bundle) a folder
    whose files are draft/'s, byte for byte, or one that is gone. A folder with other files
    is an edit."""
    path = root / "serving" / "vllm.json"
    if not path.is_file():
        return []
    written = read_config(path)
    serving, named = manifest["serving"], written.get("model")
    draft = root / "draft"
    if not (isinstance(named, str) and Path(named).name == "draft"):
        raise differ(f"serving/vllm.json names the draft at {_shown(named)}",
                     f"the bundle's draft is {draft}")
    notes = []
    if Path(named).resolve() != draft.resolve():
        if Path(named).is_dir() and not same_files(Path(named), manifest["files"], "draft/"):
            raise differ(f"serving/vllm.json names the draft at {named}, whose files are not "
                         f"this bundle's draft/", "its manifest lists draft/'s (an edit, not "
                         "a move)")
        notes.append(f"the bundle has moved; serving/vllm.json names the draft at {named}, "
                     f"now at {draft} (serving/vllm.sh and sglang.sh find it where it is)")
    table = serving.get("k_per_batch_size")
    vllm = serving["engines"]["vllm"]
    want = {"method": vllm.get("method"),
            "num_speculative_tokens": max([serving["num_speculative_tokens"]] +
                                          [k for _, _, k in table or []]),
            "num_speculative_tokens_per_batch_size": table or None,
            "parallel_drafting": vllm.get("parallel_drafting")}
    for key, value in want.items():
        if written.get(key) != value:
            raise differ(f"serving/vllm.json says {key} {_shown(written.get(key))}",
                         f"{NAME}'s serving entry makes it {value!r}")
    return notes


def same_files(folder: Path, files: dict, prefix: str) -> bool:
    """Whether ``folder`` holds exactly the files ``files`` lists under ``prefix``, each with
    its sha256."""
    want = {rel[len(prefix):]: digest for rel, digest in files.items() if rel.startswith(prefix)}
    held = {p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if p.is_file()}
    return held.keys() == want.keys() and all(file_hash(held[r]) == d for r, d in want.items())


def read_config(path: Path) -> dict:
    """A JSON object the bundle holds (a config), {} where the file is not there."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        raise BundleError(f"bundle file {path} does not read as JSON; {REMEDY}") from None
    if not isinstance(value, dict):
        raise BundleError(f"bundle file {path} is not a JSON object; {REMEDY}")
    return value


def tensor_headers(folder: Path) -> dict[str, dict]:
    """name -> {"dtype", "shape"} of every tensor in ``folder``'s safetensors files, read from
    their headers (no weights, no torch)."""
    out: dict[str, dict] = {}
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with open(file, "rb") as f:
                size = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(size))
            if not isinstance(header, dict) or not all(isinstance(v, dict)
                                                       for v in header.values()):
                raise ValueError
        except (OSError, ValueError, struct.error, MemoryError, OverflowError):
            raise BundleError(f"{file} is not a safetensors file (its header does not read); "
                              f"{REMEDY}") from None
        out.update({k: v for k, v in header.items() if k != "__metadata__"})
    return out

