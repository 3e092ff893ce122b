"""The evaluation commands' args: ``draftkit eval``'s (:class:`EvalArgs`: what to measure and
where to write it, over :class:`~draftkit.evaluate.settings.EvalSettings`) and ``draftkit
regimes``' (:class:`RegimesArgs`); the commands are :mod:`draftkit.evaluate.command`. Light to
import (no torch): ``draftkit COMMAND --help`` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftkit.config import option, reuse
from draftkit.decode.args import SamplingArgs, SpeculationArgs
from draftkit.decode.k import FixedK
from draftkit.engines.args import CPU_FIX_CHOICES, CPU_FIX_HELP, PYTHON_HELP
from draftkit.errors import ConfigError
from draftkit.evaluate.settings import EvalSettings
from draftkit.models.args import ModelArgs

ENGINE_GROUP = "engine options"
DEFAULT_DRAFT_LAYERS = 4  # the early exit regimes maps when no --draft is given (c ~ 0.2 on CPU)


@dataclass
class EvalArgs(ModelArgs, EvalSettings):
    """Measure a draft against its target on domain suites and write a report. Under --k auto,
    one K policy runs per domain, learning across its prompts as a server's does across
    requests; --k-max also bounds the K sweep's predictions."""

    suite: str = option("builtin", help="JSONL suite file or folder of them: draftkit's rows, "
                                        "or MT-Bench's, Spec-Bench's, HumanEval's or GSM8K's "
                                        "question files as published (their categories the "
                                        "domains); 'builtin' = the shipped eval/suites")
    out: str = option("runs/eval", help="output directory for the report")
    baseline_draft: str | None = option(None, help="a second draft (e.g. before distillation): "
                                                   "its teacher-forced alpha on the same "
                                                   "continuations is reported as alpha_before, "
                                                   "the draft's as alpha_after")
    limit: int | None = option(None, help="at most N prompts per domain")
    domains: list[str] | None = option(None, nargs="*", metavar="DOMAIN",
                                       help="only these domains (space- or comma-separated)")
    turns: str = option("first", choices=("first", "every"),
                        help="MT-Bench's and Spec-Bench's multi-turn questions: first: each "
                             "one's first turn; every: each later turn too, a prompt of its own "
                             "after the target's greedy answers to the turns before it")
    engine: str = option("draftkit", choices=("draftkit", "vllm"), group=ENGINE_GROUP,
                         help="draftkit: measure in draftkit's own engine (the usual report); "
                              "vllm: decode the bundle (--draft BUNDLE) in vLLM, in its own "
                              "environment, beside draftkit on the same prompts: acceptance per "
                              "position and tau in each, vLLM's speedup, greedy outputs "
                              "compared, and a control (the target drafting for itself); at "
                              "--k (auto: the bundle's K) and at the bundle's config as written, "
                              "at each of --temperatures; the sweeps are not run")
    engine_python: str | None = option(None, group=ENGINE_GROUP, help=PYTHON_HELP)
    vllm_cpu_fix: str = option("auto", choices=CPU_FIX_CHOICES, group=ENGINE_GROUP,
                               help=CPU_FIX_HELP)
    temperatures: list[float] | None = option(None, nargs="*", metavar="T", group=ENGINE_GROUP,
                                              help="the temperatures --engine vllm compares "
                                                   "(default: 0 and --temperature, or 1 where "
                                                   "that is 0)")

    def validate(self) -> None:
        super().validate()
        if self.engine != "vllm" and self.temperatures is not None:
            raise ConfigError("--temperatures is for --engine vllm; draftkit's own eval takes "
                              "one --temperature")
        if self.engine != "vllm" and self.vllm_cpu_fix != "auto":
            raise ConfigError("--vllm-cpu-fix is for --engine vllm")
        if any(t < 0 for t in self.temperatures or []):
            raise ConfigError("--temperatures must be >= 0")
        if self.k_max < 1:
            raise ConfigError("--k-max must be >= 1")
        if self.limit is not None and self.limit < 1:
            raise ConfigError("--limit must be >= 1")
        if self.engine == "vllm" and self.turns != "first":
            raise ConfigError("--turns every is for draftkit's own eval; --engine vllm "
                              "compares first turns")


@dataclass
class RegimesArgs(ModelArgs, SpeculationArgs):
    """Measure where speculation stops paying for a target and draft on your own prompts: high
    entropy, a draft too slow for its acceptance, domain mismatch and large batches."""

    draft: str | None = reuse(ModelArgs, "draft", None, note="; the draft to map (default: an "
                              f"early exit of the target's first {DEFAULT_DRAFT_LAYERS} layers)")
    suite: str = option("builtin", help="JSONL suite file or folder of them; 'builtin' = the "
                                        "shipped eval/suites")
    domains: list[str] | None = option(None, nargs="*", metavar="DOMAIN",
                                       help="only these domains (space- or comma-separated)")
    out: str = option("runs/regimes", help="output directory for the report")
    drafts_by_domain: list[str] = option([], nargs="*", metavar="DOMAIN=PATH",
                                         help="drafts distilled on one domain each, for the "
                                              "mismatch matrix (default: every draft measured, "
                                              "on every domain)")
    layer_sizes: list[int] = option([1, 2, 4, 8, 15, 24, 30], nargs="*", metavar="N",
                                    help="depths of the early-exit drafts of the draft-cost "
                                         "regime; N >= the target's depth is the target itself")
    temperatures: list[float] = option([0.0, 0.7, 1.0, 1.3], nargs="*", metavar="T",
                                       help="sampling temperatures of the entropy regime")
    batch_sizes: list[int] = option([1, 2, 4, 8, 16], nargs="*", metavar="B",
                                    help="batch sizes of the batch regime (none to skip it)")
    prompts_per_domain: int = option(2, help="prompts per domain in the entropy, cost and "
                                             "mismatch regimes (the batch regime takes as many "
                                             "as --batch-groups of its largest batch)")
    batch_groups: int = reuse(EvalSettings, "batch_groups", 2,
                              note=" (here per domain; 2, the fewest that give an interval, "
                                   "to keep the map's budget)")
    max_new_tokens: int = option(32, help="new tokens per prompt")
    k: FixedK = reuse(SpeculationArgs, "k", 2, note="; regimes takes a fixed K >= 1, the same in "
                 "every measurement, so that slowdowns show instead of the policy hiding them "
                 "(the batch regime also reports the K that --k auto picks)")
    seed: int = reuse(SamplingArgs, "seed")

    def validate(self) -> None:
        super().validate()
        for name in ("prompts_per_domain", "batch_groups", "max_new_tokens", "k_max"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
        if any(n < 1 for n in self.layer_sizes) or any(b < 1 for b in self.batch_sizes):
            raise ConfigError("--layer-sizes and --batch-sizes take positive integers")
        if any(t < 0 for t in self.temperatures):
            raise ConfigError("--temperatures must be >= 0")
        for item in self.drafts_by_domain:
            domain, _, path = item.partition("=")
            if not domain.strip() or not path.strip():
                raise ConfigError(f"--drafts-by-domain takes DOMAIN=PATH, got {item!r}")
