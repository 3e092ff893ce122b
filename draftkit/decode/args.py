"""The decoding flags that the commands share, declared (with their help and checks) once, and
``draftkit generate``'s args (:class:`GenerateArgs`; the command is :mod:`draftkit.decode.command`).

- :class:`SpeculationArgs`: ``--k`` and ``--k-max`` (generate, eval, serve, regimes; bench
  takes ``--k`` alone, fixed);
- :class:`SamplingArgs`: ``--temperature``, ``--top-k``, ``--top-p`` and ``--seed``
  (generate, eval; regimes takes ``--seed``; serve's requests carry their own), and how drafts
  are chosen and verified when sampling, ``--draft-sample-method`` and ``--verify`` (serve
  takes ``--verify`` too);
- :class:`DecodingArgs`: both, as generate and eval take them (and eval's settings).

A command's args dataclass inherits them; a command that needs another default, or one of the
fields alone, declares it again with :func:`draftkit.config.reuse`, which keeps the help.
Their flags are listed under one ``--help`` group, :data:`GROUP`. Light to import (no torch):
``draftkit COMMAND --help`` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from draftkit.config import option, reuse
from draftkit.decode.k import AUTO, K, K_MAX, check_k
from draftkit.decode.sampling_params import (DRAFT_SAMPLE_METHODS, PROBABILISTIC, TOKEN,
                                             VERIFY_RULES, SamplingParams)
from draftkit.errors import ConfigError, DraftkitError
from draftkit.models.args import ModelArgs

GROUP = "decoding options"


@dataclass(kw_only=True)
class SpeculationArgs:
    """K, the tokens drafted per round, and the largest K the policy may choose."""

    k: K = option(AUTO, group=GROUP, help="drafted tokens per round (K, num_speculative_"
                  "tokens): an integer (0 = plain decoding) or 'auto', chosen each round from "
                  "measured acceptance and cost for the live batch size (K = 0 when "
                  "speculation loses)")
    k_max: int = option(K_MAX, group=GROUP, help="largest K that --k auto may choose")
    # whether --k-max bounds a fixed K too (eval: its predictions and K sweep stop at k_max)
    k_bounded: ClassVar[bool] = False

    def validate(self) -> None:
        """The one check a command's K gets; what decodes with it then takes its KChoice."""
        self.k = check_k(self.k, self.k_max, bounded=self.k_bounded)


@dataclass(kw_only=True)
class SamplingArgs:
    """How tokens are chosen (the same for target and draft: sampling_params.SamplingParams)."""

    temperature: float = option(0.0, group=GROUP, help="sampling temperature; 0 = greedy")
    top_k: int = option(0, group=GROUP, help="keep the top-k tokens; 0 = off")
    top_p: float = option(1.0, group=GROUP, help="nucleus sampling mass in (0, 1]; 1 = off")
    seed: int = option(0, group=GROUP, help="random seed for sampling; the same seed repeats "
                       "the output exactly with a fixed --k (with --k auto, K follows "
                       "measured timings, and the draws follow K)")

    draft_sample_method: str = option(PROBABILISTIC, group=GROUP, choices=DRAFT_SAMPLE_METHODS,
                                      help="how the draft picks its tokens at temperature > 0: "
                                           "probabilistic (samples its distribution q, kept "
                                           "with min(1, p/q)) or greedy (its argmax, kept with "
                                           "probability p: vLLM's default "
                                           "draft_sample_method, which accepts less); both "
                                           "emit the target's distribution")
    verify: str = option(TOKEN, group=GROUP, choices=VERIFY_RULES,
                         help="how drafted tokens are verified at temperature > 0: token (one "
                              "at a time, each kept with min(1, p/q)) or block (the block "
                              "jointly, Sun et al., arXiv 2403.10444: vLLM's "
                              "rejection_sample_method block), which keeps as many or more "
                              "(more only where the draft samples: the same under greedy "
                              "drafts); both emit the target's distribution, and greedy "
                              "decoding is the same under either")

    def sampling_params(self):
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.draft_sample_method,
                              self.verify)

    def validate(self) -> None:
        try:
            self.sampling_params()  # its checks, whose messages name each flag less its "--"
        except DraftkitError as e:
            raise ConfigError(f"--{e}") from None


@dataclass(kw_only=True)
class DecodingArgs(SamplingArgs, SpeculationArgs):
    """K and sampling: everything a decode is given besides its prompts and budget."""

    def validate(self) -> None:
        SpeculationArgs.validate(self)
        SamplingArgs.validate(self)


@dataclass
class GenerateArgs(ModelArgs, DecodingArgs):
    """Generate text from prompts with the target, speculatively when a draft is given."""

    draft: str | None = reuse(ModelArgs, "draft", None, note="; none = plain decoding")
    max_new_tokens: int = option(128, help="new tokens per prompt at most")
    prompt: str | None = option(None, help="one prompt (text)")
    prompts: str | None = option(None, help="JSONL file of prompts (string, {\"prompt\"} or "
                                            "{\"messages\"} per line)")
    batch_size: int = option(1, help="prompts decoded together")
    raw: bool = option(False, help="skip the chat template; tokenize the prompt as it is")
    json: bool = option(False, help="print one JSON object per prompt")

    def validate(self) -> None:
        super().validate()
        if (self.prompt is None) == (self.prompts is None):
            raise ConfigError("give exactly one of --prompt TEXT or --prompts FILE.jsonl")
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")
