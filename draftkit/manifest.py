"""The bundle manifest, ``draftkit.json``: one typed record (:class:`Manifest`), written by
:func:`write_manifest` and read back only by :func:`read_manifest`, so nothing edited in it goes
unnoticed. The record's fields are the file's keys in the order written, so a manifest read and
written again keeps its bytes (:mod:`draftkit.records`); its per-domain figures are narrowed from
the eval report's own rows (:class:`DomainEntry`). A key no field names (a hand edit, or a later
draftkit's field) is refused by its dotted name. The bundle's ``serving/preflight.py``
(:mod:`draftkit.export.preflight`) runs where draftkit is not installed and reads the JSON itself.

A bundle's weights are hashed file by file in the manifest, and the figures serving decisions
rest on (K, alpha, tau, c, the break-even batch) live in the manifest itself. So the manifest
carries a hash of its own content (``manifest_sha256``: sha256 of the manifest without that key,
as canonical JSON: keys sorted, no spaces), written last by :func:`seal` and checked by
:func:`read_manifest` before any value is used, by ``draftkit check`` and by every command that
loads a bundle. The values are range-checked first, so an edit that breaks a range is named by
its field; any other edit is named by the hash. A manifest without the hash (an earlier
draftkit's, or one whose hash was deleted) is refused the same way: re-exporting is cheap,
trusting an edited figure is not.

Fields added later are optional, so a bundle exported before them still checks: ``serving``
(what the engines need: dtype, tensor-parallel sizes, K per batch size, releases;
:mod:`draftkit.export.engines`), within it vLLM's ``sampled_broken`` and ``parallel_drafting``
(a parallel head's), and the draft's ``dtype``. Where present they are range-checked as the
rest; where absent they read as None and are written back absent.

Every command that loads a bundle checks its files against their hashes (:func:`check_files`,
once per file per process) and every value the bundle states in two places against the other
(:func:`check_consistent`), as ``draftkit check`` does.

Long: the record and its checks, against itself and against the files it lists, are one
concept, what a bundle says it is; apart, a field added to one would be missed by the other.
"""

from __future__ import annotations

import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from draftkit.errors import ModelError
from draftkit.io import read_json
from draftkit.records import Record, added_later

NAME = "draftkit.json"
FORMAT = 2  # 2: the manifest hashes itself
HASH = "manifest_sha256"
_REMEDY = "re-export the bundle with `draftkit export`"


# --- the record -----------------------------------------------------------------------------------
# Reading is lenient about keys a manifest lacks (they read as None: minimal manifests in tests,
# entries an earlier draftkit did not write) and strict about keys no field names.

@dataclass(kw_only=True)
class TargetEntry(Record):
    """The target the draft was exported for: where it was, and its identity."""

    name: str
    path: str
    kind: str  # how it was given: local, hub, embedded, gguf, bundle (ResolvedModel.kind)
    revision: str | None = added_later()  # its hub snapshot; no key outside the hub cache
    sha256: str | None = None  # draftkit.models.resolve.content_hash


@dataclass(kw_only=True)
class DraftEntry(Record):
    """The draft as stored in ``draft/``."""

    kind: str | None  # standalone or eagle3 (bundles before EAGLE-3 record none: standalone)
    name: str
    source: str  # the folder it was exported from
    lora_merged: bool
    num_parameters: int
    num_hidden_layers: int
    # an EAGLE-3 head's (no keys for a standalone draft): the target layers it taps, and its
    # vocabulary's size
    eagle_aux_hidden_state_layer_ids: list[int] | None = added_later()
    draft_vocab_size: int | None = added_later()
    dtype: str | None = added_later()  # as stored; bundles before the serving entry: none


@dataclass(kw_only=True)
class DomainEntry(Record):
    """One domain's figures that serving decisions rest on: the eval report's
    :class:`~draftkit.evaluate.figures.DomainFigures` narrowed (``DomainEntry.of(row)``). Any
    may be None, as a report an earlier draftkit wrote reads."""

    alpha: float | None
    tau: float | None
    c: float | None
    k: int | None  # the positive K the domain's decodes used most
    speedup_measured: float | None
    speedup_predicted: float | None
    verdict: str | None
    # sampled: the draft's teacher-forced acceptance on the eval's continuations as the eval
    # drafted, and with greedy drafts (vLLM's default): how much an engine that drafts greedily
    # keeps against it
    alpha_after: float | None = added_later()
    alpha_greedy_drafts: float | None = added_later()


@dataclass(kw_only=True)
class ReportEntry(Record):
    """Where the figures were measured: the eval report's own fields
    (``ReportEntry.of(report)``)."""

    device: str | None
    dtype: str | None
    temperature: float | None
    created: str | None
    draft_sample_method: str | None = added_later()  # sampled: how the draft chose its tokens


@dataclass(kw_only=True)
class RecipeEntry(Record):
    """The distillation recipe that trained the draft, as given to export."""

    path: str
    config: dict[str, typing.Any] | None  # the YAML as read


@dataclass(kw_only=True)
class VllmEntry(Record):
    """What vLLM needs to serve the bundle (:mod:`draftkit.export.engines`)."""

    method: str  # speculative_config's method: draft_model or eagle3
    min_version: str
    why: str  # why that release is the first
    features: dict[str, str]  # speculative-config key -> the first release that reads it
    # [build, first release, last, why]: builds whose sampled verification rejects every
    # draft (bundles exported before it was recorded have no key)
    sampled_broken: list[list[str]] | None = added_later()
    path_rule: list[str]  # draft-path parts that make vLLM switch the method
    refused: str | None  # why vLLM would not serve this draft as one, where it would not
    # true for a parallel EAGLE-3 head (P-EAGLE), which drafts all K tokens in one forward:
    # speculative_config's parallel_drafting (no key for other drafts)
    parallel_drafting: bool | None = added_later()


@dataclass(kw_only=True)
class SglangEntry(Record):
    """What SGLang needs to serve the bundle."""

    algorithm: str  # --speculative-algorithm: STANDALONE or EAGLE3
    min_version: str
    why: str
    features: dict[str, str]
    refused: str | None


@dataclass(kw_only=True)
class EnginesEntry(Record):
    vllm: VllmEntry
    sglang: SglangEntry


@dataclass(kw_only=True)
class ServingEntry(Record):
    """What the bundle's serving scripts check and launch with
    (:func:`draftkit.export.serving.serving_entry`)."""

    target: str  # where the target was at export (a hub id for a hub target)
    dtype: str
    tp_sizes: list[int]
    num_speculative_tokens: int  # the recommended K, at least 1 (engines need one to draft)
    k_per_batch_size: list[list[int]] | None  # vLLM's [first batch size, last, K] ranges
    measured_temperature: float | None
    engines: EnginesEntry
    # how the eval's draft chose tokens when it sampled: greedy (vLLM's default), or None for
    # probabilistic (the scripts write it) and for a greedy eval
    measured_draft_sample_method: str | None = added_later()


@dataclass(kw_only=True)
class Manifest(Record):
    """``draftkit.json``. Its own hash, ``manifest_sha256``, is set by :func:`write_manifest`
    and :func:`read_manifest` (None on a record not yet written)."""

    format: int
    created: str
    target: TargetEntry
    draft: DraftEntry
    num_speculative_tokens: int  # the recommended K; 0: speculation did not pay
    k_source: str  # flag (--k K), report (the report's K) or default (no report said one)
    domains: dict[str, DomainEntry] = field(default_factory=dict)
    # kind says which side of batch_size pays: "crosses", it stops paying there; "rises", it
    # starts; "below" / "above", no / every batch size measured pays
    break_even_batch: int | None
    break_even_kind: str | None
    measured: bool  # whether an eval report gave the figures
    report: ReportEntry | None = added_later()  # no key without a report
    serving: ServingEntry | None = added_later()  # bundles before it have none
    recipe: RecipeEntry | None
    versions: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # path in the bundle -> sha256
    manifest_sha256: str | None = added_later()


def content_hash(manifest: dict) -> str:
    """sha256 of ``manifest`` without its own hash, as canonical JSON."""
    body = {k: v for k, v in manifest.items() if k != HASH}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def seal(manifest: dict) -> dict:
    """``manifest`` with its own hash added last."""
    check_values(manifest, NAME)
    return {**{k: v for k, v in manifest.items() if k != HASH}, HASH: content_hash(manifest)}


def write_manifest(bundle: str | Path, manifest: Manifest) -> Manifest:
    """Write ``bundle``/draftkit.json from ``manifest``, its values checked and its own hash
    added last; the record as written (its hash set)."""
    sealed = seal(manifest.to_dict())
    (Path(bundle) / NAME).write_text(json.dumps(sealed, indent=2) + "\n")
    return Manifest.from_dict(sealed)


def read_manifest(bundle: str | Path) -> Manifest:
    """The manifest of the bundle at ``bundle``, its values in range, every key a field's and
    its hash its own, or one ModelError line saying which field or that the hash does not
    match."""
    path = Path(bundle) / NAME
    manifest = read_json(path, "bundle manifest", _REMEDY, ModelError)
    check_values(manifest, str(path))
    check_fields(manifest, str(path))
    recorded = manifest.get(HASH)
    if recorded is None:
        raise ModelError(f"{path} has no {HASH} (exported by a draftkit before format "
                         f"{FORMAT}, or the hash was removed), so its figures cannot be "
                         f"trusted; {_REMEDY}")
    if recorded != content_hash(manifest):
        raise ModelError(f"{path} was edited after export: its content does not match its "
                         f"{HASH}; {_REMEDY}")
    return Manifest.from_dict(manifest)


# --- files ----------------------------------------------------------------------------------------

def bundle_files(root: str | Path) -> list[Path]:
    """Every file in the bundle at ``root`` but the manifest: what ``files`` must list."""
    return sorted(p for p in Path(root).rglob("*") if p.is_file() and p.name != NAME)


_VERIFIED: set[tuple] = set()  # (path, size, mtime_ns, sha256) of files hashed in this process


def check_files(root: str | Path, manifest: Manifest) -> None:
    """Every file the manifest lists present with its sha256 and none it does not list, or one
    ModelError line naming the file. Each file is hashed once per process while its size and
    mtime stay (a bundle's head is ~15 MB: ~30 ms)."""
    from draftkit.io import sha256_file

    root = Path(root)
    for rel, digest in manifest.files.items():
        path = root / rel
        try:
            stat = path.stat()
        except OSError:
            stat = None
        if stat is None or not path.is_file():
            raise ModelError(f"bundle file {rel} is missing; {_REMEDY}")
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, digest)
        if key in _VERIFIED:
            continue
        if sha256_file(path) != digest:
            raise ModelError(f"bundle file {rel} does not match its sha256 in {NAME} "
                             f"(modified or truncated); {_REMEDY}")
        _VERIFIED.add(key)
    extra = [p.relative_to(root).as_posix() for p in bundle_files(root)
             if p.relative_to(root).as_posix() not in manifest.files]
    if extra:
        raise ModelError(f"bundle holds a file its manifest does not list: {extra[0]}; remove it "
                         f"or {_REMEDY}")


# --- one value, two places -----------------------------------------------------------------------

_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def check_consistent(root: str | Path, manifest: Manifest) -> None:
    """Every value the bundle at ``root`` states in two places stated the same in both, or one
    ModelError line naming both places: K (the top level, the serving entry, serving/vllm.json),
    the draft path vLLM is given, parallel drafting (the serving entry, serving/vllm.json, the
    draft's config.json), the dtype (the draft entry, the serving entry, the draft's
    config.json, its stored weights), an EAGLE-3 head's tapped layers and vocabulary size (the
    draft entry, its config.json, its tensors), the serving target and the target entry, the
    measured temperature and the report entry. Reads the draft's config.json and safetensors
    headers only (milliseconds). Figures measured apart (a domain's alpha and tau: tau counts
    the rounds adaptive K drafted nothing in) are range-checked, not compared."""
    root = Path(root)

    def differ(a: str, b: str) -> ModelError:
        return ModelError(f"{root}: {a} but {b}; the bundle disagrees with itself: {_REMEDY}")

    serving, draft, k = manifest.serving, manifest.draft, manifest.num_speculative_tokens
    if serving is not None:
        if serving.num_speculative_tokens != max(k, 1):
            raise differ(f"{NAME} num_speculative_tokens is {k}",
                         f"serving.num_speculative_tokens is {serving.num_speculative_tokens}")
        if draft.dtype is not None and draft.dtype != serving.dtype:
            raise differ(f"{NAME} draft.dtype is {draft.dtype}",
                         f"serving.dtype is {serving.dtype}")
        if manifest.target.kind != "hub" and serving.target != manifest.target.path:
            raise differ(f"serving.target is {serving.target}",
                         f"target.path is {manifest.target.path}")
        temperature = manifest.report.temperature if manifest.report is not None else None
        if None not in (temperature, serving.measured_temperature) and \
                temperature != serving.measured_temperature:
            raise differ(f"serving.measured_temperature is {serving.measured_temperature}",
                         f"report.temperature is {temperature}")
        _check_vllm_json(root, serving, differ)
    if (manifest.report is not None or manifest.domains) and manifest.measured is False:
        raise differ(f"{NAME} measured is false", "it records a report's figures")
    config_path = root / "draft" / "config.json"
    config = read_json(config_path, "draft config", _REMEDY, ModelError) \
        if config_path.is_file() else {}
    stored = config.get("torch_dtype") or config.get("dtype")
    if draft.dtype is not None and stored not in (None, draft.dtype):
        raise differ(f"{NAME} draft.dtype is {draft.dtype}",
                     f"draft/config.json says {stored}")
    tensors = _tensor_headers(root / "draft")
    floats = sorted({_SAFETENSORS_DTYPES.get(t["dtype"], t["dtype"]) for t in tensors.values()
                     if t["dtype"] in _SAFETENSORS_DTYPES})
    if draft.dtype is not None and floats and floats != [draft.dtype]:
        raise differ(f"{NAME} draft.dtype is {draft.dtype}",
                     f"draft/'s weights are stored as {', '.join(floats)}")
    if draft.kind != "eagle3":
        return
    layers = config.get("eagle_aux_hidden_state_layer_ids")
    if draft.eagle_aux_hidden_state_layer_ids != layers:
        raise differ(f"{NAME} records tapped layers {draft.eagle_aux_hidden_state_layer_ids}",
                     f"draft/config.json {layers}")
    n = draft.draft_vocab_size
    if n is not None and config.get("draft_vocab_size") != n:
        raise differ(f"{NAME} draft.draft_vocab_size is {n}",
                     f"draft/config.json says {config.get('draft_vocab_size')}")
    parallel = serving.engines.vllm.parallel_drafting if serving is not None else None
    if serving is not None and bool(parallel) != bool(config.get("parallel_drafting")):
        raise differ(f"{NAME} serving.engines.vllm.parallel_drafting is {parallel}",
                     f"draft/config.json parallel_drafting is "
                     f"{config.get('parallel_drafting')}")
    rows = tensors.get("lm_head.weight", {}).get("shape", [n])[0]
    if n is not None and rows != n:
        raise differ(f"{NAME} draft.draft_vocab_size is {n}",
                     f"draft/model.safetensors' lm_head.weight has {rows} rows")


def _check_vllm_json(root: Path, serving: ServingEntry, differ) -> None:
    """serving/vllm.json as export writes it from the serving entry
    (:func:`draftkit.export.serving.vllm_speculative_config`, not imported: importing
    draftkit.export costs seconds), the draft it names this bundle's draft/ (wherever the
    bundle now is: a moved bundle's scripts find it there)."""
    path = root / "serving" / "vllm.json"
    if not path.is_file():
        return
    written = read_json(path, "serving config", _REMEDY, ModelError)
    named = written.get("model")
    if not (isinstance(named, str) and Path(named).name == "draft"):
        raise differ(f"serving/vllm.json names the draft at {named!r}",
                     f"the bundle's draft is {root / 'draft'}")
    table = serving.k_per_batch_size
    want = {"method": serving.engines.vllm.method,
            "num_speculative_tokens": max([serving.num_speculative_tokens] +
                                          [k for _, _, k in table or []]),
            "num_speculative_tokens_per_batch_size": table or None,
            "parallel_drafting": serving.engines.vllm.parallel_drafting}
    for key, value in want.items():
        if written.get(key) != value:
            raise differ(f"serving/vllm.json says {key} {written.get(key)!r}",
                         f"{NAME}'s serving entry makes it {value!r}")


def _tensor_headers(folder: Path) -> dict[str, dict]:
    """name -> {"dtype", "shape"} of every tensor in ``folder``'s safetensors files, read from
    their headers (the standard library only: no weights, no torch)."""
    import struct

    out: dict[str, dict] = {}
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with open(file, "rb") as f:
                size = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(size))
        except (OSError, ValueError, struct.error):
            raise ModelError(f"{file} is not a safetensors file (its header does not read); "
                             f"{_REMEDY}") from None
        out.update({k: v for k, v in header.items() if k != "__metadata__"})
    return out


# --- keys -----------------------------------------------------------------------------------------

def check_fields(manifest: dict, where: str) -> None:
    """Refuse a key no field of :class:`Manifest` (or a record in it) names, and an entry that
    is not the mapping its record reads, naming it by its dotted path."""
    problem = _unknown(manifest, Manifest, "")
    if problem is not None:
        name, what = problem
        raise ModelError(f"{where}: {name} {what}; {_REMEDY}")


def _unknown(value, tp, name: str) -> tuple[str, str] | None:
    """(dotted name, what is wrong) of the first key in ``value`` (named ``name``) that its type
    ``tp`` does not name, looking into records and mappings of records; None where every key is
    known."""
    if value is None:
        return None
    inner = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(inner) == 1:
        tp = inner[0]  # an optional entry: None is fine, anything else is read as the entry
    if isinstance(tp, type) and issubclass(tp, Record):
        if not isinstance(value, dict):
            return name, f"is {value!r}, not a mapping"
        hints = typing.get_type_hints(tp)
        for key, item in value.items():
            if key not in hints:
                return _dotted(name, key), ("is not a field of a draftkit bundle manifest "
                                            "(edited after export, or written by a later "
                                            "draftkit)")
            found = _unknown(item, hints[key], _dotted(name, key))
            if found is not None:
                return found
    elif typing.get_origin(tp) is dict and isinstance(value, dict):
        item_type = typing.get_args(tp)[1]
        for key, item in value.items():
            found = _unknown(item, item_type, _dotted(name, key))
            if found is not None:
                return found
    return None


def _dotted(name: str, key: str) -> str:
    return f"{name}.{key}" if name else key


# --- ranges ---------------------------------------------------------------------------------------

def check_values(manifest: dict, where: str) -> None:
    """Refuse a manifest whose structure or figures are out of range, naming the field."""
    def bad(field: str, value, want: str) -> ModelError:
        return ModelError(f"{where}: {field} is {value!r}, {want}; {_REMEDY}")

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


DTYPES = ("float32", "float16", "bfloat16")


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
    if not isinstance(serving.get("engines"), dict):
        raise bad("serving.engines", serving.get("engines"), "not a mapping")


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
