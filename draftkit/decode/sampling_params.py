"""How tokens are chosen, as a decode is asked for it: :class:`SamplingParams` and the names of
its choices, checked once. Light to import (no torch): the commands' flags
(:mod:`draftkit.decode.args`) and the traffic records name them; :mod:`draftkit.decode.sampling`
turns them into distributions.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftkit.errors import DraftkitError

# Below this, logits / temperature overflow and the probabilities are NaN: such a temperature
# is greedy in all but name, and decodes as greedy (vLLM does the same).
MIN_TEMPERATURE = 1e-5
PROBABILISTIC, GREEDY_DRAFT = "probabilistic", "greedy"  # SamplingParams.draft_sample_method
DRAFT_SAMPLE_METHODS = (PROBABILISTIC, GREEDY_DRAFT)
TOKEN, BLOCK = "token", "block"  # SamplingParams.verify: verify.py's verify_sampled, block_verify
VERIFY_RULES = (TOKEN, BLOCK)


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen; the same for target and draft."""

    temperature: float = 0.0  # 0 (or below MIN_TEMPERATURE) = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    # how a draft picks its tokens when sampling (vLLM's names): PROBABILISTIC samples q, the
    # rule of Leviathan et al.; GREEDY_DRAFT takes q's argmax and verifies it as one-hot, so a
    # token is kept with probability p(d), as vLLM's default draft_sample_method does
    draft_sample_method: str = "probabilistic"
    # how a sampled row's drafts are verified: TOKEN one at a time (Leviathan et al.), BLOCK
    # jointly (Sun et al., arXiv 2403.10444: vLLM's rejection_sample_method block), which keeps
    # as many or more (the same number in expectation under GREEDY_DRAFT); both emit the
    # target's distribution, and greedy rows are unaffected
    verify: str = TOKEN

    def __post_init__(self) -> None:
        # each message starts with the parameter's name as its flag spells it, less the "--"
        # (decode/args.py adds it back for the commands)
        if not 0 <= self.temperature < float("inf"):  # also NaN
            raise DraftkitError(f"temperature must be a finite number >= 0 (0 = greedy), got "
                                f"{self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise DraftkitError(f"top-p must lie in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise DraftkitError(f"top-k must be >= 0 (0 = off), got {self.top_k}")
        if self.draft_sample_method not in DRAFT_SAMPLE_METHODS:
            raise DraftkitError(f"draft-sample-method must be one of "
                                f"{', '.join(DRAFT_SAMPLE_METHODS)}, got "
                                f"{self.draft_sample_method!r}")
        if self.verify not in VERIFY_RULES:
            raise DraftkitError(f"verify must be one of {', '.join(VERIFY_RULES)}, got "
                                f"{self.verify!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE

    @property
    def greedy_draft(self) -> bool:
        """A sampled row whose draft proposes its argmax (q one-hot in the accept test)."""
        return self.draft_sample_method == GREEDY_DRAFT and not self.greedy
