"""The distillation commands' args: ``draftkit distill``'s (:class:`DistillArgs`, whose
``--help`` lists its recipe's keys from :class:`~draftkit.distill.config.DistillConfig`) and
``draftkit init``'s (:class:`InitArgs`); the commands are :mod:`draftkit.distill.command` and
:mod:`draftkit.distill.init`. Light to import (no torch): ``draftkit COMMAND --help`` reads
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from draftkit.config import option
from draftkit.distill.config import DistillConfig
from draftkit.errors import ConfigError


@dataclass
class DistillArgs:
    """Distil a draft against the target's distribution from a YAML recipe."""

    recipe: str = option(help="YAML recipe (see recipes/)", positional=True)
    overrides: list[str] = option([], help="key=value overrides, dotted for sections "
                                           "(train.lr=1e-4)", positional=True, nargs="*",
                                  metavar="KEY=VALUE")
    dry_run: bool = option(False, help="validate the recipe and exit without training")
    prepare: bool = option(False, help="build the target's answers and the teacher cache "
                                       "(kept on disk), then exit: a later run of the recipe "
                                       "starts training at once, so max_minutes buys steps")

    recipe_config: ClassVar[type] = DistillConfig  # its keys are listed in --help

    def validate(self) -> None:
        if self.dry_run and self.prepare:
            raise ConfigError("--dry-run builds nothing and --prepare builds the data: "
                              "give one of them")


@dataclass(kw_only=True)
class InitArgs:
    """Write a commented EAGLE-3 recipe for a target and a data file, each choice said in a
    comment; `draftkit distill RECIPE --dry-run` checks it, `draftkit distill RECIPE` trains."""

    target: str = option(help="target model: HF directory, hub id (its config.json in the "
                              "local Hugging Face cache) or 'embedded'")
    data: str = option(help="training data: a .jsonl or .json file of chats or prompts "
                            "(ShareGPT, OpenAI messages, prompt/response rows)")
    gpus: int = option(1, help="GPUs the recipe trains on (0: this machine's CPU)")
    domain: str = option("chat", help="the domain label of the data's rows")
    epochs: float = option(2.0, help="passes over the data the steps add up to")
    rows: int | None = option(None, help="the data's rows, where init cannot count them (a "
                                         "format other than .jsonl or .json)")
    out: str | None = option(None, help="recipe file to write (default: "
                                        "TARGETNAME_to_eagle3.yaml here)")
    force: bool = option(False, help="replace an existing recipe file")

    def validate(self) -> None:
        if self.gpus < 0:
            raise ConfigError(f"--gpus must be >= 0, got {self.gpus}")
        if not self.epochs > 0:
            raise ConfigError(f"--epochs must be positive, got {self.epochs}")
        if self.rows is not None and self.rows < 1:
            raise ConfigError(f"--rows must be >= 1, got {self.rows}")
