"""The bundle commands' args: ``draftkit export``'s (:class:`ExportArgs`) and ``draftkit
check``'s (:class:`CheckArgs`); the commands are :mod:`draftkit.export.command`. Light to
import (no torch): ``draftkit COMMAND --help`` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftkit.config import option, reuse
from draftkit.decode.k import DEFAULT_FIXED_K
from draftkit.export.k import REPORT, ExportK
from draftkit.models.args import ModelArgs
from draftkit.signing_args import SigningArgs, TrustArgs


@dataclass(kw_only=True)
class ExportArgs(SigningArgs, TrustArgs):
    """Export a draft with its target reference and serving configs as a bundle, signed
    (:mod:`draftkit.signing`)."""

    out: str = option(help="bundle directory to create")
    draft: str = reuse(ModelArgs, "draft", note="; a LoRA adapter folder is merged; an EAGLE-3 "
                       "head folder with the --target it was trained on")
    target: str = reuse(ModelArgs, "target", note="; the one the draft serves")
    report: str | None = option(None, help="eval report.json: per-domain figures and the "
                                           "recommended K go into the bundle")
    k: ExportK = option(REPORT, help="the K (num_speculative_tokens) the serving configs "
                                     f"draft: an integer, or '{REPORT}': the K the report's "
                                     f"decodes used most, else {DEFAULT_FIXED_K} (vLLM and "
                                     "SGLang draft a fixed K: 'auto' is refused)")
    recipe: str | None = option(None, help="the distillation recipe (resolved config.yaml) that "
                                           "trained the draft, recorded in the bundle "
                                           "(default: a run's config.yaml, for its best/)")
    dtype: str = option("bfloat16", choices=("float32", "float16", "bfloat16"),
                        help="dtype the draft is stored in, and the engines' scripts serve the "
                             "target in: the dtype the target is served in (vLLM casts the "
                             "draft to the target's; SGLang's --dtype auto runs a float32 "
                             "draft as float16)")
    force: bool = option(False, help="replace an existing bundle directory")


@dataclass(kw_only=True)
class CheckArgs(TrustArgs):
    """Verify a bundle: every file's hash, the draft's config (an EAGLE-3 head's as vLLM and
    SGLang read it), and the pairing with its target; or a loose EAGLE-3 head folder against
    --target."""

    bundle: str = option(help="bundle directory, or a loose EAGLE-3 head folder (a run's best/, "
                              "a published head)", positional=True)
    target: str | None = reuse(ModelArgs, "target", None, note="; give it where the bundle's "
                               "recorded one is not found on this machine (it is checked "
                               "against its recorded sha256); a loose head needs it")
    record_target: bool = option(False, help="a loose EAGLE-3 head that records no target "
                                             "(saved by another trainer): check it against "
                                             "--target and record that target in its "
                                             "target.json, so commands that load it take it")
