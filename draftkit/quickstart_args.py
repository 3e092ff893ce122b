"""``draftkit quickstart``'s args (:class:`QuickstartArgs`; the command is
:mod:`draftkit.quickstart`). Light to import (no torch): ``draftkit quickstart --help`` reads
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftkit.config import option
from draftkit.errors import ConfigError
from draftkit.signing_args import SigningArgs

RECIPE = Path("smollm2-135m-instruct_to_eagle3") / "quickstart_ttt.yaml"


@dataclass(kw_only=True)
class QuickstartArgs(SigningArgs):
    """Derive, distill, evaluate and export a draft for the embedded SmolLM2-135M-Instruct. The
    bundle is signed: by --signing-key (or $DRAFTKIT_SIGNING_KEY) where one is given, else by
    a key pair made in OUT/keys on the first run."""

    out: str = option("runs/quickstart", help="output directory")
    minutes: float | None = option(None, help="also stop distillation after M minutes (a time "
                                              "budget: the head then depends on how fast the "
                                              "machine is); default: the recipe's steps, the "
                                              "same head on any machine")
    recipe: str | None = option(None, help="distillation recipe (default: the quickstart recipe "
                                           f"recipes/{RECIPE})")
    eval_limit: int = option(8, help="eval prompts per domain")
    eval_tokens: int = option(64, help="new tokens per eval prompt")
    prompts_per_domain: int = option(24, help="standalone recipes: training prompts per domain "
                                              "the target answers (answers are cached for "
                                              "later runs); an EAGLE-3 recipe's own data stands")
    code_text_chunks: int = option(24, help="standalone recipes: chunks of real Python source "
                                             "added to the code domain")
    resume: bool = option(True, help="continue the distillation an earlier quickstart left in "
                                     "--out; --no-resume starts it over, moving the earlier "
                                     "run's files aside")

    def validate(self) -> None:
        if self.minutes is not None and self.minutes <= 0:
            raise ConfigError(f"--minutes must be positive, got {self.minutes}")
        if min(self.eval_limit, self.eval_tokens, self.prompts_per_domain) < 1:
            raise ConfigError("--eval-limit, --eval-tokens and --prompts-per-domain must be >= 1")
