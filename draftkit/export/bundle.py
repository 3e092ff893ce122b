"""Export and check draftkit bundles.

A bundle is a folder that serving systems take as it is::

    BUNDLE/
      draft/            the draft as the engines load it, with the target's tokenizer:
                        a standalone draft as a plain HF model folder, its
                        generation_config.json with num_assistant_tokens = recommended K;
                        an EAGLE-3 head as vLLM and SGLang load one (draftkit/export/eagle3.py)
      serving/          vllm.json + vllm.sh, sglang.sh, preflight.py (what the scripts check
                        before they launch), hf_transformers.py, README.md
      draftkit.json     target reference, the draft's kind (standalone or eagle3; an EAGLE-3
                        head's tapped layers) and dtype, measured figures, what serving needs
                        (``serving``: engine releases, tensor-parallel sizes, K per batch
                        size; :mod:`draftkit.engines.releases`), recipe, versions, sha256 of
                        each file and of itself (:mod:`draftkit.manifest`)

The draft's kind is a property of the draft (an EAGLE-3 head's config.json names its
architecture); one object per kind (:class:`StandaloneExport`,
:class:`~draftkit.export.eagle3.Eagle3Export`) checks it against the target and writes
``draft/``, the rest of the bundle is the same for both. Export validates before it writes
(tokenizer and special tokens, or an EAGLE-3 head's vocabulary, width and attention shape,
equal to the target's; max_position_embeddings and the context length SGLang reads not below the
target's; every weight key known, LoRA merged; no engine that would rewrite the draft into
another kind of model unsaid), writes the draft in the dtype asked (bf16 by default, the dtype
targets are served in) to a temporary folder, reloads the written draft and compares its logits
with the in-memory one, and only then renames the folder into place.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import torch
import yaml
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

import draftkit
from draftkit.bundle_signature import UNSIGNED
from draftkit.engines import releases
from draftkit.errors import DraftkitError, ModelError
from draftkit.export.eagle3 import Eagle3Export, check_against_target, check_served_layout
from draftkit.export.k import REPORT, ExportKValue, check_export_k, recommended_k
from draftkit.export.model_card import model_card
from draftkit.export.serving import k_per_batch_size, serving_entry, write_serving
from draftkit.figures import EvalReport
from draftkit.io import atomic_dir, read_json, sha256_file
from draftkit.manifest import (FORMAT, NAME as MANIFEST, DomainEntry, DraftEntry, Manifest,
                               RecipeEntry, ReportEntry, ServingEntry, SigningEntry, TargetEntry,
                               bundle_files, check_consistent, check_files, read_manifest,
                               write_manifest)
from draftkit.models import check_compatible, load_tokenizer, resolve_model
from draftkit.models.facts import context_window, vocab_size
from draftkit.models.load import is_eagle3_dir, load_causal_lm
from draftkit.models.reduced_head import FILE, ReducedHead
from draftkit.models.resolve import bundle_ref, content_hash
from draftkit.models.save import save_model, save_tokenizer
from draftkit.signing import Signer, signer_from, verify

FROM_ENV = "env"  # export_bundle's signer: the key DRAFTKIT_SIGNING_KEY names


# --- hashing ------------------------------------------------------------------------------------

_bundle_files = bundle_files


def target_reference(ref) -> TargetEntry:
    """Name, local path and an identity for the target: the hub revision and a content hash."""
    parts = Path(ref.path).parts
    revision = parts[parts.index("snapshots") + 1] if "snapshots" in parts and \
        parts.index("snapshots") + 1 < len(parts) else None
    return TargetEntry(name=ref.name, path=str(ref.path), kind=ref.kind, revision=revision,
                       sha256=content_hash(ref))


def _probe_ids(vocab_size: int):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (2, 16), generator=g)


# --- export -------------------------------------------------------------------------------------

class StandaloneExport:
    """A standalone draft (a causal LM over tokens; a LoRA adapter comes back merged) on its way
    into a bundle, checked against the target before anything is written. Its EAGLE-3
    counterpart is :class:`draftkit.export.eagle3.Eagle3Export`."""

    kind = "standalone"
    parallel = False  # parallel drafting is an EAGLE-3 head's mode (Eagle3Export.parallel)

    def __init__(self, draft_ref, target_tok, target_cfg):
        self.ref, self.target_cfg = draft_ref, target_cfg
        self.model, self.merged = load_causal_lm(draft_ref.path, torch.float32, "draft")
        draft_tok = target_tok
        if any(Path(draft_ref.path).glob("tokenizer*")):
            draft_tok = load_tokenizer(draft_ref, "draft")
        check_compatible(target_tok, draft_tok, target_cfg, self.model.config)  # vocab_size too
        t_max, d_max = context_window(target_cfg), context_window(self.model)
        if t_max and d_max and d_max < t_max:
            raise ModelError(f"draft max_position_embeddings {d_max} is below the target's "
                             f"{t_max}; serving would cut contexts short. Set it to {t_max} in "
                             f"the draft's config.json (and check its RoPE settings) before "
                             f"exporting")
        releases.check_context(self.model.config, target_cfg, f"draft {draft_ref.path}")
        self.config = self.model.config

    def write(self, folder: Path, tokenizer, k: int, dtype: str) -> None:
        """A plain HF model folder in ``dtype`` with the target's tokenizer and K in its
        generation config; reloaded and its logits compared with the in-memory draft's, rounded
        to ``dtype`` as the file holds it."""
        _cast(self.model, getattr(torch, dtype))  # weights only: RoPE tables stay float32
        save_model(self.model, folder)
        _cast(self.model, torch.float32)  # the stored values, exactly: compared below
        save_tokenizer(tokenizer, folder)  # the target's tokenizer
        source = Path(self.ref.path)
        head = ReducedHead.load(source, vocab_size(self.target_cfg)) if source.is_dir() else None
        if head is not None:  # our decoder's reduced head (checked); other engines ignore it
            shutil.copy2(source / FILE, folder / FILE)
        gen = GenerationConfig.from_model_config(self.model.config)
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(tokenizer, key, None)
            if value is not None and getattr(gen, key, None) is None:
                setattr(gen, key, value)
        gen.num_assistant_tokens = max(k, 1)
        gen.num_assistant_tokens_schedule = "constant"
        gen.assistant_confidence_threshold = 0.0
        gen.save_pretrained(folder)

        # Load what was written and compare with the in-memory draft.
        written = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        ids = _probe_ids(vocab_size(self.target_cfg))
        with torch.no_grad():
            diff = (written(ids).logits - self.model(ids).logits).abs().max().item()
        if diff > 1e-4:
            raise ModelError(f"the written draft's logits differ from the in-memory draft's by "
                             f"{diff:.2e}; export aborted, nothing written")

    def entry(self) -> DraftEntry:
        """The manifest's ``draft`` entry (its dtype is export's)."""
        return DraftEntry(kind=self.kind, name=self.ref.name, source=str(self.ref.path),
                          lora_merged=self.merged,
                          num_parameters=sum(p.numel() for p in self.model.parameters()),
                          num_hidden_layers=self.model.config.get_text_config().num_hidden_layers)


def _cast(model, dtype) -> None:
    """``model``'s floating weights in ``dtype``, in place (a tied head stays tied)."""
    for p in model.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)
    model.config.dtype = dtype


def export_bundle(target: str, draft: str, out: str | Path,
                  report: str | Path | EvalReport | None = None, k: ExportKValue = REPORT,
                  recipe: str | Path | None = None, force: bool = False,
                  dtype: str = "bfloat16", signer: Signer | None | str = FROM_ENV) -> Path:
    """Write the bundle for ``draft`` beside ``target`` to ``out``. ``report``: the eval report
    (the record, or the report.json the CLI is given) whose figures and K the bundle records;
    ``k``: an integer, or :data:`~draftkit.export.k.REPORT` (:mod:`draftkit.export.k`),
    checked here, once; ``signer``: who signs it (:mod:`draftkit.signing`), None for an
    unsigned bundle, or :data:`FROM_ENV`: the key ``DRAFTKIT_SIGNING_KEY`` names."""
    k = check_export_k(k)  # refuses 'auto' before anything is loaded
    signer = signer_from(None) if signer == FROM_ENV else signer  # before any work

    out = Path(out)
    if out.exists() and not force:
        raise DraftkitError(f"{out} already exists; pass --force to replace it or choose "
                            f"another --out")
    if out.exists() and not (out.is_dir() and (not any(out.iterdir())
                                               or (out / MANIFEST).is_file())):
        raise DraftkitError(f"{out} is not a draftkit bundle (no {MANIFEST}), so --force will "
                            f"not replace it; choose another --out or remove it yourself")
    report_data = report if isinstance(report, EvalReport) else \
        _read_report(report) if report else None
    k, k_source = recommended_k(k, report_data)
    target_ref = resolve_model(target, "target")
    draft_ref = resolve_model(draft, "draft")
    target_tok = load_tokenizer(target_ref, "target")
    target_cfg = AutoConfig.from_pretrained(target_ref.path)
    target_entry = target_reference(target_ref)
    # the draft's kind is its own: an EAGLE-3 head's config.json says so
    source = Eagle3Export(draft_ref, target_ref, target_cfg, target_entry.sha256) if \
        is_eagle3_dir(draft_ref.path) else StandaloneExport(draft_ref, target_tok, target_cfg)
    final_draft = str(out.resolve() / "draft")
    target_for_serving = str(target_ref.path) if target_ref.kind != "hub" else target_ref.spec
    serving = _serving(source, final_draft, target_for_serving, k, dtype, report_data)

    ran = Path(draft).parent / "config.yaml"  # a distill run's best/ sits beside its config
    if recipe is None and Path(draft).name == "best" and ran.is_file():
        recipe = ran
    recipe_data = _read_recipe(recipe) if recipe else None
    figures = _figures(report_data)
    with atomic_dir(out, overwrite=force) as tmp:
        try:
            source.write(tmp / "draft", target_tok, k, dtype)
        except DraftkitError as e:  # the hidden temporary folder means nothing to the user
            e.args = (str(e).replace(str(tmp), str(out)),)
            raise
        write_serving(tmp / "serving", serving, final_draft, source.kind, k, figures["domains"])
        (tmp / "draft" / "README.md").write_text(model_card(
            name=f"{source.entry().name} for {target_entry.name}", kind=source.kind,
            target=target_ref.spec if target_ref.kind == "hub" else target_entry.name,
            target_sha256=target_entry.sha256, k=k, k_source=k_source,
            recipe=recipe_data.config if recipe_data else None, report=report_data,
            signed=signer is not None))
        write_manifest(tmp, Manifest(
            format=FORMAT,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            target=target_entry, draft=replace(source.entry(), dtype=dtype),
            num_speculative_tokens=k, k_source=k_source, **figures, serving=serving,
            recipe=recipe_data, versions=_versions(),
            files={str(p.relative_to(tmp)): sha256_file(p) for p in _bundle_files(tmp)},
            signing=signer.entry() if signer else SigningEntry(method=UNSIGNED)))
        if signer is not None:
            signer.sign(tmp)
    return out


def _serving(source, draft_dir: str, target: str, k: int, dtype: str,
             report: EvalReport | None) -> ServingEntry:
    """The manifest's ``serving`` entry for this draft (:func:`serving_entry`), refusing what
    no engine would serve as the bundle says and warning, one line each, of what one engine
    would not."""
    rewrite = releases.vllm_path_rewrite(draft_dir) if source.kind == StandaloneExport.kind \
        else None
    if rewrite:  # vLLM would switch method draft_model to another for this path
        raise DraftkitError(f"the bundle's draft path {draft_dir} makes vLLM serve it as method "
                            f"{rewrite!r}, not draft_model (SpeculativeConfig reads the method "
                            f"off the draft's path); choose an --out without "
                            f"{', '.join(repr(p) for p, _ in releases.VLLM_PATH_METHODS)}")
    refused = releases.refused_engines(source.config)
    tp = releases.tp_sizes(source.config)
    for line in refused.values():
        _warn(f"{line}; its serving script will refuse to start")
    missing = [n for n in releases.COMMON_TP if n not in tp]
    if missing:
        sglang = "" if "sglang" in refused else \
            "SGLang cannot serve it beside a target at those; "
        _warn(f"the draft shards at tensor-parallel sizes {tp} only, not "
              f"{', '.join(map(str, missing))} (its attention heads, KV heads and MLP width do "
              f"not divide them): {sglang}vLLM runs it at draft_tensor_parallel_size 1")
    table = k_per_batch_size(report.batch_sweep) if report else None
    return serving_entry(source.kind, target, k, dtype, tp, table, refused,
                         report.temperature if report else None,
                         parallel=source.parallel, deep=releases.is_deep_head(source.config),
                         draft_sample_method=report.draft_sample_method if report else None,
                         verify=report.verify if report else None)


def _warn(line: str) -> None:
    print(f"draftkit: warning: {line}", file=sys.stderr, flush=True)


def _read_report(path) -> EvalReport | None:
    """An eval report.json, this version's or an earlier one's (figures it lacks read as
    None)."""
    data = read_json(path, "report", "run `draftkit eval ... --out DIR` and pass "
                     "DIR/report.json", kind=object)  # the report's own check names it
    if not data:
        return None  # an empty report measured nothing: export as without one
    try:
        return EvalReport.from_dict(data)
    except (AttributeError, TypeError, ValueError):
        raise DraftkitError(f"report {path} is not a draftkit eval report.json; pass the "
                            f"report.json `draftkit eval` wrote") from None


def _read_recipe(path) -> RecipeEntry:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise DraftkitError(f"recipe {path} does not exist") from None
    except yaml.YAMLError:
        raise DraftkitError(f"recipe {path} is not valid YAML") from None
    return RecipeEntry(path=str(path), config=data)


def _figures(report: EvalReport | None) -> dict:
    """The :class:`Manifest` fields a report gives: its per-domain figures that serving
    decisions need, the break-even batch size and where it was measured."""
    if report is None:
        return {"domains": {}, "break_even_batch": None, "break_even_kind": None,
                "measured": False}
    be = report.break_even
    domains = {name: DomainEntry.of(row) for name, row in report.domains.items()}
    for entry in domains.values():  # alpha_after is kept as the greedy drafts' reference only
        if entry.alpha_greedy_drafts is None:
            entry.alpha_after = None
    return {"domains": domains,
            "break_even_batch": be.batch_size if be else None,
            "break_even_kind": be.kind if be else None, "measured": True,
            "report": ReportEntry.of(report)}


def _versions() -> dict[str, str]:
    out = {"draftkit": draftkit.__version__}  # its distribution is draftkit-spec
    for name in ("torch", "transformers", "peft", "safetensors", "tokenizers"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


# --- check --------------------------------------------------------------------------------------

def check_bundle(bundle: str | Path, check_target: bool = True,
                 target: str | None = None, said: list[str] | None = None) -> Manifest:
    """Verify every file's sha256, an EAGLE-3 head's served layout, the values the bundle
    states twice, its signature (:func:`draftkit.signing.verify`), and the draft/target
    pairing (with ``target``, or the target the manifest records); return the manifest.
    ``said`` gets what was found beyond the faults: who signed it, and notes (a moved
    bundle)."""
    root = Path(bundle)
    manifest_path = root / MANIFEST
    if not root.exists():
        raise ModelError(f"{root} does not exist; pass the folder `draftkit export` wrote")
    if not manifest_path.is_file():
        raise ModelError(f"{root} is not a draftkit bundle (no {MANIFEST}); pass the folder "
                         f"`draftkit export` wrote")
    manifest = read_manifest(root)
    check_files(root, manifest)
    try:
        draft_cfg = AutoConfig.from_pretrained(root / "draft")
    except Exception as e:
        raise ModelError(f"bundle draft/config.json does not load ({type(e).__name__}); "
                         f"re-export the bundle") from None
    head = _check_kind(root, manifest)
    notes = check_consistent(root, manifest)  # after the layout: a broken head is named
    signed = verify(root, manifest.signing)  # who signed it, as the process's trust asks
    if said is not None:
        said += [signed, *(f"note: {note}" for note in notes)]
    if check_target:  # the bundle's models from the manifest verified above, not again
        target_ref = resolve_model(target, "target") if target else \
            bundle_ref(str(root), root, manifest, "target")
        target_cfg = AutoConfig.from_pretrained(target_ref.path)
        check_compatible(load_tokenizer(target_ref, "target"),
                         load_tokenizer(bundle_ref(str(root), root, manifest, "draft"),
                                        "draft"),
                         target_cfg, draft_cfg)
        if head is not None:
            check_against_target(head, target_cfg, root / "draft")
        recorded = manifest.target.sha256
        if recorded and target_reference(target_ref).sha256 != recorded:
            raise ModelError(f"the target at {target_ref.path} is not the one this bundle was "
                             f"exported for (content hash differs); pass the right target")
    return manifest


def _check_kind(root: Path, manifest: Manifest) -> dict | None:
    """The draft's kind as the manifest records it and as draft/ holds it, the same; for an
    EAGLE-3 head, its config, checked against what vLLM and SGLang read."""
    recorded = manifest.draft
    kind = recorded.kind or StandaloneExport.kind  # bundles before EAGLE-3 record none
    held = Eagle3Export.kind if is_eagle3_dir(root / "draft") else StandaloneExport.kind
    if kind != held:
        raise ModelError(f"{MANIFEST} records the draft's kind as {kind!r} but draft/ holds "
                         f"a {held!r} draft; re-export the bundle")
    if held != Eagle3Export.kind:
        return None
    return check_served_layout(root / "draft")  # the manifest's layers: check_consistent
