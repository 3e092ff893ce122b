"""The models' command, ``draftkit derive``: a draft cut from, or shaped like, a target.

    draftkit derive --target embedded --layers 0,1,2,29 --out drafts/smol-4l
    draftkit derive --target embedded --num-layers 2 --hidden-size 256 --out drafts/tiny
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftkit.config import option, reuse
from draftkit.errors import ConfigError, DraftkitError
from draftkit.models.args import ModelArgs
from draftkit.models.derive import check_layers, derive_by_layers, derive_random, save_draft
from draftkit.models.load import load_model, load_tokenizer
from draftkit.models.resolve import resolve_model


@dataclass
class DeriveArgs:
    """Derive a draft from a target by keeping some of its layers or shrinking its shape."""

    out: str = option(help="output directory (a plain Hugging Face model folder)")
    target: str = reuse(ModelArgs, "target")
    layers: list[int] | None = option(None, help="comma-separated target layer indices to copy, "
                                                 "e.g. 0,1,2,29")
    num_layers: int | None = option(None, help="random-init draft with this many layers")
    hidden_size: int | None = option(None, help="random-init draft with this hidden size")
    intermediate_size: int | None = option(None, help="random-init draft with this MLP size")
    seed: int = option(0, help="seed for random init")
    force: bool = option(False, help="replace an existing output directory")

    def validate(self) -> None:
        if self.layers is not None:
            check_layers(self.layers)  # before the slow load; the range once the target is read
        if self.layers is None and self.num_layers is None:
            raise ConfigError("give --layers (copy target layers) or --num-layers "
                              "(random init), e.g. --layers 0,1,2,29")
        if self.layers is not None and any(v is not None for v in (
                self.num_layers, self.hidden_size, self.intermediate_size)):
            raise ConfigError("--layers copies target layers; it cannot be combined with "
                              "--num-layers/--hidden-size/--intermediate-size")
        for name in ("num_layers", "hidden_size", "intermediate_size"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {v}")


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
