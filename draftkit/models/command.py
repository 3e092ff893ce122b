"""The models' command, ``draftkit derive``: a draft cut from, or shaped like, a target.

    draftkit derive --target embedded --layers 0,1,2,29 --out drafts/smol-4l
    draftkit derive --target embedded --num-layers 2 --hidden-size 256 --out drafts/tiny
"""

from __future__ import annotations

from pathlib import Path

from draftkit.errors import DraftkitError
from draftkit.models.args import DeriveArgs
from draftkit.models.derive import derive_by_layers, derive_random, save_draft
from draftkit.models.load import load_model, load_tokenizer
from draftkit.models.resolve import resolve_model


def derive(args: DeriveArgs) -> Path:
    """``draftkit derive``: load the target, cut or shrink it, save the draft."""
    out = Path(args.out)
    if out.exists() and not args.force:  # fail before the slow load
        raise DraftkitError(f"{out} already exists; pass --force to replace it or choose "
                            f"another --out")
    ref = resolve_model(args.target, "target")
    target = load_model(ref, "target", device="cpu", dtype="float32")
    tokenizer = load_tokenizer(ref, "target")
    if args.layers is not None:
        draft = derive_by_layers(target, args.layers)
    else:
        draft = derive_random(target, args.num_layers, args.hidden_size,
                              args.intermediate_size, args.seed)
    save_draft(draft, tokenizer, out, force=args.force)
    n_params = sum(p.numel() for p in draft.parameters())
    print(f"wrote draft to {out}: {draft.config.num_hidden_layers} layers, hidden "
          f"{draft.config.hidden_size}, {n_params / 1e6:.1f}M parameters")
    return out
