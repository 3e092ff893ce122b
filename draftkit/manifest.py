"""The bundle manifest, ``draftkit.json``: one typed record (:class:`Manifest`), written by
:func:`write_manifest` and read back only by :func:`read_manifest`, so nothing edited in it goes
unnoticed. The record's fields are the file's keys in the order written, so a manifest read and
written again keeps its bytes (:mod:`draftkit.records`); its per-domain figures are narrowed from
the eval report's own rows (:class:`DomainEntry`). A key no field names (a hand edit, or a later
draftkit's field) is refused by its dotted name, as is a value out of the range its field's type
carries (``Annotated[float, Range(low=0, high=1)]``: :mod:`draftkit.fields` reads both).

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
every time) and every value the bundle states in two places against the other
(:func:`check_consistent`), as ``draftkit check`` does. The seal, the ranges and those checks
are :mod:`draftkit.bundle_checks` (the standard library only), which the bundle's own
``serving/preflight.py`` runs too; this module adds the typed record and its keys. The ranges
are stated twice, on the record's fields and in ``bundle_checks`` for a launcher without
draftkit (whose copy is hashed into every bundle, so it is not rewritten from the record); the
tests hold the two alike. Who signed the bundle is :mod:`draftkit.signing`'s.
"""

from __future__ import annotations

import contextlib
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from draftkit import bundle_checks as checks
from draftkit.bundle_checks import DTYPES, HASH, NAME, content_hash
from draftkit.errors import ModelError
from draftkit.fields import FieldError, OneOf, Range, UnknownKey
from draftkit.io import read_json
from draftkit.records import Record, added_later

FORMAT = 2  # 2: the manifest hashes itself
_REMEDY = checks.REMEDY

# the ranges bundle_checks.check_values states for the launcher, on the fields they bound
_K = Annotated[int, Range(low=0)]  # a recommended K; 0: speculation did not pay
_SPEEDUP = Annotated[float, Range(above=0, what="a speedup")]


# --- the record -----------------------------------------------------------------------------------
# Reading is lenient about keys a manifest lacks (they read as None: minimal manifests in tests,
# entries an earlier draftkit did not write) and strict about keys no field names.

@dataclass(kw_only=True)
class TargetEntry(Record):
    """The target the draft was exported for: where it was, and its identity."""

    name: str  # a short name for reports
    path: str  # the local model folder it was read from at export
    kind: str  # how it was given: local, hub, embedded, gguf, bundle (ResolvedModel.kind)
    revision: str | None = added_later()  # its hub snapshot; no key outside the hub cache
    sha256: str | None = None  # draftkit.models.resolve.content_hash


@dataclass(kw_only=True)
class DraftEntry(Record):
    """The draft as stored in ``draft/``."""

    kind: str | None  # standalone or eagle3 (bundles before EAGLE-3 record none: standalone)
    name: str  # a short name for reports
    source: str  # the folder it was exported from
    lora_merged: bool  # whether LoRA adapters were merged into its weights
    num_parameters: int
    num_hidden_layers: int  # its decoder layers
    # an EAGLE-3 head's (no keys for a standalone draft): the target layers it taps, and its
    # vocabulary's size
    eagle_aux_hidden_state_layer_ids: list[int] | None = added_later()
    draft_vocab_size: int | None = added_later()
    dtype: str | None = added_later()  # as stored; bundles before the serving entry: none


@dataclass(kw_only=True)
class DomainEntry(Record):
    """One domain's figures that serving decisions rest on: the eval report's
    :class:`~draftkit.figures.DomainFigures` narrowed (``DomainEntry.of(row)``). Any
    may be None, as a report an earlier draftkit wrote reads."""

    # acceptance while decoding
    alpha: Annotated[float, Range(low=0, high=1, what="an acceptance rate")] | None
    tau: Annotated[float, Range(low=1, what="an accepted length")] | None  # tokens per target call
    # a draft step's cost in target steps
    c: Annotated[float, Range(low=0, what="a cost ratio")] | None
    k: _K | None  # the positive K the domain's decodes used most
    speedup_measured: _SPEEDUP | None  # tokens/s over plain decoding's, on the same prompts
    speedup_predicted: _SPEEDUP | None  # the speedup model's, from the measured alpha_i, c and v
    verdict: str | None  # the eval's: speculate with K, inconclusive, or why not
    # sampled: the draft's teacher-forced acceptance on the eval's continuations as the eval
    # drafted, and with greedy drafts (vLLM's default): how much an engine that drafts greedily
    # keeps against it
    alpha_after: float | None = added_later()
    alpha_greedy_drafts: float | None = added_later()


@dataclass(kw_only=True)
class ReportEntry(Record):
    """Where the figures were measured: the eval report's own fields
    (``ReportEntry.of(report)``)."""

    device: str | None  # the device the eval ran on
    dtype: str | None  # the eval's dtype
    temperature: float | None  # its sampling temperature; 0: greedy
    created: str | None  # when the eval ran (ISO 8601, UTC)
    draft_sample_method: str | None = added_later()  # sampled: how the draft chose its tokens
    verify: str | None = added_later()  # sampled: how drafts were verified, token or block


@dataclass(kw_only=True)
class RecipeEntry(Record):
    """The distillation recipe that trained the draft, as given to export."""

    path: str  # the recipe file
    config: dict[str, typing.Any] | None  # the YAML as read


@dataclass(kw_only=True)
class VllmEntry(Record):
    """What vLLM needs to serve the bundle (:mod:`draftkit.export.engines`)."""

    method: str  # speculative_config's method: draft_model or eagle3
    min_version: str  # the first release that serves the bundle as written
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
    min_version: str  # the first release that serves the bundle as written
    why: str  # why that release is the first
    features: dict[str, str]  # server flag -> the first release that reads it
    refused: str | None  # why SGLang would not serve this draft as one, where it would not


@dataclass(kw_only=True)
class EnginesEntry(Record):
    """What each serving engine needs, by engine."""

    vllm: VllmEntry
    sglang: SglangEntry


@dataclass(kw_only=True)
class ServingEntry(Record):
    """What the bundle's serving scripts check and launch with
    (:func:`draftkit.export.serving.serving_entry`)."""

    target: str  # where the target was at export (a hub id for a hub target)
    dtype: Annotated[str, OneOf(DTYPES)]  # the dtype the engines load the draft in
    # the tensor-parallel sizes the draft shards at in both engines
    tp_sizes: list[Annotated[int, Range(low=1)]]
    # the recommended K, at least 1 (engines need one to draft)
    num_speculative_tokens: Annotated[int, Range(low=1)]
    k_per_batch_size: list[list[int]] | None  # vLLM's [first batch size, last, K] ranges
    measured_temperature: float | None  # the eval's temperature; None without a report
    engines: EnginesEntry
    # how the eval's draft chose tokens when it sampled: greedy (vLLM's default), or None for
    # probabilistic (the scripts write it) and for a greedy eval
    measured_draft_sample_method: str | None = added_later()
    # block where the eval verified sampled drafts by block (Sun et al., arXiv 2403.10444): the
    # scripts write vLLM's rejection_sample_method block; None: token verification, or greedy
    measured_verify: str | None = added_later()


@dataclass(kw_only=True)
class SigningEntry(Record):
    """How the bundle is signed (:mod:`draftkit.signing`), recorded before it is: the
    signature, ``draftkit.sig``, covers the manifest."""

    method: str  # key, certificate, or none (exported with --unsigned)
    key_id: str | None = None  # sha256 of the signer's public key PEM
    public_key: str | None = None  # the signer's public key PEM: a bundle checks by itself


@dataclass(kw_only=True)
class Manifest(Record):
    """``draftkit.json``. Its own hash, ``manifest_sha256``, is set by :func:`write_manifest`
    and :func:`read_manifest` (None on a record not yet written)."""

    format: int  # the manifest's format (2: it hashes itself)
    created: str  # when the bundle was exported (ISO 8601, UTC)
    target: TargetEntry
    draft: DraftEntry
    num_speculative_tokens: _K  # the recommended K; 0: speculation did not pay
    k_source: str  # flag (--k K), report (the report's K) or default (no report said one)
    domains: dict[str, DomainEntry] = field(default_factory=dict)
    # the batch size where the eval's batch sweep crosses 1.0x
    break_even_batch: Annotated[int, Range(low=1, what="a batch size")] | None
    # which side of break_even_batch pays: "crosses", it stops paying there; "rises", it
    # starts; "below" / "above", no / every batch size measured pays
    break_even_kind: str | None
    measured: bool  # whether an eval report gave the figures
    report: ReportEntry | None = added_later()  # no key without a report
    serving: ServingEntry | None = added_later()  # bundles before it have none
    recipe: RecipeEntry | None  # no recipe given to export: null
    versions: dict[str, str] = field(default_factory=dict)  # package -> version at export
    files: dict[str, str] = field(default_factory=dict)  # path in the bundle -> sha256
    signing: SigningEntry | None = added_later()  # bundles before signing have none
    manifest_sha256: str | None = added_later()  # sha256 of the rest, as canonical JSON


def seal(manifest: dict) -> dict:
    """``manifest`` with its own hash added last."""
    with _model_error():
        checks.check_values(manifest, NAME)
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
    with _model_error():
        checks.check_plain(Path(bundle))  # before a byte is read: no link out of the bundle
    manifest = read_json(path, "bundle manifest", _REMEDY, ModelError)
    if not isinstance(manifest, dict):
        raise ModelError(f"{path} is not a JSON object; {_REMEDY}")
    with _model_error():
        checks.check_values(manifest, str(path))
    record = check_fields(manifest, str(path))
    with _model_error():
        checks.check_seal(manifest, str(path))
    return record


# --- files and cross-checks: draftkit.bundle_checks, which the bundle's launcher runs too ------

def bundle_files(root: str | Path) -> list[Path]:
    """Every file in the bundle at ``root`` but the manifest and its signature: what ``files``
    must list."""
    return checks.bundle_files(Path(root))


def check_files(root: str | Path, manifest: Manifest) -> None:
    """Every file the manifest lists present with its sha256 and none it does not list, or one
    ModelError line naming the file (:func:`draftkit.bundle_checks.check_files`)."""
    with _model_error():
        checks.check_files(Path(root), manifest.files)


def check_consistent(root: str | Path, manifest: Manifest) -> list[str]:
    """Every value the bundle at ``root`` states in two places stated the same in both, or one
    ModelError line naming both (:func:`draftkit.bundle_checks.check_consistent`); notes that
    are not faults (a moved bundle)."""
    with _model_error():
        return checks.check_consistent(Path(root), manifest.to_dict())


@contextlib.contextmanager
def _model_error():
    try:
        yield
    except checks.BundleError as e:
        raise ModelError(str(e)) from None


# --- keys ---------------------------------------------------------------------------------------

def check_fields(manifest: dict, where: str) -> Manifest:
    """The record of ``manifest``, or one ModelError line naming by its dotted path the first
    key no field of :class:`Manifest` (or a record in it) names, entry that is not the mapping
    its record reads, or value out of its field's range."""
    try:
        return Manifest.from_dict(manifest, strict=True)
    except UnknownKey as e:
        raise ModelError(f"{where}: {e.key} is not a field of a draftkit bundle manifest (edited "
                         f"after export, or written by a later draftkit); {_REMEDY}") from None
    except FieldError as e:
        raise ModelError(f"{where}: {e.key} is {e.value!r}, not {e.want}; {_REMEDY}") from None
