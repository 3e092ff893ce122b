"""The model flags that the commands share, ``--target``, ``--draft``, ``--device`` and
``--dtype``, declared (with their help and defaults) once in :class:`ModelArgs`; and ``draftkit
derive``'s args (:class:`DeriveArgs`, with :func:`check_layers`; the command is
:mod:`draftkit.models.command`). Light to import (no torch): ``draftkit COMMAND --help`` reads
them.

generate, bench, eval, regimes and serve inherit all four; a command that needs another default
or help (serve's flags override its bundle's, a draft that is optional) or one of the fields
alone (derive, export, check, a distillation recipe's ``target``) declares it again with
:func:`draftkit.config.reuse`, which keeps the help and appends the command's note.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftkit.config import option, reuse
from draftkit.errors import ConfigError
from draftkit.signing_args import TrustArgs


@dataclass(kw_only=True)  # so that a command's own fields may follow without defaults
class ModelArgs(TrustArgs):
    """The target, the draft and where and in what precision they run (and, from
    :class:`~draftkit.signing_args.TrustArgs`, whose bundles are taken)."""

    target: str = option("embedded", help="target model: HF directory, hub id, bundle or "
                                          "'embedded'")
    # Required here: most commands measure a draft; those where it is optional say what none
    # means in their note.
    draft: str = option(help="draft model: HF directory, hub id or bundle")
    device: str | None = option(None, help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    dtype: str = option("auto", help="auto (bf16 on GPU; on CPU fp32, or bf16 where the CPU has "
                                     "it natively and a decoding step measures faster in it), "
                                     "float32, bfloat16 or float16")


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


def check_layers(layers: list[int], n: int | None = None, name: str = "--layers") -> None:
    """Target layer indices to copy: at least one, each once, within 0..n-1 when the target's
    depth ``n`` is known (a recipe's dry run checks the rest before any weights load)."""
    given = ",".join(map(str, layers))
    if not layers:
        example = [0, 1, 2] + ([n - 1] if n else [])
        example = (f"{name} {','.join(map(str, example))}" if name.startswith("--")
                   else f"{name}: {example}")
        raise ConfigError(f"{name} names no layer; give target layer indices, e.g. {example}")
    twice = sorted({i for i in layers if layers.count(i) > 1})
    if twice:
        raise ConfigError(f"{name} {given}: layer {twice[0]} is given twice; a draft copies "
                          f"each target layer once")
    if any(i < 0 for i in layers):
        raise ConfigError(f"{name} {given}: layer indices count from 0 (the first layer)")
    if n is not None and any(i >= n for i in layers):
        raise ConfigError(f"{name} {given}: the target has layers 0..{n - 1}; pick indices in "
                          f"that range")
