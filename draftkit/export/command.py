"""The bundle commands, each the plain function the CLI calls with its args dataclass
(:mod:`draftkit.export.args`).

    draftkit export --target T --draft D --report runs/eval/report.json --out BUNDLE
    draftkit check BUNDLE

``export`` writes a bundle that HF, vLLM and SGLang take as it is (:mod:`draftkit.export.bundle`),
from a standalone draft or an EAGLE-3 head (then HF cannot run it: its snippet says so);
``check`` verifies one.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig

from draftkit.errors import Declined, ModelError
from draftkit.export.args import CheckArgs, ExportArgs
from draftkit.export.bundle import check_bundle, export_bundle
from draftkit.export.eagle3 import KIND as EAGLE3
from draftkit.export.eagle3 import check_against_target, target_embedding
from draftkit.manifest import NAME as MANIFEST
from draftkit.manifest import Manifest, read_manifest
from draftkit.models.eagle3_layouts import head_config
from draftkit.models.head_check import (TARGET_FILE, check_recorded_target, load_head,
                                        record_target, recorded_target)
from draftkit.models.load import is_eagle3_dir
from draftkit.models.resolve import resolve_model
from draftkit.signing import signer_of
from draftkit.tracking import Tracker


def export(args: ExportArgs) -> Path:
    """``draftkit export``."""
    out = export_bundle(args.target, args.draft, args.out, args.report, args.k, args.recipe,
                        args.force, args.dtype, signer_of(args))
    manifest = read_manifest(out)
    with Tracker("export", {"target": args.target, "draft": args.draft, "k": args.k}) as t:
        t.log_artifact(out, name=f"bundle-{out.name}", type="model",
                       metadata={"num_speculative_tokens": manifest.num_speculative_tokens})
    serving = manifest.serving
    print(f"wrote bundle {out}: K={manifest.num_speculative_tokens} "
          f"({manifest.k_source}), draft in {serving.dtype}, tensor-parallel sizes "
          f"{serving.tp_sizes}, {len(manifest.files)} files hashed")
    print(f"  needs:  vllm >= {serving.engines.vllm.min_version}, sglang >= "
          f"{serving.engines.sglang.min_version} (serving/README.md says which figures hold "
          f"where)")
    for name, engine in (("vLLM:  ", "vllm"), ("SGLang:", "sglang")):
        refused = getattr(serving.engines, engine).refused  # export warned why, in one line
        print(f"  {name} " + ("will not serve this draft: its script refuses to start "
                              "(serving/README.md says why)" if refused else
                              f"bash {out / 'serving' / f'{engine}.sh'}"))
    if manifest.draft.kind == EAGLE3:
        print(f"  HF:     cannot run an EAGLE-3 head; python "
              f"{out / 'serving' / 'hf_transformers.py'} decodes with draftkit")
    else:
        print(f"  HF:     python {out / 'serving' / 'hf_transformers.py'}")
    return out


def check(args: CheckArgs) -> Manifest:
    """``draftkit check BUNDLE``, or ``draftkit check HEAD --target T [--record-target]``."""
    root = Path(args.bundle)
    if not (root / MANIFEST).is_file() and root.is_dir() and is_eagle3_dir(root):
        return check_head_folder(root, args.target, args.record_target)
    if args.record_target:
        raise ModelError(f"--record-target is for a loose EAGLE-3 head folder; {root} is not "
                         f"one (a bundle records its target's content hash already)")
    said: list[str] = []  # who signed it, and notes (a moved bundle)
    try:
        manifest = check_bundle(args.bundle, target=args.target, said=said)
    except ModelError as e:
        if (root / MANIFEST).is_file():  # a bundle that fails a check: the answer is no
            raise Declined(str(e)) from None
        raise
    entry = manifest.draft
    parallel = manifest.serving is not None and manifest.serving.engines.vllm.parallel_drafting
    depth = f" of {entry.num_hidden_layers} layers" if (entry.num_hidden_layers or 1) > 1 else ""
    head = f", {'parallel ' if parallel else ''}EAGLE-3 head{depth} tapping target layers " \
        f"{entry.eagle_aux_hidden_state_layer_ids}" if entry.kind == EAGLE3 else ""
    print(f"bundle {args.bundle} OK: {len(manifest.files)} files verified, target "
          f"{manifest.target.name}{head}, K={manifest.num_speculative_tokens}")
    print(f"  {said[0]}")
    for line in said[1:]:
        print(line)
    return manifest


def check_head_folder(folder: Path, target: str | None, record: bool) -> None:
    """A loose EAGLE-3 head against ``target``: its config (widths, attention shape, tapped
    layers) and its tensors (:func:`draftkit.models.head_check.check_head`), then the target it
    records, or with ``record`` the one it is given, written to its target.json."""
    if target is None:
        raise ModelError(f"{folder} is a loose EAGLE-3 head; pass --target, the target it was "
                         f"trained for")
    target_ref = resolve_model(target, "target")
    target_config = AutoConfig.from_pretrained(target_ref.path)
    check_against_target(head_config(folder, target_config), target_config, folder)
    head = load_head(folder, target_embedding(target_ref.path, target_config), folder)
    what = f"EAGLE-3 head {folder} OK: taps target layers {head.aux_layers}, drafts over " \
           f"{head.d2t.numel()} tokens"
    if recorded_target(folder) is not None:
        check_recorded_target(folder, target_ref, folder)  # refused if it records another
        print(f"{what}; trained for {target_ref.path} ({TARGET_FILE})")
    elif record:
        record_target(folder, target_ref)
        print(f"{what}; recorded {target_ref.path} as its target in {folder / TARGET_FILE}")
    else:
        check_recorded_target(folder, target_ref, folder)  # the refusal that says --record-target
