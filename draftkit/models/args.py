"""The model flags that the commands share, ``--target``, ``--draft``, ``--device`` and
``--dtype``, declared (with their help and defaults) once in :class:`ModelArgs`.

generate, bench, eval, regimes and serve inherit all four; a command that needs another default
or help (serve's flags override its bundle's, a draft that is optional) or one of the fields
alone (derive, export, check, a distillation recipe's ``target``) declares it again with
:func:`draftkit.config.reuse`, which keeps the help and appends the command's note.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftkit.config import option
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
    dtype: str = option("auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16 or "
                                     "float16")
