"""What ``draftkit eval`` and ``draftkit regimes`` report, as typed records.

Each record is one JSON object of ``report.json`` (:class:`draftkit.records.Record`), its fields
the keys in order; ``from_dict`` reads an earlier version's too (a missing figure is None).

- eval: :class:`EvalReport`, with :class:`DomainFigures` per domain and overall (and their
  :class:`EntropyTable`), the K sweep's :class:`KSweepRow`, the batch sweep's :class:`BatchRow`
  and its :class:`BreakEven`;
- regimes: :class:`RegimesReport`, one section per regime (:class:`EntropyRegime`,
  :class:`CostRegime`, :class:`MismatchRegime`, :class:`BatchRegime`) over the figures of each
  point measured (:class:`PointFigures`) and the crossovers found (:class:`Crossover`);
- and when a row's measured speedup shows a gain (:func:`shown_speedup`), the one rule eval's
  break-even, the regime map and export's K per batch size read rows by.

Terms (alpha, tau, c, v, K): eval/README.md, "How speculation pays"; each figure: eval/README.md.

Long: every record both reports are made of, each a few lines, one schema read together.
"""

from __future__ import annotations

import datetime as _dt
import typing
from dataclasses import dataclass, field

from draftkit.records import Record, added_later, extra_keys

# the report key of --baseline-draft's teacher-forced acceptance (DomainFigures.baselines)
ALPHA_BEFORE = "alpha_before"


def now() -> str:
    """A report's ``created``: the time in UTC, to the second."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# --- crossovers ----------------------------------------------------------------------------------

@dataclass(kw_only=True)
class Crossover(Record):
    """Where a measured curve crosses speedup 1.0 (:func:`draftkit.metrics.crossover`):
    ``kind`` is crosses (it falls below at x), rises (it rises above at x), below / above (on
    that side everywhere; x None) or empty (no points)."""

    kind: str
    x: float | None


@dataclass(kw_only=True)
class BatchBreakEven(Crossover):
    """A crossover of speedup against batch size (x in batch size, interpolated in log2 B)."""

    batch_size: int | None  # from it every larger B is on the final side (None: above, empty)


@dataclass(kw_only=True)
class BreakEven(BatchBreakEven):
    """The batch sweep's break-even, measured, and per domain as that domain's alpha_i and the
    measured c(B), v(B) predict it."""

    per_domain: dict[str, BatchBreakEven]


@dataclass(kw_only=True)
class CrossoverPair(Record):
    """One curve's crossover as measured and as the speedup model predicts it."""

    measured: Crossover
    predicted: Crossover


# --- draftkit eval -------------------------------------------------------------------------------

@dataclass(kw_only=True)
class EntropyTable(Record):
    """Teacher-forced acceptance per bucket of the target's entropy
    (:mod:`draftkit.evaluate.entropy`)."""

    buckets: list[str]  # the buckets' labels, in nats
    positions: list[int]  # decoded positions in each bucket
    # mean acceptance per bucket (None where empty), by model: "draft", then each baseline's key
    acceptance: dict[str, list[float | None]] = extra_keys()


@dataclass(kw_only=True)
class DomainFigures(Record):
    """One domain's figures, or the token-weighted ``overall`` row: eval's per-domain table."""

    n_prompts: int
    new_tokens: int  # new tokens of the speculative decodes (one repeat)
    alpha: float | None  # decode-time acceptance; None when nothing was drafted
    alpha_tv: float | None  # mean 1 - TV at the tested positions (temperature > 0)
    alpha_after: float | None  # the draft's teacher-forced acceptance (alpha_before's like)
    alpha_per_position: list[float]  # conditional alpha_i
    tau: float
    c: float | None
    v: float | None  # at k
    k: int  # the positive K the run used most
    plain_round_share: float
    rounds_by_k: dict[str, int]
    speedup_predicted: float | None
    speedup_measured: float
    # its 95% interval, a paired bootstrap over prompts (None from one prompt), and about how
    # many prompts would put the interval clear of 1.0 where it includes it
    speedup_low: float | None = added_later()
    speedup_high: float | None = added_later()
    prompts_to_decide: int | None = added_later()
    plain_tokens_per_s: float
    spec_tokens_per_s: float
    target_entropy: float | None  # nats, mean over the decoded continuations
    by_entropy: EntropyTable | None
    overhead_per_round_ms: float
    verdict: str | None
    draft_per_round: bool | None = added_later()  # True: c is a round's (a parallel head)
    # sampled with probabilistic drafts: the draft's teacher-forced acceptance under greedy
    # drafting (vLLM's default draft_sample_method), beside alpha_after's
    alpha_greedy_drafts: float | None = added_later()
    # each baseline draft's teacher-forced acceptance on the same continuations, by its key
    # (ALPHA_BEFORE for --baseline-draft); no key at all, not a null, without a baseline
    baselines: dict[str, float | None] = extra_keys()

    @property
    def alpha_before(self) -> float | None:
        return self.baselines.get(ALPHA_BEFORE)


@dataclass(kw_only=True)
class KSweepRow(Record):
    """One domain at one K: tau and speedup predicted from the table's alpha_i, c and v(K),
    beside the figures measured where the sweep ran that K (None elsewhere)."""

    domain: str
    k: int
    tau: float | None  # predicted; None when nothing was drafted
    tau_measured: float | None
    c: float | None
    v: float | None
    speedup_predicted: float | None
    speedup_measured: float | None
    prompts: int | None  # what the measured figures were measured on
    new_tokens: int | None
    # where measured: the speedup's 95% interval, a paired bootstrap over the prompts (each
    # decoded plainly and at this K, interleaved; None from one prompt), about how many prompts
    # would put it clear of 1.0 where it includes it, and the verdict at this K
    speedup_low: float | None = added_later()
    speedup_high: float | None = added_later()
    prompts_to_decide: int | None = added_later()
    verdict: str | None = added_later()


@dataclass(kw_only=True)
class BatchRow(Record):
    """K = 0 and speculation at K on the same B prompts."""

    batch_size: int
    alpha: float | None
    c: float | None  # c(B)
    v: float | None  # v(B)
    k: int
    plain_tokens_per_s: float
    spec_tokens_per_s: float
    speedup_predicted: float | None
    speedup_measured: float
    # the speedup's 95% interval: batch size 1 is the table's overall row, with its interval
    # over prompts; a larger one's is a paired bootstrap over its batches (distinct prompts,
    # each batch decoded plainly and with speculation, interleaved; None from one batch)
    speedup_low: float | None = added_later()
    speedup_high: float | None = added_later()
    prompts_to_decide: int | None = added_later()  # batches to decide x the batch size
    batches: int | None = added_later()  # the batches measured (batch size 1: the prompts)
    verdict: str | None = added_later()  # the table's verdict rule, at this row's K and B
    draft_per_round: bool | None = added_later()  # as DomainFigures'


@dataclass(kw_only=True)
class PlainStep(Record):
    """The baseline beside its limit (:mod:`draftkit.evaluate.floor`): plain decoding's time
    per token at batch 1, whole loop and target forward alone, and the memory floor: the
    target's weights read once at the rate this device reads memory."""

    ms_per_token: float  # 1000 / plain tokens per second, over every domain
    forward_ms: float | None  # the target's one-token forward alone
    floor_ms: float
    weights_gb: float
    read_gb_per_s: float
    decode_path: str | None = added_later()  # how the forwards ran (DecodeStats.path_text)

    @property
    def over_floor(self) -> float:
        return self.ms_per_token / self.floor_ms


@dataclass(kw_only=True)
class EvalReport(Record):
    """``draftkit eval``'s report.json."""

    target: str
    draft: str | None
    device: str
    dtype: str
    temperature: float
    k: int | str  # --k as given: a number or 'auto'
    created: str
    domains: dict[str, DomainFigures] = field(default_factory=dict)
    overall: DomainFigures | None = None
    k_sweep: list[KSweepRow] = field(default_factory=list)
    batch_sweep: list[BatchRow] = field(default_factory=list)
    break_even: BreakEven | None = None
    plain_step: PlainStep | None = added_later()
    # the K the batch sweep decoded with, a number or 'auto' (reports before it: the sweep's
    # rows' K, fixed)
    batch_sweep_k: int | str | None = added_later()
    machine: str | None = added_later()  # the quickstart's probe beside its reference run's
    # how the draft chose its tokens (temperature > 0): probabilistic, or greedy (vLLM's
    # default draft_sample_method); None: greedy decoding, or a report from before the choice
    draft_sample_method: str | None = added_later()
    # how the sampled drafts were verified (temperature > 0): token, or block (Sun et al.,
    # arXiv 2403.10444); None: greedy decoding, or a report from before the choice (token)
    verify: str | None = added_later()
    # the public benchmark the suite's questions came from (MT-Bench, Spec-Bench, HumanEval,
    # GSM8K); None: draftkit's own suite rows
    benchmark: str | None = added_later()
    # how --dtype auto chose ``dtype`` (measured on a CPU: :mod:`draftkit.decode.dtype_choice`);
    # None: the dtype was asked for, or a report from before the choice
    dtype_choice: str | None = added_later()


# --- draftkit regimes ----------------------------------------------------------------------------

@dataclass(kw_only=True)
class PointFigures(Record):
    """The figures of one point a regime measured (a prompt, a domain, a draft, a
    temperature): eval's per-domain figures that regimes keeps, and the break-even alpha."""

    n_prompts: int
    new_tokens: int
    alpha: float | None
    alpha_per_position: list[float]
    tau: float
    c: float | None
    v: float | None
    k: int
    speedup_measured: float
    speedup_predicted: float | None
    plain_tokens_per_s: float
    spec_tokens_per_s: float
    target_entropy: float | None
    overhead_per_round_ms: float
    break_even_alpha: float | None  # the i.i.d. alpha at which S(K) = 1 for this c and v
    # eval's 95% interval over the point's prompts (None from one prompt) and the prompts
    # that would decide where it includes 1.0
    speedup_low: float | None = added_later()
    speedup_high: float | None = added_later()
    prompts_to_decide: int | None = added_later()
    draft_per_round: bool | None = added_later()  # as DomainFigures'


@dataclass(kw_only=True)
class PromptPoint(PointFigures):
    domain: str
    index: int  # the prompt's place in its domain


@dataclass(kw_only=True)
class TemperaturePoint(PointFigures):
    temperature: float
    per_domain: dict[str, PointFigures]


@dataclass(kw_only=True)
class DraftPoint(PointFigures):
    name: str
    layers: int
    derived: bool
    main: bool
    max_c: float | None  # the largest c at which this alpha still breaks even at K


@dataclass(kw_only=True)
class PolicyBatchRow(BatchRow):
    """eval's batch row at the fixed K, and what the K policy (--k auto) did at that B."""

    policy_k: int  # the K the policy used most
    speedup_policy: float  # against the same K = 0 run
    break_even_alpha: float | None


@dataclass(kw_only=True)
class DraftInfo(Record):
    """A draft the regimes measured."""

    name: str
    layers: int  # decoder layers
    main: bool = False  # the draft the entropy and batch regimes map
    derived: bool = False  # an early exit of the target (the draft-cost curve)
    home: str | None = None  # the domain a domain draft was distilled on


@dataclass(kw_only=True)
class EntropyFit(Record):
    """alpha fitted linearly against the target's entropy over the prompts, and the entropy
    at which it reaches the break-even alpha (the model's crossover; it may lie outside the
    measured range, ``inside`` says)."""

    intercept: float | None
    slope: float | None
    alpha_break_even: float | None
    entropy: float | None
    inside: bool


@dataclass(kw_only=True)
class TemperatureCrossovers(CrossoverPair):
    alpha: Crossover  # where alpha falls below the break-even alpha


@dataclass(kw_only=True)
class EntropyCrossovers(CrossoverPair):
    model: EntropyFit


@dataclass(kw_only=True)
class EntropyRegimeCrossovers(Record):
    temperature: TemperatureCrossovers
    entropy: EntropyCrossovers  # per prompt
    per_domain_temperature: dict[str, CrossoverPair]


@dataclass(kw_only=True)
class EntropyRegime(Record):
    draft: str
    k: int
    break_even_alpha: float | None
    c: float | None
    v: float | None
    prompts: list[PromptPoint]  # at T = 0
    domains: dict[str, PointFigures]  # at T = 0
    temperatures: list[TemperaturePoint]
    crossover: EntropyRegimeCrossovers
    answer: str


@dataclass(kw_only=True)
class CostRegime(Record):
    k: int
    drafts: list[DraftPoint]
    crossover: CrossoverPair  # against the early exits' depth
    best_measured: str | None
    best_predicted: str | None
    answer: str


@dataclass(kw_only=True)
class MismatchCounts(Record):
    """How many draft x domain cells are slowdowns, measured and predicted."""

    cells: int
    measured_slowdowns: int
    predicted_slowdowns: int
    agree: int
    # with domain drafts: alpha_home and alpha_away, the mean alpha on a draft's own domain and
    # on the others (None where none was measured)
    home_and_away: dict[str, float | None] = extra_keys()


@dataclass(kw_only=True)
class MismatchRegime(Record):
    drafts: list[str]  # the matrix's rows
    home: dict[str, str | None]
    domains: list[str]  # its columns
    alpha: list[list[float | None]]
    speedup_measured: list[list[float | None]]
    speedup_predicted: list[list[float | None]]
    crossover: MismatchCounts
    answer: str
    # each cell's 95% interval over its prompts (None from one prompt)
    speedup_low: list[list[float | None]] | None = added_later()
    speedup_high: list[list[float | None]] | None = added_later()


@dataclass(kw_only=True)
class BatchRegime(Record):
    draft: str
    k: int
    domains: dict[str, list[PolicyBatchRow]]
    crossover: dict[str, CrossoverPair]  # per domain
    answer: str


@dataclass(kw_only=True)
class RegimesReport(Record):
    """``draftkit regimes``' report.json."""

    target: str
    draft: str  # the main draft's name
    target_layers: int
    device: str
    dtype: str
    k: int
    k_max: int
    max_new_tokens: int
    prompts_per_domain: int
    domains: list[str]
    drafts: list[DraftInfo]
    entropy: EntropyRegime
    draft_cost: CostRegime
    mismatch: MismatchRegime
    batch: BatchRegime
    created: str
    seconds: float | None
    headline: str = ""
    # how the measured speedups' 95% intervals were taken (reports before them: None, and
    # their points carry none)
    intervals: str | None = added_later()
    dtype_choice: str | None = added_later()  # as :class:`EvalReport`'s

    def regimes(self) -> list[tuple[str, typing.Any]]:
        """(report key, section) of the four regimes, in the report's order."""
        return [("entropy", self.entropy), ("draft_cost", self.draft_cost),
                ("mismatch", self.mismatch), ("batch", self.batch)]


# --- what a measured speedup shows --------------------------------------------------------------

# a gain not shown counts as just short of break-even, on the losing side of 1.0
NOT_SHOWN = 1.0 - 1e-9


def shown_speedup(row: BatchRow | PointFigures) -> float | None:
    """A row's measured speedup where the measurement backs a gain: its interval lies above 1.0
    (over prompts, or over batches at a batch size above 1), or, without one (one prompt or
    batch, or a report from before intervals), the speedup model predicts a gain from the row's
    own alpha, c and v too. Otherwise a measured gain is noise and counts as none
    (:data:`NOT_SHOWN`). Eval's batch sweep, the regime map's curves and export's K per batch
    size read rows the same way."""
    s = row.speedup_measured
    if s is None or s <= 1.0:
        return s
    backed = (row.speedup_low > 1.0 if row.speedup_low is not None
              else (row.speedup_predicted or 0.0) > 1.0)
    return s if backed else NOT_SHOWN
