"""``draftkit bench``'s args (:class:`BenchArgs`; the command is :mod:`draftkit.labs.bench`).
Light to import (no torch): ``draftkit bench --help`` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftkit.config import option, reuse
from draftkit.decode.args import SpeculationArgs
from draftkit.decode.k import DEFAULT_FIXED_K, FixedK
from draftkit.errors import ConfigError
from draftkit.models.args import ModelArgs

METHODS = ("ours_k0", "ours_spec", "hf_generate", "hf_assisted")


@dataclass
class BenchArgs(ModelArgs):
    """Compare our K = 0 and speculative decoding with HF generate and assisted generation."""

    prompts: str = option(help="JSONL file of prompts (string, {\"prompt\"} or {\"messages\"})")
    k: FixedK = reuse(SpeculationArgs, "k", DEFAULT_FIXED_K,
                      note="; bench takes a fixed K >= 1, as HF assisted generation drafts a "
                           "constant number")
    max_new_tokens: int = option(64, help="new tokens per prompt at most")
    repeats: int = option(3, help="interleaved repetitions; medians are reported")
    methods: list[str] = option(list(METHODS), help="methods to run, comma-separated")
    raw: bool = option(False, help="skip the chat template")
    json: bool = option(False, help="print the figures as one JSON object")

    def validate(self) -> None:
        if self.repeats < 1 or self.max_new_tokens < 1:
            raise ConfigError("--repeats and --max-new-tokens must be >= 1")
        bad = [m for m in self.methods if m not in METHODS]
        if not self.methods:
            raise ConfigError(f"--methods is empty; choose from {', '.join(METHODS)}")
        if bad:
            raise ConfigError(f"unknown method {bad[0]!r}; choose from {', '.join(METHODS)}")
